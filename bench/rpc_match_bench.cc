// Match RPC latency on loopback: an in-process daemon, a separate SDK client,
// a 4K-token prompt (page_size 16, 256 pages) that is fully cached, and one
// that misses. Thousands of sequential calls after a warm-up; p50/p99/mean
// in microseconds.
//
// Baselines in the same run: the core's Namespace::Match called directly
// (no RPC), and DescribeNamespace, a unary RPC that does almost nothing (the
// gRPC round-trip floor). Ratios say what the RPC adds and what Match adds
// on top of a bare RPC. Target: Match (hit) p50 < 200 us.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "server/daemon.h"

ABSL_FLAG(int, iters, 5000, "measured calls per case");
ABSL_FLAG(int, warmup, 500, "unmeasured calls per case before measuring");
ABSL_FLAG(int, tokens, 4096, "prompt length in tokens");

namespace kvharbor {
namespace {

constexpr uint32_t kPageSize = 16;

struct Latency {
  double p50 = 0, p99 = 0, mean = 0;
};

Latency Measure(int warmup, int iters, const std::function<bool()>& call) {
  for (int i = 0; i < warmup; ++i) {
    if (!call()) {
      std::fprintf(stderr, "warm-up call failed\n");
      std::exit(1);
    }
  }
  std::vector<double> us;
  us.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = call();
    const auto t1 = std::chrono::steady_clock::now();
    if (!ok) {
      std::fprintf(stderr, "measured call failed\n");
      std::exit(1);
    }
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  Latency l;
  l.p50 = us[us.size() / 2];
  l.p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  double sum = 0;
  for (double v : us) sum += v;
  l.mean = sum / us.size();
  return l;
}

int Run() {
  const int iters = absl::GetFlag(FLAGS_iters);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int n_tokens = absl::GetFlag(FLAGS_tokens) / kPageSize * kPageSize;

  DaemonOptions dopt;
  dopt.listen = "127.0.0.1:0";
  dopt.store.pool_budget_bytes = uint64_t{256} << 20;
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(dopt);
  if (!daemon.ok()) {
    std::fprintf(stderr, "daemon: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  ClientOptions copt;
  copt.address = (*daemon)->address();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(copt);
  if (!client.ok()) return 1;
  Client& c = **client;

  // 2 * 1 layer * 16 tokens * 1 head * 64 dim * 2 bytes = 4 KiB pages: the
  // page bytes do not matter to Match, only the page count does.
  client::NamespaceSpec spec;
  spec.name = "bench";
  spec.geometry = {1,
                   1,
                   64,
                   kPageSize,
                   client::DType::kBF16,
                   client::PageLayout::kKvLayerTokenHeadDim,
                   0.0f};
  spec.capacity_bytes = uint64_t{64} << 20;
  if (!c.CreateNamespace(spec).ok()) return 1;
  const uint64_t pb = spec.geometry.PageBytes();

  std::vector<int32_t> hit(n_tokens), miss(n_tokens);
  for (int i = 0; i < n_tokens; ++i) {
    hit[i] = 1000 + i;
    miss[i] = 5000000 + i;
  }
  std::vector<uint8_t> pages(n_tokens / kPageSize * pb, 0x3C);
  absl::StatusOr<client::InsertResult> ins = c.Insert("bench", hit, pages, pb);
  if (!ins.ok()) {
    std::fprintf(stderr, "insert: %s\n", ins.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<client::Lease> check = c.Match("bench", hit);
  if (!check.ok() || check->matched_tokens != static_cast<uint64_t>(n_tokens)) {
    std::fprintf(stderr, "the prompt is not fully cached\n");
    return 1;
  }

  std::shared_ptr<Namespace> ns = *(*daemon)->store().Get("bench");
  auto core_match = [&](const std::vector<int32_t>& t, uint64_t want) {
    return [&, want] {
      absl::StatusOr<Namespace::MatchOutcome> m =
          ns->Match(t, false, absl::ZeroDuration());
      return m.ok() && m->matched_tokens == want;
    };
  };
  auto rpc_match = [&](const std::vector<int32_t>& t, uint64_t want) {
    return [&, want] {
      absl::StatusOr<client::Lease> m = c.Match("bench", t);
      return m.ok() && m->matched_tokens == want;
    };
  };
  const uint64_t all = static_cast<uint64_t>(n_tokens);
  const Latency core_hit = Measure(warmup, iters, core_match(hit, all));
  const Latency core_miss = Measure(warmup, iters, core_match(miss, 0));
  const Latency describe =
      Measure(warmup, iters, [&] { return c.DescribeNamespace("bench").ok(); });
  const Latency rpc_hit = Measure(warmup, iters, rpc_match(hit, all));
  const Latency rpc_miss = Measure(warmup, iters, rpc_match(miss, 0));
  const Latency rpc_lock = Measure(warmup, iters, [&] {
    absl::StatusOr<client::Lease> m = c.Match("bench", hit, true);
    return m.ok() && m->locked() && c.Release(m->id).ok();
  });

  std::printf(
      "Match latency, %d-token prompt (page_size %u, %d pages), "
      "%d calls after %d warm-up, loopback gRPC, 1 client thread\n\n",
      n_tokens, kPageSize, n_tokens / static_cast<int>(kPageSize), iters,
      warmup);
  std::printf("%-36s %10s %10s %10s %12s\n", "case", "p50 us", "p99 us",
              "mean us", "p50 ratio");
  auto row = [](const char* name, const Latency& l, double base) {
    std::printf("%-36s %10.1f %10.1f %10.1f %11.2fx\n", name, l.p50, l.p99,
                l.mean, base > 0 ? l.p50 / base : 0.0);
  };
  std::printf("-- baselines --\n");
  row("core Namespace::Match hit (no RPC)", core_hit, 0);
  row("core Namespace::Match miss (no RPC)", core_miss, 0);
  row("RPC DescribeNamespace (RPC floor)", describe, 0);
  std::printf("-- Match RPC (ratio vs RPC floor) --\n");
  row("RPC Match hit (4K tokens cached)", rpc_hit, describe.p50);
  row("RPC Match miss", rpc_miss, describe.p50);
  row("RPC Match hit lock + Release (2 RPCs)", rpc_lock, describe.p50);
  std::printf("\nRPC overhead on a hit: %.1f us (p50 RPC hit - p50 core hit)\n",
              rpc_hit.p50 - core_hit.p50);
  std::printf("target: Match hit p50 < 200 us: %s (%.1f us)\n",
              rpc_hit.p50 < 200 ? "MET" : "MISSED", rpc_hit.p50);
  (*daemon)->Shutdown(absl::Seconds(1));
  return 0;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvharbor::Run();
}
