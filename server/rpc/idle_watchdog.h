// IdleWatchdog: cancels streams that make no progress -- an Insert whose
// client sends nothing more, a Fetch whose client reads nothing more -- so
// that a client cannot hold the slots, pins and in-flight places such a call
// has for as long as it likes (limits.upload_idle_timeout_ms,
// limits.fetch_idle_timeout_ms; docs/operations.md "Limits and overload").
//
// A reactor Watch()es its call when it starts and keeps the returned Entry;
// it calls Entry::Progress() whenever a message moves (a chunk read, a
// chunk's write completed), and Unwatch()es in OnDone. One thread scans the
// entries every `tick` and calls TryCancel on each call idle for longer than
// its timeout; the reactor then sees its call cancelled and cleans up as for
// any cancellation (an upload is aborted, pins are released).
//
// Thread-safe. The watchdog owns its thread and the entries; a call's
// context must stay valid until its entry is unwatched (OnDone unwatches
// before gRPC frees the context). TryCancel runs under the watchdog's
// mutex, so Unwatch waits for a scan that is cancelling the call.
#ifndef KVHARBOR_SERVER_RPC_IDLE_WATCHDOG_H_
#define KVHARBOR_SERVER_RPC_IDLE_WATCHDOG_H_

#include <grpcpp/server_context.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace kvharbor {

class IdleWatchdog {
 public:
  class Entry {
   public:
    // The call moved a message: its idle time starts again.
    void Progress() {
      last_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
    }
    // Whether the watchdog cancelled the call for idling.
    bool expired() const { return expired_.load(std::memory_order_relaxed); }

   private:
    friend class IdleWatchdog;
    Entry(grpc::CallbackServerContext* ctx, absl::Duration timeout)
        : ctx_(ctx), timeout_ns_(absl::ToInt64Nanoseconds(timeout)) {
      Progress();
    }
    grpc::CallbackServerContext* const ctx_;
    const int64_t timeout_ns_;
    std::atomic<int64_t> last_ns_{0};
    std::atomic<bool> expired_{false};
  };

  // Scans every `tick` (> 0); `on_cancel` (may be null) is called, under
  // the watchdog's mutex, for each call it cancels.
  IdleWatchdog(absl::Duration tick, std::function<void()> on_cancel);
  ~IdleWatchdog();  // stops the thread; every entry must be unwatched
  IdleWatchdog(const IdleWatchdog&) = delete;
  IdleWatchdog& operator=(const IdleWatchdog&) = delete;

  // Watches `ctx`'s call; a `timeout` of zero or less watches nothing and
  // returns null (Progress/Unwatch accept null).
  Entry* Watch(grpc::CallbackServerContext* ctx, absl::Duration timeout);
  void Unwatch(Entry* entry);

  // A tick that notices a `timeout` within a quarter of it, at most 1 s.
  static absl::Duration TickFor(absl::Duration timeout);

 private:
  void Run();
  void ScanLocked(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration tick_;
  const std::function<void()> on_cancel_;
  absl::Mutex mu_;
  absl::flat_hash_set<Entry*> entries_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread thread_;
};

// Progress() of a possibly null entry.
inline void NoteProgress(IdleWatchdog::Entry* e) {
  if (e != nullptr) e->Progress();
}

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_RPC_IDLE_WATCHDOG_H_
