#include "server/rpc/work_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace kvharbor {

WorkPool::WorkPool(int threads) {
  for (int i = 0; i < std::max(threads, 1); ++i) {
    threads_.emplace_back([this] { Loop(); });
  }
}

WorkPool::~WorkPool() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void WorkPool::Run(const std::string& tenant,
                   absl::AnyInvocable<void() &&> job) {
  absl::MutexLock l(&mu_);
  queues_[tenant].push_back(std::move(job));
  ++queued_;
}

size_t WorkPool::queued() const {
  absl::MutexLock l(&mu_);
  return queued_;
}

bool WorkPool::Take(absl::AnyInvocable<void() &&>* job) {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(this, &WorkPool::StoppedOrQueuedLocked));
  if (queued_ == 0) return false;  // stopped, nothing left
  auto it = queues_.upper_bound(last_);
  if (it == queues_.end()) it = queues_.begin();
  *job = std::move(it->second.front());
  it->second.pop_front();
  --queued_;
  last_ = it->first;
  if (it->second.empty()) queues_.erase(it);
  return true;
}

bool WorkPool::StoppedOrQueuedLocked() const { return stop_ || queued_ > 0; }

void WorkPool::Loop() {
  // Per-thread on Linux; lowering one's own priority needs no privilege.
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  setpriority(PRIO_PROCESS, tid,
              getpriority(PRIO_PROCESS, tid) + kNiceIncrement);
  absl::AnyInvocable<void() &&> job;
  while (Take(&job)) std::move(job)();
}

}  // namespace kvharbor
