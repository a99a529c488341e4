// GPU tier 0 end to end (GPU machine only; built as kvharbor_gpu_tier_tests,
// run by scripts/gpu_checks.sh): a daemon whose namespace pools live in a
// cudaMalloc arena, driven through the SDK. The tier state machine of
// tests/client/tiers_test.cc again: inserts land on the device and come back
// byte-exact; pool pressure compresses LRU device pages into the host tier
// (KVTC: batched on the GPU straight into pinned memory; identity: on the
// CPU from host copies); RAW fetches of cold pages decode within the codec's
// bounds (identity exactly), COMPRESSED fetches decode to the same bytes;
// the disk tier serves what the host tier held; and the GPU-evicted KVTC
// pages agree with a host-pool daemon's CPU eviction of the same data.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/client.h"
#include "core/kvtc_calibration.h"
#include "cuda/device_tier.h"
#include "server/daemon.h"
#include "spdlog/spdlog.h"
#include "tests/client/client_test_util.h"
#include "tests/core/kvtc_test_util.h"
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
std::unique_ptr<Daemon> StartDaemon(uint64_t device_bytes) {
  spdlog::set_level(spdlog::level::warn);
  DaemonOptions o;
  o.listen = "127.0.0.1:0";
  o.store.pool_budget_bytes = uint64_t{512} << 20;
  o.store.default_namespace_bytes = uint64_t{1} << 20;
  o.store.device_pool_bytes = device_bytes;
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

TEST_CASE("GPU tier: KVTC eviction on the GPU matches the CPU path",
          "[gpu][tiers]") {
  TempDir dir;
  Geometry g;
  g.num_layers = kLayers;
  g.num_kv_heads = kHeads;
  g.head_dim = kHeadDim;
  g.page_size = kPageSize;
  g.dtype = DType::kFP32;
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  auto cal = testing::MakeCalibration(g, KvtcRowKind::kPerToken,
                                      IdentityBasis(f, f, testing::Fp8All(f)),
                                      IdentityBasis(f, f, testing::Fp8All(f)));
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
}

TEST_CASE("GPU tier: a namespace larger than the arena is refused",
          "[gpu][tiers]") {
  auto daemon = StartDaemon(uint64_t{1} << 20);
  auto c = testing::Connect(*daemon);
  auto r = c->CreateNamespace(Spec("big", 4096, ""));
  INFO(r.status().ToString());
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(r.status().message().find("capacity_bytes") != absl::string_view::npos);
}

}  // namespace
}  // namespace kvharbor
