// Insert and Fetch throughput on loopback (in-process daemon, SDK client)
// beside Redis SET/GET of the same values in the same run.
//
// For pages of 256 KiB, 1 MiB and 2 MiB (geometries whose page bytes are
// exactly these) the same bytes go both ways: kvharbor Insert/Fetch calls of
// --batch_mib worth of pages each, and Redis SET/GET of one page per key,
// pipelined --batch_mib worth of keys per round trip (hiredis), GET copying
// each value into the destination buffer as Fetch does. kvharbor verifies
// every page's XXH3-64 on Fetch and computes them on Insert; Redis checks
// nothing. The benchmark starts Debian's redis-server itself on a free
// loopback port and kills it at the end; without the binary it skips Redis
// and says so. Throughput is the median of --reps runs, in MB/s (1e6 B/s),
// per wall-clock second and per CPU second of every process involved (the
// latter stays meaningful on a machine busy with other work).
// The same-host row ("ShmFetch") fetches the same leases with the same batch
// through the SDK's shared-memory path (store.host_ipc_socket: the client
// maps the daemon's host arena read-only, copies each page into the same
// destination and verifies its XXH3-64); "Fetch" is the gRPC stream (a
// client with host_fetch off), so both rows run against one daemon.
// The same-host Insert row ("ShmInsert") stores the same batches through the
// daemon's staging socket (Client::InsertStaged): each call's pages are
// copied into the client's registered staging region (timed: the caller's
// part), and the daemon copies them from there into its pool; "Insert" is
// the gRPC stream. The Fetch rows then read what ShmInsert stored, so a
// wrong byte there fails the run.
// The remote row ("BulkFetch") fetches the same leases on the daemon's bulk
// data plane (data_plane.listen; docs/data_plane.md): a client with
// host_fetch off and DataPlaneMode::kOn, whose pages come on
// --bulk_connections TCP connections and are verified as on the stream;
// "Fetch" is a client with the plane off. Loopback TCP stands in for the
// network here.
// "BulkInsert" stores the same batches through that client: its pages go on
// the plane's connections straight into the daemon's slots.
// Targets: Fetch >= 1.5x Redis GET on the same host (the shared-memory path)
// and over the remote plane (BulkFetch); BulkInsert >= 1.5x Redis SET.
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/redis_server.h"
#include "kvharbor/client.h"
#include "server/daemon/daemon.h"

ABSL_FLAG(int, mib, 128, "MiB moved per page size, operation and rep");
ABSL_FLAG(int, reps, 3, "runs per measurement (median reported)");
ABSL_FLAG(int, batch_mib, 8, "MiB per Insert/Fetch call and Redis pipeline");
ABSL_FLAG(std::string, redis_server, "redis-server", "redis-server binary");
ABSL_FLAG(int, bulk_connections, 4,
          "TCP connections of one BulkFetch call (ClientOptions::"
          "data_plane_connections)");

namespace kvharbor {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// CPU seconds (user + system) used so far by this process, and by `pid`
// when it is > 0 (from /proc; clock-tick resolution).
double CpuSeconds(pid_t pid) {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  double s = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
             ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
  if (pid > 0) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    // Fields after the ")" that ends the command name: state is field 3,
    // utime and stime are fields 14 and 15.
    std::vector<std::string> f =
        absl::StrSplit(stat.substr(stat.rfind(')') + 2), ' ');
    if (f.size() > 12) {
      s += (std::stod(f[11]) + std::stod(f[12])) / sysconf(_SC_CLK_TCK);
    }
  }
  return s;
}

// Megabytes per wall-clock second, and per CPU second spent by every
// process involved (this one, holding the daemon or the Redis client, plus
// redis-server). The second is what a busy machine distorts least.
struct Rate {
  double wall = 0;
  double cpu = 0;
};

// Moving `bytes` with `fn`, median over `reps`; `between` runs untimed
// before each rep.
Rate Throughput(int reps, uint64_t bytes, const std::function<bool()>& fn,
                const std::function<void()>& between = nullptr,
                pid_t other = -1) {
  std::vector<double> wall, cpu;
  for (int r = 0; r < reps; ++r) {
    if (between) between();
    const double c0 = CpuSeconds(other);
    const auto t0 = Clock::now();
    if (!fn()) {
      std::fprintf(stderr, "benchmark step failed\n");
      std::exit(1);
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    const double c = CpuSeconds(other) - c0;
    wall.push_back(bytes / s / 1e6);
    cpu.push_back(bytes / std::max(c, 1e-3) / 1e6);
  }
  return {Median(wall), Median(cpu)};
}

// ---- Redis ----

using bench::FindInPath;
using bench::RedisServer;

// ---- kvharbor ----

struct Size {
  const char* name;
  client::Geometry geometry;
};

struct Result {
  Rate insert, shm_insert, bulk_insert, fetch, shm_fetch, bulk_fetch, set, get;
};

client::Geometry Geo(uint32_t layers, uint32_t heads, uint32_t dim,
                     client::DType dtype) {
  return {layers, heads, dim,
          16,     dtype, client::PageLayout::kKvLayerTokenHeadDim,
          0.0f};
}

// One Fetch pass over every lease through `client`; every call must take
// `path` (the shared-memory client must not silently stream).
bool FetchAll(Client& client, const std::string& ns,
              const std::vector<uint64_t>& leases,
              const std::vector<size_t>& call_bytes, std::vector<uint8_t>& dst,
              size_t stride, client::FetchPath path) {
  for (size_t k = 0; k < leases.size(); ++k) {
    absl::StatusOr<client::FetchResult> r = client.FetchInto(
        ns, client::FetchSource::FromLease(leases[k]),
        absl::MakeSpan(dst.data() + k * stride, call_bytes[k]));
    if (!r.ok() || r->path != path) {
      std::fprintf(stderr, "fetch: %s (path %d)\n",
                   r.status().ToString().c_str(),
                   r.ok() ? static_cast<int>(r->path) : -1);
      return false;
    }
  }
  return true;
}

// `c` streams Fetch over gRPC; `shm` fetches through shared memory; `bulk`
// on the bulk data plane.
bool RunKvharbor(Client& c, Client& shm, Client& bulk, const Size& size,
                 const std::vector<uint8_t>& src, std::vector<uint8_t>& dst,
                 int reps, size_t batch, Result* out) {
  const uint64_t pb = size.geometry.PageBytes();
  const size_t pages = src.size() / pb;
  const size_t calls = (pages + batch - 1) / batch;
  client::NamespaceSpec spec;
  spec.name = absl::StrCat("bench_", pb);
  spec.geometry = size.geometry;
  spec.capacity_bytes = (pages + batch) * pb;
  absl::StatusOr<client::CreateNamespaceResult> created =
      c.CreateNamespace(spec);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return false;
  }
  const uint32_t ps = spec.geometry.page_size;
  // Call k inserts pages [k*batch, ...) under tokens unique to k.
  std::vector<std::vector<int32_t>> tokens(calls);
  for (size_t k = 0; k < calls; ++k) {
    const size_t n = std::min(batch, pages - k * batch);
    for (size_t t = 0; t < n * ps; ++t) {
      tokens[k].push_back(static_cast<int32_t>(k * 1000000 + t));
    }
  }
  auto span = [&](size_t k) {
    return absl::MakeConstSpan(src.data() + k * batch * pb,
                               tokens[k].size() / ps * pb);
  };
  out->insert = Throughput(
      reps, src.size(),
      [&] {
        for (size_t k = 0; k < calls; ++k) {
          absl::StatusOr<client::InsertResult> r =
              c.Insert(spec.name, tokens[k], span(k), pb);
          if (!r.ok() || r->pages_stored != tokens[k].size() / ps) {
            std::fprintf(stderr, "insert: %s\n", r.status().ToString().c_str());
            return false;
          }
        }
        return true;
      },
      [&] { (void)c.EvictAll(spec.name); });
  out->bulk_insert = Throughput(
      reps, src.size(),
      [&] {
        for (size_t k = 0; k < calls; ++k) {
          absl::StatusOr<client::InsertResult> r =
              bulk.Insert(spec.name, tokens[k], span(k), pb);
          if (!r.ok() || r->pages_stored != tokens[k].size() / ps ||
              !r->data_plane) {
            std::fprintf(stderr, "bulk insert: %s\n",
                         r.status().ToString().c_str());
            return false;
          }
        }
        return true;
      },
      [&] { (void)c.EvictAll(spec.name); });
  absl::StatusOr<client::NamespaceInfo> info = shm.DescribeNamespace(spec.name);
  if (!info.ok()) return false;
  absl::StatusOr<std::unique_ptr<client::StagingRegion>> region =
      client::StagingRegion::Create(info->staging_socket, batch * pb);
  if (!region.ok()) {
    std::fprintf(stderr, "staging: %s\n", region.status().ToString().c_str());
    return false;
  }
  out->shm_insert = Throughput(
      reps, src.size(),
      [&] {
        for (size_t k = 0; k < calls; ++k) {
          const absl::Span<const uint8_t> pages = span(k);
          std::memcpy((*region)->data(), pages.data(), pages.size());
          absl::StatusOr<client::InsertResult> r =
              shm.InsertStaged(spec.name, client::Sequence::OfTokens(tokens[k]),
                               **region, 0, pages.size(), {}, {});
          if (!r.ok() || r->pages_stored != tokens[k].size() / ps) {
            std::fprintf(stderr, "staged insert: %s\n",
                         r.status().ToString().c_str());
            return false;
          }
        }
        return true;
      },
      [&] { (void)c.EvictAll(spec.name); });
  std::vector<uint64_t> leases;
  std::vector<size_t> call_bytes;
  for (size_t k = 0; k < calls; ++k) {
    absl::StatusOr<client::Lease> l =
        c.Match(spec.name, tokens[k], true, absl::Minutes(5));
    if (!l.ok() || l->matched_tokens != tokens[k].size()) return false;
    leases.push_back(l->id);
    call_bytes.push_back(tokens[k].size() / ps * pb);
  }
  out->fetch = Throughput(reps, src.size(), [&] {
    return FetchAll(c, spec.name, leases, call_bytes, dst, batch * pb,
                    client::FetchPath::kGrpc);
  });
  bool same = dst == src;
  std::fill(dst.begin(), dst.end(), 0);
  out->shm_fetch = Throughput(reps, src.size(), [&] {
    return FetchAll(shm, spec.name, leases, call_bytes, dst, batch * pb,
                    client::FetchPath::kSharedMemory);
  });
  same = same && dst == src;
  std::fill(dst.begin(), dst.end(), 0);
  out->bulk_fetch = Throughput(reps, src.size(), [&] {
    return FetchAll(bulk, spec.name, leases, call_bytes, dst, batch * pb,
                    client::FetchPath::kBulk);
  });
  same = same && dst == src;
  for (uint64_t id : leases) (void)c.Release(id);
  (void)c.DeleteNamespace(spec.name, /*force=*/true);
  return same;
}

bool RunRedis(RedisServer& redis, const Size& size,
              const std::vector<uint8_t>& src, std::vector<uint8_t>& dst,
              int reps, size_t batch, Result* out) {
  const uint64_t pb = size.geometry.PageBytes();
  const size_t pages = src.size() / pb;
  const std::string prefix = absl::StrCat("page:", pb, ":");
  out->set = Throughput(
      reps, src.size(),
      [&] {
        for (size_t first = 0; first < pages; first += batch) {
          const size_t n = std::min(batch, pages - first);
          if (!redis.Set(prefix, first, n, src.data() + first * pb, pb)) {
            return false;
          }
        }
        return true;
      },
      nullptr, redis.pid());
  std::fill(dst.begin(), dst.end(), 0);
  out->get = Throughput(
      reps, src.size(),
      [&] {
        for (size_t first = 0; first < pages; first += batch) {
          const size_t n = std::min(batch, pages - first);
          if (!redis.Get(prefix, first, n, dst.data() + first * pb, pb)) {
            return false;
          }
        }
        return true;
      },
      nullptr, redis.pid());
  const bool same = dst == src;
  return redis.FlushAll() && same;
}

// Prints wall-clock and per-CPU tables; true when the same-host Fetch
// (shared memory) is >= 1.5x GET on the wall clock for every size.
bool PrintTables(const std::vector<Size>& sizes,
                 const std::vector<Result>& results, bool redis_ran) {
  bool all_met = true;
  for (int cpu = 0; cpu < 2; ++cpu) {
    std::printf("\n%s\n", cpu ? "MB per CPU second (all processes involved)"
                              : "MB per wall-clock second");
    std::printf(
        "%-8s  %10s  %10s  %10s  %10s  %10s  %10s  %10s  %10s  %8s  %9s  %9s  "
        "%9s  %9s  %9s  %9s\n",
        "page", "Insert", "ShmInsert", "BulkInsert", "Redis SET", "Fetch",
        "ShmFetch", "BulkFetch", "Redis GET", "Ins/SET", "ShmIns/SET",
        "BulkIns/SET", "Fetch/GET", "Shm/GET", "Bulk/GET", "Shm/Fetch");
    for (size_t i = 0; i < sizes.size(); ++i) {
      const Result& r = results[i];
      auto v = [cpu](const Rate& x) { return cpu ? x.cpu : x.wall; };
      auto num = [&](const Rate& x) {
        return redis_ran ? absl::StrFormat("%.0f", v(x)) : std::string("-");
      };
      auto ratio = [&](const Rate& a, const Rate& b) {
        return redis_ran ? absl::StrFormat("%.2fx", v(a) / v(b))
                         : std::string("-");
      };
      std::printf(
          "%-8s  %10.0f  %10.0f  %10.0f  %10s  %10.0f  %10.0f  %10.0f  %10s  "
          "%8s  %9s  %9s  %9s  %9s  %9s  %8.2fx\n",
          sizes[i].name, v(r.insert), v(r.shm_insert), v(r.bulk_insert),
          num(r.set).c_str(), v(r.fetch), v(r.shm_fetch), v(r.bulk_fetch),
          num(r.get).c_str(), ratio(r.insert, r.set).c_str(),
          ratio(r.shm_insert, r.set).c_str(),
          ratio(r.bulk_insert, r.set).c_str(), ratio(r.fetch, r.get).c_str(),
          ratio(r.shm_fetch, r.get).c_str(), ratio(r.bulk_fetch, r.get).c_str(),
          v(r.shm_fetch) / v(r.fetch));
      if (redis_ran && cpu == 0 &&
          (r.shm_fetch.wall < 1.5 * r.get.wall ||
           r.bulk_fetch.wall < 1.5 * r.get.wall ||
           r.bulk_insert.wall < 1.5 * r.set.wall)) {
        all_met = false;
      }
    }
  }
  return all_met;
}

// Starts redis-server; empty on success, else why Redis is skipped.
std::string StartRedis(RedisServer& redis) {
  const std::string binary = FindInPath(absl::GetFlag(FLAGS_redis_server));
  if (binary.empty()) {
    return absl::StrCat("'", absl::GetFlag(FLAGS_redis_server),
                        "' not found in PATH");
  }
  std::string skip = redis.Start(binary);
  if (skip.empty()) {
    std::printf(
        "redis: %s on 127.0.0.1:%d (--save '' --appendonly no), hiredis "
        "pipelined\n",
        binary.c_str(), redis.port());
  }
  return skip;
}

int Run() {
  const int reps = absl::GetFlag(FLAGS_reps);
  const uint64_t total = static_cast<uint64_t>(absl::GetFlag(FLAGS_mib)) << 20;
  const uint64_t batch_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_batch_mib)) << 20;
  const std::vector<Size> sizes = {
      {"256 KiB", Geo(4, 8, 128, client::DType::kFP16)},  // 2*4*16*8*128*2
      {"1 MiB", Geo(16, 8, 128, client::DType::kFP16)},   // 2*16*16*8*128*2
      {"2 MiB", Geo(16, 8, 128, client::DType::kFP32)},   // 2*16*16*8*128*4
  };
  std::vector<uint8_t> src(total);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= src.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(src.data() + i, &v, 8);
  }

  DaemonOptions dopt;
  dopt.listen = "127.0.0.1:0";
  dopt.store.pool_budget_bytes = total + (uint64_t{64} << 20);
  dopt.data_plane.listen = "127.0.0.1:0";  // the BulkFetch row
  // The same-host path's socket, private to this run.
  dopt.host_ipc.socket =
      absl::StrCat("/tmp/kvharbor_bench_", getpid(), ".sock");
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(dopt);
  if (!daemon.ok()) {
    std::fprintf(stderr, "daemon: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  ClientOptions copt;
  copt.address = (*daemon)->address();
  copt.host_fetch = HostFetchMode::kOff;  // the gRPC stream rows
  copt.data_plane = DataPlaneMode::kOff;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(copt);
  if (!client.ok()) return 1;
  copt.data_plane = DataPlaneMode::kOn;  // the BulkFetch row
  copt.data_plane_connections =
      static_cast<uint32_t>(absl::GetFlag(FLAGS_bulk_connections));
  absl::StatusOr<std::unique_ptr<Client>> bulk_client = Client::Create(copt);
  if (!bulk_client.ok()) {
    std::fprintf(stderr, "%s\n", bulk_client.status().ToString().c_str());
    return 1;
  }
  copt.data_plane = DataPlaneMode::kOff;
  copt.host_fetch = HostFetchMode::kOn;  // the same-host row
  absl::StatusOr<std::unique_ptr<Client>> shm_client = Client::Create(copt);
  if (!shm_client.ok()) return 1;

  std::ifstream loadavg("/proc/loadavg");
  std::string load;
  std::getline(loadavg, load);
  std::printf("machine: %ld CPUs, /proc/loadavg %s\n",
              sysconf(_SC_NPROCESSORS_ONLN), load.c_str());
  std::printf(
      "Insert/Fetch vs Redis SET/GET on loopback: %llu MiB per page size and "
      "op, %llu MiB per call/pipeline, median of %d runs, MB = 1e6 B\n",
      static_cast<unsigned long long>(total >> 20),
      static_cast<unsigned long long>(batch_bytes >> 20), reps);
  // The Redis child reopens stdout: flush first so nothing prints twice.
  std::fflush(stdout);
  RedisServer redis;
  const std::string skip = StartRedis(redis);
  if (!skip.empty())
    std::printf("NOTE: Redis baseline SKIPPED: %s\n", skip.c_str());

  std::vector<Result> results;
  for (const Size& s : sizes) {
    const uint64_t pb = s.geometry.PageBytes();
    const size_t batch = std::max<uint64_t>(1, batch_bytes / pb);
    const size_t bytes = total / pb * pb;
    std::vector<uint8_t> src_s(src.begin(), src.begin() + bytes);
    std::vector<uint8_t> dst_s(bytes);
    Result r;
    if (!RunKvharbor(**client, **shm_client, **bulk_client, s, src_s, dst_s,
                     reps, batch, &r)) {
      std::fprintf(stderr,
                   "kvharbor run for %s failed or returned wrong "
                   "bytes\n",
                   s.name);
      return 1;
    }
    if (skip.empty() && !RunRedis(redis, s, src_s, dst_s, reps, batch, &r)) {
      std::fprintf(stderr, "redis run for %s failed or returned wrong bytes\n",
                   s.name);
      return 1;
    }
    results.push_back(r);
  }
  const bool all_met = PrintTables(sizes, results, skip.empty());
  if (skip.empty()) {
    std::printf(
        "\ntargets (wall clock): Fetch >= 1.5x Redis GET (same-host "
        "shared-memory Fetch and remote BulkFetch), remote BulkInsert >= 1.5x "
        "Redis SET: %s\n",
        all_met ? "MET for every page size" : "MISSED");
  }
  (*daemon)->Shutdown(absl::Seconds(1));
  return 0;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvharbor::Run();
}
