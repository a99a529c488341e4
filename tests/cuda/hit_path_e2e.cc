// The hit paths into an engine's GPU cache end to end (GPU machine only;
// built as kvharbor_hit_path_tests, run by scripts/gpu_checks.sh): kvharbord
// child processes (tests/cuda/daemon_process.h) and the SDK's LayoutTransfer
// (client/cuda/layout_transfer.h) in this process. Every fetch is compared
// byte for byte with the CPU reference scatter of the same pages into a
// host copy of the same layout, every byte of every layout buffer (so a
// stray write shows): device_ipc into vLLM, FlashInfer, SGLang (both) and HF
// layouts and a layer range; the forced RAW and COMPRESSED streams; cold
// pages through compressed_local (GPU decode of KVTC equal to the SDK's CPU
// decode) and, without gpu_decode, raw_remote; with stage_cold through
// device_ipc after the daemon decoded them into its device tier (and
// compressed_local when it has no room); host_shm with the arena
// registered once and again after the daemon gave a range back; the
// remote-style paths; layer-wise loads (a layout of some layers) on every
// path, moving only those layers' bytes where the path can (both page
// layouts, registration chunks a page straddles); an insert from a layout;
// and bad input (host memory or another GPU's for a device layout, block
// ids, a layout that does not fit, a layer range outside the namespace, IPC
// that is not offered), never writing.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "client/cuda/compressed_stream_path.h"
#include "client/cuda/layout_transfer.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/memory/paged_kv_copy.h"
#include "kvharbor/client.h"
#include "tests/client/client_test_util.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"
#include "tests/cuda/codec_test_util.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/daemon_process.h"
#include "tests/kv_layout_test_util.h"
#include "tests/temp_dir.h"
#include "types/layer_range.h"

namespace kvharbor {
namespace {

using client::FetchFormat;
using client::LayoutFetchOptions;
using client::LayoutTransfer;
using client::Tier;
using client::TransferResult;
using gpu::testing::DeviceBuf;
using testing::EngineLayout;
using testing::HostAllocs;
using testing::Kvharbord;
using testing::TempDir;

// bf16, 4 layers, 2 heads, head_dim 64, 16 tokens a page: 32 KiB pages.
Geometry Bf16Geometry() {
  Geometry g;
  g.num_layers = 4;
  g.num_kv_heads = 2;
  g.head_dim = 64;
  g.page_size = 16;
  g.dtype = DType::kBF16;
  return g;
}

constexpr char kDeviceConfig[] =
    "store:\n  pool_budget_bytes: 512MiB\n  device_pool_bytes: 256MiB\n"
    "  allow_ipc: true\n";
constexpr char kNoIpcConfig[] =
    "store:\n  pool_budget_bytes: 512MiB\n  device_pool_bytes: 64MiB\n";

// The tests compare GPU decodes with the CPU decode byte for byte: the
// reconstruction GEMM in FP32 (the modes' errors have their own test).
ClientOptions Exact() {
  ClientOptions o;
  o.gpu_decode_gemm = client::GpuDecodeGemm::kFp32;
  return o;
}

std::unique_ptr<Client> Connect(const Kvharbord& d, ClientOptions o = Exact()) {
  auto c = testing::ConnectChild(d, o);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return *std::move(c);
}

std::unique_ptr<LayoutTransfer> Transfer(Client* c) {
  auto t = LayoutTransfer::Create(c);
  REQUIRE(t.ok());
  return *std::move(t);
}

// A layout on the GPU and the same layout in host memory, both filled
// with the sentinel.
struct Twin {
  HostAllocs host;
  std::vector<std::unique_ptr<DeviceBuf>> dev;
  PagedKvLayout hl, dl;

  Twin(EngineLayout e, const Geometry& g, uint32_t begin, uint32_t n,
       uint64_t blocks) {
    hl = testing::MakeEngineLayout(e, g, begin, n, blocks, host.alloc());
    dl = testing::MakeEngineLayout(
        e, g, begin, n, blocks, [this](uint64_t bytes) {
          dev.push_back(std::make_unique<DeviceBuf>(bytes));
          dev.back()->Fill(0xA5);
          return reinterpret_cast<uint64_t>(dev.back()->bytes());
        });
    dl.device = 0;
  }
  // The CPU reference of `pages` into the host twin.
  void Expect(const Geometry& g, const std::vector<std::vector<uint8_t>>& pages,
              const std::vector<int64_t>& blocks) {
    std::vector<const uint8_t*> ptrs;
    for (const auto& p : pages) ptrs.push_back(p.data());
    REQUIRE(ScatterPagesToLayout(g, hl, ptrs, blocks).ok());
  }
  void CheckEqual() {
    for (size_t i = 0; i < dev.size(); ++i) {
      std::vector<uint8_t> got(dev[i]->size());
      dev[i]->Download(got.data(), got.size());
      INFO("buffer " << i);
      CHECK(got == host.buffers[i]);
    }
  }
  bool Untouched() {
    for (auto& d : dev) {
      std::vector<uint8_t> got(d->size());
      d->Download(got.data(), got.size());
      for (uint8_t b : got) {
        if (b != 0xA5) return false;
      }
    }
    return true;
  }
};

std::vector<std::vector<uint8_t>> Split(const std::vector<uint8_t>& all,
                                        uint64_t pb, size_t first, size_t n) {
  std::vector<std::vector<uint8_t>> out;
  for (size_t i = first; i < first + n; ++i) {
    out.emplace_back(all.begin() + i * pb, all.begin() + (i + 1) * pb);
  }
  return out;
}

client::Lease Lock(Client& c, const std::string& ns,
                   const std::vector<int32_t>& tokens) {
  auto l = c.Match(ns, tokens, /*lock=*/true);
  INFO(l.status().ToString());
  REQUIRE(l.ok());
  REQUIRE(l->matched_tokens == tokens.size());
  return *l;
}

TransferResult FetchOk(LayoutTransfer& t, const std::string& ns,
                       const client::Lease& l, const PagedKvLayout& layout,
                       const std::vector<int64_t>& blocks,
                       LayoutFetchOptions o = LayoutFetchOptions()) {
  o.page_tiers = l.page_tiers;
  auto r = t.Fetch(ns, l.id, layout, blocks, o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  INFO("path " << r->path
               << " fallbacks: " << absl::StrJoin(r->fallbacks, " | "));
  return *r;
}

// fp32 with an identity-basis FP8 calibration: the GEMM is exact, so the
// GPU decode must equal the CPU decode byte for byte.
Geometry ExactKvtcGeometry() {
  Geometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  g.page_size = 4;
  g.dtype = DType::kFP32;
  return g;
}

std::string ExactKvtcCalibration(const Geometry& g,
                                 KvtcRowKind kind = KvtcRowKind::kPerToken,
                                 uint32_t sink_tokens = 0) {
  const uint64_t f = testing::FeaturesFor(g, kind);
  auto cal = testing::MakeCalibration(
      g, kind, IdentityBasis(f, f, testing::Fp8All(f)),
      IdentityBasis(f, f, testing::Fp8All(f)), sink_tokens);
  auto bytes = SerializeKvtcCalibration(*cal);
  REQUIRE(bytes.ok());
  return *bytes;
}

// A KVTC namespace of `pages` raw pages with a 1 MiB host-compressed tier.
client::NamespaceSpec KvtcSpec(const std::string& name, const Geometry& g,
                               const std::string& calibration, int pages) {
  client::NamespaceSpec spec =
      testing::MakeSpec(name, g.num_layers, g.num_kv_heads, g.head_dim,
                        g.page_size, g.dtype, pages * g.PageBytes());
  spec.codec = "kvtc";
  spec.calibration = calibration;
  spec.host_compressed_bytes = 1 << 20;
  return spec;
}

TEST_CASE("device tier: device_ipc into every engine layout, byte-exact",
          "[gpu][hit_path]") {
  TempDir dir;
  auto d = testing::StartChildDaemon(dir.path, "dev", kDeviceConfig);
  REQUIRE(d->started());
  auto c = Connect(*d);
  const Geometry g = Bf16Geometry();
  client::NamespaceSpec spec =
      testing::MakeSpec("n", g.num_layers, g.num_kv_heads, g.head_dim,
                        g.page_size, g.dtype, 16 * g.PageBytes());
  spec.host_compressed_bytes = 8 << 20;
  REQUIRE(c->CreateNamespace(spec).ok());
  const uint64_t pb = g.PageBytes();
  const auto tokens = testing::TokenRange(8 * g.page_size, 1);
  const auto pages = testing::RandomBytes(8 * pb, 2);
  REQUIRE(c->Insert("n", tokens, pages, pb).ok());
  auto t = Transfer(c.get());
  const client::Lease l = Lock(*c, "n", tokens);
  const std::vector<int64_t> blocks = {9, 3, 0, 7, 1, 5};
  LayoutFetchOptions o;
  o.start_page = 2;
  for (EngineLayout e : testing::AllEngineLayouts()) {
    for (auto [begin, n] : {std::pair<uint32_t, uint32_t>{0, 4}, {1, 2}}) {
      INFO(testing::EngineLayoutName(e)
           << " layers [" << begin << ", " << begin + n << ")");
      Twin twin(e, g, begin, n, 10);
      twin.Expect(g, Split(pages, pb, 2, 6), blocks);
      const TransferResult r = FetchOk(*t, "n", l, twin.dl, blocks, o);
      CHECK(r.path == "device_ipc");
      CHECK(r.pages == 6);
      twin.CheckEqual();
    }
  }
  // The gRPC streams, forced.
  for (FetchFormat f : {FetchFormat::kRaw, FetchFormat::kCompressed}) {
    Twin twin(EngineLayout::kVllm, g, 0, 4, 10);
    twin.Expect(g, Split(pages, pb, 2, 6), blocks);
    LayoutFetchOptions fo = o;
    fo.format = f;
    const TransferResult r = FetchOk(*t, "n", l, twin.dl, blocks, fo);
    CHECK(r.path ==
          (f == FetchFormat::kRaw ? "raw_remote" : "compressed_local"));
    twin.CheckEqual();
  }
  REQUIRE(c->Release(l.id).ok());

  // Cold pages: compressed_local (identity codec: exact); without
  // gpu_decode the RAW stream.
  REQUIRE(c->Demote("n", Tier::kHostCompressed).ok());
  const client::Lease cold = Lock(*c, "n", tokens);
  REQUIRE(cold.page_tiers[0] == Tier::kHostCompressed);
  ClientOptions no_decode = Exact();
  no_decode.gpu_decode = false;
  auto c2 = Connect(*d, no_decode);
  auto t2 = Transfer(c2.get());
  for (LayoutTransfer* tr : {t.get(), t2.get()}) {
    Twin twin(EngineLayout::kSglangLayerFirst, g, 0, 4, 10);
    twin.Expect(g, Split(pages, pb, 2, 6), blocks);
    const TransferResult r = FetchOk(*tr, "n", cold, twin.dl, blocks, o);
    CHECK(r.path == (tr == t.get() ? "compressed_local" : "raw_remote"));
    twin.CheckEqual();
  }
  REQUIRE(c->Release(cold.id).ok());
}

TEST_CASE("KVTC cold pages: GPU decode into the layout equals the CPU decode",
          "[gpu][hit_path]") {
  // Both GPU paths (decoded straight into the layout, the default; decoded
  // into staging slots, then scattered) against the SDK's CPU decode
  // scattered on the CPU, byte for byte: both row kinds, sink tokens, the
  // vLLM and SGLang layouts, all layers and a layer range (the decode into
  // the layout must write only the layout's layers: every byte of the
  // layout buffers is compared).
  TempDir dir;
  auto d = testing::StartChildDaemon(dir.path, "kvtc", kDeviceConfig);
  REQUIRE(d->started());
  auto c = Connect(*d);
  const Geometry g = ExactKvtcGeometry();
  const uint64_t pb = g.PageBytes();
  struct Cal {
    const char* ns;
    KvtcRowKind kind;
    uint32_t sinks;
  };
  const Cal kCals[] = {{"k", KvtcRowKind::kPerToken, 0},
                       {"ks", KvtcRowKind::kPerToken, 6},
                       {"kp", KvtcRowKind::kPerPage, 6}};
  const std::pair<uint32_t, uint32_t> kRanges[] = {{0, 2}, {1, 1}};
  for (const Cal& cal : kCals) {
    REQUIRE(c->CreateNamespace(
                 KvtcSpec(cal.ns, g,
                          ExactKvtcCalibration(g, cal.kind, cal.sinks), 64))
                .ok());
    const auto tokens = testing::TokenRange(40 * g.page_size, 3);
    REQUIRE(c->Insert(cal.ns, tokens, testing::FloatPages(40, pb, 4), pb).ok());
    REQUIRE(c->Demote(cal.ns, Tier::kHostCompressed).ok());
    const client::Lease l = Lock(*c, cal.ns, tokens);
    // The SDK's CPU decode of the same pages is the reference.
    auto want = c->Fetch(cal.ns, client::FetchSource::FromLease(l.id),
                         FetchFormat::kCompressed);
    REQUIRE(want.ok());
    std::vector<int64_t> blocks(40);
    for (int i = 0; i < 40; ++i) blocks[i] = 39 - i;
    for (EngineLayout e : {EngineLayout::kVllm, EngineLayout::kSglangLayerFirst,
                           EngineLayout::kSglangPageFirst}) {
      for (const auto& [begin, n] : kRanges) {
        // h2d_batch_bytes: gathered copies (the default; 1 byte: a copy
        // per group), or 0: each group's payload range by range.
        const uint64_t kGathered =
            client::LayoutTransferOptions().h2d_batch_bytes;
        const std::pair<bool, uint64_t> kRuns[] = {
            {true, kGathered}, {true, 1}, {true, 0}, {false, kGathered}};
        for (const auto& [into_layout, h2d_batch] : kRuns) {
          // Into the layout: 20 groups of 2 pages over 3 streams, two
          // runs of 10 (CompressedStreamRanges) whose groups interleave at
          // the worker; else five groups of 8 over one stream.
          const int streams = into_layout ? 3 : 1;
          INFO(cal.ns << " " << testing::EngineLayoutName(e) << " layers ["
                      << begin << ", +" << n << ") into_layout " << into_layout
                      << " streams " << streams << " h2d_batch_bytes "
                      << h2d_batch);
          Twin twin(e, g, begin, n, 40);
          twin.Expect(g, *want, blocks);
          client::LayoutTransferOptions small;
          small.staging_slot_bytes = (into_layout ? 2 : 8) * pb;
          small.decode_into_layout = into_layout;
          small.compressed_streams = streams;
          small.h2d_batch_bytes = h2d_batch;
          auto t = LayoutTransfer::Create(c.get(), small);
          REQUIRE(t.ok());
          const TransferResult r = FetchOk(**t, cal.ns, l, twin.dl, blocks);
          CHECK(r.path == "compressed_local");
          bool scattered = false, h2d = false;
          for (const auto& [stage, seconds] : r.stages) {
            scattered |= stage == "scatter";
            h2d |= stage == "h2d" && seconds > 0;
          }
          // Decoded into the layout: no scatter stage at all.
          CHECK(scattered == !into_layout);
          // Gathered copies are timed (h2d_bytes: the merged batches'
          // bytes); the payloads copied range by range are not.
          const bool gathered = into_layout && h2d_batch > 0;
          CHECK(h2d == gathered);
          CHECK((r.h2d_bytes > 0) == gathered);
          twin.CheckEqual();
        }
      }
    }
    REQUIRE(c->Release(l.id).ok());
  }
}

TEST_CASE("compressed streams: runs of whole groups, at least 8 each",
          "[hit_path]") {
  using Runs = std::vector<std::pair<uint32_t, uint32_t>>;
  static_assert(client::kMinGroupsPerStream == 8);
  // Under 16 groups: one stream (a 4K-token hit in 32-page groups).
  CHECK(client::CompressedStreamRanges(256, 32, 4) == Runs{{0, 256}});
  CHECK(client::CompressedStreamRanges(480, 32, 4) == Runs{{0, 480}});
  // 16 groups (the last short): two streams.
  CHECK(client::CompressedStreamRanges(511, 32, 4) ==
        Runs{{0, 256}, {256, 255}});
  CHECK(client::CompressedStreamRanges(1, 32, 4) == Runs{{0, 1}});
  CHECK(client::CompressedStreamRanges(0, 32, 4) == Runs{{0, 0}});
  // 2048 pages of 32-page groups over 4 streams: 16 groups each.
  CHECK(client::CompressedStreamRanges(2048, 32, 4) ==
        Runs{{0, 512}, {512, 512}, {1024, 512}, {1536, 512}});
  // 20 groups over 3 streams: as many as 8 each allow, 10 each.
  CHECK(client::CompressedStreamRanges(40, 2, 3) == Runs{{0, 20}, {20, 20}});
  // 37 groups (the last short) over 4 streams: 9, 9, 9, 10.
  CHECK(client::CompressedStreamRanges(147, 4, 4) ==
        Runs{{0, 36}, {36, 36}, {72, 36}, {108, 39}});
  CHECK(client::CompressedStreamRanges(40, 2, 1) == Runs{{0, 40}});
  // Every run but the last is whole groups; together they cover n.
  for (uint32_t n : {7u, 64u, 100u, 257u, 2049u}) {
    for (int s : {1, 2, 4, 16}) {
      const Runs runs = client::CompressedStreamRanges(n, 8, s);
      INFO(n << " pages, " << s << " streams");
      CHECK(runs.size() <= static_cast<size_t>(s));
      uint32_t at = 0;
      for (size_t r = 0; r < runs.size(); ++r) {
        CHECK(runs[r].first == at);
        CHECK(runs[r].first % 8 == 0);
        CHECK((runs[r].second >= 64 || runs.size() == 1));
        at += runs[r].second;
      }
      CHECK(at == n);
    }
  }
}

// Relative RMS error of the float elements of `got` against `want`.
double RelativeRms(const std::vector<uint8_t>& got,
                   const std::vector<uint8_t>& want) {
  REQUIRE(got.size() == want.size());
  const size_t n = got.size() / sizeof(float);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    float a, b;
    std::memcpy(&a, got.data() + i * sizeof(float), sizeof(float));
    std::memcpy(&b, want.data() + i * sizeof(float), sizeof(float));
    diff += (double(a) - b) * (double(a) - b);
    norm += double(b) * b;
  }
  return norm == 0 ? 0 : std::sqrt(diff / norm);
}

TEST_CASE("KVTC GEMM modes: pipelined GPU decode against the CPU decode",
          "[gpu][hit_path][gemm]") {
  // A random orthonormal basis (the seed's FP8 / int4 / int2 ranges, RoPE,
  // sinks): the reconstruction GEMM's rounding shows. Bounds on the RMS of
  // (GPU decode - CPU decode) relative to the CPU decode, as
  // tests/cuda/kvtc_gpu_accuracy_test.cc bounds the codec's modes.
  struct Mode {
    client::GpuDecodeGemm gemm;
    const char* name;
    double max_rel;
  };
  constexpr Mode kModes[] = {{client::GpuDecodeGemm::kFp32, "fp32", 2e-3},
                             {client::GpuDecodeGemm::kTf32, "tf32", 2e-2},
                             {client::GpuDecodeGemm::kBf16, "bf16", 4e-2}};
  TempDir dir;
  auto d = testing::StartChildDaemon(dir.path, "gemm", kDeviceConfig);
  REQUIRE(d->started());
  Geometry g;
  g.num_layers = 4;
  g.num_kv_heads = 4;
  g.head_dim = 64;
  g.page_size = 16;
  g.dtype = DType::kFP32;
  std::mt19937_64 rng(11);
  auto cal = gpu::testing::MakeCalibration(
      g, KvtcRowKind::kPerToken, RopeStyle::kHalfSplit, 4,
      gpu::testing::BasisKind::kRandom, 0, 256, rng);
  auto cal_bytes = SerializeKvtcCalibration(*cal);
  REQUIRE(cal_bytes.ok());
  auto c = Connect(*d);
  constexpr int kPages = 44;  // 6 groups of 8, the last short
  REQUIRE(c->CreateNamespace(KvtcSpec("m", g, *cal_bytes, kPages)).ok());
  const uint64_t pb = g.PageBytes();
  const auto tokens = testing::TokenRange(kPages * g.page_size, 13);
  REQUIRE(c->Insert("m", tokens, testing::FloatPages(kPages, pb, 14), pb).ok());
  REQUIRE(c->Demote("m", Tier::kHostCompressed).ok());
  std::vector<int64_t> blocks(kPages);
  for (int i = 0; i < kPages; ++i) blocks[i] = (i * 7) % kPages;
  for (const Mode& m : kModes) {
    INFO("mode " << m.name);
    ClientOptions o = Exact();
    o.gpu_decode_gemm = m.gemm;
    auto cm = Connect(*d, o);
    const client::Lease l = Lock(*cm, "m", tokens);
    REQUIRE(l.page_tiers[0] == Tier::kHostCompressed);
    auto want = cm->Fetch("m", client::FetchSource::FromLease(l.id),
                          FetchFormat::kCompressed);  // the CPU decode
    REQUIRE(want.ok());
    Twin twin(EngineLayout::kVllm, g, 0, g.num_layers, kPages);
    twin.Expect(g, *want, blocks);
    client::LayoutTransferOptions small;
    small.staging_slot_bytes = 8 * pb;  // groups decoded two in flight
    auto t = LayoutTransfer::Create(cm.get(), small);
    REQUIRE(t.ok());
    const TransferResult r = FetchOk(**t, "m", l, twin.dl, blocks);
    CHECK(r.path == "compressed_local");
    double worst = 0;
    for (size_t i = 0; i < twin.dev.size(); ++i) {
      std::vector<uint8_t> got(twin.dev[i]->size());
      twin.dev[i]->Download(got.data(), got.size());
      worst = std::max(worst, RelativeRms(got, twin.host.buffers[i]));
    }
    std::printf(
        "gemm mode %s: GPU decode vs CPU decode, relative RMS error "
        "%.3g (bound %.0e)\n",
        m.name, worst, m.max_rel);
    CHECK(worst <= m.max_rel);
    REQUIRE(cm->Release(l.id).ok());
  }
}

TEST_CASE("stage_cold: the daemon stages cold pages, device_ipc serves them",
          "[gpu][hit_path][stage]") {
  TempDir dir;
  auto d = testing::StartChildDaemon(dir.path, "stage", kDeviceConfig);
  REQUIRE(d->started());
  const Geometry g = ExactKvtcGeometry();
  const std::string cal_bytes = ExactKvtcCalibration(g);
  ClientOptions staging = Exact();
  staging.stage_cold = true;
  auto c = Connect(*d, staging);
  for (Tier cold : {Tier::kHostCompressed, Tier::kDisk}) {
    const std::string ns = cold == Tier::kDisk ? "disk" : "host";
    INFO(ns);
    client::NamespaceSpec spec = KvtcSpec(ns, g, cal_bytes, 64);
    spec.disk_dir = dir.path + "/" + ns;
    REQUIRE(c->CreateNamespace(spec).ok());
    const uint64_t pb = g.PageBytes();
    const auto tokens = testing::TokenRange(24 * g.page_size, 5);
    REQUIRE(c->Insert(ns, tokens, testing::FloatPages(24, pb, 6), pb).ok());
    REQUIRE(c->Demote(ns, cold).ok());
    const client::Lease l = Lock(*c, ns, tokens);
    REQUIRE(l.page_tiers[0] == cold);
    auto want = c->Fetch(ns, client::FetchSource::FromLease(l.id),
                         FetchFormat::kCompressed);  // the SDK's CPU decode
    REQUIRE(want.ok());
    std::vector<int64_t> blocks(24);
    for (int i = 0; i < 24; ++i) blocks[i] = 23 - i;
    Twin twin(EngineLayout::kVllm, g, 0, 2, 24);
    twin.Expect(g, *want, blocks);
    auto t = Transfer(c.get());
    const TransferResult r = FetchOk(*t, ns, l, twin.dl, blocks);
    CHECK(r.path == "device_ipc");
    CHECK(std::any_of(r.stages.begin(), r.stages.end(),
                      [](const auto& s) { return s.first == "stage"; }));
    twin.CheckEqual();  // the daemon's GPU decode equals the CPU decode
    REQUIRE(c->Release(l.id).ok());
    // Staged pages stay hot: the next hit is a plain device hit.
    const client::Lease again = Lock(*c, ns, tokens);
    CHECK(again.page_tiers[0] == Tier::kRaw);
    Twin twin2(EngineLayout::kVllm, g, 0, 2, 24);
    twin2.Expect(g, *want, blocks);
    CHECK(FetchOk(*t, ns, again, twin2.dl, blocks).path == "device_ipc");
    twin2.CheckEqual();
    REQUIRE(c->Release(again.id).ok());
  }
  // Without room on the daemon's GPU, the cold pages take compressed_local.
  REQUIRE(c->CreateNamespace(KvtcSpec("small", g, cal_bytes, 4)).ok());
  const uint64_t pb = g.PageBytes();
  const auto cold_tok = testing::TokenRange(2 * g.page_size, 900);
  const auto hot_tok = testing::TokenRange(4 * g.page_size, 950);
  REQUIRE(c->Insert("small", cold_tok, testing::FloatPages(2, pb, 7), pb).ok());
  REQUIRE(c->Demote("small", Tier::kHostCompressed).ok());
  REQUIRE(c->Insert("small", hot_tok, testing::FloatPages(4, pb, 8), pb).ok());
  const client::Lease hot = Lock(*c, "small", hot_tok);
  const client::Lease cl = Lock(*c, "small", cold_tok);
  std::vector<int64_t> blocks = {0, 1};
  Twin twin(EngineLayout::kVllm, g, 0, 2, 2);
  auto want = c->Fetch("small", client::FetchSource::FromLease(cl.id),
                       FetchFormat::kCompressed);
  REQUIRE(want.ok());
  twin.Expect(g, *want, blocks);
  auto t = Transfer(c.get());
  const TransferResult r = FetchOk(*t, "small", cl, twin.dl, blocks);
  CHECK(r.path == "compressed_local");
  CHECK(absl::StrContains(absl::StrJoin(r.fallbacks, " | "), "stage_cold: "));
  twin.CheckEqual();
  REQUIRE(c->Release(cl.id).ok());
  REQUIRE(c->Release(hot.id).ok());
}

TEST_CASE("host_shm: the shared arena registered once, again after a punch",
          "[gpu][hit_path]") {
  TempDir dir;
  const std::string sock = dir.path + "/kvh.sock";
  auto d = testing::StartChildDaemon(dir.path, "shm",
                                     "store:\n  pool_budget_bytes: 256MiB\n",
                                     {"--host_ipc_socket=" + sock});
  REQUIRE(d->started());
  auto c = Connect(*d);
  const Geometry g = Bf16Geometry();
  const uint64_t pb = g.PageBytes();
  for (const char* ns : {"a", "b"}) {
    REQUIRE(c->CreateNamespace(testing::MakeSpec(ns, g.num_layers,
                                                 g.num_kv_heads, g.head_dim,
                                                 g.page_size, g.dtype, 64 * pb))
                .ok());
  }
  const auto tokens = testing::TokenRange(40 * g.page_size, 5);
  const auto pages = testing::RandomBytes(40 * pb, 6);
  REQUIRE(c->Insert("a", tokens, pages, pb).ok());
  REQUIRE(c->Insert("b", tokens, pages, pb).ok());
  client::LayoutTransferOptions small;
  small.staging_slot_bytes = 8 * pb;
  auto t = LayoutTransfer::Create(c.get(), small);
  REQUIRE(t.ok());
  std::vector<int64_t> blocks(40);
  for (int i = 0; i < 40; ++i) blocks[i] = (i * 7) % 40;
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    if (round == 2) {  // a range given back: registrations start over
      REQUIRE(c->DeleteNamespace("b").ok());
      absl::SleepFor(absl::Milliseconds(200));
    }
    const client::Lease l = Lock(*c, "a", tokens);
    Twin twin(EngineLayout::kFlashInfer, g, 0, 4, 40);
    twin.Expect(g, Split(pages, pb, 0, 40), blocks);
    const TransferResult r = FetchOk(**t, "a", l, twin.dl, blocks);
    CHECK(r.path == "host_shm");
    CHECK((*t)->host_registered_bytes() > 0);
    twin.CheckEqual();
    REQUIRE(c->Release(l.id).ok());
  }
}

TEST_CASE(
    "host_shm insert: the daemon copies the pages out of the staging "
    "region",
    "[gpu][hit_path]") {
  TempDir dir;
  const std::string sock = dir.path + "/kvh.sock";
  auto d = testing::StartChildDaemon(dir.path, "stage_ins",
                                     "store:\n  pool_budget_bytes: 256MiB\n",
                                     {"--host_ipc_socket=" + sock});
  REQUIRE(d->started());
  auto c = Connect(*d);
  const Geometry g = Bf16Geometry();
  const uint64_t pb = g.PageBytes();
  REQUIRE(c->CreateNamespace(testing::MakeSpec("s", g.num_layers,
                                               g.num_kv_heads, g.head_dim,
                                               g.page_size, g.dtype, 128 * pb))
              .ok());
  Twin twin(EngineLayout::kFlashInfer, g, 0, 4, 30);
  for (size_t i = 0; i < twin.dev.size(); ++i) {
    const auto data = testing::RandomBytes(twin.dev[i]->size(), 40 + i);
    twin.dev[i]->Upload(data.data(), data.size());
    std::copy(data.begin(), data.end(), twin.host.buffers[i].begin());
  }
  std::vector<int64_t> blocks(25);
  for (int i = 0; i < 25; ++i) blocks[i] = (i * 7) % 30;
  std::vector<std::vector<uint8_t>> want(25, std::vector<uint8_t>(pb));
  std::vector<uint8_t*> dst;
  for (auto& p : want) dst.push_back(p.data());
  REQUIRE(GatherLayoutToPages(g, twin.hl, blocks, dst).ok());
  client::LayoutTransferOptions small;
  small.staging_slot_bytes = 4 * pb;
  auto t = LayoutTransfer::Create(c.get(), small);
  REQUIRE(t.ok());
  for (int round = 0; round < 2; ++round) {  // the region is kept
    INFO("round " << round);
    const auto toks = testing::TokenRange(25 * g.page_size, 300 + round * 50);
    auto r = (*t)->Insert("s", toks, twin.dl, blocks);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(r->second.path == "host_shm");
    // device_ipc was tried first (no device tier: its note), nothing else.
    for (const std::string& f : r->second.fallbacks) {
      CHECK(absl::StartsWith(f, "device_ipc: FAILED_PRECONDITION"));
    }
    CHECK(r->first.pages_stored == 25);
    const client::Lease l = Lock(*c, "s", toks);
    auto got = c->Fetch("s", client::FetchSource::FromLease(l.id));
    REQUIRE(got.ok());
    CHECK(*got == want);
    REQUIRE(c->Release(l.id).ok());
  }
}

TEST_CASE("remote-style: the gRPC stream, or the bulk data plane",
          "[gpu][hit_path]") {
  // gRPC only (the plane off): raw_remote and compressed_remote; with the
  // daemon's bulk data plane: remote_bulk for the raw pages, whether the
  // path is picked or RAW is asked for (docs/data_plane.md).
  for (bool plane : {false, true}) {
    INFO((plane ? "bulk data plane" : "gRPC only"));
    TempDir dir;
    auto d = testing::StartChildDaemon(
        dir.path, "remote",
        std::string(kDeviceConfig) +
            (plane ? "data_plane:\n  listen: 127.0.0.1:0\n" : ""));
    REQUIRE(d->started());
    ClientOptions remote = Exact();
    remote.host_fetch = HostFetchMode::kOff;
    remote.device_ipc = DeviceIpcMode::kOff;
    if (!plane) remote.data_plane = DataPlaneMode::kOff;
    auto c = Connect(*d, remote);
    const Geometry g = Bf16Geometry();
    const uint64_t pb = g.PageBytes();
    client::NamespaceSpec spec =
        testing::MakeSpec("r", g.num_layers, g.num_kv_heads, g.head_dim,
                          g.page_size, g.dtype, 64 * pb);
    spec.host_compressed_bytes = 8 << 20;
    REQUIRE(c->CreateNamespace(spec).ok());
    const auto tokens = testing::TokenRange(20 * g.page_size, 8);
    const auto pages = testing::RandomBytes(20 * pb, 9);
    REQUIRE(c->Insert("r", tokens, pages, pb).ok());
    client::LayoutTransferOptions small;
    small.staging_slot_bytes = 3 * pb;
    auto t = LayoutTransfer::Create(c.get(), small);
    REQUIRE(t.ok());
    std::vector<int64_t> blocks(20);
    for (int i = 0; i < 20; ++i) blocks[i] = 19 - i;
    for (int round : {0, 1, 2}) {  // hot, hot with RAW asked for, cold
      const bool cold = round == 2;
      if (cold) REQUIRE(c->Demote("r", Tier::kHostCompressed).ok());
      const client::Lease l = Lock(*c, "r", tokens);
      Twin twin(EngineLayout::kHfDense, g, 0, 4, 20);
      twin.Expect(g, Split(pages, pb, 0, 20), blocks);
      LayoutFetchOptions o;
      if (round == 1) o.format = FetchFormat::kRaw;
      const TransferResult r = FetchOk(**t, "r", l, twin.dl, blocks, o);
      CHECK(r.path == (cold    ? "compressed_remote"
                       : plane ? "remote_bulk"
                               : "raw_remote"));
      CHECK(r.fallbacks.empty());
      twin.CheckEqual();
      REQUIRE(c->Release(l.id).ok());
    }
  }
}

// The layer ranges a layer-wise load of `g` asks for: every layer, the
// first, a middle pair and the last.
std::vector<LayerRange> LoadRanges(const Geometry& g) {
  return {LayerRange{0, g.num_layers}, LayerRange{0, 1},
          LayerRange{1, std::min<uint32_t>(3, g.num_layers)},
          LayerRange{g.num_layers - 1, g.num_layers}};
}

// Fetches lease pages into layouts of each range of `g` on `t` and checks
// every byte against the CPU reference (the same layers of whole pages),
// the path, and bytes_moved: the range's share of the raw pages; on the
// compressed paths that of a whole fetch (pages decode whole).
void CheckLayerRanges(LayoutTransfer& t, const std::string& ns,
                      const client::Lease& l, const Geometry& g,
                      const std::vector<uint8_t>& pages, uint32_t n,
                      const std::string& path, LayoutFetchOptions o = {}) {
  const uint64_t pb = g.PageBytes();
  std::vector<int64_t> blocks(n);
  for (uint32_t i = 0; i < n; ++i) blocks[i] = (i * 7 + 3) % (n + 2);
  uint64_t whole_moved = 0;
  for (LayerRange r : LoadRanges(g)) {
    for (EngineLayout e :
         {EngineLayout::kVllm, EngineLayout::kSglangPageFirst}) {
      INFO(path << " " << testing::EngineLayoutName(e) << " layers [" << r.begin
                << ", " << r.end << ") page layout "
                << static_cast<int>(g.layout));
      Twin twin(e, g, r.begin, r.count(), n + 2);
      twin.Expect(g, Split(pages, pb, o.start_page, n), blocks);
      const TransferResult got = FetchOk(t, ns, l, twin.dl, blocks, o);
      CHECK(got.path == path);
      CHECK(got.pages == n);
      twin.CheckEqual();
      if (r.count() == g.num_layers) whole_moved = got.bytes_moved;
      if (absl::StartsWith(path, "compressed")) {
        CHECK(got.bytes_moved == whole_moved);
      } else {
        CHECK(got.bytes_moved == uint64_t{n} * LayerRuns(g, r).total());
      }
    }
  }
}

TEST_CASE("layer-wise loads: each path moves only the layout's layers",
          "[gpu][hit_path][layers]") {
  TempDir dir;
  const std::string sock = dir.path + "/kvh.sock";
  auto dev = testing::StartChildDaemon(dir.path, "lw_dev", kDeviceConfig);
  REQUIRE(dev->started());
  // No device pool: the pages lie in the shared host arena. Three layers
  // make 24 KiB pages, so some straddle the 2 MiB registration chunks.
  auto shm = testing::StartChildDaemon(dir.path, "lw_shm",
                                       "store:\n  pool_budget_bytes: 256MiB\n",
                                       {"--host_ipc_socket=" + sock});
  REQUIRE(shm->started());
  for (PageLayout pl :
       {PageLayout::kKvLayerTokenHeadDim, PageLayout::kLayerKvTokenHeadDim}) {
    Geometry g = Bf16Geometry();
    g.layout = pl;
    const uint64_t pb = g.PageBytes();
    client::NamespaceSpec spec =
        testing::MakeSpec("lw", g.num_layers, g.num_kv_heads, g.head_dim,
                          g.page_size, g.dtype, 64 * pb);
    spec.geometry.layout = pl;
    spec.host_compressed_bytes = 8 << 20;
    auto c = Connect(*dev);
    REQUIRE(c->CreateNamespace(spec).ok());
    const auto tokens = testing::TokenRange(12 * g.page_size, 11);
    const auto pages = testing::RandomBytes(12 * pb, 12);
    REQUIRE(c->Insert("lw", tokens, pages, pb).ok());
    client::LayoutTransferOptions small;
    small.staging_slot_bytes = 3 * pb;  // several chunks of layer pages
    auto t = LayoutTransfer::Create(c.get(), small);
    REQUIRE(t.ok());
    LayoutFetchOptions o;
    o.start_page = 1;
    {
      const client::Lease l = Lock(*c, "lw", tokens);
      CheckLayerRanges(**t, "lw", l, g, pages, 10, "device_ipc", o);
      LayoutFetchOptions raw = o;
      raw.format = FetchFormat::kRaw;
      CheckLayerRanges(**t, "lw", l, g, pages, 10, "raw_remote", raw);
      LayoutFetchOptions comp = o;
      comp.format = FetchFormat::kCompressed;
      CheckLayerRanges(**t, "lw", l, g, pages, 10, "compressed_local", comp);
      REQUIRE(c->Release(l.id).ok());
    }
    // Cold pages without gpu_decode: the daemon decodes, a layer-range RAW
    // stream carries the range.
    REQUIRE(c->Demote("lw", Tier::kHostCompressed).ok());
    ClientOptions no_decode = Exact();
    no_decode.gpu_decode = false;
    auto c2 = Connect(*dev, no_decode);
    auto t2 = LayoutTransfer::Create(c2.get(), small);
    REQUIRE(t2.ok());
    {
      const client::Lease cold = Lock(*c2, "lw", tokens);
      CheckLayerRanges(**t2, "lw", cold, g, pages, 10, "raw_remote", o);
      REQUIRE(c2->Release(cold.id).ok());
    }
    REQUIRE(c->DeleteNamespace("lw").ok());

    // host_shm, three layers, 100 pages (2.4 MiB: two registration chunks).
    Geometry g3 = g;
    g3.num_layers = 3;
    const uint64_t pb3 = g3.PageBytes();
    client::NamespaceSpec spec3 =
        testing::MakeSpec("lw3", 3, g3.num_kv_heads, g3.head_dim, g3.page_size,
                          g3.dtype, 128 * pb3);
    spec3.geometry.layout = pl;
    auto cs = Connect(*shm);
    REQUIRE(cs->CreateNamespace(spec3).ok());
    const auto tokens3 = testing::TokenRange(100 * g3.page_size, 13);
    const auto pages3 = testing::RandomBytes(100 * pb3, 14);
    REQUIRE(cs->Insert("lw3", tokens3, pages3, pb3).ok());
    client::LayoutTransferOptions slots;
    slots.staging_slot_bytes = 16 * pb3;
    slots.register_chunk_bytes = 2 << 20;  // the least the registry takes
    auto ts = LayoutTransfer::Create(cs.get(), slots);
    REQUIRE(ts.ok());
    const client::Lease l3 = Lock(*cs, "lw3", tokens3);
    CheckLayerRanges(**ts, "lw3", l3, g3, pages3, 98, "host_shm");
    REQUIRE(cs->Release(l3.id).ok());
    REQUIRE(cs->DeleteNamespace("lw3").ok());
  }
}

TEST_CASE("insert from a GPU layout stores what the gather makes",
          "[gpu][hit_path]") {
  TempDir dir;
  auto d = testing::StartChildDaemon(dir.path, "ins", kDeviceConfig);
  REQUIRE(d->started());
  auto c = Connect(*d);
  const Geometry g = Bf16Geometry();
  const uint64_t pb = g.PageBytes();
  REQUIRE(c->CreateNamespace(testing::MakeSpec("i", g.num_layers,
                                               g.num_kv_heads, g.head_dim,
                                               g.page_size, g.dtype, 128 * pb))
              .ok());
  Twin twin(EngineLayout::kSglangPageFirst, g, 0, 4, 30);
  for (size_t i = 0; i < twin.dev.size(); ++i) {
    const auto data = testing::RandomBytes(twin.dev[i]->size(), 20 + i);
    twin.dev[i]->Upload(data.data(), data.size());
    std::copy(data.begin(), data.end(), twin.host.buffers[i].begin());
  }
  std::vector<int64_t> blocks(25);
  for (int i = 0; i < 25; ++i) blocks[i] = (i * 11) % 30;
  const auto tokens = testing::TokenRange(25 * g.page_size, 70);
  client::LayoutTransferOptions small;
  small.staging_slot_bytes = 4 * pb;
  auto t = LayoutTransfer::Create(c.get(), small);
  REQUIRE(t.ok());
  std::vector<std::vector<uint8_t>> want(25, std::vector<uint8_t>(pb));
  std::vector<uint8_t*> dst;
  for (auto& p : want) dst.push_back(p.data());
  REQUIRE(GatherLayoutToPages(g, twin.hl, blocks, dst).ok());
  // By default the daemon's device tier by CUDA IPC; with device_ipc off
  // the pinned staging path; each stores exactly what the gather makes.
  for (const bool ipc : {true, false}) {
    INFO("device_ipc " << ipc);
    const auto toks = testing::TokenRange(25 * g.page_size, ipc ? 70 : 9000);
    client::LayoutInsertOptions o;
    if (!ipc) o.device_ipc = false;
    auto r = (*t)->Insert("i", toks, twin.dl, blocks, o);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(r->first.pages_stored == 25);
    CHECK(r->second.path == (ipc ? "device_ipc" : "pinned"));
    CHECK(r->second.fallbacks.empty());
    CHECK(r->second.bytes_moved == 25 * pb);
    if (ipc) {
      const auto& st = r->second.stages;
      CHECK(std::any_of(st.begin(), st.end(), [](const auto& s) {
        return s.first == "gather" && s.second > 0;
      }));
    }
    const client::Lease l = Lock(*c, "i", toks);
    auto got = c->Fetch("i", client::FetchSource::FromLease(l.id));
    REQUIRE(got.ok());
    CHECK(*got == want);
    REQUIRE(c->Release(l.id).ok());
  }
  // Pages already cached are not written again: a prefix of 10 stored
  // pages, then all 25 through device_ipc (15 slots reserved).
  const auto again = testing::TokenRange(25 * g.page_size, 20000);
  REQUIRE((*t)->Insert("i",
                       absl::MakeConstSpan(again).subspan(0, 10 * g.page_size),
                       twin.dl, absl::MakeConstSpan(blocks).subspan(0, 10))
              .ok());
  auto r = (*t)->Insert("i", again, twin.dl, blocks);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->second.path == "device_ipc");
  CHECK(r->first.pages_stored == 15);
  CHECK(r->second.bytes_moved == 15 * pb);
  const client::Lease l = Lock(*c, "i", again);
  auto got = c->Fetch("i", client::FetchSource::FromLease(l.id));
  REQUIRE(got.ok());
  CHECK(*got == want);
}

TEST_CASE("bad input on the GPU: named, nothing written, IPC falls back",
          "[gpu][hit_path]") {
  TempDir dir;
  auto d = testing::StartChildDaemon(dir.path, "noipc", kNoIpcConfig);
  REQUIRE(d->started());
  auto c = Connect(*d);
  const Geometry g = Bf16Geometry();
  const uint64_t pb = g.PageBytes();
  REQUIRE(c->CreateNamespace(testing::MakeSpec("b", g.num_layers,
                                               g.num_kv_heads, g.head_dim,
                                               g.page_size, g.dtype, 16 * pb))
              .ok());
  const auto tokens = testing::TokenRange(4 * g.page_size, 1);
  const auto pages = testing::RandomBytes(4 * pb, 1);
  REQUIRE(c->Insert("b", tokens, pages, pb).ok());
  const client::Lease l = Lock(*c, "b", tokens);
  auto t = Transfer(c.get());
  Twin twin(EngineLayout::kVllm, g, 0, 4, 4);
  auto expect = [&](const PagedKvLayout& layout, std::vector<int64_t> blocks,
                    const std::string& field) {
    LayoutFetchOptions o;
    auto r = t->Fetch("b", l.id, layout, blocks, o);
    INFO(r.status().ToString());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StartsWith(r.status().message(), field));
    CHECK(twin.Untouched());
  };
  PagedKvLayout host_mem = twin.hl;  // host addresses called device memory
  host_mem.device = 0;
  expect(host_mem, {0, 1, 2, 3}, "layout.k[0]");
  PagedKvLayout other_gpu = twin.dl;
  other_gpu.device = 1;
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  expect(other_gpu, {0, 1, 2, 3}, count > 1 ? "layout.k[0]" : "layout.device");
  PagedKvLayout short_buffer = twin.dl;
  short_buffer.v_bytes[3] -= 2;
  expect(short_buffer, {0, 1, 2, 3}, "layout.v[3]");
  PagedKvLayout wrong_heads = twin.dl;
  wrong_heads.num_kv_heads = 4;
  expect(wrong_heads, {0, 1, 2, 3}, "layout.num_kv_heads");
  PagedKvLayout past_end = twin.dl;  // layers [1, 5) of 4
  past_end.layer_begin = 1;
  expect(past_end, {0, 1, 2, 3}, "layout.num_layers");
  PagedKvLayout no_such_layer = twin.dl;
  no_such_layer.layer_begin = 4;
  expect(no_such_layer, {0, 1, 2, 3}, "layout.layer_begin");
  expect(twin.dl, {0, 1, 2, 4}, "block_ids[3]");
  expect(twin.dl, {0, 1, 1, 3}, "block_ids[2]");
  // An option out of range is refused when the transfer is made.
  for (int streams : {0, client::kMaxCompressedStreams + 1}) {
    client::LayoutTransferOptions o;
    o.compressed_streams = streams;
    auto bad = LayoutTransfer::Create(c.get(), o);
    CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(
        absl::StartsWith(bad.status().message(), "options.compressed_streams"));
  }
  {
    client::LayoutTransferOptions o;
    o.h2d_batch_bytes = client::kMaxH2dBatchBytes + 1;
    auto bad = LayoutTransfer::Create(c.get(), o);
    CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StartsWith(bad.status().message(), "options.h2d_batch_bytes"));
  }
  // IPC not allowed by this daemon: the fetch falls back and says why.
  twin.Expect(g, Split(pages, pb, 0, 4), {3, 2, 1, 0});
  const TransferResult r = FetchOk(*t, "b", l, twin.dl, {3, 2, 1, 0});
  CHECK(r.path == "raw_remote");
  REQUIRE(!r.fallbacks.empty());
  CHECK(absl::StartsWith(r.fallbacks[0], "device_ipc: FAILED_PRECONDITION"));
  twin.CheckEqual();
  REQUIRE(c->Release(l.id).ok());
  // An insert from the layout: pinned staging, saying why not device_ipc;
  // device_ipc forced: FAILED_PRECONDITION naming it, nothing stored.
  const auto fresh = testing::TokenRange(2 * g.page_size, 500);
  client::LayoutInsertOptions forced;
  forced.device_ipc = true;
  auto refused = t->Insert("b", fresh, twin.dl, {0, 1}, forced);
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StartsWith(refused.status().message(), "device_ipc: "));
  auto none = c->Match("b", fresh, /*lock=*/false);
  REQUIRE(none.ok());
  CHECK(none->matched_tokens == 0);
  auto ins = t->Insert("b", fresh, twin.dl, {0, 1});
  INFO(ins.status().ToString());
  REQUIRE(ins.ok());
  CHECK(ins->second.path == "pinned");
  REQUIRE(!ins->second.fallbacks.empty());
  CHECK(absl::StartsWith(ins->second.fallbacks[0],
                         "device_ipc: FAILED_PRECONDITION"));
  auto bad = t->Insert("b", fresh, twin.dl, {0, 4}, forced);
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StartsWith(bad.status().message(), "block_ids[1]"));
}

}  // namespace
}  // namespace kvharbor
