// PagedKvLayout: an inference engine's own paged KV cache, described as
// per-layer K and V base addresses plus strides, so that fetched pages can
// be written straight into it (scatter) and stored pages read out of it
// (gather) without a copy in between.
//
// One (layer, K or V) block of the engine holds `block_size` tokens, and its
// elements sit at
//   base[layer] + (block * block_stride + token * token_stride +
//                  head * head_stride + d) * element size
// for block in [0, num_blocks), token in [0, block_size), head in
// [0, num_kv_heads), d in [0, head_dim): head_dim is contiguous, the other
// strides are in ELEMENTS and may be anything that does not make two
// elements share an address. block_size is the namespace's page_size, so
// page i of a fetch fills exactly one block (block_ids[i]). This covers:
//   vLLM          per layer [2, num_blocks, block_size, H, D]: K = t[0],
//                 V = t[1], strides of t[0]
//   FlashInfer    per layer [num_blocks, 2, block_size, H, D]: K = t[:, 0],
//                 V = t[:, 1]
//   SGLang        layer-first k_buffer[layer] / v_buffer[layer] [slots, H,
//                 D]: block b = slots [b * page, (b + 1) * page)
//   SGLang        page-first [2, slots, L, H, D]: K of layer l = kv[0, 0, l]
//                 (token stride L * H * D)
//   HF dense      per layer [1, H, S, D]: block b = tokens [b * page,
//                 (b + 1) * page) (head stride S * D, token stride D)
// The layers may be a range of the namespace's (pipeline parallelism):
// k[0] / v[0] hold namespace layer `layer_begin`.
//
// A plain value type (copyable, thread-compatible). It describes memory the
// caller owns (host memory, device == kHostDevice, or device memory of CUDA
// ordinal `device`); nothing here reads or writes through the addresses.
// ResolveLayout checks a layout against a namespace's Geometry and
// CheckBlockIds the destination blocks of a call; every error names its
// field ("layout.num_kv_heads", "layout.k[2]", "block_ids[3]").
#ifndef KVHARBOR_TYPES_KV_LAYOUT_H_
#define KVHARBOR_TYPES_KV_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "types/geometry.h"

namespace kvharbor {

// PagedKvLayout::device of host memory.
inline constexpr int kHostDevice = -1;

struct PagedKvLayout {
  DType dtype = DType::kUnspecified;
  // Namespace layer that k[0] / v[0] hold; the layout holds layers
  // [layer_begin, layer_begin + k.size()).
  uint32_t layer_begin = 0;
  // Per layer: address of element 0 of its K (V) cache.
  std::vector<uint64_t> k;
  std::vector<uint64_t> v;
  // Optional, per layer: how many bytes from k[i] (v[i]) belong to the
  // caller's buffer; checked to hold every element the layout addresses.
  // Empty, or 0 for a layer, = not known (not checked).
  std::vector<uint64_t> k_bytes;
  std::vector<uint64_t> v_bytes;
  // 0 = the namespace's (filled in by ResolveLayout).
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_size = 0;  // tokens per block: the namespace's page_size
  uint64_t num_blocks = 0;
  // In elements; all >= 1.
  int64_t block_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  // CUDA ordinal of the memory, or kHostDevice.
  int device = kHostDevice;

  uint32_t num_layers() const { return static_cast<uint32_t>(k.size()); }
  bool on_device() const { return device != kHostDevice; }
  // Element offset (from a layer's base) of (block, token, head, d = 0).
  uint64_t ElementOffset(uint64_t block, uint64_t token, uint64_t head) const {
    return block * static_cast<uint64_t>(block_stride) +
           token * static_cast<uint64_t>(token_stride) +
           head * static_cast<uint64_t>(head_stride);
  }
  // Bytes from a layer's base to one past the last element addressed
  // (valid once resolved).
  uint64_t ExtentBytes() const;
  // Elements of the longest contiguous run of one block, when one block's
  // elements are copied in [token][head][d] order: head_dim, or
  // num_kv_heads * head_dim when heads are adjacent, or the whole block
  // when tokens are too (vLLM's layout: one run per block).
  uint64_t ContiguousRunElements() const;
};

// `layout` with its 0 fields (num_kv_heads, head_dim, block_size) taken
// from `g`, checked against it: dtype, heads, head_dim and block_size equal
// the namespace's, the layer range lies within its layers (and, with
// `all_layers`, is all of them: a gather must produce whole pages), strides
// >= 1 and no two elements at one address, addresses aligned to the element
// size and, where k_bytes / v_bytes say how large a buffer is, every
// addressed element inside it. INVALID_ARGUMENT naming "layout.<field>".
absl::StatusOr<PagedKvLayout> ResolveLayout(const PagedKvLayout& layout,
                                            const Geometry& g,
                                            bool all_layers = false);

// The destination (or source) blocks of `num_pages` pages: exactly that
// many ids ("block_ids"), each in [0, layout.num_blocks) and no block twice
// ("block_ids[i]").
absl::Status CheckBlockIds(const PagedKvLayout& layout,
                           absl::Span<const int64_t> block_ids,
                           size_t num_pages);

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_KV_LAYOUT_H_
