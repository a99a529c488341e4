#include "core/page_elements.h"

#include <cmath>
#include <cstring>

#include "core/float_formats.h"

namespace kvharbor {

void LoadElements(DType dtype, const uint8_t* src, size_t n, float* dst) {
  switch (dtype) {
    case DType::kFP32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, src + 2 * i, 2);
        dst[i] = Bf16ToFloat(v);
      }
      return;
    case DType::kFP16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, src + 2 * i, 2);
        dst[i] = Fp16ToFloat(v);
      }
      return;
    case DType::kFP8E4M3:
      for (size_t i = 0; i < n; ++i) dst[i] = Fp8E4M3ToFloat(src[i]);
      return;
  }
}

void StoreElements(DType dtype, const float* src, size_t n, uint8_t* dst) {
  switch (dtype) {
    case DType::kFP32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t v = FloatToBf16(src[i]);
        std::memcpy(dst + 2 * i, &v, 2);
      }
      return;
    case DType::kFP16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t v = FloatToFp16(src[i]);
        std::memcpy(dst + 2 * i, &v, 2);
      }
      return;
    case DType::kFP8E4M3:
      for (size_t i = 0; i < n; ++i) dst[i] = FloatToFp8E4M3(src[i]);
      return;
  }
}

size_t FirstNonFinite(const float* v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) return i;
  }
  return n;
}

}  // namespace kvharbor
