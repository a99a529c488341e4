#include "core/calibration/kvtc_calibrate.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/calibration/kv_samples.h"
#include "core/codec/kvtc/kvtc_codec.h"
#include "core/codec/kvtc/kvtc_format.h"
#include "core/codec/kvtc/kvtc_stages.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"
#include "tools/calibrate_cli.h"

namespace kvharbor {
namespace {

constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 8;
constexpr uint64_t kF = kLayers * kHeads * kDim;  // 32 features per token
constexpr int kRank = 4;
const double kEigen[kRank] = {16.0, 8.0, 4.0, 2.0};

// Two sequences of `len` tokens whose position-free K and V rows are
// mean + sum_j sqrt(kEigen[j]) z_j u_j + small noise (u: random orthonormal
// columns); stored keys carry interleaved RoPE (theta 10000) as a cache does.
struct LowRank {
  KvtcBasis k_basis = RandomOrthonormalBasis(kF, kRank, 101, {});
  KvtcBasis v_basis = RandomOrthonormalBasis(kF, kRank, 202, {});
  KvSamples samples;
};

LowRank MakeLowRank(uint64_t len = 288, uint64_t seed = 5) {
  LowRank lr;
  KvSamples& s = lr.samples;
  s.num_layers = kLayers;
  s.num_kv_heads = kHeads;
  s.head_dim = kDim;
  s.tokens = 2 * len;
  s.rope_style = RopeStyle::kInterleaved;
  s.rope_theta = 10000.0f;
  s.keys_roped = true;
  s.k.resize(s.tokens * kF);
  s.v.resize(s.tokens * kF);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  for (uint64_t t = 0; t < s.tokens; ++t) {
    s.positions.push_back(static_cast<int64_t>(t % len));
    for (int kv = 0; kv < 2; ++kv) {
      const KvtcBasis& b = kv == 0 ? lr.k_basis : lr.v_basis;
      float* row = (kv == 0 ? s.k : s.v).data() + t * kF;
      double z[kRank];
      for (int j = 0; j < kRank; ++j) z[j] = std::sqrt(kEigen[j]) * n01(rng);
      for (uint64_t f = 0; f < kF; ++f) {
        double x = 0.5 * kv + 0.01 * f + 1e-3 * n01(rng);
        for (int j = 0; j < kRank; ++j) x += z[j] * b.projection[f * kRank + j];
        row[f] = static_cast<float>(x);
      }
      if (kv == 1) continue;
      float cos[kDim / 2], sin[kDim / 2];
      RopeCosSin(t % len, kDim, s.rope_theta, cos, sin);
      for (uint64_t h = 0; h < kLayers * kHeads; ++h) {
        RotateRope(row + h * kDim, kDim, s.rope_style, cos, sin, false);
      }
    }
  }
  return lr;
}

double MinCos2(const KvtcBasis& u, const KvtcBasis& got) {
  REQUIRE(got.components >= kRank);
  return testing::SubspaceMinCos2(u, got, kRank);
}

// 32 features per token are too few for one-page buffers at 8x (a buffer's
// fixed 272 bytes exceed what 8x leaves of a 2 KiB page), so these tests
// count the ratio over buffers of 64 pages.
CalibrateOptions FastOptions() {
  CalibrateOptions o;
  o.sink_tokens = 4;
  o.page_size = 16;
  o.group_sizes = {2};
  o.ratios = {4, 8};
  o.pages_per_buffer = 64;
  return o;
}

TEST_CASE("calibrate: low-rank basis is recovered with RoPE undone",
          "[kvtc_calibrate]") {
  const LowRank lr = MakeLowRank();
  CalibrateOptions o = FastOptions();
  o.ratios = {2, 8};  // 2x: generous, keeps at least the rank's components
  auto out = CalibrateKvtc(lr.samples, o);
  REQUIRE(out.ok());
  const KvtcCalibration& cal = (*out)[0].calibration;
  CHECK(cal.rope_style == RopeStyle::kInterleaved);
  CHECK(cal.rope_theta == 10000.0f);
  CHECK(MinCos2(lr.k_basis, cal.keys) > 0.999);
  CHECK(MinCos2(lr.v_basis, cal.values) > 0.999);
  // The mean is the generator's (0.5 * kv + 0.01 * f), RoPE-free for keys.
  CHECK(cal.values.mean[3] == Approx(0.53).margin(0.1));
  // At 8x (64 bits per row) the bits go to the top components: the top 4
  // in fp8 take 32 bits, so at most 4 more can get any.
  CHECK((*out)[1].keys.components <= 8);
  CHECK((*out)[1].values.components <= 8);
  REQUIRE(!(*out)[1].keys.ranges.empty());
  CHECK((*out)[1].keys.ranges.front().quant_type == KvtcQuantType::kFp8);
  CHECK((*out)[1].keys.ranges.front().start_idx == 0);
  CHECK((*out)[1].keys.ranges.front().end_idx >= 4);

  // Keeping RoPE spreads the keys' energy over many more components.
  o.undo_rope = false;
  auto roped = CalibrateKvtc(lr.samples, o);
  REQUIRE(roped.ok());
  CHECK((*roped)[0].calibration.rope_style == RopeStyle::kNone);
  CHECK((*roped)[0].keys.expected_error > 10 * (*out)[0].keys.expected_error);
}

TEST_CASE("calibrate: several group sizes keep the best allocation",
          "[kvtc_calibrate]") {
  const LowRank lr = MakeLowRank(96);
  CalibrateOptions o = FastOptions();
  o.ratios = {6};
  // The joint allocation minimizes the keys' plus the values' relative
  // squared error.
  auto joint = [](const CalibrationOutcome& c) {
    return c.keys.expected_error / c.keys_variance +
           c.values.expected_error / c.values_variance;
  };
  double single[2];
  for (int i = 0; i < 2; ++i) {
    o.group_sizes = {i == 0 ? 2u : 8u};
    auto out = CalibrateKvtc(lr.samples, o);
    REQUIRE(out.ok());
    single[i] = joint((*out)[0]);
  }
  o.group_sizes = {2, 8};
  auto both = CalibrateKvtc(lr.samples, o);
  REQUIRE(both.ok());
  CHECK(joint((*both)[0]) == Approx(std::min(single[0], single[1])));
  CHECK((*both)[0].keys_group_size == (single[1] < single[0] ? 8u : 2u));
  CHECK((*both)[0].values_group_size == (*both)[0].keys_group_size);
}

TEST_CASE("calibrate: model errors also give a working allocation",
          "[kvtc_calibrate]") {
  const LowRank lr = MakeLowRank(96);
  CalibrateOptions o = FastOptions();
  o.measured_errors = false;
  o.group_sizes = {2, 4, 8};
  auto out = CalibrateKvtc(lr.samples, o);
  REQUIRE(out.ok());
  for (const CalibrationOutcome& c : *out) {
    // Keys and values share the page's budget.
    CHECK(c.keys.charged_bits_per_row + c.values.charged_bits_per_row <=
          2 * c.budget_bits_per_row);
    CHECK(c.expected_ratio >= c.ratio);
    CHECK(c.calibration.Validate().ok());
  }
}

TEST_CASE("calibrate: calibration round-trips through its file",
          "[kvtc_calibrate]") {
  const LowRank lr = MakeLowRank(96);
  auto out = CalibrateKvtc(lr.samples, FastOptions());
  REQUIRE(out.ok());
  const std::string path = "kvtc_calibrate_test.kvtc";
  for (const CalibrationOutcome& c : *out) {
    REQUIRE(WriteKvtcCalibrationFile(c.calibration, path).ok());
    auto back = ReadKvtcCalibrationFile(path);
    REQUIRE(back.ok());
    CHECK(back->Fingerprint() == c.calibration.Fingerprint());
    CHECK(back->keys.ranges == c.calibration.keys.ranges);
    CHECK(back->values.projection == c.calibration.values.projection);
  }
  std::remove(path.c_str());
}

TEST_CASE("calibrate: the codec reaches the requested ratio",
          "[kvtc_calibrate]") {
  const uint64_t len = 288;  // 18 pages of 16 per sequence
  const LowRank lr = MakeLowRank(len);
  CalibrateOptions o = FastOptions();
  o.pages_per_buffer = 36;  // the whole batch below is one buffer
  auto out = CalibrateKvtc(lr.samples, o);
  REQUIRE(out.ok());
  Geometry g;
  g.num_layers = kLayers;
  g.num_kv_heads = kHeads;
  g.head_dim = kDim;
  g.page_size = 16;
  g.dtype = DType::kBF16;
  g.rope_theta = 10000.0f;
  std::vector<uint64_t> firsts;
  for (int seq = 0; seq < 2; ++seq) {
    for (uint64_t p = 0; p < len; p += 16) firsts.push_back(p);
  }
  testing::PageSet pages(g, firsts);
  double sum2 = 0;
  for (size_t p = 0; p < firsts.size(); ++p) {
    for (uint32_t t = 0; t < 16; ++t) {
      const uint64_t token = p * 16 + t;  // sequences are back to back
      for (int kv = 0; kv < 2; ++kv) {
        const float* row =
            (kv == 0 ? lr.samples.k : lr.samples.v).data() + token * kF;
        for (uint32_t l = 0; l < kLayers; ++l) {
          for (uint32_t h = 0; h < kHeads; ++h) {
            for (uint32_t d = 0; d < kDim; ++d) {
              const float x = row[(l * kHeads + h) * kDim + d];
              pages.Set(p, testing::ElementIndex(g, kv, l, t, h, d), x);
              sum2 += double(x) * x;
            }
          }
        }
      }
    }
  }
  const uint64_t tokens = firsts.size() * 16;
  const uint64_t raw = tokens * 2 * kF * 2;  // bf16 K and V
  double prev_err = 0;
  for (const CalibrationOutcome& c : *out) {
    INFO("ratio " << c.ratio);
    CodecParams params;
    params.geometry = g;
    params.calibration = std::make_shared<KvtcCalibration>(c.calibration);
    auto codec = KvtcCodec::Create(params);
    REQUIRE(codec.ok());
    auto buf = (*codec)->EncodeToString(pages.Refs(), nullptr);
    REQUIRE(buf.ok());
    // Exact accounting: per-batch overhead + sinks + rows * DP bits.
    const uint64_t sinks = 2 * 4;
    const uint64_t rows = tokens - sinks;
    const uint64_t overhead =
        kEnvelopeHeaderBytes + 8 * firsts.size() +
        kKvtcNumSections * kKvtcSectionHeaderBytes +
        kKvtcRangeHeaderBytes * (c.calibration.keys.ranges.size() +
                                 c.calibration.values.ranges.size() + 1) +
        sinks * 2 * kF;
    CHECK(buf->size() ==
          overhead +
              rows * (c.keys.used_bits_per_row + c.values.used_bits_per_row) /
                  8);
    CHECK(c.keys.charged_bits_per_row + c.values.charged_bits_per_row <=
          2 * c.budget_bits_per_row);
    // Every byte counted: the batch has the samples' share of sinks, so the
    // allocation's expectation is exact, and it meets the ratio.
    const double actual = double(raw) / double(buf->size());
    CHECK(actual >= c.ratio);
    CHECK(actual == Approx(c.expected_ratio).epsilon(1e-9));
    CHECK(c.calibration.estimate.expected_ratio ==
          Approx(c.expected_ratio).epsilon(1e-6));
    // And it decodes to something close (the data is rank 4 + tiny noise).
    testing::PageSet dec(g, firsts);
    REQUIRE((*codec)
                ->Decode(absl::MakeConstSpan(
                             reinterpret_cast<const uint8_t*>(buf->data()),
                             buf->size()),
                         dec.MutableRefs(), nullptr)
                .ok());
    double err2 = 0;
    for (size_t p = 0; p < firsts.size(); ++p) {
      for (uint64_t i = 0; i < g.ElementsPerPage(); ++i) {
        const double d = dec.At(p, i) - pages.At(p, i);
        err2 += d * d;
      }
    }
    const double rel = std::sqrt(err2 / sum2);
    CHECK(rel < 0.1);
    CHECK(rel >= prev_err);  // the higher ratio does not do better
    prev_err = rel;
  }
}

TEST_CASE("calibrate: per-page rows calibrate and encode", "[kvtc_calibrate]") {
  const LowRank lr = MakeLowRank(64);
  CalibrateOptions o = FastOptions();
  o.row_kind = KvtcRowKind::kPerPage;
  o.page_size = 4;
  o.group_sizes = {4};
  auto out = CalibrateKvtc(lr.samples, o);
  REQUIRE(out.ok());
  const KvtcCalibration& cal = (*out)[0].calibration;
  CHECK(cal.keys.features == 4 * kHeads * kDim);
  Geometry g;
  g.num_layers = kLayers;
  g.num_kv_heads = kHeads;
  g.head_dim = kDim;
  g.page_size = 4;
  g.dtype = DType::kFP32;
  CodecParams params;
  params.geometry = g;
  params.calibration = std::make_shared<KvtcCalibration>(cal);
  REQUIRE(KvtcCodec::Create(params).ok());
}

TEST_CASE("calibrate: bad options and too few rows are refused",
          "[kvtc_calibrate]") {
  const LowRank lr = MakeLowRank(8);
  CalibrateOptions o = FastOptions();
  o.ratios = {0.5};
  auto s = CalibrateKvtc(lr.samples, o).status();
  CHECK(s.message().find("options.ratios[0]") != std::string::npos);
  o = FastOptions();
  o.group_sizes = {4, 0};
  CHECK(CalibrateKvtc(lr.samples, o)
            .status()
            .message()
            .find("options.group_sizes[1]") != std::string::npos);
  o = FastOptions();
  o.sink_tokens = 100;  // every token is a sink
  CHECK(CalibrateKvtc(lr.samples, o).status().message().find("rows") !=
        std::string::npos);
  KvSamples pre = lr.samples;
  pre.keys_roped = false;
  o = FastOptions();
  o.undo_rope = false;
  CHECK(CalibrateKvtc(pre, o).status().message().find("options.undo_rope") !=
        std::string::npos);
}

TEST_CASE("calibrate: --device and the GPU flags", "[kvtc_calibrate]") {
  auto parse = [](std::vector<std::string> extra) {
    std::vector<std::string> a = {"--samples", "s", "--out", "o"};
    a.insert(a.end(), extra.begin(), extra.end());
    return ParseCalibrateArgs(a);
  };
  auto def = parse({});
  REQUIRE(def.ok());
  CHECK(def->device == CalibrateDevice::kAuto);
  auto gpu = parse({"--device=gpu", "--gpu-solver", "subspace",
                    "--components=96", "--gpu-tf32", "--chunk-rows", "512"});
  REQUIRE(gpu.ok());
  CHECK(gpu->device == CalibrateDevice::kGpu);
  CHECK(gpu->gpu.solver == "subspace");
  CHECK(gpu->kvtc.components == 96);
  CHECK(gpu->gpu.tf32);
  CHECK(gpu->gpu.chunk_rows == 512);
  auto message = [&](std::vector<std::string> extra) {
    return std::string(parse(std::move(extra)).status().message());
  };
  CHECK_THAT(message({"--device=tpu"}), Catch::StartsWith("--device: 'tpu'"));
  CHECK_THAT(message({"--gpu-solver=qr"}),
             Catch::StartsWith("--gpu-solver: 'qr'"));
  CHECK_THAT(message({"--chunk-rows=0"}),
             Catch::StartsWith("--chunk-rows: must be 1..65536"));
  CHECK_THAT(message({"--gpu-tf32=yes"}),
             Catch::StartsWith("--gpu-tf32: takes no value"));
  CHECK_THAT(message({"--merge-intx=1"}),
             Catch::StartsWith("--merge-intx: takes no value"));
  auto cpu = parse({"--cpu-solver=subspace", "--cpu-iterations", "3",
                    "--layer-groups", "4", "--pages-per-buffer=2"});
  REQUIRE(cpu.ok());
  CHECK(cpu->kvtc.cpu.solver == CpuPcaSolver::kSubspace);
  CHECK(cpu->kvtc.cpu.iterations == 3);
  CHECK(cpu->kvtc.layer_groups == 4);
  CHECK(cpu->kvtc.pages_per_buffer == 2);
  CHECK_THAT(message({"--cpu-solver=lanczos"}),
             Catch::StartsWith("--cpu-solver: 'lanczos' is not auto, exact or "
                               "subspace"));
  CHECK_THAT(message({"--layer-groups=0"}),
             Catch::StartsWith("--layer-groups: must be at least 1"));
  CHECK_THAT(message({"--pages-per-buffer=0"}),
             Catch::StartsWith("--pages-per-buffer: must be at least 1"));
  CHECK_THAT(message({"--codec=commvq", "--layer-groups=2"}),
             Catch::Contains("--layer-groups: only applies to --codec=kvtc"));
  CHECK_THAT(message({"--codec=commvq", "--device=gpu"}),
             Catch::Contains("--device: only applies to --codec=kvtc"));

  // cpu: the CPU PCA; gpu in a build without CUDA: a clear error.
  CalibrateArgs a = *def;
  a.device = CalibrateDevice::kCpu;
  auto pca = MakeCalibrationPca(a);
  REQUIRE(pca.ok());
  CHECK(*pca == nullptr);
  if (!CalibrateGpuBuilt()) {
    a.device = CalibrateDevice::kAuto;
    pca = MakeCalibrationPca(a);
    REQUIRE(pca.ok());
    CHECK(*pca == nullptr);
    a.device = CalibrateDevice::kGpu;
    pca = MakeCalibrationPca(a);
    CHECK(pca.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(pca.status().message()),
               Catch::StartsWith("--device: gpu asked for, but this "
                                 "kvharbor-calibrate was built without CUDA"));
  }
}

}  // namespace
}  // namespace kvharbor
