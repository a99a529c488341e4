#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/base/float_formats.h"

namespace kvharbor {
namespace {

float Pow2(int e) { return std::ldexp(1.0f, e); }

TEST_CASE("FP8 E4M3 encodes a table of known values", "[fp8]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    float in;
    uint8_t out;
  };
  const Case cases[] = {
      {0.0f, 0x00},
      {-0.0f, 0x80},
      {1.0f, 0x38},
      {-1.0f, 0xB8},
      {2.0f, 0x40},
      {0.5f, 0x30},
      {1.75f, 0x3E},
      {240.0f, 0x77},
      {416.0f, 0x7D},
      {448.0f, 0x7E},  // largest finite
      {-448.0f, 0xFE},
      {432.0f, 0x7E},  // tie 416/448 -> even mantissa (448)
      {449.0f, 0x7E},  // saturates
      {464.0f, 0x7E},  // tie with the nonexistent 480: saturates
      {1e9f, 0x7E},
      {-1e9f, 0xFE},
      {inf, 0x7E},  // +-inf saturate (SATFINITE)
      {-inf, 0xFE},
      {nan, 0x7F},
      {-nan, 0x7F},
      {Pow2(-6), 0x08},          // smallest normal
      {Pow2(-9), 0x01},          // smallest subnormal
      {7 * Pow2(-9), 0x07},      // largest subnormal
      {Pow2(-10), 0x00},         // tie 0 / 2^-9 -> even (0)
      {3 * Pow2(-10), 0x02},     // tie 1 / 2 subnormal -> even (2)
      {5 * Pow2(-10), 0x02},     // tie 2 / 3 -> even (2)
      {1.1f * Pow2(-10), 0x01},  // above the tie
      {Pow2(-12), 0x00},         // underflows to zero
      {-Pow2(-12), 0x80},        // keeps the sign
      {1.0625f, 0x38},           // tie 1.0 / 1.125 -> even (1.0)
      {1.1875f, 0x3A},           // tie 1.125 / 1.25 -> even (1.25)
      {1.0626f, 0x39},           // just above the tie
      {15.5f, 0x58},             // tie 15 / 16 -> rounds into next binade
      {0.1f, 0x1D},
  };
  for (const Case& c : cases) {
    INFO("input " << c.in);
    CHECK(static_cast<int>(FloatToFp8E4M3(c.in)) == static_cast<int>(c.out));
  }
}

TEST_CASE("FP8 E4M3 decodes every code and round-trips", "[fp8]") {
  CHECK(Fp8E4M3ToFloat(0x7E) == 448.0f);
  CHECK(Fp8E4M3ToFloat(0x01) == Pow2(-9));
  CHECK(Fp8E4M3ToFloat(0x38) == 1.0f);
  CHECK(std::isnan(Fp8E4M3ToFloat(0x7F)));
  CHECK(std::isnan(Fp8E4M3ToFloat(0xFF)));
  CHECK(std::signbit(Fp8E4M3ToFloat(0x80)));
  for (int code = 0; code < 256; ++code) {
    const uint8_t b = static_cast<uint8_t>(code);
    if (IsFp8E4M3NaN(b)) continue;
    INFO("code " << code);
    CHECK(static_cast<int>(FloatToFp8E4M3(Fp8E4M3ToFloat(b))) == code);
  }
  // Decoding is monotonic over the positive codes.
  for (int code = 1; code < 0x7F; ++code) {
    CHECK(Fp8E4M3ToFloat(code) > Fp8E4M3ToFloat(code - 1));
  }
}

// Brute-force nearest (ties to even code) among the 127 non-negative finite
// values, independent of the implementation's bit manipulation.
uint8_t NearestFp8(float v) {
  const float a = std::fabs(v);
  int best = 0;
  double best_err = std::fabs(a - 0.0);
  for (int code = 1; code <= 0x7E; ++code) {
    const double err = std::fabs(double(a) - Fp8E4M3ToFloat(code));
    if (err < best_err || (err == best_err && (code & 1) == 0)) {
      best = code;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best | (std::signbit(v) ? 0x80 : 0));
}

TEST_CASE("FP8 E4M3 matches brute-force nearest-even on random values",
          "[fp8]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exp(-12.0f, 9.0f);
  std::uniform_int_distribution<int> sign(0, 1);
  for (int i = 0; i < 20000; ++i) {
    float v = std::exp2(exp(rng)) * (sign(rng) ? -1.0f : 1.0f);
    if (std::fabs(v) > 448.0f) v = std::copysign(448.0f, v);
    INFO("value " << v);
    REQUIRE(static_cast<int>(FloatToFp8E4M3(v)) ==
            static_cast<int>(NearestFp8(v)));
  }
  // Every midpoint between neighbours rounds to the even code.
  for (int code = 0; code < 0x7E; ++code) {
    const float mid = 0.5f * (Fp8E4M3ToFloat(code) + Fp8E4M3ToFloat(code + 1));
    const int want = (code & 1) ? code + 1 : code;
    INFO("midpoint after code " << code);
    CHECK(static_cast<int>(FloatToFp8E4M3(mid)) == want);
  }
}

TEST_CASE("bf16 conversions round to nearest even and keep NaN", "[fp8]") {
  CHECK(FloatToBf16(1.0f) == 0x3F80);
  CHECK(FloatToBf16(-2.0f) == 0xC000);
  CHECK(FloatToBf16(1.0f + Pow2(-8)) == 0x3F80);      // tie -> even
  CHECK(FloatToBf16(1.0f + 3 * Pow2(-8)) == 0x3F82);  // tie -> even (up)
  CHECK(FloatToBf16(1.0f + Pow2(-7)) == 0x3F81);      // exact
  CHECK(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  CHECK(FloatToBf16(std::numeric_limits<float>::infinity()) == 0x7F80);
  for (uint32_t code = 0; code < 65536; ++code) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(code));
    if (std::isnan(f)) continue;
    REQUIRE(FloatToBf16(f) == code);
  }
}

TEST_CASE("fp16 conversions handle subnormals, overflow and ties", "[fp8]") {
  CHECK(FloatToFp16(1.0f) == 0x3C00);
  CHECK(FloatToFp16(65504.0f) == 0x7BFF);
  CHECK(FloatToFp16(65519.0f) == 0x7BFF);
  CHECK(FloatToFp16(65520.0f) == 0x7C00);  // tie to even -> inf
  CHECK(FloatToFp16(Pow2(-24)) == 0x0001);
  CHECK(FloatToFp16(Pow2(-25)) == 0x0000);             // tie -> even (0)
  CHECK(FloatToFp16(3 * Pow2(-25)) == 0x0002);         // tie -> even (2)
  CHECK(FloatToFp16(Pow2(-14)) == 0x0400);             // smallest normal
  CHECK(FloatToFp16(1.0f + Pow2(-11)) == 0x3C00);      // tie -> even
  CHECK(FloatToFp16(1.0f + 3 * Pow2(-11)) == 0x3C02);  // tie -> even
  CHECK(FloatToFp16(-0.0f) == 0x8000);
  CHECK(std::isnan(Fp16ToFloat(FloatToFp16(std::nanf("")))));
  for (uint32_t code = 0; code < 65536; ++code) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(code));
    if (std::isnan(f)) continue;
    REQUIRE(FloatToFp16(f) == code);
  }
  // Random floats: the result is one of the two neighbours and the nearer.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> exp(-26.0f, 15.9f);
  for (int i = 0; i < 20000; ++i) {
    const float v = std::exp2(exp(rng));
    const uint16_t h = FloatToFp16(v);
    const float got = Fp16ToFloat(h);
    const float lo = Fp16ToFloat(h - (h > 0 ? 1 : 0));
    const float hi = Fp16ToFloat(h + 1);
    REQUIRE(std::fabs(got - v) <= std::fabs(lo - v));
    if (h < 0x7BFF) REQUIRE(std::fabs(got - v) <= std::fabs(hi - v));
  }
}

}  // namespace
}  // namespace kvharbor
