// Helpers shared by the CommVQ tests: small configs, random codebooks and
// synthetic low-rank data.
#ifndef KVHARBOR_TESTS_CORE_CODEC_COMMVQ_COMMVQ_TEST_UTIL_H_
#define KVHARBOR_TESTS_CORE_CODEC_COMMVQ_COMMVQ_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <vector>

#include "core/codec/commvq/commvq_codebooks.h"

namespace kvharbor {
namespace testing {

// 2 layers, 2 KV heads of 8 dims (D = 16, 8 pairs), 2 groups of 4 pairs,
// 8 levels, 3 key stages, value 4 stages of 4 rows.
inline CommVqConfig SmallCommVqConfig(RopeStyle rope = RopeStyle::kNone) {
  CommVqConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.rope_style = rope;
  c.rope_theta = rope == RopeStyle::kNone ? 0.0f : 10000.0f;
  c.key_levels = 8;
  c.key_group_pairs = 4;
  c.key_stages = 3;
  c.value_stage_rows = 4;
  c.value_stages = 4;
  return c;
}

inline CommVqCodebooks RandomCodebooks(const CommVqConfig& c, uint32_t seed,
                                       float scale = 0.5f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  CommVqCodebooks cb;
  cb.config = c;
  cb.key.resize(c.key_floats());
  cb.value.resize(c.value_floats());
  for (float& x : cb.key) x = nd(rng);
  for (float& x : cb.value) x = nd(rng);
  return cb;
}

// [layers][n][dim] samples of rank `rank` plus Gaussian noise `noise`, with
// the same basis for all samples of a layer (so a held-out set drawn with
// another `sample_seed` and the same `basis_seed` comes from the same
// distribution).
inline std::vector<float> LowRankSamples(const CommVqConfig& c, uint64_t n,
                                         uint32_t rank, float noise,
                                         uint32_t basis_seed,
                                         uint32_t sample_seed) {
  const uint32_t d = c.dim();
  std::vector<float> out(uint64_t{c.num_layers} * n * d);
  std::mt19937 brng(basis_seed), srng(sample_seed);
  std::normal_distribution<float> nd;
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    std::vector<float> basis(uint64_t{rank} * d);
    for (float& x : basis) x = nd(brng);
    for (uint64_t s = 0; s < n; ++s) {
      std::vector<float> z(rank);
      for (float& x : z) x = nd(srng);
      float* v = out.data() + (uint64_t{l} * n + s) * d;
      for (uint32_t e = 0; e < d; ++e) {
        float acc = noise * nd(srng);
        for (uint32_t r = 0; r < rank; ++r) acc += z[r] * basis[r * d + e];
        v[e] = acc;
      }
    }
  }
  return out;
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_CORE_CODEC_COMMVQ_COMMVQ_TEST_UTIL_H_
