// Soak: a kvharbord subprocess under a mixed, high, loopback load for a
// bounded time (default 10 minutes), with its resident memory (VmRSS from
// /proc/PID/status) and open file descriptors (/proc/PID/fd) sampled every
// few seconds into a CSV. The summary says whether they stay flat after the
// warm-up: the least-squares slope of each after warm-up, in % of its
// post-warm-up mean per minute, and first/last/max values. Not a speed
// benchmark and not in CI.
//
// Workload: --threads SDK clients, each looping over random prompts drawn
// from a token space with heavily shared prefixes, on a tiered namespace
// (raw pool smaller than the working set, host-compressed budget, disk
// tier in a temp dir), so pages keep moving between tiers: Insert, Match
// with lock, Fetch (raw or compressed) by lease, Release; now and then
// Match without lock + Fetch by handles, ExtendLease, a short-deadline
// Fetch, EvictBytes, Demote and Stats. Every fetched page is checked
// byte-for-byte (page bytes are a function of their token prefix).
//
//   kvharbor_bench_rpc_soak --daemon=build/server/kvharbord --minutes=10
//       --csv=soak.csv  (one command line)
#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvharbor/client.h"
#include "tests/server/subprocess.h"
#include "tests/stress/stress_test_util.h"

ABSL_FLAG(std::string, daemon, "", "path of kvharbord (required)");
ABSL_FLAG(double, minutes, 10, "how long to run");
ABSL_FLAG(double, warmup_minutes, 2, "samples before this are warm-up");
ABSL_FLAG(int, threads, 8, "client threads");
ABSL_FLAG(int, sample_seconds, 5, "seconds between samples");
ABSL_FLAG(std::string, csv, "soak.csv", "where the samples go");

namespace kvharbor {
namespace {

using testing::kPageBytes;
using testing::kPageSize;

constexpr char kNs[] = "soak";
constexpr uint32_t kPoolPages = 256;

struct Sample {
  double t_s;
  double rss_kib;
  double fds;
  uint64_t ops;
  uint64_t errors;
};

double RssKib(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6);
  }
  return -1;
}

double OpenFds(pid_t pid) {
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

// A prompt from a space of 16 trunks x up to 8 pages x 6 branches.
std::vector<int32_t> RandomPrompt(std::mt19937_64& rng) {
  testing::SeqKey k;
  k.trunk = rng() % 16;
  k.pages = 1 + rng() % 8;
  k.branch_at = rng() % (k.pages + 1);
  k.branch = rng() % 6;
  return testing::MakeTokens(k);
}

struct Totals {
  std::atomic<uint64_t> ops{0}, errors{0}, mismatches{0};
  std::atomic<bool> stop{false};
};

// Checks pages [0, n) of `tokens` fetched into `got`.
bool Verify(const std::vector<int32_t>& tokens,
            const std::vector<std::vector<uint8_t>>& got) {
  for (size_t p = 0; p < got.size(); ++p) {
    if (got[p].size() != kPageBytes ||
        !testing::PageMatches(tokens, p, got[p].data())) {
      return false;
    }
  }
  return true;
}

// One round of the mixed workload; returns false on an unexpected error.
bool Round(Client& c, std::mt19937_64& rng, Totals& totals) {
  const std::vector<int32_t> tokens = RandomPrompt(rng);
  const std::vector<uint8_t> bytes = testing::Pages(tokens);
  bool ok = true;
  const auto note = [&](const absl::Status& s) {
    // Expected under this load: a full namespace (everything leased),
    // short deadlines, evictions between Match and Fetch.
    const bool expected = s.ok() || absl::IsResourceExhausted(s) ||
                          absl::IsDeadlineExceeded(s) || absl::IsNotFound(s) ||
                          absl::IsCancelled(s);
    if (!expected) {
      ok = false;
      std::fprintf(stderr, "soak: unexpected %s\n", s.ToString().c_str());
    }
  };
  note(c.Insert(kNs, tokens, bytes, kPageBytes).status());
  const uint32_t dice = rng() % 100;
  if (dice < 70) {
    absl::StatusOr<client::Lease> l =
        c.Match(kNs, tokens, /*lock=*/true, absl::Seconds(5));
    note(l.status());
    if (l.ok() && l->locked()) {
      if (dice < 5) note(c.ExtendLease(l->id, absl::Seconds(5)).status());
      const auto fmt = dice % 2 ? client::FetchFormat::kRaw
                                : client::FetchFormat::kCompressed;
      const CallOptions call =
          dice < 10 ? CallOptions::Timeout(absl::Microseconds(300))
                    : CallOptions{};
      auto got = c.Fetch(kNs, client::FetchSource::FromLease(l->id), fmt, call);
      note(got.status());
      if (got.ok() && !Verify(tokens, *got)) ++totals.mismatches;
      note(c.Release(l->id));
    }
  } else if (dice < 90) {
    absl::StatusOr<client::Lease> l = c.Match(kNs, tokens);
    note(l.status());
    if (l.ok() && !l->pages.empty()) {
      auto got = c.Fetch(kNs, client::FetchSource::FromPages(l->pages));
      note(got.status());
      if (got.ok() && !Verify(tokens, *got)) ++totals.mismatches;
    }
  } else if (dice < 94) {
    note(c.EvictBytes(kNs, 4 * kPageBytes).status());
  } else if (dice < 96) {
    note(c.Demote(kNs, dice % 2 ? client::Tier::kDisk
                                : client::Tier::kHostCompressed)
             .status());
  } else {
    note(c.Stats(kNs).status());
  }
  return ok;
}

void Worker(const std::string& address, uint64_t seed, Totals* totals) {
  ClientOptions o;
  o.address = address;
  o.default_timeout = absl::Seconds(30);
  auto c = Client::Create(o);
  if (!c.ok()) {
    ++totals->errors;
    return;
  }
  std::mt19937_64 rng(seed);
  while (!totals->stop.load()) {
    if (!Round(**c, rng, *totals)) ++totals->errors;
    ++totals->ops;
  }
}

// Least-squares slope of y over t (minutes), as % of mean(y) per minute.
double SlopePctPerMin(const std::vector<Sample>& s, double Sample::*y) {
  double n = 0, st = 0, sy = 0, stt = 0, sty = 0;
  for (const Sample& x : s) {
    const double t = x.t_s / 60;
    n += 1;
    st += t;
    sy += x.*y;
    stt += t * t;
    sty += t * (x.*y);
  }
  const double den = n * stt - st * st;
  if (n < 2 || den == 0 || sy == 0) return 0;
  return (n * sty - st * sy) / den / (sy / n) * 100;
}

void Summarize(const std::vector<Sample>& all, double warmup_s) {
  std::vector<Sample> after;
  for (const Sample& s : all) {
    if (s.t_s >= warmup_s) after.push_back(s);
  }
  if (after.size() < 2) {
    std::printf("too few samples after warm-up for a trend\n");
    return;
  }
  // The second half alone: a warm-up that is still settling (the index
  // filling up) flattens out there, a leak does not.
  const std::vector<Sample> late(after.begin() + after.size() / 2, after.end());
  for (auto [name, field] : {std::pair{"rss_kib", &Sample::rss_kib},
                             std::pair{"open_fds", &Sample::fds}}) {
    double mx = 0;
    for (const Sample& s : after) mx = std::max(mx, s.*field);
    std::printf(
        "%-8s after warm-up (%zu samples, %.0f-%.0f s): first %.0f, last "
        "%.0f, max %.0f, slope %+.3f %%/min (second half from %.0f s: "
        "%+.3f %%/min)\n",
        name, after.size(), after.front().t_s, after.back().t_s,
        after.front().*field, after.back().*field, mx,
        SlopePctPerMin(after, field), late.front().t_s,
        SlopePctPerMin(late, field));
  }
}

int Main() {
  const std::string binary = absl::GetFlag(FLAGS_daemon);
  if (binary.empty() || access(binary.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "--daemon: '%s' is not an executable\n",
                 binary.c_str());
    return 2;
  }
  char tmpl[] = "/tmp/kvharbor_soak_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 2;
  testing::Kvharbord daemon(binary, {});
  if (!daemon.started() || daemon.Connect() == nullptr) {
    std::fprintf(stderr, "kvharbord did not come up\n");
    return 1;
  }
  {
    ClientOptions o;
    o.address = daemon.address();
    auto c = Client::Create(o);
    client::NamespaceSpec spec = testing::Spec(
        kNs, kPoolPages, 128 * (kPageBytes + 256), std::string(tmpl) + "/ns");
    spec.disk_bytes = 512 * (kPageBytes + 512);
    auto created = (*c)->CreateNamespace(spec);
    if (!created.ok()) {
      std::fprintf(stderr, "CreateNamespace: %s\n",
                   created.status().ToString().c_str());
      return 1;
    }
  }
  const pid_t pid = daemon.pid();
  Totals totals;
  std::vector<std::thread> workers;
  for (int i = 0; i < absl::GetFlag(FLAGS_threads); ++i) {
    workers.emplace_back(Worker, daemon.address(), 1000 + i, &totals);
  }
  std::ofstream csv(absl::GetFlag(FLAGS_csv));
  csv << "t_s,rss_kib,open_fds,ops,errors\n";
  std::vector<Sample> samples;
  const auto t0 = std::chrono::steady_clock::now();
  const double total_s = absl::GetFlag(FLAGS_minutes) * 60;
  for (;;) {
    const double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    const Sample s{t, RssKib(pid), OpenFds(pid), totals.ops.load(),
                   totals.errors.load()};
    samples.push_back(s);
    csv << absl::StrFormat("%.1f,%.0f,%.0f,%u,%u\n", s.t_s, s.rss_kib, s.fds,
                           s.ops, s.errors)
        << std::flush;
    if (t >= total_s || s.rss_kib < 0) break;
    std::this_thread::sleep_for(
        std::chrono::seconds(absl::GetFlag(FLAGS_sample_seconds)));
  }
  totals.stop = true;
  for (std::thread& w : workers) w.join();
  const double secs = samples.back().t_s;
  std::printf(
      "soak: %.0f s, %d threads, %lu rounds (%.0f/s), %lu errors, "
      "%lu byte mismatches\n",
      secs, absl::GetFlag(FLAGS_threads),
      static_cast<unsigned long>(totals.ops.load()), totals.ops.load() / secs,
      static_cast<unsigned long>(totals.errors.load()),
      static_cast<unsigned long>(totals.mismatches.load()));
  Summarize(samples, absl::GetFlag(FLAGS_warmup_minutes) * 60);
  std::error_code ignored;
  std::filesystem::remove_all(tmpl, ignored);
  return totals.errors.load() == 0 && totals.mismatches.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvharbor::Main();
}
