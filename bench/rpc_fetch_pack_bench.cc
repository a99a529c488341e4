// Fetch of many small pages over loopback gRPC, one page per message
// against packed (FetchRequest.max_pages_per_message), side by side in one
// run against one in-process daemon.
//
// The pages are the size of a KVTC-compressed page of a 32K-token
// Llama-3.1-8B-shaped prefix (~33 KB each, 2048 of them, 68 MB: the
// host_kvtc row of docs/ttft.md): a namespace of 32 KiB raw pages (1 layer x
// 4 KV heads x 128 x 16 tokens, bf16) fetched FETCH_FORMAT_COMPRESSED with
// the identity codec (the codec buffer: the page plus its envelope, through
// the SDK's CompressedReceiver, as the host_kvtc and remote_kvtc hit paths
// stream them; the pages are first demoted to the daemon's host_compressed
// tier, as for host_kvtc), and RAW before that from the raw tier (the SDK's
// zero-copy FetchAssembler). Two clients differ
// only in ClientOptions::fetch_pages_per_message (1: today's stream of one
// message per page; 256: packed); the reps alternate between them. Reports
// the median time of --reps fetches of the whole lease, MB/s (1e6 B/s) per
// wall-clock second and per CPU second of the process (daemon and client),
// and packed/unpacked ratios. Every page's checksum is verified by the SDK.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "kvharbor/client.h"
#include "server/daemon/daemon.h"

ABSL_FLAG(int, pages, 2048, "pages fetched per call");
ABSL_FLAG(int, reps, 7, "fetches per client and format (median reported)");
ABSL_FLAG(int, pages_per_message, 256,
          "fetch_pages_per_message of the packed client");

namespace kvharbor {
namespace {

using Clock = std::chrono::steady_clock;

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timing {
  std::vector<double> wall, cpu;
  uint64_t bytes = 0;  // per fetch
};

// One timed fetch: false (and a message) on failure.
bool Time(const std::function<absl::StatusOr<uint64_t>()>& fetch, Timing* t) {
  const double c0 = CpuSeconds();
  const auto t0 = Clock::now();
  absl::StatusOr<uint64_t> bytes = fetch();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!bytes.ok()) {
    std::fprintf(stderr, "fetch: %s\n", bytes.status().ToString().c_str());
    return false;
  }
  t->wall.push_back(s);
  t->cpu.push_back(CpuSeconds() - c0);
  t->bytes = *bytes;
  return true;
}

// COMPRESSED: every page's codec buffer through the SDK's receiver; the
// bytes received.
absl::StatusOr<uint64_t> FetchCompressed(Client& c, const std::string& ns,
                                         uint64_t lease, uint32_t pages) {
  uint64_t bytes = 0;
  absl::StatusOr<uint32_t> n =
      c.FetchCompressedStreaming(ns, client::FetchSource::FromLease(lease),
                                 [&](uint32_t, client::CompressedPage page) {
                                   bytes += page.buffer.size();
                                   return absl::OkStatus();
                                 });
  if (!n.ok()) return n.status();
  if (*n != pages) return absl::InternalError("wrong page count");
  return bytes;
}

absl::StatusOr<uint64_t> FetchRaw(Client& c, const std::string& ns,
                                  uint64_t lease, std::vector<uint8_t>& dst) {
  absl::StatusOr<client::FetchResult> r = c.FetchInto(
      ns, client::FetchSource::FromLease(lease), absl::MakeSpan(dst));
  if (!r.ok()) return r.status();
  return uint64_t{r->num_pages} * r->page_bytes;
}

void PrintRow(const char* format, const Timing& one, const Timing& packed) {
  const auto row = [&](const char* name, const Timing& t) {
    const double wall = Median(t.wall), cpu = Median(t.cpu);
    std::printf("%-11s %-9s %9.1f ms %9.0f MB/s %9.0f MB/cpu-s\n", format, name,
                wall * 1e3, t.bytes / wall / 1e6,
                t.bytes / std::max(cpu, 1e-4) / 1e6);
  };
  row("1/msg", one);
  row("packed", packed);
  std::printf("%-11s packed/1-per-message: %.2fx wall, %.2fx cpu\n", format,
              Median(one.wall) / Median(packed.wall),
              Median(one.cpu) / Median(packed.cpu));
}

int Run() {
  const uint32_t pages = static_cast<uint32_t>(absl::GetFlag(FLAGS_pages));
  const int reps = absl::GetFlag(FLAGS_reps);
  client::Geometry g{1,
                     4,
                     128,
                     16,
                     client::DType::kBF16,
                     client::PageLayout::kKvLayerTokenHeadDim,
                     0.0f};
  const uint64_t pb = g.PageBytes();  // 32 KiB

  DaemonOptions dopt;
  dopt.listen = "127.0.0.1:0";
  dopt.store.pool_budget_bytes = 2 * (pages + 64) * (pb + 4096);
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(dopt);
  if (!daemon.ok()) {
    std::fprintf(stderr, "daemon: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  ClientOptions copt;
  copt.address = (*daemon)->address();
  copt.host_fetch = HostFetchMode::kOff;  // the gRPC stream, both clients
  copt.fetch_pages_per_message = 1;
  absl::StatusOr<std::unique_ptr<Client>> one = Client::Create(copt);
  copt.fetch_pages_per_message =
      static_cast<uint32_t>(absl::GetFlag(FLAGS_pages_per_message));
  absl::StatusOr<std::unique_ptr<Client>> packed = Client::Create(copt);
  if (!one.ok() || !packed.ok()) return 1;

  client::NamespaceSpec spec;
  spec.name = "small_pages";
  spec.geometry = g;
  spec.capacity_bytes = (pages + 16) * pb;
  spec.host_compressed_bytes = (pages + 16) * (pb + 4096);
  if (absl::Status s = (*one)->CreateNamespace(spec).status(); !s.ok()) {
    std::fprintf(stderr, "namespace: %s\n", s.ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> src(pages * pb);
  std::mt19937_64 rng(7);
  for (size_t i = 0; i + 8 <= src.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(src.data() + i, &v, 8);
  }
  std::vector<int32_t> tokens(pages * g.page_size);
  for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = static_cast<int>(t);
  absl::StatusOr<client::InsertResult> ins =
      (*one)->Insert(spec.name, tokens, src, pb);
  if (!ins.ok() || ins->pages_stored != pages) {
    std::fprintf(stderr, "insert: %s\n", ins.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<client::Lease> lease =
      (*one)->Match(spec.name, tokens, true, absl::Minutes(10));
  if (!lease.ok() || lease->matched_tokens != tokens.size()) return 1;

  std::ifstream loadavg("/proc/loadavg");
  std::string load;
  std::getline(loadavg, load);
  std::printf("machine: %ld CPUs, /proc/loadavg %s\n",
              sysconf(_SC_NPROCESSORS_ONLN), load.c_str());
  std::printf(
      "Fetch of %u pages over loopback gRPC, in-process daemon: one page per "
      "message vs fetch_pages_per_message=%d (default 1 MiB chunks); median "
      "of %d, reps alternating, MB = 1e6 B\n",
      pages, absl::GetFlag(FLAGS_pages_per_message), reps);

  Timing c1, cp, r1, rp;
  std::vector<uint8_t> dst(src.size());
  bool same = true;
  const uint64_t id = lease->id;
  // RAW first, from the raw tier; then the pages are demoted to the
  // host_compressed tier and fetched COMPRESSED from there (host_kvtc).
  for (int r = 0; r <= reps; ++r) {
    Timing warm;  // the first round warms both clients' connections
    Timing* pick[2] = {&r1, &rp};
    if (r == 0) pick[0] = pick[1] = &warm;
    for (int k = 0; k < 2; ++k) {
      std::fill(dst.begin(), dst.end(), 0);
      Client& c = k == 0 ? **one : **packed;
      if (!Time([&] { return FetchRaw(c, spec.name, id, dst); }, pick[k])) {
        return 1;
      }
      same = same && dst == src;
    }
  }
  // A leased page stays where it is: release, demote, lease again.
  (void)(*one)->Release(lease->id);
  absl::StatusOr<uint64_t> demoted =
      (*one)->Demote(spec.name, client::Tier::kHostCompressed);
  if (!demoted.ok() || *demoted != pages) {
    std::fprintf(stderr, "demote: %s, %llu pages\n",
                 demoted.status().ToString().c_str(),
                 static_cast<unsigned long long>(demoted.value_or(0)));
    return 1;
  }
  lease = (*one)->Match(spec.name, tokens, true, absl::Minutes(10));
  if (!lease.ok() || lease->matched_tokens != tokens.size()) return 1;
  const uint64_t cold_id = lease->id;
  for (int r = 0; r <= reps; ++r) {
    Timing warm;
    Timing* pick[2] = {&c1, &cp};
    if (r == 0) pick[0] = pick[1] = &warm;
    for (int k = 0; k < 2; ++k) {
      Client& c = k == 0 ? **one : **packed;
      if (!Time([&] { return FetchCompressed(c, spec.name, cold_id, pages); },
                pick[k])) {
        return 1;
      }
    }
  }
  std::printf(
      "COMPRESSED pages: %.1f KB each (identity codec buffers in the "
      "host_compressed tier)\n",
      c1.bytes / 1e3 / pages);
  PrintRow("COMPRESSED", c1, cp);
  PrintRow("RAW", r1, rp);
  (void)(*one)->Release(cold_id);
  (*daemon)->Shutdown(absl::Seconds(1));
  if (!same) {
    std::fprintf(stderr, "RAW fetch returned wrong bytes\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvharbor::Run();
}
