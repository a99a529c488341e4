#include "core/codec/kvtc/kvtc_stages.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "core/base/float_formats.h"
#include "core/codec/kvtc/kvtc_format.h"

namespace kvharbor {
namespace {

TEST_CASE("IntX packs LSB-first with one byte-aligned row each", "[kvtc]") {
  // Row [0 1 2 3 | 3]: 2-bit codes 0,1,2,3 then 3 -> 0xE4, 0x03.
  const std::vector<float> y = {0, 1, 2, 3, 3, /*row 2*/ 5, 5, 5, 5, 5};
  std::vector<float> mins(2), maxs(2);
  MinMaxRange(y.data(), 2, 5, 0, 5, mins.data(), maxs.data());
  CHECK(mins[0] == 0.0f);
  CHECK(maxs[0] == 3.0f);
  CHECK(mins[1] == 5.0f);
  REQUIRE(IntXBytesPerRow(5, 2) == 2);
  std::vector<uint8_t> packed(4, 0xAA);
  QuantizeIntXRange(y.data(), 2, 5, 0, 5, 2, mins.data(), maxs.data(),
                    packed.data());
  CHECK(packed[0] == 0xE4);
  CHECK(packed[1] == 0x03);
  CHECK(packed[2] == 0x00);  // constant row: interval treated as 1, code 0
  CHECK(packed[3] == 0x00);
  std::vector<float> back(10, -1.0f);
  DequantizeIntXRange(packed.data(), 2, 5, 0, 5, 2, mins.data(), maxs.data(),
                      back.data());
  for (int i = 0; i < 10; ++i) CHECK(back[i] == y[i]);
  // 1-bit: 8 per byte, bit i = value i.
  const std::vector<float> z = {0, 1, 1, 0, 0, 0, 0, 1, 1};
  float mn, mx;
  MinMaxRange(z.data(), 1, 9, 0, 9, &mn, &mx);
  std::vector<uint8_t> bits(2);
  QuantizeIntXRange(z.data(), 1, 9, 0, 9, 1, &mn, &mx, bits.data());
  CHECK(bits[0] == 0x86);
  CHECK(bits[1] == 0x01);
}

TEST_CASE("IntX error is at most half a step for every bit width", "[kvtc]") {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const size_t rows = 7, ld = 40, start = 3, end = 37;
  std::vector<float> y(rows * ld);
  for (float& v : y) v = dist(rng);
  for (int bits : {1, 2, 4, 8}) {
    INFO("bits " << bits);
    std::vector<float> mins(rows), maxs(rows);
    MinMaxRange(y.data(), rows, ld, start, end, mins.data(), maxs.data());
    std::vector<uint8_t> packed(rows * IntXBytesPerRow(end - start, bits));
    QuantizeIntXRange(y.data(), rows, ld, start, end, bits, mins.data(),
                      maxs.data(), packed.data());
    std::vector<float> back(rows * ld, 0.0f);
    DequantizeIntXRange(packed.data(), rows, ld, start, end, bits, mins.data(),
                        maxs.data(), back.data());
    for (size_t r = 0; r < rows; ++r) {
      const float step = (maxs[r] - mins[r]) / float((1 << bits) - 1);
      for (size_t c = 0; c < ld; ++c) {
        const float got = back[r * ld + c];
        if (c < start || c >= end) {
          REQUIRE(got == 0.0f);  // outside the range: untouched
          continue;
        }
        REQUIRE(std::fabs(got - y[r * ld + c]) <=
                0.5f * step * 1.0001f + 1e-6f);
      }
      // The row minimum is code 0 and decodes to min exactly.
      size_t arg = start;
      for (size_t c = start; c < end; ++c) {
        if (y[r * ld + c] < y[r * ld + arg]) arg = c;
      }
      REQUIRE(back[r * ld + arg] == mins[r]);
    }
  }
}

TEST_CASE("FP8 range stage writes row-major bytes of the range", "[kvtc]") {
  const std::vector<float> y = {9, 1.0f, -2.0f, 9, 9, 0.5f, 448.0f, 9};
  std::vector<uint8_t> out(4);
  QuantizeFp8Range(y.data(), 2, 4, 1, 3, out.data());
  CHECK(out[0] == FloatToFp8E4M3(1.0f));
  CHECK(out[1] == FloatToFp8E4M3(-2.0f));
  CHECK(out[2] == FloatToFp8E4M3(0.5f));
  CHECK(out[3] == 0x7E);
  std::vector<float> back(8, 7.0f);
  DequantizeFp8Range(out.data(), 2, 4, 1, 3, back.data());
  CHECK(back == std::vector<float>{7, 1, -2, 7, 7, 0.5f, 448, 7});
}

TEST_CASE("RoPE rotation pairs, inverse and position 0", "[kvtc]") {
  const uint32_t d = 8;
  std::vector<float> cos(d / 2), sin(d / 2);
  RopeCosSin(0, d, 10000.0f, cos.data(), sin.data());
  for (uint32_t i = 0; i < d / 2; ++i) {
    CHECK(cos[i] == 1.0f);
    CHECK(sin[i] == 0.0f);
  }
  RopeCosSin(5, d, 10000.0f, cos.data(), sin.data());
  // Pair 0 has inv_freq 1: angle = position.
  CHECK(cos[0] == Approx(std::cos(5.0)).margin(1e-7));
  CHECK(sin[0] == Approx(std::sin(5.0)).margin(1e-7));
  CHECK(cos[1] == Approx(std::cos(5.0 * std::pow(10000.0, -2.0 / 8))));

  const std::vector<float> v = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> inter = v, split = v;
  RotateRope(inter.data(), d, RopeStyle::kInterleaved, cos.data(), sin.data(),
             false);
  RotateRope(split.data(), d, RopeStyle::kHalfSplit, cos.data(), sin.data(),
             false);
  // Interleaved rotates (v0, v1) by pair 0; half-split rotates (v0, v4).
  CHECK(inter[0] == Approx(1 * cos[0] - 2 * sin[0]));
  CHECK(inter[1] == Approx(1 * sin[0] + 2 * cos[0]));
  CHECK(split[0] == Approx(1 * cos[0] - 5 * sin[0]));
  CHECK(split[4] == Approx(1 * sin[0] + 5 * cos[0]));
  CHECK(inter != split);
  for (auto* w : {&inter, &split}) {
    const RopeStyle s =
        w == &inter ? RopeStyle::kInterleaved : RopeStyle::kHalfSplit;
    RotateRope(w->data(), d, s, cos.data(), sin.data(), /*inverse=*/true);
    for (uint32_t i = 0; i < d; ++i)
      CHECK((*w)[i] == Approx(v[i]).margin(1e-5));
  }
  std::vector<float> none = v;
  RotateRope(none.data(), d, RopeStyle::kNone, cos.data(), sin.data(), false);
  CHECK(none == v);
}

}  // namespace
}  // namespace kvharbor
