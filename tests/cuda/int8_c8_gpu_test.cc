// GPU int8 C8 quantize / dequantize (cuda/kernels/int8_c8_quantize.h) against
// the CPU reference QuantizeC8 / DequantizeC8 (core/codec/c8/int8_c8_codec.h),
// bit for bit, over a sweep of page dtypes and shapes, with rounding ties,
// saturation and non-finite inputs.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/codec/c8/int8_c8_codec.h"
#include "core/codec/page_elements.h"
#include "cuda/kernels/int8_c8_quantize.h"
#include "tests/cuda/cuda_test_util.h"

namespace kvharbor {
namespace gpu {
namespace {

using testing::DeviceBuf;

struct C8Case {
  uint32_t layers, channels;
  uint64_t rows;
};

// Values as the dtype stores them: Gaussian, plus exact rounding ties
// (x / scale + offset = k + 0.5 with power-of-two scales) and values far
// beyond the int8 range.
std::vector<uint8_t> C8Values(DType dt, const C8Case& c,
                              const std::vector<float>& scale,
                              const std::vector<float>& offset,
                              std::mt19937_64& rng) {
  const uint64_t n = uint64_t{c.layers} * c.rows * c.channels;
  std::vector<float> v(n);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_int_distribution<int> k(-140, 140), pick(0, 9);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t ch =
        (i / (c.rows * c.channels)) * c.channels + i % c.channels;
    const int p = pick(rng);
    if (p == 0) {
      v[i] = ((k(rng) + 0.5f) - offset[ch]) * scale[ch];  // a tie
    } else if (p == 1) {
      v[i] = g(rng) * 1e4f;  // saturates
    } else {
      v[i] = g(rng) * 100.0f * scale[ch];
    }
  }
  std::vector<uint8_t> bytes(n * DTypeSize(dt));
  StoreElements(dt, v.data(), n, bytes.data());
  return bytes;
}

void RunC8Case(DType dt, const C8Case& c, std::mt19937_64& rng, bool with_nan) {
  const uint64_t lc = uint64_t{c.layers} * c.channels;
  const uint64_t n = lc * c.rows;
  std::vector<float> scale(lc), offset(lc);
  std::uniform_int_distribution<int> e(-8, 0), off(-128, 127), kind(0, 3);
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  for (uint64_t i = 0; i < lc; ++i) {
    // Power-of-two scales make the ties of C8Values exact; others not.
    scale[i] = kind(rng) == 0 ? u(rng) * 0.05f : std::ldexp(1.0f, e(rng));
    offset[i] = kind(rng) == 0 ? off(rng) + 0.25f * kind(rng)
                               : static_cast<float>(off(rng));
    if (offset[i] > 127.0f) offset[i] = 127.0f;
  }
  offset[0] = -128.0f;
  offset[lc - 1] = 127.0f;
  std::vector<uint8_t> in = C8Values(dt, c, scale, offset, rng);
  const size_t es = DTypeSize(dt);
  uint64_t nan_at = n;
  if (with_nan) {
    nan_at = n / 2;
    const float bad[2] = {std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity()};
    StoreElements(dt, &bad[nan_at % 2], 1, in.data() + nan_at * es);
  }
  std::vector<float> x(n);
  LoadElements(dt, in.data(), n, x.data());
  // FP8 saturates infinity to a finite value: only a real non-finite counts.
  if (nan_at < n && std::isfinite(x[nan_at])) nan_at = n;
  std::vector<int8_t> want(n);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t ch =
        (i / (c.rows * c.channels)) * c.channels + i % c.channels;
    want[i] = i == nan_at ? 0 : QuantizeC8(x[i], scale[ch], offset[ch]);
  }
  DeviceBuf din(in.size()), dscale(lc * 4), doff(lc * 4), dcodes(n), dbad(8),
      dout(in.size());
  din.Upload(in.data(), in.size());
  dscale.Upload(scale.data(), lc * 4);
  doff.Upload(offset.data(), lc * 4);
  dbad.Fill(0xFF);
  dcodes.Fill(0x5A);
  QuantizeC8Args q;
  q.dtype = dt;
  q.layers = c.layers;
  q.rows = c.rows;
  q.channels = c.channels;
  q.values = din.bytes();
  q.scale = dscale.as<float>();
  q.offset = doff.as<float>();
  q.codes = dcodes.as<int8_t>();
  q.first_bad = dbad.as<unsigned long long>();
  KVH_STATUS_REQUIRE(LaunchQuantizeC8(q, nullptr));
  KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
  std::vector<int8_t> got(n);
  dcodes.Download(got.data(), n);
  unsigned long long bad = 0;
  dbad.Download(&bad, 8);
  INFO("dtype " << static_cast<int>(dt) << " layers " << c.layers << " rows "
                << c.rows << " channels " << c.channels);
  REQUIRE(bad == (nan_at < n ? nan_at : kC8NoBadIndex));
  uint64_t mismatches = 0;
  for (uint64_t i = 0; i < n; ++i) mismatches += got[i] != want[i];
  REQUIRE(mismatches == 0);

  // Dequantize the CPU codes and compare the stored dtype bytes.
  std::vector<float> deq(n);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t ch =
        (i / (c.rows * c.channels)) * c.channels + i % c.channels;
    deq[i] = DequantizeC8(want[i], scale[ch], offset[ch]);
  }
  std::vector<uint8_t> want_bytes(in.size());
  StoreElements(dt, deq.data(), n, want_bytes.data());
  dout.Fill(0xA5);
  DequantizeC8Args d;
  d.dtype = dt;
  d.layers = c.layers;
  d.rows = c.rows;
  d.channels = c.channels;
  d.codes = dcodes.as<int8_t>();
  d.scale = dscale.as<float>();
  d.offset = doff.as<float>();
  d.values = dout.bytes();
  KVH_STATUS_REQUIRE(LaunchDequantizeC8(d, nullptr));
  KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
  std::vector<uint8_t> got_bytes(in.size());
  dout.Download(got_bytes.data(), got_bytes.size());
  REQUIRE(std::memcmp(got_bytes.data(), want_bytes.data(), in.size()) == 0);
}

TEST_CASE("C8 quantize/dequantize on the GPU equal the CPU bit for bit",
          "[cuda][c8]") {
  std::mt19937_64 rng(61);
  const C8Case cases[] = {{1, 1, 1},   {1, 64, 16},  {2, 96, 33},
                          {3, 130, 7}, {4, 256, 64}, {1, 4096, 5}};
  uint64_t elements = 0;
  for (DType dt : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3}) {
    for (const C8Case& c : cases) {
      RunC8Case(dt, c, rng, false);
      RunC8Case(dt, c, rng, true);
      elements += 2 * uint64_t{c.layers} * c.rows * c.channels;
    }
  }
  std::printf(
      "c8 gpu: %llu elements over 4 dtypes x 6 shapes: codes and "
      "dequantized bytes identical to the CPU\n",
      static_cast<unsigned long long>(elements));
}

TEST_CASE("C8 launchers refuse bad arguments", "[cuda][c8]") {
  DeviceBuf buf(1024);
  QuantizeC8Args q;
  q.layers = 1;
  q.rows = 1;
  q.channels = 4;
  q.values = buf.bytes();
  q.scale = buf.as<float>();
  q.offset = buf.as<float>();
  q.codes = buf.as<int8_t>();
  QuantizeC8Args bad = q;
  bad.channels = 0;
  CHECK_FALSE(LaunchQuantizeC8(bad, nullptr).ok());
  bad = q;
  bad.scale = nullptr;
  CHECK_FALSE(LaunchQuantizeC8(bad, nullptr).ok());
  bad = q;
  bad.dtype = static_cast<DType>(9);
  const absl::Status st = LaunchQuantizeC8(bad, nullptr);
  CHECK(st.message().find("dtype") != std::string::npos);
  DequantizeC8Args d;
  d.layers = 1;
  d.rows = uint64_t{1} << 40;
  d.channels = 1;
  d.codes = buf.as<int8_t>();
  d.scale = buf.as<float>();
  d.offset = buf.as<float>();
  d.values = buf.bytes();
  CHECK_FALSE(LaunchDequantizeC8(d, nullptr).ok());
}

}  // namespace
}  // namespace gpu
}  // namespace kvharbor
