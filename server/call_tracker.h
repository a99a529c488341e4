// CallTracker: counts the KvHarbor calls in flight so that shutdown can drain
// them, and turns new calls away once draining began.
//
// Every call is counted from its handler until its reactor's OnDone, so a
// call whose status is still on its way to the client is still in flight
// (draining waits for it). Its admitted slot (max_in_flight) is given back
// earlier, by ReleaseAdmission just before Finish, so that a client sending
// its next call on seeing the status is not refused for the call it saw end.
// The daemon drains by StartDraining() (new calls then fail with UNAVAILABLE),
// AwaitIdle(deadline), and only then shuts the gRPC server down, which
// cancels whatever is left -- including streams of other services, such as
// health Watch, that would otherwise hold shutdown for the whole drain time.
//
// Admission control: at most `max_in_flight` calls are admitted at once;
// Begin() turns further ones away with RESOURCE_EXHAUSTED naming
// limits.max_in_flight_calls (they are still counted until End, so that
// draining waits for their reactors too, but do not take an admitted slot).
//
// CallAlive() is the deadline check every handler and reactor makes before
// it starts or continues work: gRPC cancels a call whose deadline passed,
// but only the handler can stop work it is doing for it.
//
// Each call is described by a CallRecord (method, start, final status code)
// that its reactor keeps and hands to End(), which records the call's latency
// and status in ServerMetrics (when given) before it stops counting the call,
// so a drained daemon's metrics include every call.
//
// Thread-safe. Owned by KvHarborService; reactors hold a pointer and must be
// done before the service is destroyed (the gRPC server guarantees that).
#ifndef KVHARBOR_SERVER_CALL_TRACKER_H_
#define KVHARBOR_SERVER_CALL_TRACKER_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/server_metrics.h"

namespace kvharbor {

// One KvHarbor call: its method, when its handler began, and the status
// code it finished with (set by the reactor when it calls Finish).
struct CallRecord {
  explicit CallRecord(RpcMethod m) : method(m) {}
  RpcMethod method;
  std::chrono::steady_clock::time_point start =
      std::chrono::steady_clock::now();
  grpc::StatusCode code = grpc::StatusCode::OK;
  // Holds an admitted slot: set by CallTracker::Begin, cleared by
  // ReleaseAdmission (under the tracker's lock).
  bool admitted = false;
};

// OK while `ctx`'s call may go on: CANCELLED once the client cancelled it,
// DEADLINE_EXCEEDED once its deadline passed. `what` says what was stopped
// ("Fetch: ...").
inline absl::Status CallAlive(const grpc::CallbackServerContext& ctx,
                              absl::string_view what) {
  if (ctx.deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": the call's deadline passed; stopped"));
  }
  if (ctx.IsCancelled()) {
    return absl::CancelledError(
        absl::StrCat(what, ": the call was cancelled; stopped"));
  }
  return absl::OkStatus();
}

class CallTracker {
 public:
  // `metrics` (may be null) must outlive the tracker; `max_in_flight` 0
  // admits any number of calls.
  explicit CallTracker(ServerMetrics* metrics = nullptr,
                       uint32_t max_in_flight = 0)
      : metrics_(metrics), max_in_flight_(max_in_flight) {}

  // Counts a new call; the returned status is UNAVAILABLE when the daemon is
  // draining and RESOURCE_EXHAUSTED when max_in_flight calls are admitted
  // already. Either way the call must still End().
  absl::Status Begin(CallRecord* call) {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
    if (draining_) {
      return absl::UnavailableError(
          "server: kvharbord is shutting down and takes no new calls");
    }
    if (max_in_flight_ != 0 && admitted_ >= max_in_flight_) {
      ++rejected_;
      return absl::ResourceExhaustedError(absl::StrCat(
          "limits.max_in_flight_calls: ", max_in_flight_,
          " calls are in flight, the daemon's limit; retry later"));
    }
    ++admitted_;
    call->admitted = true;
    return absl::OkStatus();
  }
  // Gives back the call's admitted slot, before its reactor calls Finish: the
  // client may send its next call as soon as it has the status, and OnDone
  // (End) can come later than that. The call still counts as in flight (for
  // draining) until End. Idempotent: End then releases nothing twice.
  void ReleaseAdmission(CallRecord* call) {
    absl::MutexLock lock(&mu_);
    if (call->admitted) --admitted_;
    call->admitted = false;
  }
  void End(const CallRecord& call) {
    if (metrics_ != nullptr) {
      const std::chrono::duration<double> took =
          std::chrono::steady_clock::now() - call.start;
      metrics_->RecordRpc(call.method, call.code, took.count());
    }
    absl::MutexLock lock(&mu_);
    --in_flight_;
    if (call.admitted) --admitted_;
  }
  void StartDraining() {
    absl::MutexLock lock(&mu_);
    draining_ = true;
  }
  // True when no call is in flight, waiting until `deadline` for that.
  bool AwaitIdle(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithDeadline(
        absl::Condition(this, &CallTracker::IdleLocked), deadline);
  }
  int64_t in_flight() const {
    absl::MutexLock lock(&mu_);
    return in_flight_;
  }
  // Calls turned away by max_in_flight since start.
  uint64_t rejected() const {
    absl::MutexLock lock(&mu_);
    return rejected_;
  }

 private:
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_ == 0;
  }

  ServerMetrics* const metrics_;
  const uint32_t max_in_flight_;
  mutable absl::Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t admitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_CALL_TRACKER_H_
