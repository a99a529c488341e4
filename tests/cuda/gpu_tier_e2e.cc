// GPU tier 0 end to end (GPU machine only; built as kvharbor_gpu_tier_tests,
// run by scripts/gpu_checks.sh): a daemon whose namespace pools live in a
// cudaMalloc arena, driven through the SDK. The tier state machine of
// tests/client/tiers_test.cc again: inserts land on the device and come back
// byte-exact; pool pressure compresses LRU device pages into the host tier
// (KVTC: batched on the GPU straight into pinned memory; identity: on the
// CPU from host copies); RAW fetches of cold pages decode within the codec's
// bounds (identity exactly), COMPRESSED fetches decode to the same bytes;
// the disk tier serves what the host tier held; and the GPU-evicted KVTC
// pages agree with a host-pool daemon's CPU eviction of the same data. RAW
// fetches of cold KVTC pages decode on the GPU (KvtcBatchDecoder, checked
// against the CPU codec page by page), promote_on_fetch brings them back to
// the device, and after a calibration switch the new calibration evicts and
// decodes on the GPU too. The SDK's GpuPageDecoder (client/cuda/gpu_decode.h)
// decodes COMPRESSED fetches on the client's GPU to the bytes of the SDK's
// CPU decode.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvharbor/client.h"
#include "client/cuda/gpu_decode.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/codec/kvtc/kvtc_codec.h"
#include "core/codec/kvtc/kvtc_split.h"
#include "cuda/tier/device_tier.h"
#include "server/daemon/daemon.h"
#include "spdlog/spdlog.h"
#include "tests/client/client_test_util.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

using client::FetchFormat;
using client::FetchSource;
using client::Tier;
using testing::FloatPages;
using testing::TempDir;
using testing::TokenRange;

// fp32, 2 layers, 2 heads, head_dim 8, 4 tokens a page: 1 KiB pages.
constexpr uint32_t kLayers = 2, kHeads = 2, kHeadDim = 8, kPageSize = 4;
constexpr uint64_t kPageBytes = 2 * kLayers * kPageSize * kHeads * kHeadDim * 4;

// A daemon with a device arena of `device_bytes` on GPU 0 (0: host pools).
std::unique_ptr<Daemon> StartDaemon(uint64_t device_bytes,
                                    bool promote_on_fetch = false) {
  spdlog::set_level(spdlog::level::warn);
  DaemonOptions o;
  o.listen = "127.0.0.1:0";
  o.store.pool_budget_bytes = uint64_t{512} << 20;
  o.store.default_namespace_bytes = uint64_t{1} << 20;
  o.store.device_pool_bytes = device_bytes;
  o.store.promote_on_fetch = promote_on_fetch;
  o.drain_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  return *std::move(d);
}

gpu::CudaDeviceTier* DeviceTierOf(Daemon& d) {
  return dynamic_cast<gpu::CudaDeviceTier*>(
      d.store().options().device_tier.get());
}

client::NamespaceSpec Spec(const std::string& name, uint32_t pages,
                           const std::string& disk_dir) {
  client::NamespaceSpec s =
      testing::MakeSpec(name, kLayers, kHeads, kHeadDim, kPageSize,
                        client::DType::kFP32, pages * kPageBytes);
  s.host_compressed_bytes = 1 << 20;
  s.disk_dir = disk_dir;
  return s;
}

std::vector<uint8_t> Page(const std::vector<uint8_t>& all, size_t i) {
  return std::vector<uint8_t>(all.begin() + i * kPageBytes,
                              all.begin() + (i + 1) * kPageBytes);
}

client::Lease MatchIn(Client& c, const std::string& ns,
                      const std::vector<int32_t>& tokens, Tier tier) {
  absl::StatusOr<client::Lease> m = c.Match(ns, tokens, /*lock=*/true);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  REQUIRE(m->pages.size() == tokens.size() / kPageSize);
  for (Tier t : m->page_tiers) CHECK(client::TierName(t) == TierName(tier));
  return *m;
}

std::vector<std::vector<uint8_t>> FetchAll(Client& c, const std::string& ns,
                                           const client::Lease& l,
                                           FetchFormat f) {
  auto pages = c.Fetch(ns, FetchSource::FromLease(l.id), f);
  INFO(pages.status().ToString());
  REQUIRE(pages.ok());
  REQUIRE(pages->size() == l.pages.size());
  return *std::move(pages);
}

// Largest excess of |decoded - want| over KVTC FP8's bound (relative error
// 2^-4, E4M3's 3 mantissa bits) across a page of fp32 values.
double WorstOverBound(const std::vector<uint8_t>& want,
                      const std::vector<uint8_t>& got) {
  double worst = 0;
  for (size_t k = 0; k + 4 <= want.size(); k += 4) {
    float x, y;
    std::memcpy(&x, &want[k], 4);
    std::memcpy(&y, &got[k], 4);
    worst = std::max(worst, std::fabs(double(y) - x) - std::fabs(x) / 16.0);
  }
  return worst;
}

TEST_CASE("GPU tier: identity pages device -> host -> disk, byte-exact",
          "[gpu][tiers]") {
  TempDir dir;
  auto daemon = StartDaemon(uint64_t{64} << 20);
  gpu::CudaDeviceTier* tier = DeviceTierOf(*daemon);
  REQUIRE(tier != nullptr);
  const uint64_t free_before = tier->arena().free_bytes();
  auto c = testing::Connect(*daemon);
  const std::string ns = "id";
  REQUIRE(c->CreateNamespace(Spec(ns, 4, dir.path + "/disk")).ok());
  // The namespace's pool was cut from the device arena.
  CHECK(free_before - tier->arena().free_bytes() >= 4 * kPageBytes);

  const auto a_tok = TokenRange(4 * kPageSize, 100);
  const auto b_tok = TokenRange(4 * kPageSize, 5000);
  const auto a = FloatPages(4, kPageBytes, 1), b = FloatPages(4, kPageBytes, 2);
  REQUIRE(c->Insert(ns, a_tok, a, kPageBytes).ok());
  {
    client::Lease l = MatchIn(*c, ns, a_tok, Tier::kRaw);
    for (FetchFormat f : {FetchFormat::kRaw, FetchFormat::kCompressed}) {
      auto got = FetchAll(*c, ns, l, f);
      for (size_t i = 0; i < 4; ++i) CHECK(got[i] == Page(a, i));
    }
    REQUIRE(c->Release(l.id).ok());
  }
  // The 4-page device pool is full: B pushes A into the host tier.
  REQUIRE(c->Insert(ns, b_tok, b, kPageBytes).ok());
  for (Tier t : {Tier::kHostCompressed, Tier::kDisk}) {
    INFO(client::TierName(t));
    if (t == Tier::kDisk) REQUIRE(c->Demote(ns, Tier::kDisk).ok());
    client::Lease l = MatchIn(*c, ns, a_tok, t);
    for (FetchFormat f : {FetchFormat::kRaw, FetchFormat::kCompressed}) {
      auto got = FetchAll(*c, ns, l, f);
      for (size_t i = 0; i < 4; ++i) CHECK(got[i] == Page(a, i));
    }
    REQUIRE(c->Release(l.id).ok());
  }
  auto stats = c->Stats(ns);
  REQUIRE(stats.ok());
  // A by the insert (4), then B raw -> host (4), all 8 host -> disk.
  CHECK(stats->namespaces[0].demoted_pages == 4 + 4 + 8);
  REQUIRE(c->DeleteNamespace(ns).ok());
  // The range goes back when the last reference (a reader, the metrics
  // poller) lets the namespace go.
  for (int i = 0; i < 200 && tier->arena().free_bytes() != free_before; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK(tier->arena().free_bytes() == free_before);
}

Geometry TestGeometry() {
  Geometry g;
  g.num_layers = kLayers;
  g.num_kv_heads = kHeads;
  g.head_dim = kHeadDim;
  g.page_size = kPageSize;
  g.dtype = DType::kFP32;
  return g;
}

// An all-FP8 identity-basis calibration (projection exact, so GPU and CPU
// decode bit for bit) whose key mean is `mean` (a distinct fingerprint).
std::shared_ptr<KvtcCalibration> KvtcCal(float mean = 0.0f) {
  const Geometry g = TestGeometry();
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  auto cal = testing::MakeCalibration(g, KvtcRowKind::kPerToken,
                                      IdentityBasis(f, f, testing::Fp8All(f)),
                                      IdentityBasis(f, f, testing::Fp8All(f)));
  for (float& m : cal->keys.mean) m = mean;
  return cal;
}

std::string Serialized(const KvtcCalibration& cal) {
  auto bytes = SerializeKvtcCalibration(cal);
  REQUIRE(bytes.ok());
  return *bytes;
}

// The namespace's calibrations as the daemon holds them.
std::vector<CalibrationInfo> CalibrationsOf(Daemon& d, const std::string& ns) {
  auto n = d.store().Get(ns);
  REQUIRE(n.ok());
  return (*n)->ListCalibrations();
}

TEST_CASE("GPU tier: KVTC eviction on the GPU matches the CPU path",
          "[gpu][tiers]") {
  TempDir dir;
  auto cal = KvtcCal();
  auto cal_bytes = SerializeKvtcCalibration(*cal);
  REQUIRE(cal_bytes.ok());

  auto gpu_daemon = StartDaemon(uint64_t{64} << 20);
  REQUIRE(DeviceTierOf(*gpu_daemon) != nullptr);
  auto cpu_daemon = StartDaemon(0);
  REQUIRE(DeviceTierOf(*cpu_daemon) == nullptr);
  auto gc = testing::Connect(*gpu_daemon);
  auto cc = testing::Connect(*cpu_daemon);
  const std::string ns = "k";
  for (auto [c, sub] : {std::pair{gc.get(), "/g"}, std::pair{cc.get(), "/c"}}) {
    client::NamespaceSpec s = Spec(ns, 4, dir.path + sub);
    s.codec = "kvtc";
    s.calibration = *cal_bytes;
    auto r = c->CreateNamespace(s);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
  }
  const auto a_tok = TokenRange(4 * kPageSize, 7);
  const auto b_tok = TokenRange(4 * kPageSize, 9000);
  const auto a = FloatPages(4, kPageBytes, 3), b = FloatPages(4, kPageBytes, 4);
  for (Client* c : {gc.get(), cc.get()}) {
    REQUIRE(c->Insert(ns, a_tok, a, kPageBytes).ok());
  }
  {  // Device hit: raw bytes exactly as inserted.
    client::Lease l = MatchIn(*gc, ns, a_tok, Tier::kRaw);
    auto got = FetchAll(*gc, ns, l, FetchFormat::kRaw);
    for (size_t i = 0; i < 4; ++i) CHECK(got[i] == Page(a, i));
    REQUIRE(gc->Release(l.id).ok());
  }
  // Pool pressure: A is compressed (GPU daemon: on the GPU, in one batch).
  for (Client* c : {gc.get(), cc.get()}) {
    REQUIRE(c->Insert(ns, b_tok, b, kPageBytes).ok());
  }
  std::vector<std::vector<uint8_t>> host_raw[2];
  std::vector<client::CompressedPage> comp[2];
  for (int side = 0; side < 2; ++side) {
    Client& c = side == 0 ? *gc : *cc;
    INFO((side == 0 ? "gpu daemon" : "cpu daemon"));
    client::Lease l = MatchIn(c, ns, a_tok, Tier::kHostCompressed);
    host_raw[side] = FetchAll(c, ns, l, FetchFormat::kRaw);
    auto decoded = FetchAll(c, ns, l, FetchFormat::kCompressed);
    auto cb = c.FetchCompressed(ns, FetchSource::FromLease(l.id));
    REQUIRE(cb.ok());
    comp[side] = *std::move(cb);
    for (size_t i = 0; i < 4; ++i) {
      CHECK(decoded[i] == host_raw[side][i]);  // SDK decodes as the daemon
      CHECK(WorstOverBound(Page(a, i), host_raw[side][i]) <= 1e-2);
      CHECK(host_raw[side][i] != Page(a, i));  // lossy: really KVTC
      CHECK(comp[side][i].codec == "kvtc");
      CHECK(comp[side][i].calibration_fingerprint == cal->Fingerprint());
    }
    REQUIRE(c.Release(l.id).ok());
  }
  // GPU and CPU encoders write the same layout, and their pages decode to
  // values within one FP8 step of each other (GEMM rounding may differ).
  for (size_t i = 0; i < 4; ++i) {
    CHECK(comp[0][i].buffer.size() == comp[1][i].buffer.size());
    CHECK(WorstOverBound(host_raw[1][i], host_raw[0][i]) <= 1e-2);
  }
  // Disk: the GPU-written buffers, now from files, decode to the same bytes.
  REQUIRE(gc->Demote(ns, Tier::kDisk).ok());
  client::Lease l = MatchIn(*gc, ns, a_tok, Tier::kDisk);
  auto disk_raw = FetchAll(*gc, ns, l, FetchFormat::kRaw);
  for (size_t i = 0; i < 4; ++i) CHECK(disk_raw[i] == host_raw[0][i]);
  REQUIRE(gc->Release(l.id).ok());
  auto stats = gc->Stats(ns);
  REQUIRE(stats.ok());
  CHECK(stats->namespaces[0].tiers[2].pages == 8);
  // The GPU daemon's RAW fetches above decoded on the GPU; the CPU one's not.
  CHECK(CalibrationsOf(*gpu_daemon, ns).at(0).gpu);
  CHECK(!CalibrationsOf(*cpu_daemon, ns).at(0).gpu);
}

TEST_CASE("GPU tier: the batch decoder equals the CPU codec page by page",
          "[gpu][tiers]") {
  const Geometry g = TestGeometry();
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  // FP8 and IntX ranges, attention sinks, a mean: every decode stage.
  std::vector<KvtcRange> ranges = {{KvtcQuantType::kFp8, 0, 0, f / 4},
                                   {KvtcQuantType::kIntX, 4, f / 4, f / 2},
                                   {KvtcQuantType::kIntX, 2, f / 2, f}};
  auto cal = testing::MakeCalibration(g, KvtcRowKind::kPerToken,
                                      IdentityBasis(f, f, ranges),
                                      IdentityBasis(f, f, ranges),
                                      /*sink_tokens=*/6);
  for (float& m : cal->values.mean) m = 0.125f;
  CodecParams params;
  params.geometry = g;
  params.calibration = cal;
  params.zstd = true;  // the host tier's buffers may carry the zstd stage
  auto cpu = KvtcCodec::Create(params);
  REQUIRE(cpu.ok());
  params.zstd = false;
  auto gcodec = gpu::KvtcGpuCodec::Create(params);
  REQUIRE(gcodec.ok());
  // 8-page batches: 37 pages take five, the last one short.
  auto dec = gpu::KvtcBatchDecoder::Create(
      0, std::shared_ptr<const gpu::KvtcGpuCodec>(*std::move(gcodec)), 8);
  INFO(dec.status().ToString());
  REQUIRE(dec.ok());
  constexpr size_t kPages = 37;
  const auto bytes = FloatPages(kPages, kPageBytes, 17);
  std::vector<PageRef> refs;
  for (size_t i = 0; i < kPages; ++i) {
    refs.push_back({bytes.data() + i * kPageBytes, i * kPageSize});
  }
  auto batch = (*cpu)->EncodeToString(refs, nullptr);
  REQUIRE(batch.ok());
  auto split = SplitKvtcBatch(
      *cal, g,
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(batch->data()),
                          batch->size()),
      /*zstd=*/true);
  REQUIRE(split.ok());
  (*split)[13][200] ^= 0x40;  // page 13 fails its checksum
  std::vector<absl::Span<const uint8_t>> bufs;
  for (const std::string& b : *split) {
    bufs.push_back(absl::MakeConstSpan(
        reinterpret_cast<const uint8_t*>(b.data()), b.size()));
  }
  std::vector<std::vector<uint8_t>> got(kPages,
                                        std::vector<uint8_t>(kPageBytes, 0xEE)),
      want = got;
  std::vector<MutablePageRef> out;
  for (size_t i = 0; i < kPages; ++i) {
    out.push_back({got[i].data(), i * kPageSize});
  }
  const std::vector<absl::Status> st = (*dec)->DecodeEach(bufs, out);
  REQUIRE(st.size() == kPages);
  for (size_t i = 0; i < kPages; ++i) {
    INFO("page " << i << ": " << st[i].ToString());
    MutablePageRef w{want[i].data(), i * kPageSize};
    const absl::Status cs =
        (*cpu)->Decode(bufs[i], absl::MakeConstSpan(&w, 1), nullptr);
    if (i == 13) {
      CHECK(st[i].code() == absl::StatusCode::kDataLoss);
      CHECK(!cs.ok());
      continue;
    }
    REQUIRE(st[i].ok());
    REQUIRE(cs.ok());
    CHECK(got[i] == want[i]);
  }
  // Merge + EnqueueMerged: batches merged side by side into one pinned
  // region, moved in one H2D copy and decoded from there into device pages
  // give what the CPU codec gives.
  {
    gpu::testing::DeviceBuf dev(kPages * kPageBytes);
    std::vector<MutablePageRef> dref;
    for (size_t i = 0; i < kPages; ++i) {
      dref.push_back({dev.bytes() + i * kPageBytes, i * kPageSize});
    }
    const auto all_bufs = absl::MakeConstSpan(bufs);
    const auto all_refs = absl::MakeConstSpan(dref);
    // Pages [0, 13) and [14, 37) in batches of at most 8 (13 is corrupt).
    const std::pair<size_t, size_t> kBatches[] = {{0, 8},  {8, 5},  {14, 8},
                                                  {22, 8}, {30, 4}, {34, 3}};
    const size_t slot = ((*dec)->max_merged_bytes() + 255) / 256 * 256;
    gpu::testing::PinnedBuf host(slot * std::size(kBatches));
    gpu::testing::DeviceBuf copy(host.size());
    std::vector<absl::Span<const uint8_t>> merged;
    size_t at = 0;
    for (const auto& [first, n] : kBatches) {
      auto size = (*dec)->Merge(all_bufs.subspan(first, n),
                                absl::MakeSpan(host.bytes() + at, slot));
      INFO(size.status().ToString());
      REQUIRE(size.ok());
      merged.push_back(absl::MakeConstSpan(host.bytes() + at, *size));
      at += slot;
    }
    copy.Upload(host.bytes(), at);
    uint64_t last = 0;
    for (size_t k = 0; k < std::size(kBatches); ++k) {
      const auto& [first, n] = kBatches[k];
      const gpu::KvtcDeviceInput input{
          copy.bytes() + (merged[k].data() - host.bytes()), nullptr};
      auto t = (*dec)->EnqueueMerged(merged[k], all_refs.subspan(first, n),
                                     gpu::PagedKvDest{}, input);
      INFO(t.status().ToString());
      REQUIRE(t.ok());
      CHECK(*t > last);
      last = *t;
    }
    REQUIRE((*dec)->FinishToDevice(last).ok());
    for (size_t i = 0; i < kPages; ++i) {
      if (i == 13) continue;
      INFO("page " << i);
      std::vector<uint8_t> d(kPageBytes);
      dev.Download(d.data(), kPageBytes, i * kPageBytes);
      CHECK(d == want[i]);
    }
    // A corrupt page fails the merge, naming it in its batch.
    auto bad = (*dec)->Merge(all_bufs.subspan(8, 8),
                             absl::MakeSpan(host.bytes(), slot));
    CHECK(bad.status().code() == absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(bad.status().message(), "pages[5]"));
    // More than batch_pages() buffers, or no device copy: named.
    auto many = (*dec)->Merge(all_bufs.subspan(0, 9),
                              absl::MakeSpan(host.bytes(), slot));
    CHECK(many.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StartsWith(many.status().message(), "buffers"));
    auto no_input = (*dec)->EnqueueMerged(merged[0], all_refs.subspan(0, 8),
                                          gpu::PagedKvDest{}, {});
    CHECK(no_input.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StartsWith(no_input.status().message(), "input"));
  }
}

TEST_CASE("GPU tier: promote_on_fetch brings fetched pages back to the device",
          "[gpu][tiers]") {
  TempDir dir;
  auto daemon = StartDaemon(uint64_t{64} << 20, /*promote_on_fetch=*/true);
  auto c = testing::Connect(*daemon);
  const std::string ns = "p";
  client::NamespaceSpec s = Spec(ns, 8, dir.path + "/disk");
  s.codec = "kvtc";
  s.calibration = Serialized(*KvtcCal());
  REQUIRE(c->CreateNamespace(s).ok());
  const auto a_tok = TokenRange(4 * kPageSize, 11);
  const auto b_tok = TokenRange(4 * kPageSize, 7000);
  const auto a = FloatPages(4, kPageBytes, 5), b = FloatPages(4, kPageBytes, 6);
  REQUIRE(c->Insert(ns, a_tok, a, kPageBytes).ok());
  REQUIRE(c->Insert(ns, b_tok, b, kPageBytes).ok());
  REQUIRE(c->Demote(ns, Tier::kHostCompressed).ok());
  REQUIRE(c->Demote(ns, Tier::kDisk).ok());
  // B from host memory, A from disk: decoded on the GPU, written back to
  // device slots; the next fetches are device hits of the same bytes.
  for (auto [tok, want, from] : {std::tuple{&b_tok, &b, Tier::kDisk},
                                 std::tuple{&a_tok, &a, Tier::kDisk}}) {
    client::Lease l = MatchIn(*c, ns, *tok, from);
    auto first = FetchAll(*c, ns, l, FetchFormat::kRaw);
    REQUIRE(c->Release(l.id).ok());
    client::Lease hot = MatchIn(*c, ns, *tok, Tier::kRaw);
    auto again = FetchAll(*c, ns, hot, FetchFormat::kRaw);
    REQUIRE(c->Release(hot.id).ok());
    for (size_t i = 0; i < 4; ++i) {
      CHECK(again[i] == first[i]);
      CHECK(WorstOverBound(Page(*want, i), first[i]) <= 1e-2);
    }
  }
  auto stats = c->Stats(ns);
  REQUIRE(stats.ok());
  CHECK(stats->namespaces[0].promoted_pages == 8);
  CHECK(stats->namespaces[0].tiers[0].pages == 8);
  CHECK(stats->namespaces[0].tiers[2].pages == 0);
}

TEST_CASE("GPU tier: after a calibration switch the GPU codecs follow it",
          "[gpu][tiers]") {
  TempDir dir;
  auto gpu_daemon = StartDaemon(uint64_t{64} << 20);
  auto cpu_daemon = StartDaemon(0);
  auto gc = testing::Connect(*gpu_daemon);
  auto cc = testing::Connect(*cpu_daemon);
  const std::string ns = "sw";
  // A small mean: FP8's bound is relative to |x - mean|, so WorstOverBound
  // (relative to |x|) stays meaningful.
  auto cal1 = KvtcCal(0.0f), cal2 = KvtcCal(1.0f / 1024);
  REQUIRE(cal1->Fingerprint() != cal2->Fingerprint());
  const auto a_tok = TokenRange(4 * kPageSize, 3);
  const auto b_tok = TokenRange(4 * kPageSize, 4000);
  const auto a = FloatPages(4, kPageBytes, 8), b = FloatPages(4, kPageBytes, 9);
  std::vector<client::CompressedPage> comp[2];
  std::vector<std::vector<uint8_t>> raw[2];
  for (int side = 0; side < 2; ++side) {
    Client& c = side == 0 ? *gc : *cc;
    client::NamespaceSpec s = Spec(ns, 8, "");
    s.codec = "kvtc";
    s.calibration = Serialized(*cal1);
    REQUIRE(c.CreateNamespace(s).ok());
    REQUIRE(c.Insert(ns, a_tok, a, kPageBytes).ok());
    REQUIRE(c.Demote(ns, Tier::kHostCompressed).ok());
    auto fp = c.UploadCalibration(ns, Serialized(*cal2), /*pin=*/false);
    INFO(fp.status().ToString());
    REQUIRE(fp.ok());
    REQUIRE(*fp == cal2->Fingerprint());
    REQUIRE(c.Insert(ns, b_tok, b, kPageBytes).ok());
    REQUIRE(c.Demote(ns, Tier::kHostCompressed).ok());
    client::Lease l = MatchIn(c, ns, b_tok, Tier::kHostCompressed);
    auto cb = c.FetchCompressed(ns, FetchSource::FromLease(l.id));
    REQUIRE(cb.ok());
    comp[side] = *std::move(cb);
    raw[side] = FetchAll(c, ns, l, FetchFormat::kRaw);
    auto sdk = FetchAll(c, ns, l, FetchFormat::kCompressed);
    REQUIRE(c.Release(l.id).ok());
    for (size_t i = 0; i < 4; ++i) {
      CHECK(comp[side][i].calibration_fingerprint == cal2->Fingerprint());
      CHECK(sdk[i] == raw[side][i]);  // daemon decode == SDK decode
      CHECK(WorstOverBound(Page(b, i), raw[side][i]) <= 1e-2);
    }
  }
  for (size_t i = 0; i < 4; ++i) {
    CHECK(comp[0][i].buffer.size() == comp[1][i].buffer.size());
    CHECK(WorstOverBound(raw[1][i], raw[0][i]) <= 1e-2);
  }
  // Both calibrations hold pages and have GPU twins on the GPU daemon.
  const auto cals = CalibrationsOf(*gpu_daemon, ns);
  REQUIRE(cals.size() == 2);
  for (const auto& info : cals) {
    CHECK(info.gpu);
    CHECK(info.pages == 4);
  }
  // Old pages still decode with theirs.
  client::Lease l = MatchIn(*gc, ns, a_tok, Tier::kHostCompressed);
  auto old = FetchAll(*gc, ns, l, FetchFormat::kRaw);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(WorstOverBound(Page(a, i), old[i]) <= 1e-2);
  }
  REQUIRE(gc->Release(l.id).ok());
}

// Pages of `ns` demoted to host-compressed, fetched compressed through the
// SDK, with the namespace's calibration (what GpuPageDecoder is made from).
std::vector<client::CompressedPage> CompressedPages(
    Client& c, const std::string& ns, const std::vector<int32_t>& tokens) {
  REQUIRE(c.Demote(ns, Tier::kHostCompressed).ok());
  client::Lease l = MatchIn(c, ns, tokens, Tier::kHostCompressed);
  auto comp = c.FetchCompressed(ns, FetchSource::FromLease(l.id));
  INFO(comp.status().ToString());
  REQUIRE(comp.ok());
  REQUIRE(c.Release(l.id).ok());
  return *std::move(comp);
}

std::vector<uint8_t*> Dsts(std::vector<std::vector<uint8_t>>& pages) {
  std::vector<uint8_t*> d;
  for (auto& p : pages) d.push_back(p.data());
  return d;
}

TEST_CASE("GPU tier: the SDK's GpuPageDecoder equals its CPU decode",
          "[gpu][tiers][sdk]") {
  TempDir dir;
  auto daemon = StartDaemon(0);  // host pools: the daemon's CPU eviction
  auto c = testing::Connect(*daemon);
  constexpr size_t kPages = 8;
  const auto tok = TokenRange(kPages * kPageSize, 300);
  const auto raw = FloatPages(kPages, kPageBytes, 21);
  client::NamespaceSpec s = Spec("kv", kPages, dir.path + "/k");
  s.codec = "kvtc";
  s.calibration = Serialized(*KvtcCal(0.125f));
  REQUIRE(c->CreateNamespace(s).ok());
  REQUIRE(c->Insert("kv", tok, raw, kPageBytes).ok());
  auto comp = CompressedPages(*c, "kv", tok);
  REQUIRE(comp.size() == kPages);
  auto cal = c->GetCalibration("kv");
  REQUIRE(cal.ok());
  // 3-page GPU batches: 8 pages take three, the last one short.
  auto dec = client::GpuPageDecoder::Create(*cal, s.geometry, {0, 3});
  INFO(dec.status().ToString());
  REQUIRE(dec.ok());
  REQUIRE((*dec)->page_bytes() == kPageBytes);
  std::vector<std::vector<uint8_t>> got(kPages,
                                        std::vector<uint8_t>(kPageBytes, 0xEE));
  auto dst = Dsts(got);
  absl::Status st = (*dec)->Decode(comp, dst);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK((*dec)->gpu_pages() == kPages);
  CHECK((*dec)->cpu_pages() == 0);
  for (size_t i = 0; i < kPages; ++i) {
    INFO("page " << i);
    auto want = c->DecodePage("kv", comp[i]);
    REQUIRE(want.ok());
    CHECK(got[i] == *want);  // GPU and CPU decode of a buffer: byte-identical
    CHECK(got[i] != Page(raw, i));  // lossy: really KVTC
    CHECK(WorstOverBound(Page(raw, i), got[i]) <= 1e-2);
  }
  // A corrupt page fails naming its handle; the others still decode.
  auto bad = comp;
  bad[5].buffer[bad[5].buffer.size() / 2] ^= 0x40;
  std::vector<std::vector<uint8_t>> again(kPages,
                                          std::vector<uint8_t>(kPageBytes));
  auto dst2 = Dsts(again);
  st = (*dec)->Decode(bad, dst2);
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(st.message(),
                          absl::StrCat("page ", bad[5].handle, ":")));
  for (size_t i = 0; i < kPages; ++i) {
    if (i != 5) CHECK(again[i] == got[i]);
  }
  // DecodeToDevice in two steps: 8 pages in 3-page batches (the third
  // batch's enqueue finishes the first), two calls in flight, then finished
  // in order; each page equals the host decode.
  {
    gpu::testing::DeviceBuf out(kPages * kPageBytes);
    std::vector<uint8_t*> ddst;
    for (size_t i = 0; i < kPages; ++i) {
      ddst.push_back(out.bytes() + i * kPageBytes);
    }
    const auto all = absl::MakeConstSpan(comp);
    const auto dall = absl::MakeConstSpan(ddst);
    auto t1 = (*dec)->EnqueueToDevice(all.subspan(0, 5), dall.subspan(0, 5));
    auto t2 = (*dec)->EnqueueToDevice(all.subspan(5), dall.subspan(5));
    REQUIRE(t1.ok());
    REQUIRE(t2.ok());
    CHECK(*t2 > *t1);
    CHECK((*dec)->FinishToDevice(*t1).ok());
    CHECK((*dec)->FinishToDevice(*t2).ok());
    for (size_t i = 0; i < kPages; ++i) {
      INFO("page " << i);
      std::vector<uint8_t> d(kPageBytes);
      out.Download(d.data(), kPageBytes, i * kPageBytes);
      CHECK(d == got[i]);
    }
    // A corrupt page fails its batch's call naming it; the decoder has
    // nothing pending after it and decodes again.
    auto tb = (*dec)->EnqueueToDevice(bad, ddst);
    absl::Status fb = tb.ok() ? (*dec)->FinishToDevice(*tb) : tb.status();
    if (!tb.ok()) {
      CHECK((*dec)->FinishToDevice(client::GpuPageDecoder::kAllTickets).ok());
    }
    CHECK(fb.code() == absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(fb.message(), absl::StrCat(bad[5].handle)));
    CHECK((*dec)->DecodeToDevice(comp, ddst).ok());
  }
  // MergeForLayout (the merge step of a gathered copy): 8 pages in batches
  // of 3, 3 and 2 merged side by side at 256-byte aligned offsets, each
  // batch's first page and positions kept; a corrupt page fails it naming
  // the page, with nothing appended. The decode of merged batches is
  // checked by kvharbor_hit_path_tests (gathered copies into the layout).
  {
    const int64_t blocks[kPages] = {};
    gpu::PagedKvDest dest;
    dest.block_ids = blocks;
    std::vector<uint8_t> region((*dec)->MaxMergedBytes(kPages));
    std::vector<client::GpuPageDecoder::MergedBatch> batches;
    auto used =
        (*dec)->MergeForLayout(comp, dest, absl::MakeSpan(region), &batches);
    INFO(used.status().ToString());
    REQUIRE(used.ok());
    CHECK(*used <= region.size());
    REQUIRE(batches.size() == 3);
    for (size_t b = 0; b < 3; ++b) {
      CHECK(batches[b].handle == comp[3 * b].handle);
      CHECK(batches[b].refs.size() == (b < 2 ? 3u : 2u));
      CHECK(batches[b].refs[0].first_position == 3 * b * kPageSize);
      CHECK(batches[b].dest.block_ids == blocks + 3 * b);
      CHECK((batches[b].merged.data() - region.data()) % 256 == 0);
    }
    auto refused =
        (*dec)->MergeForLayout(bad, dest, absl::MakeSpan(region), &batches);
    CHECK(refused.status().code() == absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(refused.status().message(),
                            absl::StrCat("page ", bad[5].handle, ":")));
    CHECK(batches.size() == 3);
  }
  // Device memory is not a destination this decoder writes.
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, kPageBytes) == cudaSuccess);
  uint8_t* dev_dst[] = {static_cast<uint8_t*>(dev)};
  st = (*dec)->Decode(absl::MakeConstSpan(comp.data(), 1), dev_dst);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(st.message(), "dst"));
  cudaFree(dev);

  // An identity namespace has no GPU decoder: its pages decode on the CPU,
  // byte-exact.
  client::NamespaceSpec is = Spec("id", kPages, dir.path + "/i");
  REQUIRE(c->CreateNamespace(is).ok());
  REQUIRE(c->Insert("id", tok, raw, kPageBytes).ok());
  auto icomp = CompressedPages(*c, "id", tok);
  auto ical = c->GetCalibration("id");
  REQUIRE(ical.ok());
  auto idec = client::GpuPageDecoder::Create(*ical, is.geometry);
  REQUIRE(idec.ok());
  std::vector<std::vector<uint8_t>> ids(kPages,
                                        std::vector<uint8_t>(kPageBytes));
  auto dst3 = Dsts(ids);
  REQUIRE((*idec)->Decode(icomp, dst3).ok());
  CHECK((*idec)->cpu_pages() == kPages);
  CHECK((*idec)->gpu_pages() == 0);
  for (size_t i = 0; i < kPages; ++i) CHECK(ids[i] == Page(raw, i));
}

TEST_CASE("GPU tier: a namespace larger than the arena is refused",
          "[gpu][tiers]") {
  auto daemon = StartDaemon(uint64_t{1} << 20);
  auto c = testing::Connect(*daemon);
  auto r = c->CreateNamespace(Spec("big", 4096, ""));
  INFO(r.status().ToString());
  // A capacity over the whole budget (the arena) is bad input, whatever the
  // other namespaces hold (docs/operations.md, "Memory budget").
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("capacity_bytes") != absl::string_view::npos);
}

}  // namespace
}  // namespace kvharbor
