#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/calibration/commvq_train.h"
#include "core/codec/commvq/commvq_codebooks.h"
#include "core/codec/kvtc/kvtc_stages.h"
#include "tests/core/codec/commvq/commvq_test_util.h"

namespace kvharbor {
namespace {

using testing::LowRankSamples;
using testing::RandomCodebooks;
using testing::SmallCommVqConfig;

std::string ConfigError(const CommVqConfig& c) {
  const absl::Status s = c.Validate();
  REQUIRE_FALSE(s.ok());
  return std::string(s.message());
}

TEST_CASE("commvq: config validation names the field", "[commvq]") {
  const CommVqConfig ok = SmallCommVqConfig();
  REQUIRE(ok.Validate().ok());
  REQUIRE(SmallCommVqConfig(RopeStyle::kHalfSplit).Validate().ok());
  CHECK(ok.key_code_bits() == 3);
  CHECK(ok.key_groups() == 2);
  CHECK(ok.key_bits_per_token() == 3 * 2 * 2 * 3);
  CHECK(ok.value_bits_per_token() == 16);
  auto with = [&](auto edit) {
    CommVqConfig c = ok;
    edit(c);
    return ConfigError(c);
  };
  CHECK_THAT(with([](auto& c) { c.num_layers = 0; }),
             Catch::Contains("commvq.num_layers"));
  CHECK_THAT(with([](auto& c) { c.num_kv_heads = 0; }),
             Catch::Contains("commvq.num_kv_heads"));
  CHECK_THAT(with([](auto& c) { c.head_dim = 7; }),
             Catch::Contains("commvq.head_dim"));
  CHECK_THAT(with([](auto& c) { c.rope_style = static_cast<RopeStyle>(9); }),
             Catch::Contains("commvq.rope_style"));
  CHECK_THAT(with([](auto& c) { c.rope_theta = 10000.0f; }),
             Catch::Contains("commvq.rope_theta"));
  CHECK_THAT(with([](auto& c) {
               c.rope_style = RopeStyle::kInterleaved;
               c.rope_theta = 0.0f;
             }),
             Catch::Contains("commvq.rope_theta"));
  CHECK_THAT(with([](auto& c) {
               c.rope_style = RopeStyle::kInterleaved;
               c.rope_theta = std::numeric_limits<float>::quiet_NaN();
             }),
             Catch::Contains("commvq.rope_theta"));
  CHECK_THAT(with([](auto& c) { c.key_levels = 6; }),
             Catch::Contains("commvq.key_levels"));
  CHECK_THAT(with([](auto& c) { c.key_levels = 1; }),
             Catch::Contains("commvq.key_levels"));
  CHECK_THAT(with([](auto& c) { c.key_levels = 512; }),
             Catch::Contains("commvq.key_levels"));
  CHECK_THAT(with([](auto& c) { c.key_group_pairs = 0; }),
             Catch::Contains("commvq.key_group_pairs"));
  CHECK_THAT(with([](auto& c) { c.key_group_pairs = 3; }),
             Catch::Contains("commvq.key_group_pairs"));
  CHECK_THAT(with([](auto& c) { c.key_stages = 0; }),
             Catch::Contains("commvq.key_stages"));
  CHECK_THAT(with([](auto& c) { c.key_stages = 65; }),
             Catch::Contains("commvq.key_stages"));
  CHECK_THAT(with([](auto& c) { c.value_stage_rows = 0; }),
             Catch::Contains("commvq.value_stage_rows"));
  CHECK_THAT(with([](auto& c) { c.value_stages = 0; }),
             Catch::Contains("commvq.value_stages"));
  CHECK_THAT(with([](auto& c) { c.value_stages = 20000; }),
             Catch::Contains("commvq.value_stages"));
  CHECK_THAT(with([](auto& c) {
               c.num_kv_heads = 1024;
               c.head_dim = 4096;
               c.key_levels = 256;
               c.key_stages = 64;
             }),
             Catch::Contains("over the limit"));
  CommVqCodebooks cb = RandomCodebooks(ok, 1);
  REQUIRE(cb.Validate().ok());
  cb.key[17] = std::numeric_limits<float>::infinity();
  CHECK_THAT(std::string(cb.Validate().message()),
             Catch::Contains("commvq.key[17]"));
  cb = RandomCodebooks(ok, 1);
  cb.value.pop_back();
  CHECK_THAT(std::string(cb.Validate().message()),
             Catch::Contains("commvq.value"));
}

TEST_CASE("commvq: decoding is the paper's formulas", "[commvq]") {
  const CommVqConfig c = SmallCommVqConfig(RopeStyle::kHalfSplit);
  const CommVqCodebooks cb = RandomCodebooks(c, 2);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const uint32_t layer = trial % 2;
    std::vector<uint16_t> codes(c.key_codes());
    for (auto& x : codes) x = rng() % c.key_levels;
    std::vector<float> key(c.dim());
    DecodeCommVqKey(cb, layer, codes.data(), key.data());
    // k^j = [1 0] C[a] + [0 1] C[b], C = [[x, y], [-y, x]], summed over stages.
    std::vector<double> want(c.dim(), 0.0);
    for (uint32_t s = 0; s < c.key_stages; ++s) {
      for (uint32_t j = 0; j < c.pairs(); ++j) {
        const uint32_t q = j / c.key_group_pairs;
        const uint32_t a = codes[(s * c.key_groups() + q) * 2];
        const uint32_t b = codes[(s * c.key_groups() + q) * 2 + 1];
        const float* xy = cb.key_at(layer, s, j);
        const double ca[2][2] = {{xy[2 * a], xy[2 * a + 1]},
                                 {-xy[2 * a + 1], xy[2 * a]}};
        const double cbm[2][2] = {{xy[2 * b], xy[2 * b + 1]},
                                  {-xy[2 * b + 1], xy[2 * b]}};
        uint32_t e0, e1;
        c.PairElements(j, &e0, &e1);
        want[e0] += ca[0][0] + cbm[1][0];
        want[e1] += ca[0][1] + cbm[1][1];
      }
    }
    for (uint32_t i = 0; i < c.dim(); ++i)
      REQUIRE(key[i] == Approx(want[i]).margin(1e-5));
    // Values: bits @ C_V.
    std::vector<uint8_t> bits((c.value_rows() + 7) / 8);
    for (auto& b : bits) b = static_cast<uint8_t>(rng());
    std::vector<float> value(c.dim());
    DecodeCommVqValue(cb, layer, bits.data(), value.data());
    for (uint32_t i = 0; i < c.dim(); ++i) {
      double w = 0.0;
      for (uint32_t n = 0; n < c.value_rows(); ++n) {
        if ((bits[n / 8] >> (n % 8)) & 1) w += cb.value_at(layer, n)[i];
      }
      REQUIRE(value[i] == Approx(w).margin(1e-5));
    }
  }
  // Pairs follow the RoPE style.
  uint32_t e0, e1;
  c.PairElements(5, &e0, &e1);  // head 1, index 1
  CHECK((e0 == 9 && e1 == 13));
  SmallCommVqConfig().PairElements(5, &e0, &e1);
  CHECK((e0 == 10 && e1 == 11));
}

TEST_CASE("commvq: the encoder picks the nearest centre", "[commvq]") {
  CommVqConfig c = SmallCommVqConfig();
  c.key_stages = 1;
  c.value_stages = 1;
  auto cb = std::make_shared<CommVqCodebooks>(RandomCodebooks(c, 4));
  auto enc = CommVqEncoder::Create(cb);
  REQUIRE(enc.ok());
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> scratch((*enc)->ScratchFloats());
  std::vector<uint16_t> codes(c.key_codes());
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> key(c.dim());
    for (float& x : key) x = nd(rng);
    (*enc)->EncodeKey(0, key.data(), codes.data(), scratch.data());
    for (uint32_t q = 0; q < c.key_groups(); ++q) {
      auto dist = [&](uint32_t a, uint32_t b) {
        double d = 0.0;
        for (uint32_t j = q * c.key_group_pairs;
             j < (q + 1) * c.key_group_pairs; ++j) {
          const float* xy = cb->key_at(0, 0, j);
          uint32_t e0, e1;
          c.PairElements(j, &e0, &e1);
          const double u = key[e0] - (double{xy[2 * a]} - xy[2 * b + 1]);
          const double v = key[e1] - (double{xy[2 * a + 1]} + xy[2 * b]);
          d += u * u + v * v;
        }
        return d;
      };
      double best = 1e300;
      for (uint32_t a = 0; a < c.key_levels; ++a) {
        for (uint32_t b = 0; b < c.key_levels; ++b)
          best = std::min(best, dist(a, b));
      }
      REQUIRE(dist(codes[2 * q], codes[2 * q + 1]) <= best + 1e-4);
    }
    std::vector<float> value(c.dim());
    for (float& x : value) x = nd(rng);
    std::vector<uint8_t> bits(1);
    (*enc)->EncodeValue(1, value.data(), bits.data(), scratch.data());
    REQUIRE((bits[0] & 0xF0) == 0);  // only the stage's 4 rows
    auto vdist = [&](int row) {
      double d = 0.0;
      for (uint32_t i = 0; i < c.dim(); ++i) {
        const double r = value[i] - (row < 0 ? 0.0 : cb->value_at(1, row)[i]);
        d += r * r;
      }
      return d;
    };
    int chosen = -1;
    for (int k = 0; k < 4; ++k) {
      if ((bits[0] >> k) & 1) chosen = k;
    }
    REQUIRE(__builtin_popcount(bits[0]) <= 1);
    double best = vdist(-1);
    for (int k = 0; k < 4; ++k) best = std::min(best, vdist(k));
    REQUIRE(vdist(chosen) <= best + 1e-4);
  }
}

TEST_CASE("commvq: the key codebook commutes with RoPE", "[commvq]") {
  std::mt19937 rng(6);
  std::normal_distribution<float> nd;
  // C = [[x, y], [-y, x]] commutes with every rotation R.
  for (int i = 0; i < 100; ++i) {
    const double x = nd(rng), y = nd(rng), t = nd(rng) * 3;
    const double C[2][2] = {{x, y}, {-y, x}};
    const double R[2][2] = {{std::cos(t), -std::sin(t)},
                            {std::sin(t), std::cos(t)}};
    for (int r = 0; r < 2; ++r) {
      for (int k = 0; k < 2; ++k) {
        const double rc = R[r][0] * C[0][k] + R[r][1] * C[1][k];
        const double cr = C[r][0] * R[0][k] + C[r][1] * R[1][k];
        REQUIRE(rc == Approx(cr).margin(1e-12));
      }
    }
  }
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    const CommVqConfig c = SmallCommVqConfig(style);
    const CommVqCodebooks cb = RandomCodebooks(c, 7);
    const uint32_t half = c.head_dim / 2;
    for (uint64_t pos :
         {uint64_t{0}, uint64_t{1}, uint64_t{37}, uint64_t{4095}}) {
      std::vector<float> cos(half), sin(half);
      RopeCosSin(pos, c.head_dim, c.rope_theta, cos.data(), sin.data());
      const CommVqCodebooks rotated =
          RotateCommVqKeyCodebook(cb, cos.data(), sin.data());
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<uint16_t> codes(c.key_codes());
        for (auto& x : codes) x = rng() % c.key_levels;
        std::vector<float> a(c.dim()), b(c.dim());
        DecodeCommVqKey(cb, 1, codes.data(), a.data());
        for (uint32_t h = 0; h < c.num_kv_heads; ++h) {
          RotateRope(a.data() + h * c.head_dim, c.head_dim, style, cos.data(),
                     sin.data(), false);
        }
        DecodeCommVqKey(rotated, 1, codes.data(), b.data());
        for (uint32_t i = 0; i < c.dim(); ++i)
          REQUIRE(a[i] == Approx(b[i]).margin(1e-5));
      }
      // So coding a rotated key with the rotated codebook gives the codes of
      // the unrotated key with the original one (up to float near-ties).
      auto e0 = CommVqEncoder::Create(std::make_shared<CommVqCodebooks>(cb));
      auto e1 =
          CommVqEncoder::Create(std::make_shared<CommVqCodebooks>(rotated));
      REQUIRE(e0.ok());
      REQUIRE(e1.ok());
      std::vector<float> scratch((*e0)->ScratchFloats());
      int same = 0, total = 0;
      for (int trial = 0; trial < 100; ++trial) {
        std::vector<float> k(c.dim());
        for (float& x : k) x = nd(rng);
        std::vector<uint16_t> c0(c.key_codes()), c1(c.key_codes());
        (*e0)->EncodeKey(0, k.data(), c0.data(), scratch.data());
        for (uint32_t h = 0; h < c.num_kv_heads; ++h) {
          RotateRope(k.data() + h * c.head_dim, c.head_dim, style, cos.data(),
                     sin.data(), false);
        }
        (*e1)->EncodeKey(0, k.data(), c1.data(), scratch.data());
        same += c0 == c1;
        ++total;
      }
      CHECK(same >= 97);
    }
  }
}

// Mean squared error per element of coding `data` ([layer][n][dim]) with
// the first `key_stages` / `value_stages` stages of `full`.
std::pair<double, double> HeldOutMse(const CommVqCodebooks& full,
                                     uint32_t key_stages, uint32_t value_stages,
                                     const std::vector<float>& keys,
                                     const std::vector<float>& values,
                                     uint64_t n) {
  auto cb = std::make_shared<CommVqCodebooks>(full);
  CommVqConfig& c = cb->config;
  c.key_stages = key_stages;
  c.value_stages = value_stages;
  // Stages are the slowest index within a layer: keep each layer's prefix.
  cb->key.clear();
  cb->value.clear();
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const float* k = full.key_at(l, 0, 0);
    cb->key.insert(cb->key.end(), k,
                   k + uint64_t{key_stages} * c.pairs() * c.key_levels * 2);
    const float* v = full.value_at(l, 0);
    cb->value.insert(cb->value.end(), v,
                     v + uint64_t{value_stages} * c.value_stage_rows * c.dim());
  }
  auto enc = CommVqEncoder::Create(cb);
  REQUIRE(enc.ok());
  std::vector<float> scratch((*enc)->ScratchFloats()), out(c.dim());
  std::vector<uint16_t> codes(c.key_codes());
  std::vector<uint8_t> bits((c.value_rows() + 7) / 8);
  double ek = 0.0, ev = 0.0;
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    for (uint64_t s = 0; s < n; ++s) {
      const float* k = keys.data() + (l * n + s) * c.dim();
      (*enc)->EncodeKey(l, k, codes.data(), scratch.data());
      DecodeCommVqKey(*cb, l, codes.data(), out.data());
      for (uint32_t i = 0; i < c.dim(); ++i) ek += std::pow(out[i] - k[i], 2);
      const float* v = values.data() + (l * n + s) * c.dim();
      (*enc)->EncodeValue(l, v, bits.data(), scratch.data());
      DecodeCommVqValue(*cb, l, bits.data(), out.data());
      for (uint32_t i = 0; i < c.dim(); ++i) ev += std::pow(out[i] - v[i], 2);
    }
  }
  const double count = double(c.num_layers) * n * c.dim();
  return {ek / count, ev / count};
}

TEST_CASE("commvq: training reduces the error; more stages code better",
          "[commvq]") {
  CommVqConfig c = SmallCommVqConfig();
  c.key_stages = 4;
  const uint64_t n = 600, held = 300;
  const auto keys = LowRankSamples(c, n, 3, 0.05f, 11, 12);
  const auto values = LowRankSamples(c, n, 3, 0.05f, 13, 14);
  CommVqTrainOptions opt;
  opt.key_iterations = 12;
  opt.value_iterations = 8;
  CommVqTrainReport report;
  auto cb = TrainCommVqCodebooks(c, keys, values, n, opt, &report);
  REQUIRE(cb.ok());
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const auto& ks = report.key_stage_mse[l];
    REQUIRE(ks.size() == c.key_stages);
    CHECK(ks[0] < 0.5 * report.key_energy[l]);
    for (uint32_t s = 0; s < c.key_stages; ++s) {
      const auto& em = report.key_em_mse[l][s];
      REQUIRE(em.size() == opt.key_iterations + 1);
      // EM improves on its initialization and ends near its best point
      // ("monotonically-ish": soft assignments may wobble on the way).
      CHECK(em.back() < 0.9 * em.front());
      CHECK(em.back() <= 1.05 * *std::min_element(em.begin(), em.end()));
      CHECK(em.back() == Approx(ks[s]).epsilon(1e-9));
      if (s > 0) CHECK(ks[s] < ks[s - 1]);
    }
    const auto& vs = report.value_stage_mse[l];
    CHECK(vs[0] < report.value_energy[l]);
    for (uint32_t m = 0; m < c.value_stages; ++m) {
      const auto& km = report.value_kmeans_mse[l][m];
      for (size_t i = 1; i < km.size(); ++i) {
        CHECK(km[i] <= km[i - 1] * (1 + 1e-6));  // Lloyd never goes up
      }
      if (m > 0) CHECK(vs[m] <= vs[m - 1]);
    }
  }
  // Held-out data from the same distribution: each extra stage helps.
  const auto hk = LowRankSamples(c, held, 3, 0.05f, 11, 21);
  const auto hv = LowRankSamples(c, held, 3, 0.05f, 13, 22);
  double prev_k = 1e300, prev_v = 1e300;
  for (uint32_t r = 1; r <= 4; ++r) {
    const auto [ek, ev] =
        HeldOutMse(*cb, std::min(r, c.key_stages), r, hk, hv, held);
    CHECK(ek < prev_k);
    CHECK(ev < prev_v);
    prev_k = ek;
    prev_v = ev;
  }
  CHECK(prev_k < 0.2 * report.key_energy[0]);
  // Deterministic for a seed.
  auto again = TrainCommVqCodebooks(c, keys, values, n, opt, nullptr);
  REQUIRE(again.ok());
  CHECK(again->key == cb->key);
  CHECK(again->value == cb->value);
}

TEST_CASE("commvq: training input checks and RoPE removal", "[commvq]") {
  const CommVqConfig c = SmallCommVqConfig(RopeStyle::kInterleaved);
  std::vector<float> k(c.num_layers * 10 * c.dim(), 1.0f);
  CHECK_FALSE(TrainCommVqCodebooks(c, k, k, 11, {}, nullptr).ok());
  CHECK_FALSE(TrainCommVqCodebooks(c, k, k, 0, {}, nullptr).ok());
  std::vector<float> bad = k;
  bad[3] = std::nanf("");
  CHECK_FALSE(TrainCommVqCodebooks(c, bad, k, 10, {}, nullptr).ok());
  CommVqTrainOptions opt;
  opt.key_iterations = 0;
  CHECK_FALSE(TrainCommVqCodebooks(c, k, k, 10, opt, nullptr).ok());
  // RemoveRope undoes RotateRope at each sample's position.
  std::vector<float> keys(3 * c.dim()), orig;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (float& x : keys) x = nd(rng);
  orig = keys;
  const uint64_t pos[3] = {0, 5, 1000};
  const uint32_t half = c.head_dim / 2;
  std::vector<float> cos(half), sin(half);
  for (int s = 0; s < 3; ++s) {
    RopeCosSin(pos[s], c.head_dim, c.rope_theta, cos.data(), sin.data());
    for (uint32_t h = 0; h < c.num_kv_heads; ++h) {
      RotateRope(keys.data() + s * c.dim() + h * c.head_dim, c.head_dim,
                 c.rope_style, cos.data(), sin.data(), false);
    }
  }
  RemoveRope(c, keys.data(), pos, 3);
  for (size_t i = 0; i < keys.size(); ++i)
    CHECK(keys[i] == Approx(orig[i]).margin(1e-5));
}

}  // namespace
}  // namespace kvharbor
