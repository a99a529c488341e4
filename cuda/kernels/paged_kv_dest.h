// PagedKvDest: an engine's paged KV layout (types/kv_layout.h) as a write
// destination of the KVTC decode kernels (cuda/kernels/mean_add_scatter.h,
// cuda/kernels/sink_fp8.h), so that a decoded page goes straight into the
// engine's blocks instead of a page-shaped staging slot plus a separate scatter
// (cuda/kernels/paged_kv_scatter.h). Addressing is the scatter's, shared
// through cuda/kernels/paged_kv_address.cuh: element (token, head, d) of layer
// j's K (V) block `block` at k_bases[j] (v_bases[j]) + block * block_stride +
// token * token_stride + head * head_stride + d (bytes here).
//
// A plain value the host fills and kernels take by value; the tables are
// device memory owned by the caller. Page i of a launch goes to block
// block_ids[i]; a block id outside [0, num_blocks) and the page layers
// outside [layer_begin, layer_begin + num_layers) are not written. Disabled
// (block_ids null): the kernels write KvtcPageInfo::data as before.
#ifndef KVHARBOR_CUDA_KERNELS_PAGED_KV_DEST_H_
#define KVHARBOR_CUDA_KERNELS_PAGED_KV_DEST_H_

#include <cstdint>

#include "cuda/kernels/paged_kv_shape.h"

namespace kvharbor {
namespace gpu {

struct PagedKvDest {
  const int64_t* block_ids = nullptr;  // [pages of the launch]
  const uint64_t* k_bases = nullptr;   // [num_layers]
  const uint64_t* v_bases = nullptr;   // [num_layers]
  uint32_t layer_begin = 0;
  uint32_t num_layers = 0;
  uint64_t num_blocks = 0;
  uint64_t block_stride_bytes = 0;
  uint64_t token_stride_bytes = 0;
  uint64_t head_stride_bytes = 0;
  // A power of two (<= 16) every base and stride (bytes) is a multiple of:
  // the kernels' vector stores need 16.
  uint32_t align = 1;

  bool enabled() const { return block_ids != nullptr; }
};

// The destination of pages of `shape` (MakePagedKvShape) going into the
// layout whose device tables are block_ids / k_bases / v_bases;
// `bases_align` is the alignment every K / V base is a multiple of.
inline PagedKvDest MakePagedKvDest(const PagedKvShape& s,
                                   const int64_t* block_ids,
                                   const uint64_t* k_bases,
                                   const uint64_t* v_bases,
                                   uint32_t bases_align) {
  PagedKvDest d;
  d.block_ids = block_ids;
  d.k_bases = k_bases;
  d.v_bases = v_bases;
  d.layer_begin = s.layer_begin;
  d.num_layers = s.num_layers;
  d.num_blocks = s.num_blocks;
  const uint64_t es = s.element_bytes;
  d.block_stride_bytes = static_cast<uint64_t>(s.block_stride) * es;
  d.token_stride_bytes = static_cast<uint64_t>(s.token_stride) * es;
  d.head_stride_bytes = static_cast<uint64_t>(s.head_stride) * es;
  uint64_t all = d.block_stride_bytes | d.token_stride_bytes |
                 d.head_stride_bytes | (bases_align == 0 ? 1 : bases_align);
  uint32_t a = 1;
  while (a < 16 && all % (2 * a) == 0) a *= 2;
  d.align = a;
  return d;
}

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_PAGED_KV_DEST_H_
