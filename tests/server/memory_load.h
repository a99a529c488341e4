// Memory under load, shared by the RSS test (tests/server/memory_test.cc)
// and the benchmark (bench/server_memory_under_load.cc): reading a process's
// VmRSS/VmHWM from /proc, a sampler thread keeping each process's peak, and
// a load driver -- many SDK clients inserting, matching (with leases),
// fetching and releasing, some calls cut short by tiny deadlines.
//
// Header-only. ProcMemory reads are thread-safe; a MemorySampler's peaks
// are read after Stop(); RunLoad blocks until its clients are done. The
// driver owns its page buffers; nothing is shared with the daemon but the
// wire.
#ifndef KVHARBOR_TESTS_SERVER_MEMORY_LOAD_H_
#define KVHARBOR_TESTS_SERVER_MEMORY_LOAD_H_

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvharbor/client.h"

namespace kvharbor {
namespace testing {

struct ProcMemory {
  uint64_t rss_bytes = 0;  // VmRSS
  uint64_t hwm_bytes = 0;  // VmHWM: the kernel's own peak of VmRSS
};

// The memory of process `pid`; zeros when it is gone.
inline ProcMemory ReadProcMemory(pid_t pid) {
  ProcMemory m;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    uint64_t kib = 0;
    if (key == "VmRSS:" && in >> kib) m.rss_bytes = kib << 10;
    if (key == "VmHWM:" && in >> kib) m.hwm_bytes = kib << 10;
  }
  return m;
}

// Samples the memory of some processes every `period` until Stop().
class MemorySampler {
 public:
  MemorySampler(std::vector<pid_t> pids, absl::Duration period)
      : pids_(std::move(pids)), peak_(pids_.size()), samples_(0) {
    thread_ = std::thread([this, period] {
      do {
        for (size_t i = 0; i < pids_.size(); ++i) {
          const ProcMemory m = ReadProcMemory(pids_[i]);
          absl::MutexLock lock(&mu_);
          peak_[i].rss_bytes = std::max(peak_[i].rss_bytes, m.rss_bytes);
          peak_[i].hwm_bytes = std::max(peak_[i].hwm_bytes, m.hwm_bytes);
        }
        ++samples_;
      } while (!stop_.WaitForNotificationWithTimeout(period));
    });
  }
  ~MemorySampler() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    stop_.Notify();
    thread_.join();
  }
  // The largest sampled VmRSS and VmHWM of pids[i].
  ProcMemory peak(size_t i) const {
    absl::MutexLock lock(&mu_);
    return peak_[i];
  }
  int samples() const { return samples_; }

 private:
  const std::vector<pid_t> pids_;
  mutable absl::Mutex mu_;
  std::vector<ProcMemory> peak_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> samples_;
  absl::Notification stop_;
  std::thread thread_;
};

// A namespace whose pages are 256 KiB: 4 layers x 8 kv heads x 128 dims x
// 16 tokens x 2 (K, V) x 2 bytes.
inline client::Geometry LoadGeometry() {
  client::Geometry g;
  g.num_layers = 4;
  g.num_kv_heads = 8;
  g.head_dim = 128;
  g.page_size = 16;
  g.dtype = client::DType::kBF16;
  return g;
}

struct LoadOptions {
  std::string address;
  std::string ns = "load";
  int clients = 16;
  absl::Duration duration = absl::Seconds(5);
  uint32_t pages_per_request = 8;
  // Every cancel_every-th operation of a client gets a deadline of 1..3 ms,
  // so that it is cut short somewhere in its work (0: none).
  int cancel_every = 8;
};

struct LoadStats {
  uint64_t ops = 0;  // insert + match + fetch + release attempts
  uint64_t ok = 0;
  uint64_t bytes_fetched = 0;
  std::map<absl::StatusCode, uint64_t> errors;  // by code
};

// One client's loop: insert a fresh sequence, match it with a lease, fetch
// the leased pages, release. Every op's outcome is counted.
inline void LoadClient(const LoadOptions& o, int index, absl::Time end,
                       LoadStats* stats, absl::Mutex* mu) {
  ClientOptions co;
  co.address = o.address;
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(co);
  if (!c.ok()) {
    absl::MutexLock lock(mu);
    ++stats->errors[c.status().code()];
    return;
  }
  const client::Geometry g = LoadGeometry();
  const uint64_t page_bytes = g.PageBytes();
  const size_t n_tokens = size_t{o.pages_per_request} * g.page_size;
  std::vector<uint8_t> pages(o.pages_per_request * page_bytes);
  std::mt19937 rng(static_cast<uint32_t>(index) + 1);
  for (uint8_t& b : pages) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> dst(pages.size());
  std::vector<client::Token> tokens(n_tokens);
  LoadStats local;
  auto count = [&](const absl::Status& s) {
    ++local.ops;
    if (s.ok()) {
      ++local.ok;
    } else {
      ++local.errors[s.code()];
    }
    return s.ok();
  };
  for (uint64_t iter = 0; absl::Now() < end; ++iter) {
    // A distinct sequence per client and iteration: the pool keeps filling
    // and evicting.
    const client::Token first =
        static_cast<client::Token>((index * 100003 + iter * 7919) % 1000000000);
    for (size_t i = 0; i < n_tokens; ++i) {
      tokens[i] = first + static_cast<client::Token>(i);
    }
    const bool cut = o.cancel_every > 0 && iter % o.cancel_every == 0;
    CallOptions call;
    if (cut) call = CallOptions::Timeout(absl::Milliseconds(1 + iter % 3));
    if (!count(c.value()
                   ->Insert(o.ns, tokens, pages, page_bytes, call)
                   .status())) {
      continue;
    }
    absl::StatusOr<client::Lease> lease =
        c.value()->Match(o.ns, tokens, /*lock=*/true, absl::Seconds(30), call);
    if (!count(lease.status()) || !lease->locked()) continue;
    absl::StatusOr<client::FetchResult> f = c.value()->FetchInto(
        o.ns, client::FetchSource::FromLease(lease->id),
        absl::MakeSpan(dst.data(), lease->pages.size() * page_bytes), call);
    if (count(f.status())) local.bytes_fetched += f->num_pages * page_bytes;
    // Released without the tiny deadline: a lease must not outlive its use.
    count(c.value()->Release(lease->id));
  }
  absl::MutexLock lock(mu);
  stats->ops += local.ops;
  stats->ok += local.ok;
  stats->bytes_fetched += local.bytes_fetched;
  for (const auto& [code, n] : local.errors) stats->errors[code] += n;
}

// Creates the namespace (capacity `capacity_bytes`) and drives `o.clients`
// concurrent clients for `o.duration`.
inline absl::StatusOr<LoadStats> RunLoad(const LoadOptions& o,
                                         uint64_t capacity_bytes) {
  ClientOptions co;
  co.address = o.address;
  co.wait_for_ready = true;
  absl::StatusOr<std::unique_ptr<Client>> admin = Client::Create(co);
  if (!admin.ok()) return admin.status();
  client::NamespaceSpec spec;
  spec.name = o.ns;
  spec.geometry = LoadGeometry();
  spec.capacity_bytes = capacity_bytes;
  absl::Status s =
      admin.value()->CreateNamespace(spec, /*if_not_exists=*/true).status();
  if (!s.ok()) return s;
  LoadStats stats;
  absl::Mutex mu;
  const absl::Time end = absl::Now() + o.duration;
  std::vector<std::thread> threads;
  for (int i = 0; i < o.clients; ++i) {
    threads.emplace_back([&, i] { LoadClient(o, i, end, &stats, &mu); });
  }
  for (std::thread& t : threads) t.join();
  return stats;
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_SERVER_MEMORY_LOAD_H_
