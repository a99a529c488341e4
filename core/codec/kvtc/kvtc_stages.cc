#include "core/codec/kvtc/kvtc_stages.h"

#include <cmath>
#include <cstring>

#include "core/base/float_formats.h"

namespace kvharbor {

void QuantizeFp8Range(const float* coeffs, size_t rows, size_t ld, size_t start,
                      size_t end, uint8_t* out) {
  const size_t width = end - start;
  for (size_t r = 0; r < rows; ++r) {
    const float* row = coeffs + r * ld + start;
    uint8_t* dst = out + r * width;
    for (size_t c = 0; c < width; ++c) dst[c] = FloatToFp8E4M3(row[c]);
  }
}

void DequantizeFp8Range(const uint8_t* in, size_t rows, size_t ld, size_t start,
                        size_t end, float* coeffs) {
  // A 256-entry table: same values as Fp8E4M3ToFloat, much faster.
  static const auto* const kTable = [] {
    auto* t = new float[256];
    for (int i = 0; i < 256; ++i)
      t[i] = Fp8E4M3ToFloat(static_cast<uint8_t>(i));
    return t;
  }();
  const size_t width = end - start;
  for (size_t r = 0; r < rows; ++r) {
    const uint8_t* src = in + r * width;
    float* row = coeffs + r * ld + start;
    for (size_t c = 0; c < width; ++c) row[c] = kTable[src[c]];
  }
}

void MinMaxRange(const float* coeffs, size_t rows, size_t ld, size_t start,
                 size_t end, float* mins, float* maxs) {
  for (size_t r = 0; r < rows; ++r) {
    const float* row = coeffs + r * ld;
    float mn = row[start];
    float mx = row[start];
    for (size_t c = start + 1; c < end; ++c) {
      mn = row[c] < mn ? row[c] : mn;
      mx = row[c] > mx ? row[c] : mx;
    }
    mins[r] = mn;
    maxs[r] = mx;
  }
}

void QuantizeIntXRange(const float* coeffs, size_t rows, size_t ld,
                       size_t start, size_t end, int bits, const float* mins,
                       const float* maxs, uint8_t* out) {
  const size_t width = end - start;
  const size_t per_byte = 8 / bits;
  const size_t row_bytes = (width + per_byte - 1) / per_byte;
  const float max_q = static_cast<float>((1 << bits) - 1);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = coeffs + r * ld + start;
    uint8_t* dst = out + r * row_bytes;
    std::memset(dst, 0, row_bytes);
    const float mn = mins[r];
    float interval = maxs[r] - mn;
    if (interval < 1e-10f) interval = 1.0f;
    for (size_t c = 0; c < width; ++c) {
      float q = std::round((row[c] - mn) / interval * max_q);
      q = q < 0.0f ? 0.0f : (q > max_q ? max_q : q);
      dst[c / per_byte] |= static_cast<uint8_t>(static_cast<uint32_t>(q)
                                                << ((c % per_byte) * bits));
    }
  }
}

void DequantizeIntXRange(const uint8_t* in, size_t rows, size_t ld,
                         size_t start, size_t end, int bits, const float* mins,
                         const float* maxs, float* coeffs) {
  const size_t width = end - start;
  const size_t per_byte = 8 / bits;
  const size_t row_bytes = (width + per_byte - 1) / per_byte;
  const int max_q_int = (1 << bits) - 1;
  const float max_q = static_cast<float>(max_q_int);
  const uint32_t mask = static_cast<uint32_t>(max_q_int);
  for (size_t r = 0; r < rows; ++r) {
    const uint8_t* src = in + r * row_bytes;
    float* row = coeffs + r * ld + start;
    const float mn = mins[r];
    float interval = maxs[r] - mn;
    if (interval < 1e-10f) interval = 1.0f;
    // Decoding a code is a table lookup per row: 2^bits values.
    float table[256];
    for (int q = 0; q <= max_q_int; ++q) {
      table[q] = static_cast<float>(q) * interval / max_q + mn;
    }
    for (size_t c = 0; c < width; ++c) {
      const uint32_t q = (src[c / per_byte] >> ((c % per_byte) * bits)) & mask;
      row[c] = table[q];
    }
  }
}

void RopeCosSin(uint64_t position, uint32_t head_dim, float theta, float* cos,
                float* sin) {
  const uint32_t half = head_dim / 2;
  const double pos = static_cast<double>(position);
  for (uint32_t i = 0; i < half; ++i) {
    const double inv_freq =
        std::pow(static_cast<double>(theta),
                 -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    const double angle = pos * inv_freq;
    cos[i] = static_cast<float>(std::cos(angle));
    sin[i] = static_cast<float>(std::sin(angle));
  }
}

void RotateRope(float* vec, uint32_t head_dim, RopeStyle style,
                const float* cos, const float* sin, bool inverse) {
  if (style == RopeStyle::kNone) return;
  const uint32_t half = head_dim / 2;
  for (uint32_t i = 0; i < half; ++i) {
    float* a;
    float* b;
    if (style == RopeStyle::kInterleaved) {
      a = &vec[2 * i];
      b = &vec[2 * i + 1];
    } else {
      a = &vec[i];
      b = &vec[i + half];
    }
    const float c = cos[i];
    const float s = inverse ? -sin[i] : sin[i];
    const float x = *a;
    const float y = *b;
    *a = x * c - y * s;
    *b = x * s + y * c;
  }
}

}  // namespace kvharbor
