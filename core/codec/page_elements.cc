#include "core/codec/page_elements.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "core/base/float_formats.h"

namespace kvharbor {

namespace {

// The 16-bit element formats, converted one element at a time (template
// arguments, so that each loop calls its conversion directly).
template <float (*kToFloat)(uint16_t)>
void Load16(const uint8_t* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, src + 2 * i, 2);
    dst[i] = kToFloat(v);
  }
}

template <uint16_t (*kFromFloat)(float)>
void Store16(const float* src, size_t n, uint8_t* dst) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t v = kFromFloat(src[i]);
    std::memcpy(dst + 2 * i, &v, 2);
  }
}

}  // namespace

void LoadElements(DType dtype, const uint8_t* src, size_t n, float* dst) {
  switch (dtype) {
    case DType::kFP32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16:
      Load16<Bf16ToFloat>(src, n, dst);
      return;
    case DType::kFP16:
      Load16<Fp16ToFloat>(src, n, dst);
      return;
    case DType::kFP8E4M3:
      for (size_t i = 0; i < n; ++i) dst[i] = Fp8E4M3ToFloat(src[i]);
      return;
    case DType::kUnspecified:
      break;
  }
}

void PageToTokenRows(const Geometry& g, const uint8_t* page, float* k_rows,
                     float* v_rows) {
  const uint64_t hd = uint64_t{g.num_kv_heads} * g.head_dim;
  const uint64_t token_features = g.ElementsPerTokenPerKv();
  const size_t es = DTypeSize(g.dtype);
  for (int kv = 0; kv < 2; ++kv) {
    float* dst = kv == 0 ? k_rows : v_rows;
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      const uint8_t* block = page + PageBlockElementOffset(g, kv, layer) * es;
      // Block rows are tokens of hd elements; output rows are [token][layer].
      for (uint32_t t = 0; t < g.page_size; ++t) {
        LoadElements(g.dtype, block + uint64_t{t} * hd * es, hd,
                     dst + t * token_features + uint64_t{layer} * hd);
      }
    }
  }
}

void StoreElements(DType dtype, const float* src, size_t n, uint8_t* dst) {
  switch (dtype) {
    case DType::kFP32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16:
      Store16<FloatToBf16>(src, n, dst);
      return;
    case DType::kFP16:
      Store16<FloatToFp16>(src, n, dst);
      return;
    case DType::kFP8E4M3:
      for (size_t i = 0; i < n; ++i) dst[i] = FloatToFp8E4M3(src[i]);
      return;
    case DType::kUnspecified:
      break;
  }
}

size_t FirstNonFinite(const float* v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) return i;
  }
  return n;
}

absl::Status CheckRunFinite(const float* run, size_t n, size_t page, int kv,
                            uint32_t layer, uint32_t token, const char* element,
                            const char* codec) {
  const size_t bad = FirstNonFinite(run, n);
  if (bad == n) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "pages[%u]: %s of layer %u, token %u, %s %u is %g; %s cannot encode "
      "non-finite values",
      page, kv == 0 ? "K" : "V", layer, token, element, bad, run[bad], codec));
}

}  // namespace kvharbor
