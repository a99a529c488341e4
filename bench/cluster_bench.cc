// Aggregate Match and Fetch throughput of a kvharbor cluster of 1, 2 and 3
// daemons on this machine, through ClusterClient (rendezvous routing over a
// static member list), with ratios to the 1-daemon figure. Baseline in the
// same run: a plain kvharbor::Client on the single daemon (what the routing
// layer costs).
//
// Each run: N in-process daemons on loopback, `convs` conversations of
// `pages` pages inserted through the cluster (so spread by their owners),
// then `threads` client threads for `seconds` each doing
//   Match:  ClusterClient::Match of a whole conversation (a full hit), and
//   Fetch:  ClusterClient::Lookup (Match + Fetch of every matched page).
// Loopback on one host: the daemons and the clients share the same cores,
// so the ratio shows how far the work spreads, not what separate machines
// would add; with few cores it is CPU-bound and stays near 1.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "cluster/member_source.h"
#include "kvharbor/client.h"
#include "kvharbor/cluster_client.h"
#include "server/daemon/daemon.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(double, seconds, 2.0, "measured seconds per case");
ABSL_FLAG(int, threads, 8, "client threads");
ABSL_FLAG(int, convs, 64, "conversations (distinct prefixes)");
ABSL_FLAG(int, pages, 8, "pages per conversation");
ABSL_FLAG(int, max_daemons, 3, "largest cluster measured");

namespace kvharbor {
namespace {

constexpr char kNs[] = "bench";

client::NamespaceSpec Spec() {
  client::NamespaceSpec s;
  s.name = kNs;
  s.geometry.num_layers = 4;
  s.geometry.num_kv_heads = 4;
  s.geometry.head_dim = 64;
  s.geometry.page_size = 16;
  s.geometry.dtype = client::DType::kBF16;  // 64 KiB pages
  s.capacity_bytes = 256 << 20;
  return s;
}

std::vector<int32_t> Tokens(int conv, int pages) {
  std::vector<int32_t> t(static_cast<size_t>(pages) * 16);
  for (size_t i = 0; i < t.size(); ++i) {
    t[i] = static_cast<int32_t>((conv * 104729 + i * 13) % 100000);
  }
  return t;
}

// Calls `op(thread, i)` from every thread for the measured time; returns
// the aggregate rate (calls per second), or -1 when a call failed.
double Rate(const std::function<bool(int, int)>& op) {
  const int threads = absl::GetFlag(FLAGS_threads);
  std::atomic<bool> stop{false};
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> done{0};
  std::vector<std::thread> pool;
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      uint64_t n = 0;
      for (int i = 0; !stop; ++i, ++n) {
        if (!op(t, i)) failed = true;
      }
      done += n;
    });
  }
  std::this_thread::sleep_for(
      std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds)));
  stop = true;
  for (std::thread& th : pool) th.join();
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return failed ? -1.0 : static_cast<double>(done.load()) / s;
}

std::unique_ptr<Daemon> StartDaemon() {
  DaemonOptions o;
  o.listen = "127.0.0.1:0";
  o.store.pool_budget_bytes = 512 << 20;
  auto d = Daemon::Start(o);
  if (!d.ok()) {
    std::fprintf(stderr, "daemon: %s\n", d.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*d);
}

// The workload's prompts and one page-sized buffer of data per page.
struct Workload {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<uint8_t> data;
  uint64_t page_bytes = Spec().geometry.PageBytes();
  uint64_t want_tokens = 0;
};

Workload MakeWorkload() {
  Workload w;
  const int pages = absl::GetFlag(FLAGS_pages);
  for (int c = 0; c < absl::GetFlag(FLAGS_convs); ++c) {
    w.tokens.push_back(Tokens(c, pages));
  }
  w.data.assign(pages * w.page_bytes, 0x5a);
  w.want_tokens = static_cast<uint64_t>(pages) * 16;
  return w;
}

struct Result {
  double match = 0, fetch = 0;
};

Result RunCluster(int n) {
  std::vector<std::unique_ptr<Daemon>> daemons;
  std::vector<std::string> addresses;
  for (int i = 0; i < n; ++i) {
    daemons.push_back(StartDaemon());
    addresses.push_back(daemons.back()->address());
  }
  ClusterClientOptions co;
  co.members = std::move(*cluster::StaticMemberSource::Create(addresses));
  co.member_timeout = absl::Seconds(5);
  auto cc = std::move(*ClusterClient::Create(co));
  if (!cc->CreateNamespace(Spec()).ok()) std::exit(1);
  const Workload w = MakeWorkload();
  const int convs = static_cast<int>(w.tokens.size());
  for (const std::vector<int32_t>& t : w.tokens) {
    auto r = cc->Insert(kNs, t, w.data, w.page_bytes);
    if (!r.ok() || r->dropped) std::exit(1);
  }
  Result r;
  r.match = Rate([&](int t, int i) {
    auto m = cc->Match(kNs, w.tokens[(i * 7 + t) % convs]);
    return m.ok() && m->lease.matched_tokens == w.want_tokens;
  });
  r.fetch = Rate([&](int t, int i) {
    auto m = cc->Lookup(kNs, w.tokens[(i * 7 + t) % convs]);
    return m.ok() && m->matched_tokens == w.want_tokens;
  });
  return r;
}

// The baseline: one daemon, one plain Client, same workload.
Result RunDirect() {
  std::unique_ptr<Daemon> d = StartDaemon();
  ClientOptions co;
  co.address = d->address();
  auto c = std::move(*Client::Create(co));
  if (!c->CreateNamespace(Spec()).ok()) std::exit(1);
  const Workload w = MakeWorkload();
  const int convs = static_cast<int>(w.tokens.size());
  for (const std::vector<int32_t>& t : w.tokens) {
    if (!c->Insert(kNs, t, w.data, w.page_bytes).ok()) std::exit(1);
  }
  Result r;
  r.match = Rate([&](int t, int i) {
    auto m = c->Match(kNs, w.tokens[(i * 7 + t) % convs]);
    return m.ok() && m->matched_tokens == w.want_tokens;
  });
  r.fetch = Rate([&](int t, int i) {
    auto m = c->Match(kNs, w.tokens[(i * 7 + t) % convs]);
    if (!m.ok() || m->matched_tokens != w.want_tokens) return false;
    std::vector<uint8_t> dst(m->pages.size() * w.page_bytes);
    return c
        ->FetchInto(kNs, client::FetchSource::FromPages(m->pages),
                    absl::MakeSpan(dst))
        .ok();
  });
  return r;
}

int Main() {
  spdlog::set_level(spdlog::level::warn);
  const int pages = absl::GetFlag(FLAGS_pages);
  const double mib_per_fetch =
      pages * static_cast<double>(Spec().geometry.PageBytes()) / (1 << 20);
  std::printf(
      "cluster_bench: %d threads, %d conversations x %d pages (%.2f MiB per "
      "Fetch), %.1f s per case, %ld CPU cores online\n",
      absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_convs), pages,
      mib_per_fetch, absl::GetFlag(FLAGS_seconds),
      sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("%-22s %12s %8s %12s %10s %8s\n", "case", "Match/s", "ratio",
              "Fetch/s", "MiB/s", "ratio");
  const Result direct = RunDirect();
  std::printf("%-22s %12.0f %8s %12.0f %10.1f %8s\n", "1 daemon, plain Client",
              direct.match, "-", direct.fetch, direct.fetch * mib_per_fetch,
              "-");
  Result one;
  for (int n = 1; n <= absl::GetFlag(FLAGS_max_daemons); ++n) {
    const Result r = RunCluster(n);
    if (r.match < 0 || r.fetch < 0) {
      std::fprintf(stderr, "%d daemons: a call failed\n", n);
      return 1;
    }
    if (n == 1) one = r;
    std::printf("%-22s %12.0f %8.2f %12.0f %10.1f %8.2f\n",
                (std::to_string(n) + " daemon(s), cluster").c_str(), r.match,
                r.match / one.match, r.fetch, r.fetch * mib_per_fetch,
                r.fetch / one.fetch);
  }
  std::printf("cluster 1 daemon vs plain Client: Match %.2f, Fetch %.2f\n",
              one.match / direct.match, one.fetch / direct.fetch);
  return 0;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvharbor::Main();
}
