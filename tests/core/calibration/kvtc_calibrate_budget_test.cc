// KVTC calibration at the byte level (issue 17): the ratio a calibration is
// made for holds over real encoded page buffers, block-diagonal bases
// (layer groups) encode and decode, the expected relative error is measured
// on held-out rows and predicts new data's, and bad input gets errors naming
// the field without touching the active codec.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/calibration/calibration_rows.h"
#include "core/calibration/kvtc_calibrate.h"
#include "core/calibration/online_calibration.h"
#include "core/codec/codec.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/codec/kvtc/kvtc_codec.h"
#include "core/codec/kvtc/kvtc_stages.h"
#include "core/store/namespace.h"
#include "core/store/store.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"

namespace kvharbor {
namespace {

Geometry Geo(uint32_t layers, uint32_t heads, uint32_t dim, uint32_t page,
             DType dtype = DType::kBF16) {
  Geometry g;
  g.num_layers = layers;
  g.num_kv_heads = heads;
  g.head_dim = dim;
  g.page_size = page;
  g.dtype = dtype;
  g.rope_theta = 10000.0f;
  return g;
}

// `seqs` sequences of `len` tokens from position 0 whose K and V rows (all
// layers together) are mean + a decaying spectrum over 48 random directions
// + noise, keys roped (interleaved) as a cache holds them.
KvSamples Samples(const Geometry& g, uint64_t seqs, uint64_t len,
                  uint64_t seed) {
  KvSamples s;
  s.num_layers = g.num_layers;
  s.num_kv_heads = g.num_kv_heads;
  s.head_dim = g.head_dim;
  s.rope_style = RopeStyle::kInterleaved;
  s.rope_theta = g.rope_theta;
  s.keys_roped = true;
  const uint64_t f = s.FeaturesPerToken();
  const uint64_t rank = std::min<uint64_t>(48, f);
  const KvtcBasis u[2] = {RandomOrthonormalBasis(f, rank, 7, {}),
                          RandomOrthonormalBasis(f, rank, 8, {})};
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  s.tokens = seqs * len;
  s.k.resize(s.tokens * f);
  s.v.resize(s.tokens * f);
  std::vector<double> z(rank);
  std::vector<float> cos(g.head_dim / 2), sin(g.head_dim / 2);
  for (uint64_t t = 0; t < s.tokens; ++t) {
    const uint64_t pos = t % len;
    s.positions.push_back(static_cast<int64_t>(pos));
    for (int kv = 0; kv < 2; ++kv) {
      for (uint64_t j = 0; j < rank; ++j) z[j] = n01(rng) / (1.0 + j / 4.0);
      float* row = (kv == 0 ? s.k : s.v).data() + t * f;
      for (uint64_t i = 0; i < f; ++i) {
        double x = 0.1 * kv + 0.02 * (i % 7) + 0.02 * n01(rng);
        for (uint64_t j = 0; j < rank; ++j) {
          x += z[j] * u[kv].projection[i * rank + j] * std::sqrt(double(f));
        }
        row[i] = static_cast<float>(x);
      }
      if (kv == 1) continue;
      RopeCosSin(pos, g.head_dim, s.rope_theta, cos.data(), sin.data());
      for (uint64_t h = 0; h < f / g.head_dim; ++h) {
        RotateRope(row + h * g.head_dim, g.head_dim, s.rope_style, cos.data(),
                   sin.data(), false);
      }
    }
  }
  return s;
}

// The samples' sequences as pages (position order), in g's dtype.
testing::PageSet PagesOf(const Geometry& g, const KvSamples& s) {
  std::vector<uint64_t> firsts;
  for (uint64_t t = 0; t + g.page_size <= s.tokens; t += g.page_size) {
    firsts.push_back(static_cast<uint64_t>(s.positions[t]));
  }
  testing::PageSet pages(g, firsts);
  const uint64_t f = s.FeaturesPerToken();
  for (size_t p = 0; p < firsts.size(); ++p) {
    for (uint32_t t = 0; t < g.page_size; ++t) {
      const uint64_t token = p * g.page_size + t;
      for (int kv = 0; kv < 2; ++kv) {
        const float* row = (kv == 0 ? s.k : s.v).data() + token * f;
        for (uint32_t l = 0; l < g.num_layers; ++l) {
          for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
            for (uint32_t d = 0; d < g.head_dim; ++d) {
              pages.Set(
                  p, testing::ElementIndex(g, kv, l, t, h, d),
                  row[(uint64_t{l} * g.num_kv_heads + h) * g.head_dim + d]);
            }
          }
        }
      }
    }
  }
  return pages;
}

// Raw bytes over stored bytes when every page is its own buffer (the
// store's eviction).
double StoredRatio(const Codec& codec, const testing::PageSet& pages) {
  uint64_t stored = 0;
  const std::vector<PageRef> refs = pages.Refs();
  for (const PageRef& r : refs) {
    auto buf = codec.EncodeToString(absl::MakeConstSpan(&r, 1), nullptr);
    REQUIRE(buf.ok());
    stored += buf->size();
  }
  return double(refs.size()) * pages.g.PageBytes() / double(stored);
}

std::unique_ptr<KvtcCodec> CodecFor(const Geometry& g,
                                    const KvtcCalibration& cal) {
  CodecParams p;
  p.geometry = g;
  p.calibration = std::make_shared<KvtcCalibration>(cal);
  auto c = KvtcCodec::Create(p);
  REQUIRE(c.ok());
  return *std::move(c);
}

TEST_CASE(
    "kvtc calibrate: a calibration for R x stores at least 0.97 R x "
    "in one-page buffers",
    "[kvtc_budget]") {
  struct Case {
    Geometry g;
    KvtcRowKind kind;
  };
  const Case cases[] = {
      {Geo(4, 2, 32, 16), KvtcRowKind::kPerToken},
      {Geo(8, 2, 64, 16), KvtcRowKind::kPerToken},
      {Geo(8, 2, 64, 16), KvtcRowKind::kPerPage},
      {Geo(2, 4, 64, 8, DType::kFP16), KvtcRowKind::kPerPage},
      {Geo(4, 4, 32, 32, DType::kFP32), KvtcRowKind::kPerToken},
  };
  for (const Case& c : cases) {
    const KvSamples calib = Samples(c.g, 6, 256, 1);
    const KvSamples held = Samples(c.g, 3, 256, 2);
    const testing::PageSet pages = PagesOf(c.g, held);
    CalibrateOptions o;
    o.row_kind = c.kind;
    o.page_size = c.g.page_size;
    o.raw_dtype = c.g.dtype;
    o.group_sizes = {8, 32};
    o.ratios = {2, 4, 8, 16, 32, 64};
    INFO(c.g.DebugString() << " " << KvtcRowKindName(c.kind));
    auto out = CalibrateKvtc(calib, o);
    // Only a ratio the buffers' fixed bytes make unreachable is refused
    // (before any PCA); the rest calibrate.
    while (!out.ok()) {
      const std::string m(out.status().message());
      REQUIRE_THAT(m, Catch::Contains("the largest reachable ratio is"));
      const size_t i = m[std::string("options.ratios[").size()] - '0';
      REQUIRE(o.ratios[i] >= 16);
      o.ratios.erase(o.ratios.begin() + i);
      out = CalibrateKvtc(calib, o);
    }
    CHECK(o.ratios.size() >= 4);
    for (const CalibrationOutcome& r : *out) {
      INFO(r.ratio << "x");
      CHECK(r.expected_ratio >= r.ratio);
      const double actual = StoredRatio(*CodecFor(c.g, r.calibration), pages);
      CHECK(actual >= 0.97 * r.ratio);
      // The allocation's own count of the stream is what the buffers hold.
      CHECK(actual == Approx(r.expected_ratio).epsilon(0.01));
    }
  }
}

TEST_CASE(
    "kvtc calibrate: layer groups give a block-diagonal basis that "
    "encodes and decodes",
    "[kvtc_budget]") {
  const Geometry g = Geo(4, 2, 32, 16);
  const KvSamples calib = Samples(g, 6, 256, 3);
  CalibrateOptions o;
  o.ratios = {8};
  o.group_sizes = {8};
  o.layer_groups = 2;
  auto blocked = CalibrateKvtc(calib, o);
  REQUIRE(blocked.ok());
  const KvtcCalibration& cal = (*blocked)[0].calibration;
  REQUIRE(cal.keys.blocks.size() == 2);
  CHECK(cal.keys.blocks[0].features == 128);
  CHECK(cal.keys.blocks[1].features == 128);
  CHECK(cal.keys.components ==
        cal.keys.blocks[0].components + cal.keys.blocks[1].components);
  // A file round trip keeps the blocks and the estimate (version 2).
  auto bytes = SerializeKvtcCalibration(cal);
  REQUIRE(bytes.ok());
  CHECK((*bytes)[8] == 2);
  auto back = ParseKvtcCalibration(absl::MakeConstSpan(
      reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()));
  REQUIRE(back.ok());
  CHECK(back->keys.blocks == cal.keys.blocks);
  CHECK(back->keys.projection == cal.keys.projection);
  CHECK(back->estimate.expected_ratio == cal.estimate.expected_ratio);
  CHECK(back->Fingerprint() == cal.Fingerprint());

  const KvSamples held = Samples(g, 2, 256, 4);
  testing::PageSet pages = PagesOf(g, held);
  const auto codec = CodecFor(g, cal);
  CHECK(StoredRatio(*codec, pages) >= 0.97 * 8);
  auto buf = codec->EncodeToString(pages.Refs(), nullptr);
  REQUIRE(buf.ok());
  testing::PageSet dec(g, pages.positions);
  REQUIRE(codec
              ->Decode(absl::MakeConstSpan(
                           reinterpret_cast<const uint8_t*>(buf->data()),
                           buf->size()),
                       dec.MutableRefs(), nullptr)
              .ok());
  double err = 0, ref = 0;
  for (size_t p = 0; p < pages.data.size(); ++p) {
    for (uint64_t i = 0; i < pages.Elements(); ++i) {
      err += std::pow(dec.At(p, i) - pages.At(p, i), 2);
      ref += std::pow(pages.At(p, i), 2);
    }
  }
  CHECK(std::sqrt(err / ref) < 0.5);
  // Full PCA at the same ratio is at least as good on its own samples.
  o.layer_groups = 1;
  auto full = CalibrateKvtc(calib, o);
  REQUIRE(full.ok());
  CHECK((*full)[0].keys.expected_error <=
        (*blocked)[0].keys.expected_error * 1.0001);
}

TEST_CASE("kvtc codec: a block-diagonal basis gives the dense one's bytes",
          "[kvtc_budget]") {
  // Identity blocks and values on a 1/8 grid: every product is exact, so
  // the block GEMMs and the dense GEMM must agree bit for bit.
  const Geometry g = Geo(4, 1, 8, 4, DType::kFP32);
  KvtcBasis b;
  b.features = 32;
  b.blocks = {{16, 5}, {16, 7}};
  b.components = 12;
  b.mean.assign(32, 0.25f);
  for (const KvtcBlock& k : b.blocks) {
    const KvtcBasis id = IdentityBasis(k.features, k.components, {});
    b.projection.insert(b.projection.end(), id.projection.begin(),
                        id.projection.end());
  }
  b.ranges = {{KvtcQuantType::kFp8, 0, 0, 6}, {KvtcQuantType::kIntX, 4, 6, 12}};
  REQUIRE(b.Validate("b").ok());
  KvtcBasis dense = b;
  dense.projection = DenseProjection(b);
  dense.blocks.clear();
  REQUIRE(dense.Validate("dense").ok());
  const auto blocked_cal =
      testing::MakeCalibration(g, KvtcRowKind::kPerToken, b, b);
  const auto dense_cal =
      testing::MakeCalibration(g, KvtcRowKind::kPerToken, dense, dense);
  testing::PageSet pages(g, {0, 4, 8});
  std::mt19937 rng(5);
  for (size_t p = 0; p < 3; ++p) {
    for (uint64_t i = 0; i < pages.Elements(); ++i) {
      pages.Set(p, i,
                static_cast<float>(static_cast<int>(rng() % 33) - 16) / 8);
    }
  }
  auto a = CodecFor(g, *blocked_cal)->EncodeToString(pages.Refs(), nullptr);
  auto d = CodecFor(g, *dense_cal)->EncodeToString(pages.Refs(), nullptr);
  REQUIRE(a.ok());
  REQUIRE(d.ok());
  // Equal payloads; the envelopes differ only in the fingerprint (and the
  // checksums over it).
  REQUIRE(a->size() == d->size());
  CHECK(a->substr(128) == d->substr(128));
}

TEST_CASE("kvtc calibration file: malformed blocks are refused",
          "[kvtc_budget]") {
  const Geometry g = Geo(2, 1, 8, 4, DType::kFP32);
  KvtcBasis b = IdentityBasis(16, 4, testing::Fp8All(4));
  b.blocks = {{8, 2}, {8, 2}};
  b.projection.resize(b.ProjectionElements());
  auto cal = testing::MakeCalibration(g, KvtcRowKind::kPerToken, b, b);
  REQUIRE(cal->Validate().ok());
  KvtcCalibration one = *cal;
  one.keys.blocks = {{16, 4}};
  CHECK_THAT(std::string(one.Validate().message()),
             Catch::StartsWith("calibration.keys.blocks: 1 blocks"));
  KvtcCalibration sums = *cal;
  sums.keys.blocks = {{8, 2}, {4, 2}};
  CHECK_THAT(std::string(sums.Validate().message()),
             Catch::StartsWith("calibration.keys.blocks: blocks sum to 12"));
  KvtcCalibration wide = *cal;
  wide.keys.blocks = {{8, 3}, {8, 1}};
  wide.keys.projection.resize(wide.keys.ProjectionElements());
  CHECK(wide.Validate().ok());
  wide.keys.blocks = {{2, 3}, {14, 1}};
  CHECK_THAT(std::string(wide.Validate().message()),
             Catch::StartsWith("calibration.keys.blocks[0]: 2 features x 3"));
}

// ---- Bad input (issue 17): each is refused naming the field.

TEST_CASE("kvtc calibrate bad input: too few samples for the components",
          "[kvtc_budget]") {
  const Geometry g = Geo(2, 2, 16, 16);
  const KvSamples s = Samples(g, 1, 40, 9);  // 36 non-sink rows
  CalibrateOptions o;
  o.ratios = {4};
  o.components = 50;
  auto out = CalibrateKvtc(s, o);
  REQUIRE(!out.ok());
  CHECK_THAT(std::string(out.status().message()),
             Catch::StartsWith("options.components: 50 components need at "
                               "most 64 features per row and at least 51 "
                               "rows to fit; the samples give 33 keys rows "
                               "of 64 features to fit"));
  o.components = 65;  // more than the features
  CHECK_THAT(
      std::string(CalibrateKvtc(Samples(g, 3, 64, 9), o).status().message()),
      Catch::StartsWith("options.components: 65 components"));
  o.components = 20;
  CHECK(CalibrateKvtc(s, o).ok());
}

TEST_CASE(
    "kvtc calibrate bad input: rows that do not fit the page or the "
    "layers",
    "[kvtc_budget]") {
  const Geometry g = Geo(4, 2, 16, 16);
  CalibrateOptions o;
  o.ratios = {4};
  o.row_kind = KvtcRowKind::kPerPage;
  o.page_size = 16;
  // Sequences of 12 tokens hold no whole page of 16.
  auto short_seqs = CalibrateKvtc(Samples(g, 8, 12, 1), o);
  REQUIRE(!short_seqs.ok());
  CHECK_THAT(std::string(short_seqs.status().message()),
             Catch::Contains("options.page_size=16"));
  o.row_kind = KvtcRowKind::kPerToken;
  o.layer_groups = 3;
  CHECK_THAT(
      std::string(CalibrateKvtc(Samples(g, 2, 64, 1), o).status().message()),
      Catch::StartsWith("options.layer_groups: 3 must be >= 1 and "
                        "divide the samples' 4 layers"));
  o.layer_groups = 2;
  o.row_kind = KvtcRowKind::kPerPage;
  CHECK_THAT(
      std::string(CalibrateKvtc(Samples(g, 2, 64, 1), o).status().message()),
      Catch::StartsWith("options.layer_groups: groups of layers need "
                        "per_token rows"));
}

TEST_CASE("kvtc calibrate bad input: ratios below 1 or out of reach",
          "[kvtc_budget]") {
  const Geometry g = Geo(2, 2, 16, 16);
  const KvSamples s = Samples(g, 2, 64, 1);
  CalibrateOptions o;
  o.ratios = {4, 0.5};
  CHECK_THAT(std::string(CalibrateKvtc(s, o).status().message()),
             Catch::StartsWith("options.ratios[1]: 0.5 must be finite and "
                               ">= 1"));
  o.ratios = {4, 1000};
  CHECK_THAT(std::string(CalibrateKvtc(s, o).status().message()),
             Catch::StartsWith("options.ratios[1]: 1000x leaves"));
  OnlineCalibrationOptions online;
  online.target_ratio = 0.9;
  CHECK_THAT(
      std::string(ValidateOnlineCalibration(online, g, "spec.oc").message()),
      Catch::StartsWith("spec.oc.target_ratio: 0.9 must be finite"));
}

TEST_CASE(
    "kvtc bad input: a calibration for another geometry is refused "
    "and the active codec stays",
    "[kvtc_budget]") {
  const Geometry g = Geo(2, 2, 16, 8);
  CalibrateOptions o;
  o.ratios = {4};
  o.page_size = 8;
  auto mine = CalibrateKvtc(Samples(g, 2, 64, 1), o);
  REQUIRE(mine.ok());
  const std::string mine_bytes =
      *SerializeKvtcCalibration((*mine)[0].calibration);
  Store store(StoreOptions{});
  NamespaceSpec spec;
  spec.name = "kv";
  spec.geometry = g;
  spec.codec = "kvtc";
  spec.calibration = mine_bytes;
  spec.capacity_bytes = 8 * g.PageBytes();
  auto created = store.CreateNamespace(spec, false);
  REQUIRE(created.ok());
  Namespace& ns = *created->first;
  const uint64_t before =
      ns.calibrations().tier_codec()->calibration_fingerprint();

  auto refused = [&](const KvtcCalibration& cal) {
    auto up = ns.calibrations().Upload(*SerializeKvtcCalibration(cal), false,
                                       "calibration");
    CHECK(!up.ok());
    CHECK(up.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(ns.calibrations().tier_codec()->calibration_fingerprint() == before);
    return std::string(up.status().message());
  };
  // More layers.
  const Geometry other = Geo(4, 2, 16, 8);
  auto theirs = CalibrateKvtc(Samples(other, 2, 64, 1), o);
  REQUIRE(theirs.ok());
  CHECK_THAT(refused((*theirs)[0].calibration),
             Catch::StartsWith("calibration: geometry.num_layers: 2 does not "
                               "match the calibration's 4"));
  // Per-page rows of 16-token pages for a namespace of 8-token pages.
  CalibrateOptions pp = o;
  pp.row_kind = KvtcRowKind::kPerPage;
  pp.page_size = 16;
  auto pages16 = CalibrateKvtc(Samples(g, 2, 64, 1), pp);
  REQUIRE(pages16.ok());
  CHECK_THAT(refused((*pages16)[0].calibration),
             Catch::StartsWith("calibration: geometry.page_size: 8 does not "
                               "match the calibration's 16"));
  // Another RoPE base.
  KvtcCalibration theta = (*mine)[0].calibration;
  theta.rope_theta = 500000.0f;
  CHECK_THAT(refused(theta),
             Catch::StartsWith("calibration: geometry.rope_theta: 10000"));
}

// ---- The expected error is held out.

TEST_CASE("calibration rows: the held-out split covers every row once",
          "[kvtc_budget]") {
  for (uint64_t rows : {0ull, 1ull, 2ull, 3ull, 9ull, 10ull, 36ull, 101ull,
                        1000ull, 65536ull}) {
    INFO(rows << " rows");
    const HeldOutSplit split = SplitHeldOut(rows);
    std::vector<int> seen(rows, 0);
    uint64_t held = 0;
    for (int side = 0; side < 2; ++side) {
      for (const RowRuns::Run& r : side == 0 ? split.fit : split.held_out) {
        REQUIRE(r.first + r.count <= rows);
        for (uint64_t i = r.first; i < r.first + r.count; ++i) ++seen[i];
        if (side == 1) held += r.count;
      }
    }
    for (uint64_t i = 0; i < rows; ++i) CHECK(seen[i] == 1);
    CHECK(held == (rows < 3 ? 0 : std::max<uint64_t>(1, rows / 10)));
    CHECK(split.held_out.size() <= kHeldOutStripes);
  }
  // A view reads its runs in order, across run boundaries.
  std::vector<float> data(40 * 3);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i);
  const MemoryRows base(data, 40, 3);
  const HeldOutSplit split = SplitHeldOut(40);
  const RowRuns fit(base, split.fit), held(base, split.held_out);
  REQUIRE(fit.rows() == 36);
  REQUIRE(held.rows() == 4);
  std::vector<float> got(36 * 2);
  fit.Read(0, 36, 1, 3, got.data());
  uint64_t r = 0;
  for (const RowRuns::Run& run : split.fit) {
    for (uint64_t i = run.first; i < run.first + run.count; ++i, ++r) {
      CHECK(got[r * 2] == data[i * 3 + 1]);
      CHECK(got[r * 2 + 1] == data[i * 3 + 2]);
    }
  }
}

// Relative error of keys [0] and values [1] of `pages` through `codec`
// (one page per buffer), around each feature's mean over the pages, tokens
// at positions below `sinks` left out: what a calibration's estimate
// predicts.
std::array<double, 2> MeasuredRelError(const Codec& codec,
                                       const testing::PageSet& pages,
                                       uint32_t sinks) {
  const Geometry& g = pages.g;
  testing::PageSet dec(g, pages.positions);
  const std::vector<PageRef> refs = pages.Refs();
  const std::vector<MutablePageRef> out = dec.MutableRefs();
  for (size_t p = 0; p < refs.size(); ++p) {
    auto buf = codec.EncodeToString(absl::MakeConstSpan(&refs[p], 1), nullptr);
    REQUIRE(buf.ok());
    REQUIRE(codec
                .Decode(absl::MakeConstSpan(
                            reinterpret_cast<const uint8_t*>(buf->data()),
                            buf->size()),
                        absl::MakeConstSpan(&out[p], 1), nullptr)
                .ok());
  }
  std::array<double, 2> rel{};
  for (int kv = 0; kv < 2; ++kv) {
    double err = 0, var = 0;
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
        for (uint32_t d = 0; d < g.head_dim; ++d) {
          double sum = 0, sum2 = 0;
          uint64_t n = 0;
          for (size_t p = 0; p < refs.size(); ++p) {
            for (uint32_t t = 0; t < g.page_size; ++t) {
              if (pages.positions[p] + t < sinks) continue;
              const uint64_t i = testing::ElementIndex(g, kv, l, t, h, d);
              const double x = pages.At(p, i), e = dec.At(p, i) - x;
              err += e * e;
              sum += x;
              sum2 += x * x;
              ++n;
            }
          }
          var += sum2 - sum * sum / double(n);
        }
      }
    }
    rel[kv] = std::sqrt(err / var);
  }
  return rel;
}

// The calibration's estimate for keys (kv 0) or values (1) is the held-out
// error it reports, and within 20% of `actual`, the error on new rows.
void CheckEstimate(const CalibrationOutcome& c,
                   const std::array<double, 2>& actual, int kv) {
  const float expected = kv == 0 ? c.calibration.estimate.keys_rel_error
                                 : c.calibration.estimate.values_rel_error;
  INFO((kv == 0 ? "keys" : "values")
       << ": expected " << expected << ", on the fitted rows "
       << c.fit_rel_error[kv] << ", measured on new rows " << actual[kv]);
  CHECK(expected == Approx(c.rel_error[kv]).epsilon(1e-5));
  CHECK(expected == Approx(actual[kv]).epsilon(0.2));
}

TEST_CASE(
    "kvtc calibrate: the expected relative error is measured on held-out "
    "rows and predicts new data's",
    "[kvtc_budget]") {
  CalibrateOptions o;
  o.group_sizes = {8};
  o.ratios = {4};
  SECTION("rows with no low-rank structure, fewer than the features") {
    // 120 rows of 128 iid Gaussian features: a basis fitted to them spans
    // them, so their own error is the quantization's alone, while new rows
    // keep ~1/6 of their energy outside it (the random-weight model of
    // bench/ttft_bench.py, at small size).
    const Geometry g = Geo(2, 2, 32, 16);
    KvSamples s;
    s.num_layers = g.num_layers;
    s.num_kv_heads = g.num_kv_heads;
    s.head_dim = g.head_dim;
    s.rope_style = RopeStyle::kNone;
    s.tokens = 128;
    const uint64_t f = s.FeaturesPerToken();
    std::mt19937_64 rng(11);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (uint64_t t = 0; t < s.tokens; ++t) {
      s.positions.push_back(static_cast<int64_t>(t % 64));
    }
    for (std::vector<float>* x : {&s.k, &s.v}) {
      x->resize(s.tokens * f);
      for (float& e : *x) e = n01(rng);
    }
    o.ratios = {2};  // bits for every component the fit could find
    auto out = CalibrateKvtc(s, o);
    REQUIRE(out.ok());
    const CalibrationOutcome& c = (*out)[0];
    CHECK(c.fit_rows == 108);
    CHECK(c.held_out_rows == 12);
    std::vector<uint64_t> firsts;
    for (uint64_t p = 1; p <= 32; ++p) firsts.push_back(16 * p);
    testing::PageSet fresh(g, firsts);
    fresh.FillRandom(12, 1.0f);
    const std::array<double, 2> actual =
        MeasuredRelError(*CodecFor(g, c.calibration), fresh, o.sink_tokens);
    for (int kv = 0; kv < 2; ++kv) {
      CheckEstimate(c, actual, kv);
      CHECK(actual[kv] > 0.3);
      // The fitted rows' own error, what the estimate used to be, is the
      // optimistic one.
      CHECK(c.fit_rel_error[kv] < 0.5 * actual[kv]);
    }
  }
  SECTION("low-rank rows") {
    const Geometry g = Geo(4, 2, 32, 16);
    auto out = CalibrateKvtc(Samples(g, 6, 256, 21), o);
    REQUIRE(out.ok());
    const CalibrationOutcome& c = (*out)[0];
    const testing::PageSet held = PagesOf(g, Samples(g, 3, 256, 22));
    const std::array<double, 2> actual =
        MeasuredRelError(*CodecFor(g, c.calibration), held, o.sink_tokens);
    for (int kv = 0; kv < 2; ++kv) CheckEstimate(c, actual, kv);
  }
}

}  // namespace
}  // namespace kvharbor
