#include "server/rpc/idle_watchdog.h"

#include <algorithm>
#include <utility>

namespace kvharbor {

IdleWatchdog::IdleWatchdog(absl::Duration tick, std::function<void()> on_cancel)
    : tick_(tick),
      on_cancel_(std::move(on_cancel)),
      thread_([this] { Run(); }) {}

IdleWatchdog::~IdleWatchdog() {
  stop_.Notify();
  thread_.join();
}

absl::Duration IdleWatchdog::TickFor(absl::Duration timeout) {
  return std::clamp(timeout / 4, absl::Milliseconds(5), absl::Seconds(1));
}

IdleWatchdog::Entry* IdleWatchdog::Watch(grpc::CallbackServerContext* ctx,
                                         absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return nullptr;
  auto* e = new Entry(ctx, timeout);
  absl::MutexLock l(&mu_);
  entries_.insert(e);
  return e;
}

void IdleWatchdog::Unwatch(Entry* entry) {
  if (entry == nullptr) return;
  {
    absl::MutexLock l(&mu_);
    entries_.erase(entry);
  }
  delete entry;
}

void IdleWatchdog::ScanLocked(int64_t now_ns) {
  for (Entry* e : entries_) {
    if (e->expired_.load(std::memory_order_relaxed)) continue;
    if (now_ns - e->last_ns_.load(std::memory_order_relaxed) < e->timeout_ns_) {
      continue;
    }
    e->expired_.store(true, std::memory_order_relaxed);
    // Counted first: the client may see the cancellation at once.
    if (on_cancel_) on_cancel_();
    e->ctx_->TryCancel();
  }
}

void IdleWatchdog::Run() {
  while (!stop_.WaitForNotificationWithTimeout(tick_)) {
    absl::MutexLock l(&mu_);
    ScanLocked(absl::GetCurrentTimeNanos());
  }
}

}  // namespace kvharbor
