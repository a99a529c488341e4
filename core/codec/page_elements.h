// Element access inside KV pages for the CPU codecs: float32 conversion of
// contiguous element runs in each stored dtype (bf16 / fp16 / fp8 rounding
// as core/base/float_formats.h, round to nearest even, fp8 saturating).
//
// Where a (kv, layer) block starts in a page is PageBlockElementOffset
// (types/geometry.h).
//
// Pure functions on caller-owned memory; thread-safe.
#ifndef KVHARBOR_CORE_CODEC_PAGE_ELEMENTS_H_
#define KVHARBOR_CORE_CODEC_PAGE_ELEMENTS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "types/geometry.h"

namespace kvharbor {

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
// OK when run[0, n) is finite; else InvalidArgument naming the first bad
// element: "pages[<page>]: K|V of layer <layer>, token <token>, <element>
// <i> is <value>; <codec> cannot encode non-finite values".
absl::Status CheckRunFinite(const float* run, size_t n, size_t page, int kv,
                            uint32_t layer, uint32_t token, const char* element,
                            const char* codec);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_PAGE_ELEMENTS_H_
