// DeviceInsertReactor: server side of the bidirectional DeviceInsert RPC
// (same-host insert into the device tier by CUDA IPC; the proto's
// DeviceInsertBegin states the protocol).
//
// begin -> Namespace::BeginInsert reserves the slots (a placed upload) and
// the reactor answers where they lie in the device arena; the client writes
// the pages there itself; commit -> Upload::AcceptPlaced hashes the slots on
// the daemon's GPU against the client's checksums, then Upload::Commit. The
// upload lives in a DeviceUpload shared with the service's
// DeviceUploadTable, whose reaper (the daemon's lease-reaping thread) aborts
// it once its TTL is over; a stream that ends, fails or is cancelled before
// the commit aborts it in OnDone at the latest. Aborting destroys the
// upload, which gives the slots back.
//
// Until its begin arrives the call is watched for idleness
// (limits.upload_idle_timeout_ms, server/rpc/idle_watchdog.h): a stream that
// never begins holds an in-flight place and is cancelled like an idle
// Insert. After the begin, the upload's TTL bounds the wait instead (the
// client copies on its GPU between slots and commit).
//
// Owned by gRPC's callback machinery: created by KvHarborService::
// DeviceInsert and deleted in OnDone. Reads and writes alternate (one
// operation outstanding at a time), so the reactions never run
// concurrently; only the DeviceUpload is shared, under its mutex.
#ifndef KVHARBOR_SERVER_RPC_DEVICE_INSERT_REACTOR_H_
#define KVHARBOR_SERVER_RPC_DEVICE_INSERT_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/store/namespace.h"
#include "core/store/store.h"
#include "kvharbor/v1/kvharbor.pb.h"
#include "server/rpc/call_tracker.h"
#include "server/rpc/idle_watchdog.h"
#include "server/security/auth.h"

namespace kvharbor {

// One DeviceInsert's upload between its slots answer and its commit.
struct DeviceUpload {
  absl::Mutex mu;
  // Null once committed or aborted.
  std::unique_ptr<Namespace::Upload> upload ABSL_GUARDED_BY(mu);
  absl::Time expiry ABSL_GUARDED_BY(mu);
  absl::Duration ttl ABSL_GUARDED_BY(mu);
  bool expired ABSL_GUARDED_BY(mu) = false;
};

// The DeviceInsert uploads waiting for their commit. Thread-safe; its mutex
// is never held with a DeviceUpload's (lock order: none).
class DeviceUploadTable {
 public:
  void Add(std::shared_ptr<DeviceUpload> upload);
  // Aborts every upload whose expiry is before `now` (its slots go back)
  // and forgets those that ended; returns how many it aborted.
  size_t AbortExpired(absl::Time now);
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::weak_ptr<DeviceUpload>> uploads_ ABSL_GUARDED_BY(mu_);
};

class DeviceInsertReactor final
    : public grpc::ServerBidiReactor<v1::DeviceInsertRequest,
                                     v1::DeviceInsertResponse> {
 public:
  // Finishes at once with `caller`'s error (draining, or the call is not
  // authorized); otherwise inserts only into namespaces the caller sees.
  // `idle` (null: not watched) is the call's entry in `watchdog`, unwatched
  // once the begin arrived (or in OnDone).
  DeviceInsertReactor(grpc::CallbackServerContext* ctx, Store* store,
                      CallTracker* calls, DeviceUploadTable* table,
                      const CallRecord& call, absl::StatusOr<Caller> caller,
                      IdleWatchdog* watchdog = nullptr,
                      IdleWatchdog::Entry* idle = nullptr);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  enum class Stage { kBegin, kSlotsSent, kCommit, kDoneSent, kFinished };
  // Reserves the slots and fills response_.slots.
  absl::Status OnBegin(const v1::DeviceInsertBegin& begin);
  // Checks and commits the upload and fills response_.done.
  absl::Status OnCommit(const v1::DeviceInsertCommit& commit);
  // Aborts any upload, then finishes the RPC with `status`.
  void FinishWith(const absl::Status& status);
  void Abort();

  grpc::CallbackServerContext* const ctx_;
  Store* const store_;
  CallTracker* const calls_;
  DeviceUploadTable* const table_;
  IdleWatchdog* const watchdog_;
  IdleWatchdog::Entry* idle_;  // null once the begin arrived
  CallRecord call_;
  Caller caller_;
  Stage stage_ = Stage::kBegin;
  v1::DeviceInsertRequest request_;    // reused for every read
  v1::DeviceInsertResponse response_;  // the one write in flight
  std::shared_ptr<DeviceUpload> upload_;
  std::string namespace_name_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_RPC_DEVICE_INSERT_REACTOR_H_
