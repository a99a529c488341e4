// Helpers shared by the KVTC GPU benchmarks (kvtc_gpu_bench, gpu_tier_bench,
// hit_path_bench): a status check that exits, a wall clock, the seed's range
// split, Gaussian bf16 page data and a random projection basis (building a real PCA basis of 32768 features
// would take minutes on the host). Header only; no state.
#ifndef KVHARBOR_BENCH_KVTC_BENCH_UTIL_H_
#define KVHARBOR_BENCH_KVTC_BENCH_UTIL_H_

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "core/codec/kvtc/kvtc_calibration.h"

#define BENCH_CHECK(expr)                                     \
  do {                                                        \
    const absl::Status s_ = (expr);                           \
    if (!s_.ok()) {                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, \
                   s_.ToString().c_str());                    \
      std::exit(1);                                           \
    }                                                         \
  } while (0)

namespace kvharbor {
namespace bench {

inline double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The seed's split scaled to c components: 20% FP8, 40% int4, 40% int2.
inline std::vector<KvtcRange> SeedRanges(uint64_t c) {
  const uint64_t a = c / 5, b = c * 3 / 5;
  return {{KvtcQuantType::kFp8, 0, 0, a},
          {KvtcQuantType::kIntX, 4, a, b},
          {KvtcQuantType::kIntX, 2, b, c}};
}

// A random projection with roughly orthonormal columns (Gaussian /
// sqrt(features)), mean 0.01, SeedRanges.
inline KvtcBasis RandomBasis(uint64_t features, uint64_t c, uint64_t seed) {
  KvtcBasis b;
  b.features = features;
  b.components = c;
  b.mean.assign(features, 0.01f);
  b.projection.resize(features * c);
  std::mt19937_64 rng(seed);
  const float scale = 1.0f / std::sqrt(float(features));
  uint64_t x = rng();
  for (float& v : b.projection) {  // xorshift + Irwin-Hall(4) ~ Gaussian
    float s = 0;
    for (int k = 0; k < 4; ++k) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      s += float(x >> 40) * (1.0f / 16777216.0f);
    }
    v = (s - 2.0f) * 1.7320508f * scale;
  }
  b.ranges = SeedRanges(c);
  return b;
}

// `bytes` of Gaussian bf16 (round to nearest even): page-like data that
// every codec accepts (finite values).
inline std::vector<uint8_t> GaussianBf16Tile(size_t bytes) {
  std::vector<uint8_t> tile(bytes);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t i = 0; i + 2 <= tile.size(); i += 2) {
    const float f = nd(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint16_t v =
        static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
    std::memcpy(&tile[i], &v, 2);
  }
  return tile;
}

}  // namespace bench
}  // namespace kvharbor

#endif  // KVHARBOR_BENCH_KVTC_BENCH_UTIL_H_
