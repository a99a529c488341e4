#include "core/base/float_formats.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace kvharbor {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Rounds a non-negative float below 2^24 to the nearest integer, ties to
// even, independently of the floating-point environment's rounding mode.
uint32_t RoundHalfEven(float x) {
  const float fl = std::floor(x);
  const float frac = x - fl;  // exact for x < 2^24
  uint32_t n = static_cast<uint32_t>(fl);
  if (frac > 0.5f || (frac == 0.5f && (n & 1u))) ++n;
  return n;
}

}  // namespace

uint8_t FloatToFp8E4M3(float value) {
  const uint32_t bits = FloatBits(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return kFp8E4M3NaN;
  constexpr uint8_t kMaxFinite = 0x7E;  // exponent 15, mantissa 6: 448
  if (abs_bits >= 0x43F00000u) return sign | kMaxFinite;  // >= 480 or inf
  if (abs_bits == 0) return sign;
  const float a = BitsFloat(abs_bits);
  // E4M3 exponents run from -6 (subnormals share it) to 8; the value grid at
  // exponent e has spacing 2^(e-3).
  int exp = static_cast<int>(abs_bits >> 23) - 127;
  if (exp < -6) exp = -6;
  const float scaled = std::ldexp(a, 3 - exp);  // exact: in [0, 16)
  uint32_t n = RoundHalfEven(scaled);
  if (n >= 16) {  // rounded up into the next binade
    n = 8;
    ++exp;
  }
  if (n < 8) return sign | static_cast<uint8_t>(n);  // subnormal (exp == -6)
  const uint32_t biased = static_cast<uint32_t>(exp + 7);
  const uint32_t mant = n - 8;
  if (biased > 15 || (biased == 15 && mant == 7)) return sign | kMaxFinite;
  return sign | static_cast<uint8_t>((biased << 3) | mant);
}

float Fp8E4M3ToFloat(uint8_t bits) {
  const uint32_t e = (bits >> 3) & 0xF;
  const uint32_t m = bits & 0x7;
  float v;
  if (e == 15 && m == 7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(m), -9);
  } else {
    v = std::ldexp(static_cast<float>(8 + m), static_cast<int>(e) - 10);
  }
  return (bits & 0x80) ? -v : v;
}

uint16_t FloatToBf16(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040);  // quiet NaN
  }
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

float Bf16ToFloat(uint16_t bits) {
  return BitsFloat(static_cast<uint32_t>(bits) << 16);
}

uint16_t FloatToFp16(float value) {
  const uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t x = bits & 0x7FFFFFFFu;
  if (x > 0x7F800000u) {
    return sign | 0x7E00 | static_cast<uint16_t>((x >> 13) & 0x3FF);
  }
  if (x >= 0x477FF000u) return sign | 0x7C00;  // >= 65520 rounds to inf
  if (x <
      0x38800000u) {  // below 2^-14: half subnormal (or rounds to min normal)
    const float scaled = std::ldexp(BitsFloat(x), 24);  // exact, < 1024
    return sign | static_cast<uint16_t>(RoundHalfEven(scaled));
  }
  const uint32_t odd = (x >> 13) & 1u;
  const uint32_t rounded = x + 0xFFFu + odd;
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1F;
  const uint32_t m = h & 0x3FF;
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  if (e == 31) return BitsFloat(sign | 0x7F800000u | (m << 13));
  return BitsFloat(sign | ((e + 112) << 23) | (m << 13));
}

}  // namespace kvharbor
