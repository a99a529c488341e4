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
// Admission control (Admit, once the caller is authenticated): at most
// `limits.global` calls are admitted at once, at most `limits.per_tenant` of
// one tenant (with tokens; a tenant that opens streams it never reads then
// cannot take every slot) and at most `limits.per_connection` from one peer
// address (a TCP connection; every Unix-socket client shares one). A call
// over any of them gets RESOURCE_EXHAUSTED naming the limit's key (it is
// still counted until End, so that draining waits for its reactor too, but
// takes no admitted slot). Unauthenticated calls are refused before they
// are admitted, so they cannot fill the limits either.
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
#ifndef KVHARBOR_SERVER_RPC_CALL_TRACKER_H_
#define KVHARBOR_SERVER_RPC_CALL_TRACKER_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/metrics/server_metrics.h"
#include "server/rpc/status_map.h"

namespace kvharbor {

// One KvHarbor call: its method, when its handler began, and the status
// code it finished with (set by the reactor when it calls Finish).
struct CallRecord {
  explicit CallRecord(RpcMethod m) : method(m) {}
  RpcMethod method;
  std::chrono::steady_clock::time_point start =
      std::chrono::steady_clock::now();
  grpc::StatusCode code = grpc::StatusCode::OK;
  // Holds an admitted slot: set by CallTracker::Admit, cleared by
  // ReleaseAdmission (under the tracker's lock), as are the keys it was
  // counted under ("" tenant: none).
  bool admitted = false;
  std::string tenant;
  std::string peer;
};

// The in-flight limits of CallTracker (limits.max_in_flight_calls*); 0 =
// no limit.
struct AdmissionLimits {
  uint32_t global = 0;
  uint32_t per_tenant = 0;
  uint32_t per_connection = 0;
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
  // `metrics` (may be null) must outlive the tracker.
  explicit CallTracker(ServerMetrics* metrics = nullptr,
                       AdmissionLimits limits = AdmissionLimits())
      : metrics_(metrics), limits_(limits) {}

  // Counts a new call; UNAVAILABLE when the daemon is draining. Either way
  // the call must still End().
  absl::Status Begin(CallRecord* call) {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
    if (draining_) {
      return absl::UnavailableError(
          "server: kvharbord is shutting down and takes no new calls");
    }
    return absl::OkStatus();
  }
  // Admits a begun call of `tenant` ("" = not limited per tenant: no
  // tokens) from `peer`, or RESOURCE_EXHAUSTED naming the limit it is over.
  absl::Status Admit(CallRecord* call, absl::string_view tenant,
                     absl::string_view peer) {
    absl::MutexLock lock(&mu_);
    absl::Status over = OverLimitLocked(tenant, peer);
    if (!over.ok()) {
      ++rejected_;
      return over;
    }
    ++admitted_;
    if (!tenant.empty()) ++per_tenant_[tenant];
    ++per_peer_[peer];
    call->admitted = true;
    call->tenant = std::string(tenant);
    call->peer = std::string(peer);
    return absl::OkStatus();
  }
  // Gives back the call's admitted slot, before its reactor calls Finish: the
  // client may send its next call as soon as it has the status, and OnDone
  // (End) can come later than that. The call still counts as in flight (for
  // draining) until End. Idempotent: End then releases nothing twice.
  void ReleaseAdmission(CallRecord* call) {
    absl::MutexLock lock(&mu_);
    ReleaseLocked(call);
  }
  // The status a reactor is about to Finish `call` with, as gRPC's: its code
  // recorded in the call, and its admitted slot given back first.
  grpc::Status Finishing(CallRecord* call, const absl::Status& status) {
    const grpc::Status grpc_status = ToGrpcStatus(status);
    call->code = grpc_status.error_code();
    ReleaseAdmission(call);
    return grpc_status;
  }
  void End(const CallRecord& call) {
    if (metrics_ != nullptr) {
      const std::chrono::duration<double> took =
          std::chrono::steady_clock::now() - call.start;
      metrics_->RecordRpc(call.method, call.code, took.count());
    }
    absl::MutexLock lock(&mu_);
    --in_flight_;
    CallRecord done = call;
    ReleaseLocked(&done);
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
  // A stream the IdleWatchdog cancelled (limits.*_idle_timeout_ms).
  void NoteIdleCancelled() {
    idle_cancelled_.fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t idle_cancelled() const {
    return idle_cancelled_.load(std::memory_order_relaxed);
  }
  // Calls turned away by the in-flight limits since start.
  uint64_t rejected() const {
    absl::MutexLock lock(&mu_);
    return rejected_;
  }

 private:
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_ == 0;
  }
  absl::Status OverLimitLocked(absl::string_view tenant,
                               absl::string_view peer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (limits_.global != 0 && admitted_ >= limits_.global) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "limits.max_in_flight_calls: ", limits_.global,
          " calls are in flight, the daemon's limit; retry later"));
    }
    if (limits_.per_tenant != 0 && !tenant.empty()) {
      auto it = per_tenant_.find(tenant);
      if (it != per_tenant_.end() && it->second >= limits_.per_tenant) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "limits.max_in_flight_calls_per_tenant: tenant '", tenant, "' has ",
            it->second, " calls in flight, its limit; retry later"));
      }
    }
    if (limits_.per_connection != 0) {
      auto it = per_peer_.find(peer);
      if (it != per_peer_.end() && it->second >= limits_.per_connection) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "limits.max_in_flight_calls_per_connection: ", it->second,
            " calls are in flight from ", peer, ", the limit; retry later"));
      }
    }
    return absl::OkStatus();
  }
  void ReleaseLocked(CallRecord* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!call->admitted) return;
    call->admitted = false;
    --admitted_;
    Decrement(&per_tenant_, call->tenant);
    Decrement(&per_peer_, call->peer);
  }
  static void Decrement(absl::flat_hash_map<std::string, uint32_t>* counts,
                        const std::string& key) {
    auto it = counts->find(key);
    if (it == counts->end()) return;  // "" tenant: not counted
    if (--it->second == 0) counts->erase(it);
  }

  ServerMetrics* const metrics_;
  const AdmissionLimits limits_;
  mutable absl::Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t admitted_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, uint32_t> per_tenant_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> per_peer_ ABSL_GUARDED_BY(mu_);
  uint64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> idle_cancelled_{0};
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_RPC_CALL_TRACKER_H_
