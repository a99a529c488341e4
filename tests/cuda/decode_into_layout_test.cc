// The KVTC decode's write kernels (mean-add + scatter, sink decode) with an
// engine-layout destination (cuda/kernels/paged_kv_dest.h) against the
// reference they replace: the same kernels writing pages, then the paged-KV
// scatter (cuda/kernels/paged_kv_scatter.h) into the layout. Every byte of
// every layout buffer is compared (sentinel-filled), over dtypes x page layouts
// x row kinds x RoPE x every engine layout of tests/kv_layout_test_util.h x
// layer ranges (all layers, and one layer of three: the fused write must leave
// the other layers alone), vector and scalar paths; the fused launches get
// null page pointers, so they cannot have read or written a page.
#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <vector>

#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/mean_add_scatter.h"
#include "cuda/kernels/paged_kv_dest.h"
#include "cuda/kernels/paged_kv_scatter.h"
#include "cuda/kernels/sink_fp8.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/kv_layout_test_util.h"

namespace kvharbor {
namespace gpu {
namespace {

using kvharbor::testing::EngineLayout;
using testing::DeviceBuf;

template <typename T>
std::unique_ptr<DeviceBuf> Upload(const std::vector<T>& v) {
  auto d = std::make_unique<DeviceBuf>(v.size() * sizeof(T) + 1);
  if (!v.empty()) d->Upload(v.data(), v.size() * sizeof(T));
  return d;
}

std::vector<float> RandomFloats(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return v;
}

// Device buffers of one engine layout, sentinel-filled.
struct Layout {
  std::vector<std::unique_ptr<DeviceBuf>> buffers;
  PagedKvLayout l;
  std::unique_ptr<DeviceBuf> k, v;
  Layout(EngineLayout e, const Geometry& g, uint32_t begin, uint32_t n,
         uint64_t blocks) {
    l = kvharbor::testing::MakeEngineLayout(
        e, g, begin, n, blocks, [this](uint64_t bytes) {
          buffers.push_back(std::make_unique<DeviceBuf>(bytes));
          buffers.back()->Fill(0xA5);
          return reinterpret_cast<uint64_t>(buffers.back()->bytes());
        });
    l.device = 0;
    k = Upload(l.k);
    v = Upload(l.v);
  }
  uint32_t Align() const {
    uint64_t all = 0;
    for (uint64_t b : l.k) all |= b;
    for (uint64_t b : l.v) all |= b;
    return AlignmentOf(all);
  }
  std::vector<std::vector<uint8_t>> Bytes() const {
    std::vector<std::vector<uint8_t>> out;
    for (const auto& b : buffers) {
      out.emplace_back(b->size());
      b->Download(out.back().data(), b->size());
    }
    return out;
  }
};

struct Case {
  DType dtype;
  PageLayout page_layout;
  KvtcRowKind kind;
  RopeStyle rope;
};

// The batch both paths decode: 5 pages, sinks in the pages at positions 0
// and 2 (sink_tokens 4), random rows, means, RoPE tables and FP8 sink bytes.
struct Batch {
  Geometry g;
  Case c;
  std::vector<uint64_t> positions = {0, 5, 1000003, 2, 17};
  std::vector<KvtcPageInfo> infos;
  std::vector<KvtcTokenRef> rows, sinks;
  std::vector<float> x[2], mean[2], cos, sin;
  std::vector<uint8_t> sink_bytes;

  KvtcPageShape Shape() const {
    return {g.num_layers,
            g.num_kv_heads,
            g.head_dim,
            g.page_size,
            static_cast<int>(g.dtype),
            static_cast<int>(g.layout)};
  }
  uint64_t Hd() const { return uint64_t{g.num_kv_heads} * g.head_dim; }
  uint64_t Features() const {
    return (c.kind == KvtcRowKind::kPerToken ? g.num_layers : g.page_size) *
           Hd();
  }
  uint64_t NumRows() const {
    return c.kind == KvtcRowKind::kPerToken ? rows.size()
                                            : positions.size() * g.num_layers;
  }
};

Batch MakeBatch(const Case& c, std::mt19937_64& rng) {
  Batch b;
  b.c = c;
  b.g.num_layers = 3;
  b.g.num_kv_heads = 2;
  b.g.head_dim = c.rope == RopeStyle::kNone ? 8 : 16;
  b.g.page_size = 4;
  b.g.dtype = c.dtype;
  b.g.layout = c.page_layout;
  const uint32_t sink_tokens = 4;
  for (size_t p = 0; p < b.positions.size(); ++p) {
    const uint64_t pos = b.positions[p];
    const uint32_t s = pos >= sink_tokens
                           ? 0
                           : static_cast<uint32_t>(std::min<uint64_t>(
                                 b.g.page_size, sink_tokens - pos));
    b.infos.push_back({nullptr, pos, s, 0});
    for (uint32_t t = 0; t < b.g.page_size; ++t) {
      (t < s ? b.sinks : b.rows).push_back({uint32_t(p), t});
    }
  }
  for (int kv = 0; kv < 2; ++kv) {
    b.mean[kv] = RandomFloats(b.Features(), rng);
    b.x[kv] = RandomFloats(b.NumRows() * b.Features(), rng);
  }
  const size_t table = b.positions.size() * b.g.page_size * b.g.head_dim / 2;
  b.cos = RandomFloats(table, rng);
  b.sin = RandomFloats(table, rng);
  b.sink_bytes.resize(b.sinks.size() * 2 * b.g.num_layers * b.Hd());
  for (uint8_t& v : b.sink_bytes) {
    v = static_cast<uint8_t>(rng());
    if ((v & 0x7F) == 0x7F) v = 0x11;  // no FP8 NaN codes
  }
  return b;
}

// Decodes `b` with the write kernels: into the pages `infos` points at
// (dest disabled), or into the layout `dest`.
void Decode(const Batch& b, const std::vector<KvtcPageInfo>& infos,
            const PagedKvDest& dest, bool allow_vector, bool native,
            int* vector_runs) {
  auto d_infos = Upload(infos);
  auto d_rows = Upload(b.rows);
  auto d_sinks = Upload(b.sinks);
  auto d_cos = Upload(b.cos);
  auto d_sin = Upload(b.sin);
  auto d_sink_bytes = Upload(b.sink_bytes);
  for (int kv = 0; kv < 2; ++kv) {
    auto d_mean = Upload(b.mean[kv]);
    auto d_x = Upload(b.x[kv]);
    MeanAddScatterArgs a;
    a.shape = b.Shape();
    a.row_kind = b.c.kind;
    a.kv = kv;
    a.rope = kv == 0 ? b.c.rope : RopeStyle::kNone;
    a.pages = d_infos->as<KvtcPageInfo>();
    a.num_pages = uint32_t(infos.size());
    a.rows = d_rows->as<KvtcTokenRef>();
    a.num_rows = uint32_t(b.NumRows());
    a.mean = d_mean->as<float>();
    a.rope_cos = d_cos->as<float>();
    a.rope_sin = d_sin->as<float>();
    a.in = d_x->as<float>();
    a.native_fp8 = native;
    a.pages_aligned16 = true;  // the pages path's arena is 256-aligned
    a.allow_vector = allow_vector;
    a.dest = dest;
    *vector_runs += MeanAddScatterVectorized(a);
    KVH_STATUS_REQUIRE(LaunchMeanAddScatter(a, nullptr));
    KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
  }
  SinkDecodeArgs s;
  s.shape = b.Shape();
  s.pages = d_infos->as<KvtcPageInfo>();
  s.num_pages = uint32_t(infos.size());
  s.sinks = d_sinks->as<KvtcTokenRef>();
  s.num_sinks = uint32_t(b.sinks.size());
  s.in = d_sink_bytes->bytes();
  s.native_fp8 = native;
  s.dest = dest;
  KVH_STATUS_REQUIRE(LaunchSinkDecode(s, nullptr));
  KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (DType dt : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3}) {
    for (PageLayout pl :
         {PageLayout::kKvLayerTokenHeadDim, PageLayout::kLayerKvTokenHeadDim}) {
      for (KvtcRowKind kind : {KvtcRowKind::kPerToken, KvtcRowKind::kPerPage}) {
        for (RopeStyle rope : {RopeStyle::kNone, RopeStyle::kHalfSplit,
                               RopeStyle::kInterleaved}) {
          out.push_back({dt, pl, kind, rope});
        }
      }
    }
  }
  return out;
}

TEST_CASE("KVTC decode kernels into a layout equal pages + scatter",
          "[cuda][decode_into_layout]") {
  std::mt19937_64 rng(21);
  const auto native = ResolveNativeFp8(Fp8Path::kAuto);
  REQUIRE(native.ok());
  constexpr uint64_t kBlocks = 9;
  // Page i to block_ids[i]; -1: a page the layout does not take (skipped).
  const std::vector<int64_t> block_ids = {8, 1, -1, 0, 4};
  int vector_runs = 0, cases = 0;
  for (const Case& c : Cases()) {
    const Batch b = MakeBatch(c, rng);
    const size_t pb = b.g.PageBytes();
    for (EngineLayout e : kvharbor::testing::AllEngineLayouts()) {
      const std::pair<uint32_t, uint32_t> kRanges[] = {{0, 3}, {1, 1}};
      for (const auto& [begin, n] : kRanges) {
        for (int path = 0; path < 2; ++path) {
          const bool vec = path == 1;
          const bool nat = vec && *native;
          INFO(DTypeName(c.dtype)
               << " " << PageLayoutName(c.page_layout) << " "
               << KvtcRowKindName(c.kind) << " " << RopeStyleName(c.rope) << " "
               << kvharbor::testing::EngineLayoutName(e) << " layers [" << begin
               << ", +" << n << ") vector " << vec);
          // Reference: decode into pages, then scatter them.
          Layout want(e, b.g, begin, n, kBlocks);
          const absl::StatusOr<PagedKvLayout> rl = ResolveLayout(want.l, b.g);
          KVH_STATUS_REQUIRE(rl.status());
          const PagedKvShape shape = MakePagedKvShape(b.g, *rl);
          auto d_blocks = Upload(block_ids);
          DeviceBuf arena(b.positions.size() * pb + 256);
          arena.Fill(0x5A);
          std::vector<KvtcPageInfo> infos = b.infos;
          for (size_t p = 0; p < infos.size(); ++p) {
            infos[p].data = arena.bytes() + p * pb;
          }
          int ignored = 0;
          Decode(b, infos, PagedKvDest{}, vec, nat, &ignored);
          PagedKvScatterArgs sc;
          sc.shape = shape;
          sc.num_pages = uint32_t(infos.size());
          sc.page_base = arena.bytes();
          sc.page_pitch = pb;
          sc.block_ids = d_blocks->as<int64_t>();
          sc.k_bases = want.k->as<uint64_t>();
          sc.v_bases = want.v->as<uint64_t>();
          sc.layout_align = want.Align();
          KVH_STATUS_REQUIRE(LaunchPagedKvScatter(sc, nullptr));
          KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
          // Fused: straight into the layout, no page memory at all.
          Layout got(e, b.g, begin, n, kBlocks);
          const PagedKvDest dest =
              MakePagedKvDest(MakePagedKvShape(b.g, *ResolveLayout(got.l, b.g)),
                              d_blocks->as<int64_t>(), got.k->as<uint64_t>(),
                              got.v->as<uint64_t>(), got.Align());
          Decode(b, b.infos, dest, vec, nat, &vector_runs);
          const auto w = want.Bytes(), g = got.Bytes();
          REQUIRE(w.size() == g.size());
          for (size_t i = 0; i < w.size(); ++i) {
            INFO("buffer " << i);
            REQUIRE(g[i] == w[i]);
          }
          ++cases;
        }
      }
    }
  }
  REQUIRE(cases > 0);
  REQUIRE(vector_runs > 0);  // the fused vector path ran somewhere
}

TEST_CASE("KVTC decode kernels into a layout: bad destinations refused",
          "[cuda][decode_into_layout]") {
  MeanAddScatterArgs a;
  DeviceBuf blocks(8);
  a.dest.block_ids = blocks.as<int64_t>();  // no K / V bases
  const absl::Status s = LaunchMeanAddScatter(a, nullptr);
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(s.message().find("dest.k_bases") != std::string::npos);
  SinkDecodeArgs d;
  d.dest.block_ids = blocks.as<int64_t>();
  const absl::Status t = LaunchSinkDecode(d, nullptr);
  REQUIRE(t.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(t.message().find("dest.k_bases") != std::string::npos);
}

}  // namespace
}  // namespace gpu
}  // namespace kvharbor
