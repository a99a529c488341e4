// FP8 / IntX / min-max / helper kernels against core/codec/kvtc/kvtc_stages.h
// and core/base/float_formats.h, bit for bit, on both FP8 paths, into device
// and mapped pinned host memory at every alignment; every output byte written,
// none outside the output touched.
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "core/base/float_formats.h"
#include "core/codec/kvtc/kvtc_format.h"
#include "core/codec/kvtc/kvtc_stages.h"
#include "cuda/kernels/coeff_utils.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/fp8_quantize.h"
#include "cuda/kernels/intx_quantize.h"
#include "cuda/kernels/minmax_reduce.h"
#include "tests/cuda/cuda_test_util.h"

namespace kvharbor {
namespace gpu {
namespace {

using testing::DeviceBuf;
using testing::PinnedBuf;
using testing::SameBits;

constexpr size_t kGuard = 64;  // bytes checked on each side of an output

float Bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Float inputs that exercise FP8 rounding: specials, every midpoint between
// neighbouring FP8 values (ties to even) and its neighbours, and a stride
// through all 2^32 bit patterns.
std::vector<float> Fp8Inputs() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          448.0f,
                          -448.0f,
                          464.0f,
                          -464.0f,
                          479.99f,
                          480.0f,
                          -480.0f,
                          1e30f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(),
                          Bits(0x7FC00000u),
                          Bits(0xFFC00000u),
                          Bits(0x7F800001u),
                          Bits(0xFFFFFFFFu),
                          std::ldexp(1.0f, -9),
                          std::ldexp(1.0f, -10),
                          std::ldexp(3.0f, -11),
                          std::ldexp(1.0f, -11)};
  for (int code = 0; code < 0x7E; ++code) {
    const float a = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
    const float b = Fp8E4M3ToFloat(static_cast<uint8_t>(code + 1));
    const float mid = (a + b) / 2;  // exact in float
    for (float m :
         {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), a, b}) {
      v.push_back(m);
      v.push_back(-m);
    }
  }
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) {
    v.push_back(Bits(static_cast<uint32_t>(u)));
  }
  return v;
}

// Runs QuantizeFp8 over `in` laid out as [rows][ld] columns [start, end),
// into device or pinned memory at byte offset `skew`, and checks it against
// QuantizeFp8Range (and the guard bytes around the output).
void CheckQuantizeFp8(const std::vector<float>& in, size_t rows, size_t ld,
                      size_t start, size_t end, bool native, bool pinned,
                      size_t skew) {
  const size_t width = end - start;
  std::vector<uint8_t> want(rows * width);
  QuantizeFp8Range(in.data(), rows, ld, start, end, want.data());
  DeviceBuf coeffs(in.size() * 4);
  coeffs.Upload(in.data(), in.size() * 4);
  const size_t total = want.size() + 2 * kGuard;
  for (uint8_t sentinel : {uint8_t{0xA5}, uint8_t{0x5A}}) {
    std::vector<uint8_t> got(total);
    DeviceBuf dout(total);
    PinnedBuf pout(total);
    dout.Fill(sentinel);
    pout.Fill(sentinel);
    uint8_t* base = pinned ? pout.bytes() : dout.bytes();
    QuantizeFp8Args a{coeffs.as<float>(),
                      rows,
                      ld,
                      start,
                      end,
                      base + kGuard + skew - kGuard / 2,
                      native};
    KVH_STATUS_REQUIRE(LaunchQuantizeFp8(a, nullptr));
    KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
    if (pinned) {
      std::memcpy(got.data(), pout.bytes(), total);
    } else {
      dout.Download(got.data(), total);
    }
    const size_t at = kGuard + skew - kGuard / 2;
    for (size_t i = 0; i < total; ++i) {
      if (i >= at && i < at + want.size()) continue;
      INFO("guard byte " << i);
      REQUIRE(got[i] == sentinel);
    }
    size_t mismatches = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (got[at + i] != want[i] && mismatches++ < 5) {
        const size_t r = i / width, c = i % width;
        uint32_t u;
        std::memcpy(&u, &in[r * ld + start + c], 4);
        UNSCOPED_INFO("input 0x" << std::hex << u << " -> got 0x"
                                 << int(got[at + i]) << " want 0x"
                                 << int(want[i]));
      }
    }
    REQUIRE(mismatches == 0);
  }
}

TEST_CASE("QuantizeFp8 matches FloatToFp8E4M3 on both paths", "[cuda][fp8]") {
  const std::vector<float> inputs = Fp8Inputs();
  const auto native = ResolveNativeFp8(Fp8Path::kAuto);
  REQUIRE(native.ok());
  std::vector<bool> paths = {false};
  if (*native) paths.push_back(true);
  // [rows][ld] with the inputs in columns [3, 3 + 4093).
  const size_t width = 4093, ld = 4100, start = 3;
  const size_t rows = (inputs.size() + width - 1) / width;
  std::vector<float> m(rows * ld, 1.0f);
  for (size_t i = 0; i < inputs.size(); ++i) {
    m[(i / width) * ld + start + i % width] = inputs[i];
  }
  for (bool nat : paths) {
    DYNAMIC_SECTION("native " << nat) {
      CheckQuantizeFp8(m, rows, ld, start, start + width, nat, false, 1);
      // Small shapes at every alignment, into pinned memory too.
      for (size_t w : {1, 2, 3, 5, 31, 64}) {
        for (size_t skew = 0; skew < 4; ++skew) {
          for (bool pinned : {false, true}) {
            CheckQuantizeFp8(m, 7, ld, start, start + w, nat, pinned, skew);
          }
        }
      }
    }
  }
  INFO("native FP8 available: " << *native);
  REQUIRE(*native);  // H100/H200: the hardware path must have been tested
}

TEST_CASE("DequantizeFp8 matches Fp8E4M3ToFloat for all codes", "[cuda][fp8]") {
  const auto native = ResolveNativeFp8(Fp8Path::kAuto);
  REQUIRE(native.ok());
  for (bool nat : {false, bool(*native)}) {
    for (size_t skew = 0; skew < 4; ++skew) {
      for (bool pinned : {false, true}) {
        // 3 rows of all 256 codes (plus a partial row), columns [2, 2+w).
        const size_t w = 256 + 3, rows = 3, ld = w + 5, start = 2;
        std::vector<uint8_t> codes(rows * w);
        for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(i * 7);
        std::vector<float> want(rows * ld, 0.25f);
        DequantizeFp8Range(codes.data(), rows, ld, start, start + w,
                           want.data());
        DeviceBuf din(codes.size() + 8);
        PinnedBuf pin(codes.size() + 8);
        din.Upload(codes.data(), codes.size(), skew);
        std::memcpy(pin.bytes() + skew, codes.data(), codes.size());
        DeviceBuf dco(rows * ld * 4);
        std::vector<float> init(rows * ld, 0.25f);
        dco.Upload(init.data(), init.size() * 4);
        DequantizeFp8Args a{(pinned ? pin.bytes() : din.bytes()) + skew,
                            rows,
                            ld,
                            start,
                            start + w,
                            dco.as<float>(),
                            nat};
        KVH_STATUS_REQUIRE(LaunchDequantizeFp8(a, nullptr));
        std::vector<float> got(rows * ld);
        dco.Download(got.data(), got.size() * 4);
        for (size_t i = 0; i < got.size(); ++i) {
          INFO("native " << nat << " skew " << skew << " index " << i);
          REQUIRE(SameBits(got[i], want[i]));
        }
      }
    }
  }
}

TEST_CASE("DequantizeFp8 reports NaN codes in the error word", "[cuda][fp8]") {
  const auto native = ResolveNativeFp8(Fp8Path::kAuto);
  REQUIRE(native.ok());
  const size_t w = 37, rows = 5, ld = 41, start = 3;
  std::vector<uint8_t> clean(rows * w);
  for (size_t i = 0; i < clean.size(); ++i) {
    clean[i] = uint8_t(i * 13) & 0x7E;  // never 0x7F / 0xFF
  }
  // (row, column) of the NaN codes planted, and the row reported: the
  // smallest, whatever the thread order; column 0 and w - 1 are the bytes at
  // the run's unaligned ends.
  struct Plant {
    std::vector<std::pair<size_t, size_t>> at;
    int64_t row;  // -1: none
  };
  const std::vector<Plant> plants = {{{}, -1},
                                     {{{3, 5}}, 3},
                                     {{{4, w - 1}, {2, 0}}, 2},
                                     {{{0, w - 1}, {1, 0}, {4, 4}}, 0}};
  for (bool nat : {false, bool(*native)}) {
    for (size_t skew = 0; skew < 4; ++skew) {
      for (bool pinned : {false, true}) {
        for (const Plant& p : plants) {
          std::vector<uint8_t> codes = clean;
          for (size_t k = 0; k < p.at.size(); ++k) {
            codes[p.at[k].first * w + p.at[k].second] = k % 2 ? 0xFF : 0x7F;
          }
          DeviceBuf din(codes.size() + 8), dco(rows * ld * 4), err(8);
          PinnedBuf pin(codes.size() + 8);
          din.Upload(codes.data(), codes.size(), skew);
          std::memcpy(pin.bytes() + skew, codes.data(), codes.size());
          err.Fill(0xFF);
          DequantizeFp8Args a;
          a.in = (pinned ? pin.bytes() : din.bytes()) + skew;
          a.rows = rows;
          a.ld = ld;
          a.start = start;
          a.end = start + w;
          a.coeffs = dco.as<float>();
          a.native_fp8 = nat;
          a.error = err.as<unsigned long long>();
          a.section = 1;
          a.range = 6;
          a.first_row = 1000;
          KVH_STATUS_REQUIRE(LaunchDequantizeFp8(a, nullptr));
          unsigned long long code = 0;
          err.Download(&code, 8);
          INFO("native " << nat << " skew " << skew << " pinned " << pinned
                         << " planted " << p.at.size());
          REQUIRE(code == (p.row < 0 ? kKvtcNoError
                                     : KvtcDataErrorCode(1, 6, 1000 + p.row)));
        }
      }
    }
  }
}

TEST_CASE("DequantizeIntX reports bad min / max in the error word",
          "[cuda][intx]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float big = std::numeric_limits<float>::max();
  const size_t rows = 6, w = 10, ld = 12, start = 1;
  // One bad row per case (or none): its min and max.
  struct Case {
    int64_t row;
    float mn, mx;
  };
  const std::vector<Case> cases = {
      {-1, 0, 0},        {0, nan, 1}, {5, 0, nan},    {2, -inf, 1},
      {3, 0, inf},       {4, 2, 1},   {1, -big, big},  // span overflows
      {-1, -1.0f, -1.0f}};  // equal min and max are fine
  for (int bits : {1, 8}) {
    for (const Case& c : cases) {
      std::vector<float> mins(rows, -1.0f), maxs(rows, 1.0f);
      if (c.row >= 0) {
        mins[c.row] = c.mn;
        maxs[c.row] = c.mx;
      } else {
        mins[3] = c.mn;
        maxs[3] = c.mx;
      }
      std::vector<uint8_t> meta(8 * rows + 1);
      std::memcpy(meta.data() + 1, mins.data(), 4 * rows);  // unaligned
      std::memcpy(meta.data() + 1 + 4 * rows, maxs.data(), 4 * rows);
      const size_t packed = rows * IntXBytesPerRow(w, bits);
      DeviceBuf dmeta(meta.size()), din(packed), dco(rows * ld * 4), err(8);
      dmeta.Upload(meta.data(), meta.size());
      din.Fill(0x5B);
      err.Fill(0xFF);
      DequantizeIntXArgs d;
      d.in = din.bytes();
      d.rows = rows;
      d.ld = ld;
      d.start = start;
      d.end = start + w;
      d.bits = bits;
      d.mins = dmeta.bytes() + 1;
      d.maxs = dmeta.bytes() + 1 + 4 * rows;
      d.coeffs = dco.as<float>();
      d.error = err.as<unsigned long long>();
      d.section = 0;
      d.range = 4095;
      d.first_row = uint64_t{1} << 33;
      KVH_STATUS_REQUIRE(LaunchDequantizeIntX(d, nullptr));
      unsigned long long code = 0;
      err.Download(&code, 8);
      INFO("bits " << bits << " row " << c.row << " min " << c.mn << " max "
                   << c.mx);
      REQUIRE(code == (c.row < 0
                           ? kKvtcNoError
                           : KvtcDataErrorCode(0, 4095, d.first_row + c.row)));
    }
  }
}

// Coefficient rows with ties (+0 / -0, repeated extremes), constant rows
// (interval below 1e-10) and wide-range rows.
std::vector<float> CoeffMatrix(size_t rows, size_t ld, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> m(rows * ld);
  for (size_t r = 0; r < rows; ++r) {
    float* row = m.data() + r * ld;
    const int kind = static_cast<int>(r % 6);
    for (size_t c = 0; c < ld; ++c) {
      float v = d(rng);
      if (kind == 1) v = (c % 2) ? 0.0f : -0.0f;
      if (kind == 2) v = 1.5f;
      if (kind == 3) v = std::round(v);  // many equal values
      if (kind == 4) v *= 1e-12f;        // tiny interval
      if (kind == 5) v *= 1e30f;
      row[c] = v;
    }
  }
  return m;
}

TEST_CASE("MinMax matches MinMaxRange bit for bit", "[cuda][intx]") {
  std::mt19937_64 rng(7);
  for (size_t ld : {1, 9, 300, 2049}) {
    const size_t rows = 37;
    const std::vector<float> m = CoeffMatrix(rows, ld, rng);
    for (size_t start : {size_t{0}, ld / 3}) {
      for (size_t end : {ld, start + 1}) {
        if (end <= start || end > ld) continue;
        std::vector<float> wmin(rows), wmax(rows);
        MinMaxRange(m.data(), rows, ld, start, end, wmin.data(), wmax.data());
        DeviceBuf dm(m.size() * 4), dmin(rows * 4), dmax(rows * 4);
        dm.Upload(m.data(), m.size() * 4);
        DeviceBuf err(8);
        err.Fill(0xFF);
        MinMaxArgs a{dm.as<float>(),
                     rows,
                     ld,
                     start,
                     end,
                     dmin.as<float>(),
                     dmax.as<float>(),
                     err.as<unsigned long long>(),
                     1,
                     100};
        KVH_STATUS_REQUIRE(LaunchMinMax(a, nullptr));
        std::vector<float> gmin(rows), gmax(rows);
        dmin.Download(gmin.data(), rows * 4);
        dmax.Download(gmax.data(), rows * 4);
        unsigned long long code;
        err.Download(&code, 8);
        REQUIRE(code == kKvtcNoError);
        for (size_t r = 0; r < rows; ++r) {
          INFO("ld " << ld << " [" << start << ", " << end << ") row " << r);
          REQUIRE(SameBits(gmin[r], wmin[r]));
          REQUIRE(SameBits(gmax[r], wmax[r]));
        }
      }
    }
  }
}

TEST_CASE("MinMax flags spans that overflow float", "[cuda][intx]") {
  std::vector<float> m = {1.0f, 2.0f, -3e38f, 3e38f};  // 2 rows of 2
  DeviceBuf dm(16), dmin(8), dmax(8), err(8);
  dm.Upload(m.data(), 16);
  err.Fill(0xFF);
  MinMaxArgs a{dm.as<float>(),
               2,
               2,
               0,
               2,
               dmin.as<float>(),
               dmax.as<float>(),
               err.as<unsigned long long>(),
               1,
               40};
  KVH_STATUS_REQUIRE(LaunchMinMax(a, nullptr));
  unsigned long long code;
  err.Download(&code, 8);
  REQUIRE(code == KvtcErrorCode(KvtcErrorKind::kCoefficientSpan, 1, 41));
}

void CheckIntX(const std::vector<float>& m, size_t rows, size_t ld,
               size_t start, size_t end, int bits, bool pinned, size_t skew) {
  const size_t width = end - start;
  const size_t row_bytes = IntXBytesPerRow(width, bits);
  std::vector<float> mins(rows), maxs(rows);
  MinMaxRange(m.data(), rows, ld, start, end, mins.data(), maxs.data());
  std::vector<uint8_t> want(rows * row_bytes);
  QuantizeIntXRange(m.data(), rows, ld, start, end, bits, mins.data(),
                    maxs.data(), want.data());
  DeviceBuf dm(m.size() * 4), dmin(rows * 4), dmax(rows * 4);
  dm.Upload(m.data(), m.size() * 4);
  dmin.Upload(mins.data(), rows * 4);
  dmax.Upload(maxs.data(), rows * 4);
  const size_t total = want.size() + 2 * kGuard;
  const size_t at = kGuard + skew;
  DeviceBuf dout(total);
  PinnedBuf pout(total);
  std::vector<uint8_t> got(total);
  for (uint8_t sentinel : {uint8_t{0xA5}, uint8_t{0x5A}}) {
    dout.Fill(sentinel);
    pout.Fill(sentinel);
    uint8_t* base = pinned ? pout.bytes() : dout.bytes();
    QuantizeIntXArgs q{
        dm.as<float>(),   rows,     ld, start, end, bits, dmin.as<float>(),
        dmax.as<float>(), base + at};
    KVH_STATUS_REQUIRE(LaunchQuantizeIntX(q, nullptr));
    KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
    if (pinned) {
      std::memcpy(got.data(), pout.bytes(), total);
    } else {
      dout.Download(got.data(), total);
    }
    INFO("bits " << bits << " width " << width << " ld " << ld << " skew "
                 << skew << " pinned " << pinned);
    for (size_t i = 0; i < total; ++i) {
      if (i >= at && i < at + want.size()) {
        if (got[i] != want[i - at]) {
          INFO("byte " << i - at << " got " << int(got[i]) << " want "
                       << int(want[i - at]));
          REQUIRE(got[i] == want[i - at]);
        }
      } else if (got[i] != sentinel) {
        INFO("guard byte " << i);
        REQUIRE(got[i] == sentinel);
      }
    }
  }
  // Dequantize from the packed bytes (and min/max as unaligned byte arrays).
  std::vector<float> wdec(rows * ld, -7.0f);
  DequantizeIntXRange(want.data(), rows, ld, start, end, bits, mins.data(),
                      maxs.data(), wdec.data());
  std::vector<uint8_t> meta(8 * rows + 3);
  std::memcpy(meta.data() + 1, mins.data(), 4 * rows);
  std::memcpy(meta.data() + 1 + 4 * rows, maxs.data(), 4 * rows);
  PinnedBuf pmeta(meta.size());
  std::memcpy(pmeta.bytes(), meta.data(), meta.size());
  DeviceBuf dmeta(meta.size());
  dmeta.Upload(meta.data(), meta.size());
  const uint8_t* mbase = pinned ? pmeta.bytes() : dmeta.bytes();
  std::vector<float> init(rows * ld, -7.0f);
  DeviceBuf ddec(rows * ld * 4);
  ddec.Upload(init.data(), init.size() * 4);
  const uint8_t* packed = (pinned ? pout.bytes() : dout.bytes()) + at;
  DequantizeIntXArgs d{packed,
                       rows,
                       ld,
                       start,
                       end,
                       bits,
                       mbase + 1,
                       mbase + 1 + 4 * rows,
                       ddec.as<float>()};
  KVH_STATUS_REQUIRE(LaunchDequantizeIntX(d, nullptr));
  std::vector<float> gdec(rows * ld);
  ddec.Download(gdec.data(), gdec.size() * 4);
  for (size_t i = 0; i < gdec.size(); ++i) {
    INFO("dequantized index " << i << " got " << gdec[i] << " want "
                              << wdec[i]);
    REQUIRE(SameBits(gdec[i], wdec[i]));
  }
}

TEST_CASE("IntX quantize/dequantize match the CPU bit for bit",
          "[cuda][intx]") {
  std::mt19937_64 rng(11);
  for (int bits : {1, 2, 4, 8}) {
    for (size_t width : {1, 2, 3, 5, 7, 8, 9, 15, 17, 63, 1000}) {
      const size_t start = width % 3, ld = start + width + (width % 2);
      const size_t rows = 13;
      const std::vector<float> m = CoeffMatrix(rows, ld, rng);
      for (size_t skew = 0; skew < 4; ++skew) {
        CheckIntX(m, rows, ld, start, start + width, bits, skew % 2 == 1, skew);
      }
    }
  }
  // One large case.
  const size_t rows = 512, ld = 4096;
  const std::vector<float> m = CoeffMatrix(rows, ld, rng);
  CheckIntX(m, rows, ld, 100, 4096, 2, true, 3);
  CheckIntX(m, rows, ld, 0, 4000, 4, false, 0);
}

TEST_CASE("CheckFinite, ConvertToBf16 and CopyBytes", "[cuda][utils]") {
  const size_t rows = 9, cols = 33;
  std::vector<float> m(rows * cols, 1.0f);
  m[4 * cols + 7] = std::numeric_limits<float>::quiet_NaN();
  m[6 * cols + 1] = std::numeric_limits<float>::infinity();
  DeviceBuf dm(m.size() * 4), err(8);
  dm.Upload(m.data(), m.size() * 4);
  err.Fill(0xFF);
  CheckFiniteArgs cf{
      dm.as<float>(), rows, cols, err.as<unsigned long long>(), 0, 10};
  KVH_STATUS_REQUIRE(LaunchCheckFinite(cf, nullptr));
  unsigned long long code;
  err.Download(&code, 8);
  REQUIRE(code == KvtcErrorCode(KvtcErrorKind::kNonFiniteCoefficient, 0, 14));

  std::vector<float> in = Fp8Inputs();
  in.resize(200000);
  DeviceBuf din(in.size() * 4), dout(in.size() * 2);
  din.Upload(in.data(), in.size() * 4);
  KVH_STATUS_REQUIRE(LaunchConvertToBf16(
      {din.as<float>(), dout.as<uint16_t>(), in.size()}, nullptr));
  std::vector<uint16_t> got(in.size());
  dout.Download(got.data(), got.size() * 2);
  for (size_t i = 0; i < in.size(); ++i) {
    INFO("index " << i);
    REQUIRE(got[i] == FloatToBf16(in[i]));
  }

  for (size_t n : {1, 3, 4, 5, 100, 40000}) {
    for (size_t skew = 0; skew < 4; ++skew) {
      std::vector<uint8_t> src(n);
      for (size_t i = 0; i < n; ++i) src[i] = uint8_t(i * 13 + 1);
      DeviceBuf ds(n);
      ds.Upload(src.data(), n);
      PinnedBuf dst(n + 8);
      dst.Fill(0xEE);
      KVH_STATUS_REQUIRE(
          LaunchCopyBytes({ds.bytes(), dst.bytes() + skew, n}, nullptr));
      KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
      for (size_t i = 0; i < n + 8; ++i) {
        const bool inside = i >= skew && i < skew + n;
        INFO("n " << n << " skew " << skew << " byte " << i);
        REQUIRE(dst.bytes()[i] == (inside ? src[i - skew] : 0xEE));
      }
    }
  }
}

TEST_CASE("Kernel launchers refuse bad arguments", "[cuda][args]") {
  DeviceBuf d(64);
  QuantizeIntXArgs q{d.as<float>(), 1,        4, 0, 4, 3, d.as<float>(),
                     d.as<float>(), d.bytes()};
  REQUIRE(LaunchQuantizeIntX(q, nullptr).code() ==
          absl::StatusCode::kInvalidArgument);
  QuantizeFp8Args f{d.as<float>(), 1, 4, 3, 5, d.bytes(), false};
  REQUIRE(LaunchQuantizeFp8(f, nullptr).code() ==
          absl::StatusCode::kInvalidArgument);
  MinMaxArgs mm{nullptr, 1, 4, 0, 4, d.as<float>(), d.as<float>()};
  REQUIRE(LaunchMinMax(mm, nullptr).code() ==
          absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpu
}  // namespace kvharbor
