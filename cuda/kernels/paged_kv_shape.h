// What the paged-KV scatter and gather kernels
// (cuda/kernels/paged_kv_scatter.h, cuda/kernels/paged_kv_gather.h) need to
// know about a namespace's page and an engine's layout (types/kv_layout.h), as
// plain numbers a kernel can take by value, and the arguments of a launch of
// either (PagedKvCopyArgs).
//
// Dimension order. A page: [2 (K, V)][layer][token][head][d] (page_layers
// layers) or [layer][2][token][head][d] (layer_major), contiguous. A
// layout block of (layer j, K or V): element (token, head, d) at
// base[j] + block * block_stride + token * token_stride +
// head * head_stride + d (elements). Header only; a value type.
#ifndef KVHARBOR_CUDA_KERNELS_PAGED_KV_SHAPE_H_
#define KVHARBOR_CUDA_KERNELS_PAGED_KV_SHAPE_H_

#include <cstdint>

#include "types/geometry.h"
#include "types/kv_layout.h"

namespace kvharbor {
namespace gpu {

struct PagedKvShape {
  // The namespace's page.
  uint32_t page_layers = 0;
  uint32_t page_size = 0;  // tokens per page and per block
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t element_bytes = 0;
  bool layer_major = false;  // PageLayout::kLayerKvTokenHeadDim
  // The layout: layers [layer_begin, layer_begin + num_layers) of a page.
  uint32_t layer_begin = 0;
  uint32_t num_layers = 0;
  uint64_t num_blocks = 0;
  int64_t block_stride = 0;  // elements
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  // PagedKvLayout::ContiguousRunElements: the longest stretch of a block
  // that is contiguous in the layout (head_dim, heads * head_dim, or the
  // whole block).
  uint64_t run_elements = 0;

  uint64_t block_elements() const {
    return uint64_t{page_size} * num_kv_heads * head_dim;
  }
  uint64_t page_bytes() const {
    return 2 * uint64_t{page_layers} * block_elements() * element_bytes;
  }
};

// The shape of moving pages of `g` into (or out of) `layout`, which
// ResolveLayout(layout, g) returned.
inline PagedKvShape MakePagedKvShape(const Geometry& g,
                                     const PagedKvLayout& layout) {
  PagedKvShape s;
  s.page_layers = g.num_layers;
  s.page_size = g.page_size;
  s.num_kv_heads = g.num_kv_heads;
  s.head_dim = g.head_dim;
  s.element_bytes = static_cast<uint32_t>(DTypeSize(g.dtype));
  s.layer_major = g.Resolved().layout == PageLayout::kLayerKvTokenHeadDim;
  s.layer_begin = layout.layer_begin;
  s.num_layers = layout.num_layers();
  s.num_blocks = layout.num_blocks;
  s.block_stride = layout.block_stride;
  s.token_stride = layout.token_stride;
  s.head_stride = layout.head_stride;
  s.run_elements = layout.ContiguousRunElements();
  return s;
}

// What one paged-KV copy launch moves: `num_pages` pages of `shape` and the
// engine blocks they go to (scatter) or come from (gather). `Byte` is
// const uint8_t for the scatter (pages read) and uint8_t for the gather
// (pages written): PagedKvScatterArgs and PagedKvGatherArgs.
template <typename Byte>
struct PagedKvCopyArgs {
  PagedKvShape shape;
  uint32_t num_pages = 0;
  // Page i at page_ptrs[i] (a device table of addresses) when set, else at
  // page_base + i * page_pitch.
  const uint64_t* page_ptrs = nullptr;
  Byte* page_base = nullptr;
  uint64_t page_pitch = 0;
  const int64_t* block_ids = nullptr;  // [num_pages]
  const uint64_t* k_bases = nullptr;   // [shape.num_layers]
  const uint64_t* v_bases = nullptr;   // [shape.num_layers]
  // Powers of two every page address of page_ptrs (a batch's own alignment
  // is read from page_base and page_pitch) and every K / V base is a
  // multiple of; they bound the vector width.
  uint32_t page_align = 1;
  uint32_t layout_align = 1;
  uint32_t max_vector_bytes = 16;  // tests lower it to check narrow paths
};

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_PAGED_KV_SHAPE_H_
