// Memory of kvharbord under load, against an idle kvharbord as the baseline,
// both started side by side in the same run with the same pool budget.
//
// Each daemon gets one namespace as large as the budget. The loaded one is
// driven by --clients concurrent SDK clients (insert a fresh sequence, match
// it with a lease, fetch it, release; every --cancel_every-th round with a
// 1..3 ms deadline, cut short mid-call) for --seconds; the idle one gets the
// namespace and nothing else. Both processes' VmRSS/VmHWM are sampled from
// /proc every --sample_ms. Printed per daemon: peak RSS, VmHWM, pool budget
// and overhead = peak RSS - pool budget (absolute and as a fraction of the
// budget), plus the load's throughput and error codes. The pool is one lazily
// committed mapping, so an idle daemon's RSS holds almost none of it and the
// loaded one's, once the pool filled, all of it.
//
//   kvharbor_bench_server_memory_under_load --pool_bytes=1GiB --clients=32
//       --seconds=20   (one command line)
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "server/daemon/config.h"
#include "tests/server/memory_load.h"
#include "tests/server/subprocess.h"

ABSL_FLAG(std::string, kvharbord, "",
          "path of kvharbord (default: ../server/kvharbord next to this "
          "binary's build directory)");
ABSL_FLAG(std::string, pool_bytes, "512MiB", "pool budget of both daemons");
ABSL_FLAG(int, clients, 32, "concurrent clients driving the loaded daemon");
ABSL_FLAG(int, seconds, 10, "how long the load runs");
ABSL_FLAG(int, pages_per_request, 8, "256 KiB pages per insert/fetch");
ABSL_FLAG(int, cancel_every, 8,
          "every Nth round runs with a 1..3 ms deadline (0: none)");
ABSL_FLAG(int, sample_ms, 20, "/proc sampling period");
ABSL_FLAG(int, report_s, 5, "print the loaded daemon's RSS this often");

namespace kvharbor {
namespace {

void PrintRow(const char* name, const testing::ProcMemory& peak,
              uint64_t pool) {
  const double overhead =
      static_cast<double>(peak.rss_bytes) - static_cast<double>(pool);
  std::printf(
      "%-6s peak_rss=%-11s vm_hwm=%-11s pool=%-11s overhead=%+.1f MiB "
      "(%+.3f of pool)\n",
      name, HumanBytes(peak.rss_bytes).c_str(),
      HumanBytes(peak.hwm_bytes).c_str(), HumanBytes(pool).c_str(),
      overhead / (1 << 20), overhead / static_cast<double>(pool));
}

int Run() {
  std::string binary = absl::GetFlag(FLAGS_kvharbord);
  if (binary.empty()) binary = testing::KvharbordBesideBench();
  absl::StatusOr<uint64_t> pool =
      ParseByteSize(absl::GetFlag(FLAGS_pool_bytes), "--pool_bytes");
  if (!pool.ok()) {
    std::fprintf(stderr, "%s\n", pool.status().ToString().c_str());
    return 2;
  }
  const std::vector<std::string> args = {
      absl::StrCat("--pool_bytes=", *pool),
      absl::StrCat("--default_namespace_bytes=", *pool)};
  testing::Kvharbord idle(binary, args);
  testing::Kvharbord loaded(binary, args);
  if (!idle.started() || !loaded.started() || idle.Connect() == nullptr ||
      loaded.Connect() == nullptr) {
    std::fprintf(stderr, "cannot start %s\n", binary.c_str());
    return 1;
  }
  testing::LoadOptions o;
  o.clients = absl::GetFlag(FLAGS_clients);
  o.duration = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  o.pages_per_request =
      static_cast<uint32_t>(absl::GetFlag(FLAGS_pages_per_request));
  o.cancel_every = absl::GetFlag(FLAGS_cancel_every);
  // The baseline: the same namespace, no traffic.
  testing::LoadOptions none = o;
  none.address = idle.address();
  none.clients = 0;
  o.address = loaded.address();

  testing::MemorySampler sampler(
      {idle.pid(), loaded.pid()},
      absl::Milliseconds(absl::GetFlag(FLAGS_sample_ms)));
  absl::StatusOr<testing::LoadStats> idle_stats = testing::RunLoad(none, *pool);
  const absl::Time start = absl::Now();
  // The loaded daemon's RSS over time: a plateau is overhead, a climb that
  // goes on after the pool filled would be a leak.
  absl::Notification load_done;
  std::thread progress([&] {
    const absl::Duration every = absl::Seconds(absl::GetFlag(FLAGS_report_s));
    while (!load_done.WaitForNotificationWithTimeout(every)) {
      std::printf(
          "t=%5.1fs loaded rss=%s\n",
          absl::ToDoubleSeconds(absl::Now() - start),
          HumanBytes(testing::ReadProcMemory(loaded.pid()).rss_bytes).c_str());
      std::fflush(stdout);
    }
  });
  absl::StatusOr<testing::LoadStats> stats = testing::RunLoad(o, *pool);
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  load_done.Notify();
  progress.join();
  // Let the sampler see the state after the load (cleanup, drained calls).
  absl::SleepFor(absl::Milliseconds(500));
  sampler.Stop();
  if (!idle_stats.ok() || !stats.ok()) {
    std::fprintf(stderr, "load failed: %s / %s\n",
                 idle_stats.status().ToString().c_str(),
                 stats.status().ToString().c_str());
    return 1;
  }

  std::printf(
      "kvharbord memory under load: pool %s, %d clients x %d s, %u pages "
      "(256 KiB) per request, every %dth round a 1..3 ms deadline, %d "
      "samples\n",
      HumanBytes(*pool).c_str(), o.clients, absl::GetFlag(FLAGS_seconds),
      o.pages_per_request, o.cancel_every, sampler.samples());
  std::printf("load: %llu ops (%.0f/s), %llu ok, fetched %s (%.1f MiB/s)",
              static_cast<unsigned long long>(stats->ops), stats->ops / secs,
              static_cast<unsigned long long>(stats->ok),
              HumanBytes(stats->bytes_fetched).c_str(),
              stats->bytes_fetched / secs / (1 << 20));
  for (const auto& [code, n] : stats->errors) {
    std::printf(", %s: %llu", absl::StatusCodeToString(code).c_str(),
                static_cast<unsigned long long>(n));
  }
  std::printf("\n");
  const testing::ProcMemory idle_peak = sampler.peak(0);
  const testing::ProcMemory load_peak = sampler.peak(1);
  PrintRow("idle", idle_peak, *pool);
  PrintRow("loaded", load_peak, *pool);
  const double idle_rss = static_cast<double>(idle_peak.rss_bytes);
  std::printf(
      "ratios: loaded/idle peak RSS %.2fx; loaded - idle = %.1f MiB, %.3f of "
      "the pool\n",
      load_peak.rss_bytes / idle_rss,
      (load_peak.rss_bytes - idle_rss) / (1 << 20),
      (load_peak.rss_bytes - idle_rss) / static_cast<double>(*pool));
  return 0;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvharbor::Run();
}
