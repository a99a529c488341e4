// WorkPool: a few threads that run long request bodies (a Match over many
// tokens) off gRPC's callback threads. gRPC runs every callback on as many
// threads as the machine has cores; one tenant's long Matches on them made
// every other tenant's short calls wait (issue 18: tenant B's Match p50
// 240 ms behind 8 clients of 262,144-page Matches on 2 cores). Here they
// queue instead, taken round-robin over tenants (another tenant's long call
// waits for one job of each tenant ahead of it, not for all of them), on
// threads at a lower priority (nice +kNiceIncrement), so that short calls on
// gRPC's threads get the CPU first.
//
// Thread-safe. Jobs own what they capture; the destructor runs every job
// still queued, then joins the threads.
#ifndef KVHARBOR_SERVER_RPC_WORK_POOL_H_
#define KVHARBOR_SERVER_RPC_WORK_POOL_H_

#include <deque>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace kvharbor {

class WorkPool {
 public:
  static constexpr int kNiceIncrement = 5;

  // `threads` >= 1.
  explicit WorkPool(int threads);
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Queues `job` under `tenant` ("" is a tenant like any other).
  void Run(const std::string& tenant, absl::AnyInvocable<void() &&> job);

  // Jobs queued and not yet started, and the threads (for tests).
  size_t queued() const;
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();
  // The next job, round-robin over tenants; false once stopped and empty.
  bool Take(absl::AnyInvocable<void() &&>* job);
  bool StoppedOrQueuedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::deque<absl::AnyInvocable<void() &&>>> queues_
      ABSL_GUARDED_BY(mu_);
  // The tenant served last: the next job comes from the first one after it.
  std::string last_ ABSL_GUARDED_BY(mu_);
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_RPC_WORK_POOL_H_
