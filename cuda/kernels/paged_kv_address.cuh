// Device helpers: where an element of an engine's paged KV layout lives.
// One definition for the paged-KV scatter / gather
// (cuda/kernels/paged_kv_copy.cu) and the decode kernels writing into a layout
// (cuda/kernels/paged_kv_dest.h). Stateless; device code only.
#ifndef KVHARBOR_CUDA_KERNELS_PAGED_KV_ADDRESS_CUH_
#define KVHARBOR_CUDA_KERNELS_PAGED_KV_ADDRESS_CUH_

#include <cstdint>

#include "cuda/kernels/device_math.cuh"
#include "cuda/kernels/kvtc_device_types.h"
#include "cuda/kernels/paged_kv_dest.h"

namespace kvharbor {
namespace gpu {
namespace dev {

// Byte address of block `block` of layout layer j's K (kv = 0) or V cache.
__device__ __forceinline__ uint8_t* LayoutBlock(const uint64_t* k_bases,
                                                const uint64_t* v_bases,
                                                uint32_t kv, uint32_t j,
                                                uint64_t block,
                                                uint64_t block_stride_bytes) {
  return reinterpret_cast<uint8_t*>(kv == 0 ? k_bases[j] : v_bases[j]) +
         block * block_stride_bytes;
}

// Bytes from a block's start to (token, head, d = 0).
__device__ __forceinline__ uint64_t
LayoutTokenHead(uint64_t token, uint64_t head, uint64_t token_stride_bytes,
                uint64_t head_stride_bytes) {
  return token * token_stride_bytes + head * head_stride_bytes;
}

// One token's run [kv_head][head_dim] of (page, K or V, layer) as a decode
// kernel writes it: in its page (KvtcPageInfo::data) or in the layout.
struct TokenRun {
  uint8_t* base = nullptr;  // null: not written (layer or block not held)
  uint64_t index = 0;       // page: element index of the run in the page
  uint64_t head_stride_bytes = 0;
  uint32_t head_dim = 0;
  bool layout = false;

  // Element e of the run: StoreElement(*at, *i, v).
  __device__ __forceinline__ void Locate(uint32_t e, uint8_t** at,
                                         uint64_t* i) const {
    if (!layout) {
      *at = base;
      *i = index + e;
      return;
    }
    const uint32_t h = e / head_dim;
    *at = base + h * head_stride_bytes;
    *i = e - h * head_dim;
  }
  template <int kDType, bool kNative>
  __device__ __forceinline__ void Store(uint32_t e, float v) const {
    uint8_t* at;
    uint64_t i;
    Locate(e, &at, &i);
    StoreElement<kDType, kNative>(at, i, v);
  }
  // Elements e..e+3, one head's (the launcher keeps head_dim % 4 == 0 and
  // 16-byte alignment for the vector path).
  template <int kDType>
  __device__ __forceinline__ void Store4(uint32_t e, float4 f) const {
    uint8_t* at;
    uint64_t i;
    Locate(e, &at, &i);
    dev::Store4<kDType>(at, i, f);
  }
};

__device__ __forceinline__ TokenRun LocateTokenRun(
    const KvtcPageShape& s, const KvtcPageInfo* pages, const PagedKvDest& d,
    uint32_t page, int kv, uint32_t layer, uint32_t token) {
  TokenRun r;
  r.head_dim = s.head_dim;
  if (d.block_ids == nullptr) {
    r.base = pages[page].data;
    r.index = s.RunIndex(kv, layer, token);
    return r;
  }
  r.layout = true;
  r.head_stride_bytes = d.head_stride_bytes;
  const int64_t block = d.block_ids[page];
  if (layer < d.layer_begin || layer - d.layer_begin >= d.num_layers ||
      block < 0 || static_cast<uint64_t>(block) >= d.num_blocks) {
    return r;  // base null
  }
  r.base = LayoutBlock(d.k_bases, d.v_bases, static_cast<uint32_t>(kv),
                       layer - d.layer_begin, static_cast<uint64_t>(block),
                       d.block_stride_bytes) +
           LayoutTokenHead(token, 0, d.token_stride_bytes, 0);
  return r;
}

}  // namespace dev
}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_PAGED_KV_ADDRESS_CUH_
