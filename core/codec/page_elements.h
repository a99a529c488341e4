// Element access inside KV pages for the CPU codecs: where a (kv, layer)
// block starts in a page, and float32 conversion of contiguous element runs
// in each stored dtype (bf16 / fp16 / fp8 rounding as
// core/base/float_formats.h, round to nearest even, fp8 saturating).
//
// Within a block, tokens are rows of num_kv_heads * head_dim contiguous
// elements ([token][kv_head][head_dim]) in both page layouts; only the order
// of the (kv, layer) blocks differs (types/geometry.h).
//
// Pure functions on caller-owned memory; thread-safe.
#ifndef KVHARBOR_CORE_CODEC_PAGE_ELEMENTS_H_
#define KVHARBOR_CORE_CODEC_PAGE_ELEMENTS_H_

#include <cstddef>
#include <cstdint>

#include "types/geometry.h"

namespace kvharbor {

// Element index (not byte) in a page of token 0 of the K (kv = 0) or V
// (kv = 1) block of layer `layer`.
inline uint64_t PageBlockElementOffset(const Geometry& g, int kv,
                                       uint32_t layer) {
  const uint64_t block =
      uint64_t{g.page_size} * g.num_kv_heads * uint64_t{g.head_dim};
  const uint64_t index = g.layout == PageLayout::kKvLayerTokenHeadDim
                             ? uint64_t(kv) * g.num_layers + layer
                             : uint64_t{layer} * 2 + kv;
  return index * block;
}

// Converts `n` elements of `dtype` at `src` (no alignment needed) to float.
void LoadElements(DType dtype, const uint8_t* src, size_t n, float* dst);
// Converts `n` floats to `dtype` at `dst`.
void StoreElements(DType dtype, const float* src, size_t n, uint8_t* dst);

// Converts one whole page (g.PageBytes() bytes at `page`, either layout) into
// float rows ordered [token][layer][kv_head][head_dim]: K into `k_rows`, V
// into `v_rows`, each page_size * g.ElementsPerTokenPerKv() floats. The one
// page-to-rows conversion (online sampler, `kvharbor samples capture`).
void PageToTokenRows(const Geometry& g, const uint8_t* page, float* k_rows,
                     float* v_rows);

// Index of the first NaN or infinity in v[0, n), or n when all are finite
// (codecs that cannot represent them name the element in their error).
size_t FirstNonFinite(const float* v, size_t n);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_PAGE_ELEMENTS_H_
