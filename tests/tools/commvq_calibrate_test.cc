// kvharbor-calibrate --codec=commvq end to end (tools/calibrate_cli.h, the
// tool's entry functions) on synthetic samples with a known codebook.
#include "tools/commvq_calibrate.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/calibration/kv_samples.h"
#include "core/codec/codec_calibrations.h"
#include "core/codec/commvq/commvq_format.h"
#include "core/codec/kvtc/kvtc_stages.h"
#include "tools/calibrate_cli.h"

namespace kvharbor {
namespace {

constexpr uint32_t kLayers = 2, kHeads = 1, kDim = 8, kD = kHeads * kDim;
constexpr uint64_t kLen = 256;  // tokens per sequence, 2 sequences
constexpr double kNoise = 0.05;

// Synthetic samples drawn from a "teacher" of the geometry the test trains
// (--bits 1 --key-levels 4 --group-pairs 2 --value-stage-rows 4): per layer
// and group of 2 pairs, a key is the centre (x_a - y_b, y_a + x_b) of a
// uniformly random code (a, b) of 4 x 4 levels with x, y ~ N(0, 1), plus
// N(0, kNoise^2) noise, stored with interleaved RoPE; a value is one of 4
// N(0, 1) rows plus the same noise. `clean_keys`: the keys before RoPE.
struct Synthetic {
  KvSamples samples;
  std::vector<float> clean_keys;  // [token][layer][dim]
};

Synthetic MakeSynthetic() {
  Synthetic syn;
  KvSamples& s = syn.samples;
  s.num_layers = kLayers;
  s.num_kv_heads = kHeads;
  s.head_dim = kDim;
  s.tokens = 2 * kLen;
  s.rope_style = RopeStyle::kInterleaved;
  s.rope_theta = 10000.0f;
  s.keys_roped = true;
  std::mt19937_64 rng(7);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::uniform_int_distribution<int> pick(0, 3);
  std::vector<double> kx(kLayers * (kD / 2) * 4), ky(kx.size());
  std::vector<double> vrow(kLayers * 4 * kD);
  for (double& x : kx) x = n01(rng);
  for (double& y : ky) y = n01(rng);
  for (double& r : vrow) r = n01(rng);
  for (uint64_t t = 0; t < s.tokens; ++t) {
    s.positions.push_back(static_cast<int64_t>(t % kLen));
    for (uint32_t l = 0; l < kLayers; ++l) {
      float key[kD];
      for (uint32_t q = 0; q < kD / 4; ++q) {  // groups of 2 pairs
        const int a = pick(rng), b = pick(rng);
        for (uint32_t j = 2 * q; j < 2 * q + 2; ++j) {
          const size_t base = (l * (kD / 2) + j) * 4;
          key[2 * j] = float(kx[base + a] - ky[base + b] + kNoise * n01(rng));
          key[2 * j + 1] =
              float(ky[base + a] + kx[base + b] + kNoise * n01(rng));
        }
      }
      syn.clean_keys.insert(syn.clean_keys.end(), key, key + kD);
      float cos[kDim / 2], sin[kDim / 2];
      RopeCosSin(t % kLen, kDim, s.rope_theta, cos, sin);
      RotateRope(key, kDim, s.rope_style, cos, sin, false);
      s.k.insert(s.k.end(), key, key + kD);
      const int r = pick(rng);
      for (uint32_t d = 0; d < kD; ++d) {
        s.v.push_back(float(vrow[(l * 4 + r) * kD + d] + kNoise * n01(rng)));
      }
    }
  }
  return syn;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kvh_commvq_cal_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::vector<std::string> Flags(const std::string& samples,
                               const std::string& out) {
  return {"--codec=commvq",
          "--samples",
          samples,
          "--out",
          out,
          "--bits",
          "1",
          "--key-levels",
          "4",
          "--group-pairs",
          "2",
          "--value-stage-rows",
          "4",
          "--quiet"};
}

struct Errors {
  double k_err = 0, k_ref = 0, k_mean = 0, v_err = 0, v_ref = 0, v_mean = 0;
  double k_sign = 0;  // best 1-bit scalar quantizer of each key channel
};

// Squared error of coding every key channel (layer, dim) as sign(x) * c with
// the best c = E|x|: sum over the channel of x^2 - n * (E|x|)^2.
double SignQuantizerError(const Synthetic& syn) {
  const uint64_t channels = kLayers * kD, n = syn.samples.tokens;
  std::vector<double> abs_sum(channels, 0.0), sq_sum(channels, 0.0);
  for (uint64_t i = 0; i < syn.clean_keys.size(); ++i) {
    abs_sum[i % channels] += std::fabs(syn.clean_keys[i]);
    sq_sum[i % channels] += std::pow(double(syn.clean_keys[i]), 2);
  }
  double err = 0;
  for (uint64_t c = 0; c < channels; ++c) {
    err += sq_sum[c] - abs_sum[c] * abs_sum[c] / double(n);
  }
  return err;
}

// Encodes and decodes every sample row with the codebooks; also the error
// of the per-layer mean vector (a trivial baseline).
Errors RoundTrip(const CommVqCodebooks& cb, const Synthetic& syn) {
  auto enc = CommVqEncoder::Create(std::make_shared<CommVqCodebooks>(cb));
  REQUIRE(enc.ok());
  const KvSamples& s = syn.samples;
  std::vector<float> scratch((*enc)->ScratchFloats()), out(kD);
  std::vector<uint16_t> codes(cb.config.key_codes());
  std::vector<uint8_t> bits((cb.config.value_bits_per_token() + 7) / 8);
  std::vector<double> mean(2 * kLayers * kD, 0.0);
  for (uint64_t i = 0; i < s.k.size(); ++i) {
    mean[(i % (kLayers * kD))] += syn.clean_keys[i] / double(s.tokens);
    mean[kLayers * kD + i % (kLayers * kD)] += s.v[i] / double(s.tokens);
  }
  Errors e;
  e.k_sign = SignQuantizerError(syn);
  for (uint64_t t = 0; t < s.tokens; ++t) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      const uint64_t at = (t * kLayers + l) * kD;
      const float* key = syn.clean_keys.data() + at;
      (*enc)->EncodeKey(l, key, codes.data(), scratch.data());
      DecodeCommVqKey(cb, l, codes.data(), out.data());
      for (uint32_t d = 0; d < kD; ++d) {
        e.k_err += std::pow(double(out[d]) - key[d], 2);
        e.k_ref += std::pow(double(key[d]), 2);
        e.k_mean += std::pow(mean[l * kD + d] - key[d], 2);
      }
      (*enc)->EncodeValue(l, s.v.data() + at, bits.data(), scratch.data());
      DecodeCommVqValue(cb, l, bits.data(), out.data());
      for (uint32_t d = 0; d < kD; ++d) {
        const double v = s.v[at + d];
        e.v_err += std::pow(double(out[d]) - v, 2);
        e.v_ref += v * v;
        e.v_mean += std::pow(mean[(kLayers + l) * kD + d] - v, 2);
      }
    }
  }
  return e;
}

TEST_CASE("calibrate commvq: trained codebook file loads and codes samples",
          "[commvq_calibrate]") {
  const Synthetic syn = MakeSynthetic();
  const std::string samples = TempPath("samples.safetensors");
  const std::string out = TempPath("cb");
  REQUIRE(WriteKvSamples(syn.samples, StDType::kF32, samples).ok());
  auto args = ParseCalibrateArgs(Flags(samples, out));
  REQUIRE(args.ok());
  REQUIRE(RunCalibrate(*args).ok());

  auto cb = ReadCommVqCodebooksFile(CommVqOutputPath(out));
  REQUIRE(cb.ok());
  const CommVqConfig& c = cb->config;
  CHECK(c.num_layers == kLayers);
  CHECK(c.num_kv_heads == kHeads);
  CHECK(c.head_dim == kDim);
  CHECK(c.rope_style == RopeStyle::kInterleaved);
  CHECK(c.rope_theta == 10000.0f);
  CHECK(c.key_levels == 4);
  CHECK(c.key_group_pairs == 2);
  CHECK(c.key_stages == 1);  // 1 bit * 2 pairs / log2(4)
  CHECK(c.value_stage_rows == 4);
  CHECK(c.value_stages == 2);  // 1 bit * 8 dims / 4 rows
  Geometry g;
  g.num_layers = kLayers;
  g.num_kv_heads = kHeads;
  g.head_dim = kDim;
  g.page_size = 16;
  g.rope_theta = 10000.0f;
  // What a namespace with codec "commvq" runs on its calibration_path.
  CHECK(ReadCommVqCalibrationForCodec(CommVqOutputPath(out), g).ok());

  // Bounds. Keys (1 bit per element): with y = 0 the centre of code
  // (a, b) on pair j is (x_j[a], x_j[b]), so in a group of two pairs level a
  // sets the first elements of both pairs from 4 points of the plane; the
  // points (+-c, +-c') make that the per-channel sign quantizer sign(x) * c.
  // This geometry's codebooks thus contain the best 1-bit scalar quantizer,
  // and a trained one must do better (on this near-Gaussian data it has
  // relative error about sqrt(1 - 2/pi) = 0.6; EM reaches 0.2-0.26 over
  // seeds 1-5 at the default 20 iterations, and the noise floor is
  // kNoise / sqrt(2) = 0.035, which 8 or 16 centres cannot fit below by
  // much: a result under half of it would mean the rows were not the
  // samples').
  // Values: the teacher's 4 rows fit the first stage of 4 rows, so k-means
  // can reach the noise floor kNoise = 0.05 (the second stage fits a little
  // of the noise, hence again half of it as a lower bound); losing one of the 4
  // clusters (1/4 of the samples at a squared distance of about 2 per element,
  // over energy 1) would leave about sqrt(2 / 4) = 0.7, hence the bound 0.2.
  // Both must beat the trivial baselines (zero vector: relative error 1;
  // per-channel mean: about 1) by at least 2x in RMS.
  const Errors e = RoundTrip(*cb, syn);
  const double k_rel = std::sqrt(e.k_err / e.k_ref);
  const double v_rel = std::sqrt(e.v_err / e.v_ref);
  const double k_sign_rel = std::sqrt(e.k_sign / e.k_ref);
  INFO("keys " << k_rel << " (sign quantizer " << k_sign_rel << ") values "
               << v_rel);
  CHECK(k_rel < k_sign_rel);
  CHECK(k_rel > 0.5 * kNoise / std::sqrt(2.0));
  CHECK(v_rel < 0.2);
  CHECK(v_rel > 0.5 * kNoise);
  CHECK(e.k_err < 0.25 * e.k_mean);
  CHECK(e.v_err < 0.25 * e.v_mean);
  CHECK(k_rel < 0.5);  // the zero vector's relative error is 1
  std::remove(samples.c_str());
  std::remove(CommVqOutputPath(out).c_str());
}

TEST_CASE("calibrate commvq: bad flags name the flag", "[commvq_calibrate]") {
  auto with = [](std::vector<std::string> extra) {
    std::vector<std::string> a = {"--samples", "s", "--out", "o"};
    a.insert(a.end(), extra.begin(), extra.end());
    return ParseCalibrateArgs(a).status();
  };
  auto message = [](const absl::Status& st) {
    return std::string(st.message());
  };
  absl::Status st = with({"--codec=zip"});
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(message(st), Catch::StartsWith("--codec: 'zip'"));
  st = with({"--codec", "commvq", "--bits", "0"});
  CHECK_THAT(message(st), Catch::StartsWith("--bits: must be at least 1"));
  st = with({"--codec=commvq", "--key-levels=x"});
  CHECK_THAT(message(st), Catch::StartsWith("--key-levels: 'x'"));
  st = with({"--bits", "2"});  // kvtc is the default
  CHECK_THAT(message(st), Catch::Contains("--bits: only applies to "
                                          "--codec=commvq"));
  st = with({"--codec=commvq", "--ratios", "8"});
  CHECK_THAT(message(st), Catch::Contains("--ratios: only applies to "
                                          "--codec=kvtc"));
  auto kvtc = ParseCalibrateArgs({"--samples", "s", "--out", "o"});
  REQUIRE(kvtc.ok());
  CHECK(kvtc->codec == CalibrateCodec::kKvtc);
}

TEST_CASE("calibrate commvq: shapes that do not fit name the flag",
          "[commvq_calibrate]") {
  const KvSamples s = MakeSynthetic().samples;
  CommVqShape shape;
  shape.bits = 1;
  shape.key_levels = 4;
  shape.key_group_pairs = 3;  // 4 pairs per token
  CHECK_THAT(std::string(CommVqConfigFor(s, shape).status().message()),
             Catch::StartsWith("--group-pairs: 3 does not divide"));
  shape.key_group_pairs = 0;  // head_dim / 2 = 4
  shape.key_levels = 8;       // 1 bit * 4 pairs is not a multiple of 3
  CHECK_THAT(std::string(CommVqConfigFor(s, shape).status().message()),
             Catch::StartsWith("--bits: "));
  shape.key_levels = 6;
  CHECK_THAT(std::string(CommVqConfigFor(s, shape).status().message()),
             Catch::StartsWith("--key-levels: 6"));
  shape.key_levels = 4;
  shape.value_stage_rows = 3;  // 8 value rows
  CHECK_THAT(std::string(CommVqConfigFor(s, shape).status().message()),
             Catch::StartsWith("--bits: "));
  shape.value_stages = 2;
  auto ok = CommVqConfigFor(s, shape);
  REQUIRE(ok.ok());
  CHECK(ok->value_rows() == 6);
}

}  // namespace
}  // namespace kvharbor
