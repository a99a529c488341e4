// Gather + mean-subtract (RoPE undo), mean-add + scatter (RoPE redo), the
// RoPE table and the sink kernels against a CPU reference written with the
// core stages (core/codec/kvtc/kvtc_stages.h, core/base/float_formats.h), bit
// for bit, over dtypes x layouts x row kinds x RoPE styles x sink positions.
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/base/float_formats.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/codec/kvtc/kvtc_stages.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/gather_mean_subtract.h"
#include "cuda/kernels/mean_add_scatter.h"
#include "cuda/kernels/rope_table.h"
#include "cuda/kernels/sink_fp8.h"
#include "tests/cuda/cuda_test_util.h"

namespace kvharbor {
namespace gpu {
namespace {

using testing::DeviceBuf;
using testing::ElementToFloat;
using testing::FloatToElement;
using testing::SameBits;

struct Batch {
  Geometry g;
  KvtcRowKind kind = KvtcRowKind::kPerToken;
  RopeStyle rope = RopeStyle::kNone;
  float theta = 10000.0f;
  uint32_t sink_tokens = 4;
  std::vector<uint64_t> positions;
  std::vector<std::vector<uint8_t>> pages;  // host copies
  // Device side: pages scattered in one arena (reverse order, gaps).
  std::unique_ptr<DeviceBuf> arena;
  std::vector<size_t> offsets;
  std::vector<KvtcPageInfo> infos;
  std::vector<KvtcTokenRef> rows, sinks;
  std::unique_ptr<DeviceBuf> d_infos, d_rows, d_sinks, d_cos, d_sin;
  std::vector<float> cos, sin;  // CPU tables [pages * page_size][D / 2]
  bool aligned16 = true;        // every page 16-byte aligned

  uint64_t hd() const { return uint64_t{g.num_kv_heads} * g.head_dim; }
  uint64_t Features() const {
    return (kind == KvtcRowKind::kPerToken ? g.num_layers : g.page_size) * hd();
  }
  uint64_t NumRows() const {
    return kind == KvtcRowKind::kPerToken ? rows.size()
                                          : positions.size() * g.num_layers;
  }
  KvtcPageShape Shape() const {
    return {g.num_layers,
            g.num_kv_heads,
            g.head_dim,
            g.page_size,
            static_cast<int>(g.dtype),
            static_cast<int>(g.layout)};
  }
};

void Build(Batch& b, std::mt19937_64& rng) {
  const size_t n = b.positions.size();
  const size_t pb = b.g.PageBytes();
  b.arena = std::make_unique<DeviceBuf>(n * (pb + 256));
  b.infos.resize(n);
  b.pages.resize(n);
  for (size_t p = 0; p < n; ++p) {
    b.pages[p] =
        testing::RandomElements(b.g.dtype, b.g.ElementsPerPage(), 1.0f, rng);
    const size_t off = (n - 1 - p) * (pb + 256) + 128;
    b.arena->Upload(b.pages[p].data(), pb, off);
    b.offsets.push_back(off);
    const uint64_t pos = b.positions[p];
    const uint32_t s = pos >= b.sink_tokens
                           ? 0
                           : static_cast<uint32_t>(std::min<uint64_t>(
                                 b.g.page_size, b.sink_tokens - pos));
    b.infos[p] = {b.arena->bytes() + off, pos, s, 0};
    b.aligned16 &=
        reinterpret_cast<uintptr_t>(b.arena->bytes() + off) % 16 == 0;
    for (uint32_t t = 0; t < b.g.page_size; ++t) {
      if (t < s) {
        b.sinks.push_back({uint32_t(p), t});
      } else {
        b.rows.push_back({uint32_t(p), t});
      }
    }
  }
  auto up = [](const void* src, size_t bytes) {
    auto d = std::make_unique<DeviceBuf>(bytes);
    if (bytes > 0) d->Upload(src, bytes);
    return d;
  };
  b.d_infos = up(b.infos.data(), n * sizeof(KvtcPageInfo));
  b.d_rows = up(b.rows.data(), b.rows.size() * sizeof(KvtcTokenRef));
  b.d_sinks = up(b.sinks.data(), b.sinks.size() * sizeof(KvtcTokenRef));
  const uint32_t half = b.g.head_dim / 2;
  b.cos.assign(n * b.g.page_size * half, 0.0f);
  b.sin.assign(n * b.g.page_size * half, 0.0f);
  if (half > 0) {
    for (size_t p = 0; p < n; ++p) {
      for (uint32_t t = 0; t < b.g.page_size; ++t) {
        const size_t at = (p * b.g.page_size + t) * half;
        RopeCosSin(b.positions[p] + t, b.g.head_dim, b.theta, &b.cos[at],
                   &b.sin[at]);
      }
    }
  }
  b.d_cos = up(b.cos.data(), b.cos.size() * 4);
  b.d_sin = up(b.sin.data(), b.sin.size() * 4);
}

// (page, layer, token, column) of every unit of row r, calling f for each.
template <typename F>
void ForEachUnit(const Batch& b, uint64_t r, F f) {
  if (b.kind == KvtcRowKind::kPerToken) {
    for (uint32_t l = 0; l < b.g.num_layers; ++l) {
      f(b.rows[r].page, l, b.rows[r].token, uint64_t{l} * b.hd());
    }
  } else {
    const uint32_t p = static_cast<uint32_t>(r / b.g.num_layers);
    const uint32_t l = static_cast<uint32_t>(r % b.g.num_layers);
    for (uint32_t t = 0; t < b.g.page_size; ++t) f(p, l, t, t * b.hd());
  }
}

std::vector<float> GatherRef(const Batch& b, int kv,
                             const std::vector<float>& mean) {
  const uint64_t F = b.Features(), hd = b.hd();
  const KvtcPageShape s = b.Shape();
  const size_t es = DTypeSize(b.g.dtype);
  const uint32_t half = b.g.head_dim / 2;
  std::vector<float> x(b.NumRows() * F);
  for (uint64_t r = 0; r < b.NumRows(); ++r) {
    ForEachUnit(b, r, [&](uint32_t p, uint32_t l, uint32_t t, uint64_t col) {
      float* dst = &x[r * F + col];
      if (b.kind == KvtcRowKind::kPerPage && t < b.infos[p].sinks) {
        std::fill(dst, dst + hd, 0.0f);
        return;
      }
      const uint8_t* src = b.pages[p].data() + s.RunIndex(kv, l, t) * es;
      for (uint64_t e = 0; e < hd; ++e)
        dst[e] = ElementToFloat(b.g.dtype, src + e * es);
      if (kv == 0 && b.rope != RopeStyle::kNone) {
        const size_t at = (size_t{p} * b.g.page_size + t) * half;
        for (uint32_t h = 0; h < b.g.num_kv_heads; ++h) {
          RotateRope(dst + h * b.g.head_dim, b.g.head_dim, b.rope, &b.cos[at],
                     &b.sin[at], /*inverse=*/true);
        }
      }
      for (uint64_t e = 0; e < hd; ++e) dst[e] -= mean[col + e];
    });
  }
  return x;
}

std::vector<float> RandomVec(size_t n, float scale, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return v;
}

std::vector<Batch> Cases() {
  std::vector<Batch> out;
  for (DType dt : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3}) {
    for (PageLayout lay :
         {PageLayout::kKvLayerTokenHeadDim, PageLayout::kLayerKvTokenHeadDim}) {
      for (KvtcRowKind kind : {KvtcRowKind::kPerToken, KvtcRowKind::kPerPage}) {
        for (RopeStyle rope : {RopeStyle::kNone, RopeStyle::kInterleaved,
                               RopeStyle::kHalfSplit}) {
          Batch b;
          b.g.num_layers = 3;
          b.g.num_kv_heads = 2;
          // 7: scalar path only; 8 and 16: the vector path too.
          b.g.head_dim = rope != RopeStyle::kNone                  ? 16
                         : lay == PageLayout::kKvLayerTokenHeadDim ? 7
                                                                   : 8;
          b.g.page_size = kind == KvtcRowKind::kPerToken ? 5 : 4;
          b.g.dtype = dt;
          b.g.layout = lay;
          b.kind = kind;
          b.rope = rope;
          b.positions = {0, 5, 1000003, 2, (uint64_t{1} << 40) + 17};
          out.push_back(std::move(b));
        }
      }
    }
  }
  return out;
}

std::string Describe(const Batch& b) {
  return absl::StrCat(DTypeName(b.g.dtype), " ", PageLayoutName(b.g.layout),
                      " ", KvtcRowKindName(b.kind), " ", RopeStyleName(b.rope));
}

TEST_CASE("Gather + mean-subtract matches the CPU reference",
          "[cuda][gather]") {
  std::mt19937_64 rng(3);
  int vector_runs = 0;
  const auto native = ResolveNativeFp8(Fp8Path::kAuto);
  REQUIRE(native.ok());
  for (Batch& b : Cases()) {
    Build(b, rng);
    for (int kv = 0; kv < 2; ++kv) {
      const uint64_t F = b.Features(), rows = b.NumRows();
      const std::vector<float> mean = RandomVec(F, 0.3f, rng);
      const std::vector<float> want = GatherRef(b, kv, mean);
      DeviceBuf dmean(F * 4);
      dmean.Upload(mean.data(), F * 4);
      for (bool bf16 : {false, true}) {
        for (int path = 0; path < 3; ++path) {
          // 0, 1: scalar path (software, native FP8); 2: vector path.
          const bool nat = path == 1 && *native;
          const bool vec = path == 2;
          // Two chunks of rows, as the codec runs them.
          DeviceBuf out(rows * F * 4);
          out.Fill(0xA7);
          DeviceBuf err(8);
          err.Fill(0xFF);
          const uint32_t split = static_cast<uint32_t>(rows / 2);
          for (auto [first, n] : {std::pair<uint32_t, uint32_t>{0, split},
                                  {split, uint32_t(rows) - split}}) {
            GatherMeanSubtractArgs a;
            a.shape = b.Shape();
            a.row_kind = b.kind;
            a.kv = kv;
            a.rope = kv == 0 ? b.rope : RopeStyle::kNone;
            a.pages = b.d_infos->as<KvtcPageInfo>();
            a.num_pages = uint32_t(b.positions.size());
            a.rows = b.d_rows->as<KvtcTokenRef>();
            a.first_row = first;
            a.num_rows = n;
            a.mean = dmean.as<float>();
            a.rope_cos = b.d_cos->as<float>();
            a.rope_sin = b.d_sin->as<float>();
            a.out = out.bytes() + uint64_t{first} * F * (bf16 ? 2 : 4);
            a.out_bf16 = bf16;
            a.native_fp8 = nat;
            a.error = err.as<unsigned long long>();
            a.pages_aligned16 = b.aligned16;
            a.allow_vector = vec;
            vector_runs += GatherMeanSubtractVectorized(a);
            KVH_STATUS_REQUIRE(LaunchGatherMeanSubtract(a, nullptr));
          }
          unsigned long long code;
          err.Download(&code, 8);
          REQUIRE(code == kKvtcNoError);
          INFO(Describe(b) << " kv " << kv << " bf16 " << bf16 << " path "
                           << path);
          if (bf16) {
            std::vector<uint16_t> got(rows * F);
            out.Download(got.data(), got.size() * 2);
            for (size_t i = 0; i < got.size(); ++i) {
              INFO("index " << i);
              REQUIRE(got[i] == FloatToBf16(want[i]));
            }
          } else {
            std::vector<float> got(rows * F);
            out.Download(got.data(), got.size() * 4);
            for (size_t i = 0; i < got.size(); ++i) {
              INFO("index " << i << " got " << got[i] << " want " << want[i]);
              REQUIRE(SameBits(got[i], want[i]));
            }
          }
        }
      }
    }
  }
  REQUIRE(vector_runs > 0);
}

TEST_CASE("Mean-add + scatter matches the CPU reference", "[cuda][scatter]") {
  std::mt19937_64 rng(5);
  int vector_runs = 0;
  const auto native = ResolveNativeFp8(Fp8Path::kAuto);
  REQUIRE(native.ok());
  for (Batch& b : Cases()) {
    Build(b, rng);
    const uint64_t F = b.Features(), rows = b.NumRows(), hd = b.hd();
    const size_t es = DTypeSize(b.g.dtype), pb = b.g.PageBytes();
    const KvtcPageShape s = b.Shape();
    const uint32_t half = b.g.head_dim / 2;
    for (int path = 0; path < 3; ++path) {
      const bool nat = path == 1 && *native;
      b.arena->Fill(0xC3);  // sentinel: untouched bytes must stay
      std::vector<std::vector<uint8_t>> want(b.positions.size(),
                                             std::vector<uint8_t>(pb, 0xC3));
      for (int kv = 0; kv < 2; ++kv) {
        const std::vector<float> mean = RandomVec(F, 0.3f, rng);
        const std::vector<float> x = RandomVec(rows * F, 1.0f, rng);
        for (uint64_t r = 0; r < rows; ++r) {
          ForEachUnit(
              b, r, [&](uint32_t p, uint32_t l, uint32_t t, uint64_t col) {
                if (b.kind == KvtcRowKind::kPerPage && t < b.infos[p].sinks)
                  return;
                std::vector<float> v(hd);
                for (uint64_t e = 0; e < hd; ++e) {
                  v[e] = x[r * F + col + e] + mean[col + e];
                }
                if (kv == 0 && b.rope != RopeStyle::kNone) {
                  const size_t at = (size_t{p} * b.g.page_size + t) * half;
                  for (uint32_t h = 0; h < b.g.num_kv_heads; ++h) {
                    RotateRope(&v[h * b.g.head_dim], b.g.head_dim, b.rope,
                               &b.cos[at], &b.sin[at], /*inverse=*/false);
                  }
                }
                uint8_t* dst = want[p].data() + s.RunIndex(kv, l, t) * es;
                for (uint64_t e = 0; e < hd; ++e) {
                  FloatToElement(b.g.dtype, v[e], dst + e * es);
                }
              });
        }
        DeviceBuf dmean(F * 4), dx(rows * F * 4);
        dmean.Upload(mean.data(), F * 4);
        dx.Upload(x.data(), x.size() * 4);
        MeanAddScatterArgs a;
        a.shape = s;
        a.row_kind = b.kind;
        a.kv = kv;
        a.rope = kv == 0 ? b.rope : RopeStyle::kNone;
        a.pages = b.d_infos->as<KvtcPageInfo>();
        a.num_pages = uint32_t(b.positions.size());
        a.rows = b.d_rows->as<KvtcTokenRef>();
        a.first_row = 0;
        a.num_rows = uint32_t(rows);
        a.mean = dmean.as<float>();
        a.rope_cos = b.d_cos->as<float>();
        a.rope_sin = b.d_sin->as<float>();
        a.in = dx.as<float>();
        a.native_fp8 = nat;
        a.pages_aligned16 = b.aligned16;
        a.allow_vector = path == 2;
        vector_runs += MeanAddScatterVectorized(a);
        KVH_STATUS_REQUIRE(LaunchMeanAddScatter(a, nullptr));
      }
      for (size_t p = 0; p < b.positions.size(); ++p) {
        std::vector<uint8_t> got(pb);
        b.arena->Download(got.data(), pb, b.offsets[p]);
        for (size_t i = 0; i < pb; ++i) {
          INFO(Describe(b) << " path " << path << " page " << p << " byte "
                           << i);
          REQUIRE(got[i] == want[p][i]);
        }
      }
    }
  }
  REQUIRE(vector_runs > 0);
}

TEST_CASE("RoPE table matches RopeCosSin", "[cuda][rope]") {
  for (uint32_t head_dim : {2u, 64u, 128u}) {
    for (float theta : {10000.0f, 500000.0f}) {
      std::vector<KvtcPageInfo> pages;
      const uint32_t page_size = 16;
      for (uint64_t pos : {uint64_t{0}, uint64_t{16}, uint64_t{131072},
                           uint64_t{1} << 33, (uint64_t{1} << 53) - 100}) {
        pages.push_back({nullptr, pos, 0, 0});
      }
      const std::vector<double> f = RopeInvFreq(head_dim, theta);
      const size_t n = pages.size() * page_size * (head_dim / 2);
      DeviceBuf dp(pages.size() * sizeof(KvtcPageInfo)), df(f.size() * 8),
          dc(n * 4), ds(n * 4);
      dp.Upload(pages.data(), pages.size() * sizeof(KvtcPageInfo));
      df.Upload(f.data(), f.size() * 8);
      RopeTableArgs a{dp.as<KvtcPageInfo>(),
                      uint32_t(pages.size()),
                      page_size,
                      head_dim,
                      df.as<double>(),
                      dc.as<float>(),
                      ds.as<float>()};
      KVH_STATUS_REQUIRE(LaunchRopeTable(a, nullptr));
      std::vector<float> gc(n), gs(n), wc(head_dim / 2), ws(head_dim / 2);
      dc.Download(gc.data(), n * 4);
      ds.Download(gs.data(), n * 4);
      size_t mismatches = 0;
      for (size_t p = 0; p < pages.size(); ++p) {
        for (uint32_t t = 0; t < page_size; ++t) {
          RopeCosSin(pages[p].first_position + t, head_dim, theta, wc.data(),
                     ws.data());
          for (uint32_t i = 0; i < head_dim / 2; ++i) {
            const size_t at = (p * page_size + t) * (head_dim / 2) + i;
            mismatches += !SameBits(gc[at], wc[i]) || !SameBits(gs[at], ws[i]);
          }
        }
      }
      INFO("head_dim " << head_dim << " theta " << theta);
      REQUIRE(mismatches == 0);
    }
  }
}

TEST_CASE("Sink kernels match WriteSinks / ReadSinks", "[cuda][sinks]") {
  std::mt19937_64 rng(9);
  const auto native = ResolveNativeFp8(Fp8Path::kAuto);
  REQUIRE(native.ok());
  for (Batch& b : Cases()) {
    if (b.rope != RopeStyle::kNone) continue;
    b.sink_tokens = 7;  // spans pages: positions 0 and 5 and 2 hold sinks
    Build(b, rng);
    const KvtcPageShape s = b.Shape();
    const size_t es = DTypeSize(b.g.dtype);
    const uint64_t row_bytes = 2 * uint64_t{b.g.num_layers} * b.hd();
    const size_t n = b.sinks.size();
    REQUIRE(n > 0);
    std::vector<uint8_t> want(n * row_bytes);
    for (size_t j = 0; j < n; ++j) {
      for (uint64_t k = 0; k < row_bytes; ++k) {
        const uint64_t run = k / b.hd();
        const int kv = int(run / b.g.num_layers);
        const uint32_t l = uint32_t(run % b.g.num_layers);
        const uint8_t* src =
            b.pages[b.sinks[j].page].data() +
            (s.RunIndex(kv, l, b.sinks[j].token) + k % b.hd()) * es;
        want[j * row_bytes + k] =
            FloatToFp8E4M3(ElementToFloat(b.g.dtype, src));
      }
    }
    for (bool nat : {false, bool(*native)}) {
      testing::PinnedBuf out(want.size() + 3);
      out.Fill(0x11);
      SinkEncodeArgs e;
      e.shape = s;
      e.pages = b.d_infos->as<KvtcPageInfo>();
      e.num_pages = uint32_t(b.positions.size());
      e.sinks = b.d_sinks->as<KvtcTokenRef>();
      e.num_sinks = uint32_t(n);
      e.out = out.bytes() + 1;
      e.native_fp8 = nat;
      KVH_STATUS_REQUIRE(LaunchSinkEncode(e, nullptr));
      KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
      INFO(Describe(b));
      REQUIRE(out.bytes()[0] == 0x11);
      REQUIRE(out.bytes()[want.size() + 1] == 0x11);
      REQUIRE(std::memcmp(out.bytes() + 1, want.data(), want.size()) == 0);
      // Decode into sentinel pages: exactly the sink tokens' runs change.
      b.arena->Fill(0x3C);
      SinkDecodeArgs d;
      d.shape = s;
      d.pages = e.pages;
      d.num_pages = e.num_pages;
      d.sinks = e.sinks;
      d.num_sinks = e.num_sinks;
      d.in = out.bytes() + 1;
      d.native_fp8 = nat;
      KVH_STATUS_REQUIRE(LaunchSinkDecode(d, nullptr));
      for (size_t p = 0; p < b.positions.size(); ++p) {
        std::vector<uint8_t> got(b.g.PageBytes()), exp(b.g.PageBytes(), 0x3C);
        b.arena->Download(got.data(), got.size(), b.offsets[p]);
        for (size_t j = 0; j < n; ++j) {
          if (b.sinks[j].page != p) continue;
          for (uint64_t k = 0; k < row_bytes; ++k) {
            const uint64_t run = k / b.hd();
            const int kv = int(run / b.g.num_layers);
            const uint32_t l = uint32_t(run % b.g.num_layers);
            FloatToElement(
                b.g.dtype, Fp8E4M3ToFloat(want[j * row_bytes + k]),
                exp.data() +
                    (s.RunIndex(kv, l, b.sinks[j].token) + k % b.hd()) * es);
          }
        }
        REQUIRE(got == exp);
      }
      // With an error word: clean rows raise nothing; a NaN code (which the
      // encoder never writes) is reported with its sink row.
      DeviceBuf err(8);
      err.Fill(0xFF);
      d.error = err.as<unsigned long long>();
      KVH_STATUS_REQUIRE(LaunchSinkDecode(d, nullptr));
      unsigned long long code = 0;
      err.Download(&code, 8);
      REQUIRE(code == kKvtcNoError);
      testing::PinnedBuf bad(want.size());
      std::memcpy(bad.bytes(), want.data(), want.size());
      bad.bytes()[(n - 1) * row_bytes + row_bytes / 2] = 0xFF;
      d.in = bad.bytes();
      KVH_STATUS_REQUIRE(LaunchSinkDecode(d, nullptr));
      err.Download(&code, 8);
      REQUIRE(code == KvtcDataErrorCode(2, 0, n - 1));
      // The next pass encodes from these pages: put the good sinks back.
      d.in = out.bytes() + 1;
      d.error = nullptr;
      KVH_STATUS_REQUIRE(LaunchSinkDecode(d, nullptr));
      KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
    }
  }
}

TEST_CASE("Gather flags non-finite page values", "[cuda][gather]") {
  std::mt19937_64 rng(1);
  Batch b = std::move(Cases()[0]);  // bf16, per token, no RoPE
  Build(b, rng);
  const uint16_t inf = 0x7F80;
  // Page 1 (position 5: token 0 is a sink with sink_tokens 4? no: 5 >= 4),
  // its token 2 of layer 1, keys.
  const size_t at = b.offsets[1] + b.Shape().RunIndex(0, 1, 2) * 2 + 6;
  b.arena->Upload(&inf, 2, at);
  const uint64_t F = b.Features();
  DeviceBuf mean(F * 4), out(b.NumRows() * F * 4), err(8);
  mean.Fill(0);
  err.Fill(0xFF);
  GatherMeanSubtractArgs a;
  a.shape = b.Shape();
  a.pages = b.d_infos->as<KvtcPageInfo>();
  a.num_pages = uint32_t(b.positions.size());
  a.rows = b.d_rows->as<KvtcTokenRef>();
  a.num_rows = uint32_t(b.NumRows());
  a.mean = mean.as<float>();
  a.out = out.bytes();
  a.error = err.as<unsigned long long>();
  KVH_STATUS_REQUIRE(LaunchGatherMeanSubtract(a, nullptr));
  unsigned long long code;
  err.Download(&code, 8);
  // Row of (page 1, token 2): page 0 contributes 5 - 4 = 1 row.
  REQUIRE(code == KvtcErrorCode(KvtcErrorKind::kNonFiniteInput, 0, 1 + 2));
}

}  // namespace
}  // namespace gpu
}  // namespace kvharbor
