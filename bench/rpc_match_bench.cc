// Match RPC latency on loopback: an in-process daemon, a separate SDK client,
// a 4K-token prompt (page_size 16, 256 pages) that is fully cached, and one
// that misses. Thousands of sequential calls after a warm-up; p50/p99/mean
// in microseconds.
//
// Baselines in the same run: the core's Namespace::Match called directly
// (no RPC), and DescribeNamespace, a unary RPC that does almost nothing (the
// gRPC round-trip floor). Ratios say what the RPC adds and what Match adds
// on top of a bare RPC. "CPU us" is the process's CPU time (client and
// daemon threads together) per call, which a busy machine does not inflate
// the way it inflates wall-clock latency. Target: Match (hit) p50 < 200 us.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "kvharbor/client.h"
#include "server/daemon/daemon.h"

ABSL_FLAG(int, iters, 5000, "measured calls per case");
ABSL_FLAG(int, warmup, 500, "unmeasured calls per case before measuring");
ABSL_FLAG(int, tokens, 4096, "prompt length in tokens");

namespace kvharbor {
namespace {

constexpr uint32_t kPageSize = 16;

struct Latency {
  double p50 = 0, p99 = 0, mean = 0;
  // CPU time of the whole process (client and in-process daemon threads)
  // per call: what a call costs, however busy the machine is.
  double cpu = 0;
};

double ProcessCpuMicros() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec +
         ru.ru_stime.tv_usec;
}

Latency Measure(int warmup, int iters, const std::function<bool()>& call) {
  for (int i = 0; i < warmup; ++i) {
    if (!call()) {
      std::fprintf(stderr, "warm-up call failed\n");
      std::exit(1);
    }
  }
  std::vector<double> us;
  us.reserve(iters);
  const double cpu0 = ProcessCpuMicros();
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
  const double cpu = ProcessCpuMicros() - cpu0;
  std::sort(us.begin(), us.end());
  Latency l;
  l.cpu = cpu / iters;
  l.p50 = us[us.size() / 2];
  l.p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  double sum = 0;
  for (double v : us) sum += v;
  l.mean = sum / us.size();
  return l;
}

void PrintHeader(int n_tokens, int iters, int warmup) {
  std::ifstream loadavg("/proc/loadavg");
  std::string load;
  std::getline(loadavg, load);
  std::printf("machine: %ld CPUs, /proc/loadavg %s\n",
              sysconf(_SC_NPROCESSORS_ONLN), load.c_str());
  std::printf(
      "Match latency, %d-token prompt (page_size %u, %d pages), "
      "%d calls after %d warm-up, loopback gRPC, 1 client thread\n\n",
      n_tokens, kPageSize, n_tokens / static_cast<int>(kPageSize), iters,
      warmup);
  std::printf("%-38s %9s %9s %9s %9s %10s\n", "case", "p50 us", "p99 us",
              "mean us", "CPU us", "p50 ratio");
}

void PrintRow(const char* name, const Latency& l, double base) {
  const std::string ratio =
      base > 0 ? absl::StrFormat("%.2fx", l.p50 / base) : std::string("-");
  std::printf("%-38s %9.1f %9.1f %9.1f %9.1f %10s\n", name, l.p50, l.p99,
              l.mean, l.cpu, ratio.c_str());
}

// Creates namespace "bench" and caches the pages of `hit`.
bool SetUp(Client& c, const std::vector<int32_t>& hit) {
  // 2 * 1 layer * 16 tokens * 1 head * 64 dim * 2 bytes = 4 KiB pages: the
  // page bytes do not matter to Match, only the page count does.
  client::NamespaceSpec spec;
  spec.name = "bench";
  spec.geometry.num_layers = 1;
  spec.geometry.num_kv_heads = 1;
  spec.geometry.head_dim = 64;
  spec.geometry.page_size = kPageSize;
  spec.geometry.dtype = client::DType::kBF16;
  spec.capacity_bytes = uint64_t{64} << 20;
  if (!c.CreateNamespace(spec).ok()) return false;
  const uint64_t pb = spec.geometry.PageBytes();
  std::vector<uint8_t> pages(hit.size() / kPageSize * pb, 0x3C);
  absl::StatusOr<client::InsertResult> ins = c.Insert("bench", hit, pages, pb);
  if (!ins.ok()) {
    std::fprintf(stderr, "insert: %s\n", ins.status().ToString().c_str());
    return false;
  }
  absl::StatusOr<client::Lease> check = c.Match("bench", hit);
  return check.ok() && check->matched_tokens == hit.size();
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
  std::vector<int32_t> hit(n_tokens), miss(n_tokens);
  for (int i = 0; i < n_tokens; ++i) {
    hit[i] = 1000 + i;
    miss[i] = 5000000 + i;
  }
  if (!SetUp(c, hit)) {
    std::fprintf(stderr, "set-up failed: the prompt is not cached\n");
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

  PrintHeader(n_tokens, iters, warmup);
  std::printf("-- baselines --\n");
  PrintRow("core Namespace::Match hit (no RPC)", core_hit, 0);
  PrintRow("core Namespace::Match miss (no RPC)", core_miss, 0);
  PrintRow("RPC DescribeNamespace (RPC floor)", describe, 0);
  std::printf("-- Match RPC (ratio vs RPC floor) --\n");
  PrintRow("RPC Match hit (4K tokens cached)", rpc_hit, describe.p50);
  PrintRow("RPC Match miss", rpc_miss, describe.p50);
  PrintRow("RPC Match hit lock + Release (2 RPCs)", rpc_lock, describe.p50);
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
