// Round trips of the KVTC codec: error bounds from the spec's quantizers for
// every bit width, row kind, dtype and layout; RoPE; sinks; PCA.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/codec/kvtc/kvtc_codec.h"
#include "core/codec/kvtc/kvtc_stages.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"

namespace kvharbor {
namespace {

using testing::FeaturesFor;
using testing::MakeCalibration;
using testing::PageSet;

// The rows the codec projects, rebuilt independently with ElementIndex:
// element (row, col) of kv is page `page[row*F+col]`, element `index[...]`;
// `sink[...]` marks tokens at positions < sink_tokens.
struct Rows {
  uint64_t rows = 0, features = 0;
  std::vector<size_t> page;
  std::vector<uint64_t> index;
  std::vector<bool> sink;
};

Rows BuildRows(const PageSet& ps, KvtcRowKind kind, int kv, uint32_t sinks) {
  const Geometry& g = ps.g;
  Rows r;
  r.features = FeaturesFor(g, kind);
  auto add = [&](size_t p, uint32_t l, uint32_t t, uint32_t h, uint32_t d,
                 bool sink) {
    r.page.push_back(p);
    r.index.push_back(testing::ElementIndex(g, kv, l, t, h, d));
    r.sink.push_back(sink);
  };
  for (size_t p = 0; p < ps.data.size(); ++p) {
    if (kind == KvtcRowKind::kPerToken) {
      for (uint32_t t = 0; t < g.page_size; ++t) {
        if (ps.positions[p] + t < sinks) continue;
        for (uint32_t l = 0; l < g.num_layers; ++l)
          for (uint32_t h = 0; h < g.num_kv_heads; ++h)
            for (uint32_t d = 0; d < g.head_dim; ++d) add(p, l, t, h, d, false);
      }
    } else {
      for (uint32_t l = 0; l < g.num_layers; ++l)
        for (uint32_t t = 0; t < g.page_size; ++t)
          for (uint32_t h = 0; h < g.num_kv_heads; ++h)
            for (uint32_t d = 0; d < g.head_dim; ++d)
              add(p, l, t, h, d, ps.positions[p] + t < sinks);
    }
  }
  r.rows = r.page.size() / r.features;
  return r;
}

// Relative rounding of the page dtype (half an ulp) plus an absolute floor.
double DTypeSlack(DType d, double v) {
  switch (d) {
    case DType::kFP32:
      return 1e-6 * std::fabs(v) + 1e-6;
    case DType::kBF16:
      return std::fabs(v) * std::ldexp(1.0, -8) + 1e-6;
    case DType::kFP16:
      return std::fabs(v) * std::ldexp(1.0, -11) + 1e-6;
    case DType::kFP8E4M3:
      return std::fabs(v) * std::ldexp(1.0, -4) + std::ldexp(1.0, -10);
    case DType::kUnspecified:
      break;
  }
  return 0;
}

// Checks every projected row of `kv`: the L2 error over non-sink columns is
// within the quantizers' bound (half an IntX step, FP8 relative rounding,
// dropped components in full), transported through the orthonormal basis.
void CheckRows(const PageSet& in, const PageSet& out, const KvtcBasis& basis,
               KvtcRowKind kind, int kv, uint32_t sinks) {
  const Rows r = BuildRows(in, kind, kv, sinks);
  const uint64_t f = r.features, c = basis.components;
  for (uint64_t row = 0; row < r.rows; ++row) {
    std::vector<double> x(f);
    for (uint64_t i = 0; i < f; ++i) {
      const size_t k = row * f + i;
      x[i] = r.sink[k] ? 0.0 : in.At(r.page[k], r.index[k]) - basis.mean[i];
    }
    std::vector<double> y(c, 0.0);
    for (uint64_t i = 0; i < f; ++i)
      for (uint64_t j = 0; j < c; ++j)
        y[j] += x[i] * basis.projection[i * c + j];
    std::vector<double> err(c);
    for (uint64_t j = 0; j < c; ++j) err[j] = std::fabs(y[j]);  // dropped
    for (const KvtcRange& range : basis.ranges) {
      double mn = 1e300, mx = -1e300;
      for (uint64_t j = range.start_idx; j < range.end_idx; ++j) {
        mn = std::min(mn, y[j]);
        mx = std::max(mx, y[j]);
      }
      for (uint64_t j = range.start_idx; j < range.end_idx; ++j) {
        err[j] =
            range.quant_type == KvtcQuantType::kFp8
                ? std::fabs(y[j]) * std::ldexp(1.0, -4) + std::ldexp(1.0, -10)
                : 0.5 * (mx - mn) / ((1 << range.int_bits) - 1);
      }
    }
    // Plus what lies outside the basis' span (truncated bases).
    double x2 = 0, y2 = 0;
    for (double v : x) x2 += v * v;
    for (double v : y) y2 += v * v;
    double bound2 = std::max(0.0, x2 - y2), err2 = 0, slack = 0;
    for (double e : err) bound2 += e * e;
    for (uint64_t i = 0; i < f; ++i) {
      const size_t k = row * f + i;
      if (r.sink[k]) continue;
      const double want = in.At(r.page[k], r.index[k]);
      const double got = out.At(r.page[k], r.index[k]);
      err2 += (got - want) * (got - want);
      slack += DTypeSlack(in.g.dtype, want);
    }
    INFO("kv " << kv << " row " << row);
    REQUIRE(std::sqrt(err2) <= std::sqrt(bound2) * 1.0001 + slack + 1e-4);
  }
}

// Sinks are FP8 of the raw value, then the page dtype: exact.
void CheckSinks(const PageSet& in, const PageSet& out, uint32_t sinks) {
  const Geometry& g = in.g;
  int checked = 0;
  for (size_t p = 0; p < in.data.size(); ++p) {
    for (uint32_t t = 0; t < g.page_size; ++t) {
      if (in.positions[p] + t >= sinks) continue;
      for (int kv = 0; kv < 2; ++kv)
        for (uint32_t l = 0; l < g.num_layers; ++l)
          for (uint32_t h = 0; h < g.num_kv_heads; ++h)
            for (uint32_t d = 0; d < g.head_dim; ++d) {
              const uint64_t i = testing::ElementIndex(g, kv, l, t, h, d);
              const float want = Fp8E4M3ToFloat(FloatToFp8E4M3(in.At(p, i)));
              REQUIRE(out.At(p, i) == want);
              ++checked;
            }
    }
  }
  (void)checked;
}

struct Trip {
  PageSet out;
  std::string buffer;
};

Trip RoundTrip(const KvtcCodec& codec, const PageSet& in, bool zstd = false) {
  CodecWorkspace ws;
  auto buf = codec.EncodeToString(in.Refs(), &ws);
  REQUIRE(buf.ok());
  PageSet out(in.g, in.positions);
  auto refs = out.MutableRefs();
  const absl::Status s = codec.Decode(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(buf->data()),
                          buf->size()),
      refs, &ws);
  INFO(s.ToString());
  REQUIRE(s.ok());
  (void)zstd;
  return {std::move(out), *std::move(buf)};
}

std::unique_ptr<KvtcCodec> MakeCodec(const Geometry& g,
                                     std::shared_ptr<KvtcCalibration> cal,
                                     bool zstd = false) {
  CodecParams p;
  p.geometry = g;
  p.calibration = cal;
  p.zstd = zstd;
  auto codec = KvtcCodec::Create(p);
  INFO(codec.status().ToString());
  REQUIRE(codec.ok());
  return *std::move(codec);
}

std::vector<KvtcRange> MixedRanges(uint64_t c, int bits) {
  // FP8 head, IntX middle, a dropped gap, IntX tail.
  return {{KvtcQuantType::kFp8, 0, 0, c / 4},
          {KvtcQuantType::kIntX, bits, c / 4, c / 2 + 1},
          {KvtcQuantType::kIntX, bits, c / 2 + 3, c}};
}

TEST_CASE("KVTC identity basis: per-element bounds, all widths and kinds",
          "[kvtc]") {
  for (KvtcRowKind kind : {KvtcRowKind::kPerToken, KvtcRowKind::kPerPage}) {
    for (int bits : {1, 2, 4, 8}) {
      for (PageLayout layout : {PageLayout::kKvLayerTokenHeadDim,
                                PageLayout::kLayerKvTokenHeadDim}) {
        INFO("kind " << KvtcRowKindName(kind) << " bits " << bits << " layout "
                     << PageLayoutName(layout));
        const Geometry g = testing::SmallGeometry(DType::kFP32, layout);
        const uint64_t f = FeaturesFor(g, kind);
        auto cal = MakeCalibration(
            g, kind, IdentityBasis(f, f, MixedRanges(f, bits)),
            IdentityBasis(f, f, {{KvtcQuantType::kIntX, bits, 0, f}}));
        auto codec = MakeCodec(g, cal);
        PageSet in(g, {0, 4, 20});
        in.FillRandom(bits * 10 + int(kind), 1.0f);
        Trip t = RoundTrip(*codec, in);
        CheckRows(in, t.out, cal->keys, kind, 0, 0);
        CheckRows(in, t.out, cal->values, kind, 1, 0);
      }
    }
  }
}

TEST_CASE("KVTC random orthonormal basis, full and truncated", "[kvtc]") {
  for (KvtcRowKind kind : {KvtcRowKind::kPerToken, KvtcRowKind::kPerPage}) {
    const Geometry g = testing::SmallGeometry(DType::kFP32);
    const uint64_t f = FeaturesFor(g, kind);
    for (uint64_t c : {f, f / 2}) {
      INFO("kind " << KvtcRowKindName(kind) << " components " << c);
      auto cal = MakeCalibration(
          g, kind, RandomOrthonormalBasis(f, c, 1, MixedRanges(c, 8)),
          RandomOrthonormalBasis(f, c, 2, testing::Fp8All(c)));
      auto codec = MakeCodec(g, cal);
      PageSet in(g, {8, 12});
      in.FillRandom(5, 2.0f);
      Trip t = RoundTrip(*codec, in);
      CheckRows(in, t.out, cal->keys, kind, 0, 0);
      CheckRows(in, t.out, cal->values, kind, 1, 0);
    }
  }
}

TEST_CASE("KVTC accepts every page dtype", "[kvtc]") {
  for (DType dtype :
       {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3}) {
    INFO("dtype " << DTypeName(dtype));
    const Geometry g = testing::SmallGeometry(dtype);
    const uint64_t f = FeaturesFor(g, KvtcRowKind::kPerToken);
    auto cal = MakeCalibration(
        g, KvtcRowKind::kPerToken,
        RandomOrthonormalBasis(f, f, 3, MixedRanges(f, 4)),
        IdentityBasis(f, f, testing::Fp8All(f)), /*sink_tokens=*/4);
    auto codec = MakeCodec(g, cal);
    PageSet in(g, {0, 4, 8});
    in.FillRandom(9, 1.5f);
    Trip t = RoundTrip(*codec, in);
    CheckRows(in, t.out, cal->keys, KvtcRowKind::kPerToken, 0, 4);
    CheckSinks(in, t.out, 4);
    // Values use an identity FP8 basis: FP8 of the value, exactly.
    const Rows r = BuildRows(in, KvtcRowKind::kPerToken, 1, 4);
    for (size_t k = 0; k < r.page.size(); ++k) {
      const float want =
          Fp8E4M3ToFloat(FloatToFp8E4M3(in.At(r.page[k], r.index[k])));
      REQUIRE(t.out.At(r.page[k], r.index[k]) == want);
    }
  }
}

TEST_CASE("KVTC keeps attention sinks in FP8, both row kinds", "[kvtc]") {
  for (KvtcRowKind kind : {KvtcRowKind::kPerToken, KvtcRowKind::kPerPage}) {
    INFO("kind " << KvtcRowKindName(kind));
    const Geometry g = testing::SmallGeometry(DType::kBF16);
    const uint64_t f = FeaturesFor(g, kind);
    auto cal = MakeCalibration(
        g, kind, RandomOrthonormalBasis(f, f, 4, MixedRanges(f, 8)),
        RandomOrthonormalBasis(f, f, 5, MixedRanges(f, 8)), /*sinks=*/6);
    auto codec = MakeCodec(g, cal);
    // Page 0: all 4 tokens sinks; page 1 at 2: tokens 0..3 -> positions 2..5
    // all sinks; page 2 at 5: token 0 is a sink; page 3 none.
    PageSet in(g, {0, 2, 5, 40});
    in.FillRandom(6, 1.0f);
    Trip t = RoundTrip(*codec, in);
    CheckSinks(in, t.out, 6);
    CheckRows(in, t.out, cal->keys, kind, 0, 6);
    CheckRows(in, t.out, cal->values, kind, 1, 6);
    auto layout = codec->PayloadLayout(in.positions);
    REQUIRE(layout.ok());
    CHECK(layout->sink_rows == 4 + 4 + 1);
  }
  // A batch of sinks only has no projected rows (per token).
  const Geometry g = testing::SmallGeometry(DType::kFP32);
  const uint64_t f = FeaturesFor(g, KvtcRowKind::kPerToken);
  auto cal = MakeCalibration(g, KvtcRowKind::kPerToken,
                             IdentityBasis(f, f, testing::IntXAll(f, 2)),
                             IdentityBasis(f, f, testing::IntXAll(f, 2)), 4);
  auto codec = MakeCodec(g, cal);
  PageSet in(g, {0});
  in.FillRandom(7, 1.0f);
  Trip t = RoundTrip(*codec, in);
  CheckSinks(in, t.out, 4);
}

// Keys are RoPE(position) of one position-free vector per (layer, head): with
// RoPE undone and that vector as the mean, the centered keys vanish and even
// 1-bit quantization reconstructs them; the wrong rotation style does not.
TEST_CASE("KVTC undoes and redoes RoPE in both styles", "[kvtc]") {
  for (RopeStyle data_style :
       {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    Geometry g = testing::SmallGeometry(DType::kFP32);
    g.rope_theta = 10000.0f;
    const uint64_t f = FeaturesFor(g, KvtcRowKind::kPerToken);
    std::mt19937 rng{static_cast<uint32_t>(data_style)};
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> k0(f);
    for (float& v : k0) v = dist(rng);
    PageSet in(g, {100, 104, 4000});
    in.FillRandom(8, 1.0f);  // values (keys overwritten below)
    std::vector<float> cos(g.head_dim / 2), sin(g.head_dim / 2);
    for (size_t p = 0; p < in.data.size(); ++p) {
      for (uint32_t t = 0; t < g.page_size; ++t) {
        RopeCosSin(in.positions[p] + t, g.head_dim, g.rope_theta, cos.data(),
                   sin.data());
        for (uint32_t l = 0; l < g.num_layers; ++l)
          for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
            std::vector<float> v(
                k0.begin() + (l * g.num_kv_heads + h) * g.head_dim,
                k0.begin() + (l * g.num_kv_heads + h + 1) * g.head_dim);
            RotateRope(v.data(), g.head_dim, data_style, cos.data(), sin.data(),
                       false);
            for (uint32_t d = 0; d < g.head_dim; ++d)
              in.Set(p, testing::ElementIndex(g, 0, l, t, h, d), v[d]);
          }
      }
    }
    for (RopeStyle cal_style :
         {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
      INFO("data " << RopeStyleName(data_style) << " calibration "
                   << RopeStyleName(cal_style));
      KvtcBasis keys = IdentityBasis(f, f, testing::IntXAll(f, 1));
      keys.mean = k0;
      auto cal = MakeCalibration(g, KvtcRowKind::kPerToken, std::move(keys),
                                 IdentityBasis(f, f, testing::Fp8All(f)));
      cal->rope_style = cal_style;
      cal->rope_theta = g.rope_theta;
      auto codec = MakeCodec(g, cal);
      Trip t = RoundTrip(*codec, in);
      double max_err = 0;
      const Rows r = BuildRows(in, KvtcRowKind::kPerToken, 0, 0);
      for (size_t k = 0; k < r.page.size(); ++k) {
        max_err =
            std::max(max_err, double(std::fabs(t.out.At(r.page[k], r.index[k]) -
                                               in.At(r.page[k], r.index[k]))));
      }
      if (cal_style == data_style) {
        CHECK(max_err < 1e-4);
      } else {
        CHECK(max_err > 0.1);
      }
    }
  }
}

TEST_CASE("KVTC with a PCA calibration compresses low-rank data", "[kvtc]") {
  const Geometry g = testing::SmallGeometry(DType::kBF16);
  const uint64_t f = FeaturesFor(g, KvtcRowKind::kPerToken);
  const uint64_t rank = 4;
  std::mt19937 rng(21);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> basis(f * rank), offset(f);
  for (float& v : basis) v = dist(rng);
  for (float& v : offset) v = 3.0f * dist(rng);
  auto sample = [&](float* out) {
    float z[rank];
    for (float& v : z) v = dist(rng);
    for (uint64_t i = 0; i < f; ++i) {
      float s = offset[i] + 0.01f * dist(rng);
      for (uint64_t j = 0; j < rank; ++j) s += basis[i * rank + j] * z[j];
      out[i] = s;
    }
  };
  const uint64_t n = 400;
  std::vector<float> samples(n * f);
  for (uint64_t r = 0; r < n; ++r) sample(&samples[r * f]);
  const std::vector<KvtcRange> ranges = {{KvtcQuantType::kFp8, 0, 0, 2},
                                         {KvtcQuantType::kIntX, 4, 2, 4},
                                         {KvtcQuantType::kIntX, 2, 4, 6}};
  auto pca = PcaBasis(samples, n, f, 6, ranges);
  REQUIRE(pca.ok());
  // Orthonormal columns, decreasing variance.
  for (uint64_t a = 0; a < 6; ++a)
    for (uint64_t b = 0; b < 6; ++b) {
      double dot = 0;
      for (uint64_t i = 0; i < f; ++i)
        dot += double(pca->projection[i * 6 + a]) * pca->projection[i * 6 + b];
      CHECK(dot == Approx(a == b ? 1.0 : 0.0).margin(1e-5));
    }
  auto cal = MakeCalibration(g, KvtcRowKind::kPerToken, *pca, *pca, 4);
  auto codec = MakeCodec(g, cal);
  const size_t num_pages = 16;
  std::vector<uint64_t> positions;
  for (size_t p = 0; p < num_pages; ++p) positions.push_back(64 + 4 * p);
  PageSet in(g, positions);
  for (size_t p = 0; p < num_pages; ++p) {
    for (uint32_t t = 0; t < g.page_size; ++t)
      for (int kv = 0; kv < 2; ++kv) {
        std::vector<float> x(f);
        sample(x.data());
        for (uint32_t l = 0; l < g.num_layers; ++l)
          for (uint32_t h = 0; h < g.num_kv_heads; ++h)
            for (uint32_t d = 0; d < g.head_dim; ++d)
              in.Set(p, testing::ElementIndex(g, kv, l, t, h, d),
                     x[(l * g.num_kv_heads + h) * g.head_dim + d]);
      }
  }
  Trip t = RoundTrip(*codec, in);
  double err2 = 0, sig2 = 0;
  for (size_t p = 0; p < num_pages; ++p)
    for (uint64_t i = 0; i < in.Elements(); ++i) {
      const double c = in.At(p, i) - offset[i % f];  // signal around the mean
      err2 += std::pow(t.out.At(p, i) - in.At(p, i), 2);
      sig2 += c * c;
    }
  CHECK(std::sqrt(err2 / sig2) < 0.2);
  // 64 bf16 bytes per row become 2 + 1 + 1 bytes of codes and 16 of min/max.
  const double ratio = double(num_pages) * g.PageBytes() / t.buffer.size();
  CHECK(ratio > 2.0);
}

TEST_CASE("KVTC sizes: EncodedSize exact, MaxEncodedSize bounds, zstd",
          "[kvtc]") {
  const Geometry g = testing::SmallGeometry(DType::kBF16);
  const uint64_t f = FeaturesFor(g, KvtcRowKind::kPerToken);
  auto cal = MakeCalibration(g, KvtcRowKind::kPerToken,
                             IdentityBasis(f, f / 2, MixedRanges(f / 2, 2)),
                             IdentityBasis(f, f / 2, MixedRanges(f / 2, 4)), 4);
  auto plain = MakeCodec(g, cal);
  auto packed = MakeCodec(g, cal, /*zstd=*/true);
  for (std::vector<uint64_t> pos : std::vector<std::vector<uint64_t>>{
           {0}, {3}, {0, 4, 8}, {100, 0, 1, 2}, {8, 12, 16, 20, 24, 28}}) {
    PageSet in(g, pos);
    in.FillRandom(pos.size(), 0.5f);
    // Low-entropy content so that zstd wins.
    for (uint64_t i = 0; i < in.Elements(); i += 2) in.Set(0, i, 0.0f);
    Trip a = RoundTrip(*plain, in);
    Trip b = RoundTrip(*packed, in);
    auto exact = plain->EncodedSize(in.Refs());
    auto most = plain->MaxEncodedSize(pos.size());
    REQUIRE(exact.ok());
    REQUIRE(most.ok());
    CHECK(a.buffer.size() == *exact);
    CHECK(*exact <= *most);
    CHECK(b.buffer.size() <= a.buffer.size());
    CHECK(a.out.data == b.out.data);  // zstd is lossless
  }
  CHECK(!plain->MaxEncodedSize(0).ok());
  // Constant pages compress: the zstd flag is set and the result decodes.
  PageSet zeros(g, {8, 12, 16});
  for (size_t p = 0; p < 3; ++p)
    for (uint64_t i = 0; i < zeros.Elements(); ++i) zeros.Set(p, i, 0.25f);
  Trip a = RoundTrip(*plain, zeros);
  Trip b = RoundTrip(*packed, zeros);
  CHECK(b.buffer.size() < a.buffer.size() / 2);
  CHECK((uint8_t(b.buffer[12]) & kEnvelopeFlagZstd) != 0);
  CHECK(a.out.data == b.out.data);
}

}  // namespace
}  // namespace kvharbor
