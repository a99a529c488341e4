// InsertReactor: server side of the client-streaming Insert RPC.
//
// The first message must be the header: it starts a two-phase upload
// (Namespace::BeginInsert locks the skipped prefix and reserves the slots),
// and once accepted the reactor sends the call's initial metadata
// ("kvh-sent-pages": the pages whose bytes it expects), which a client may
// await before sending data. Each chunk is copied straight
// from the request into the reserved slots (Upload::Write); nothing buffers
// the whole upload. When the client half-closes, the upload is committed if
// every byte arrived. On any error, cancellation or a broken stream the
// upload is destroyed before the RPC finishes, which aborts it: nothing
// becomes visible and the slots go back to the pool. The call is checked
// (CallAlive) before each message and before the commit, so an upload whose
// deadline passed stops there even while its client keeps sending; and an
// upload that receives no message for limits.upload_idle_timeout_ms is
// cancelled by the service's IdleWatchdog, which aborts it the same way.
// Slots are reserved as the bytes arrive (Namespace::Upload::Write), so a
// header alone holds at most one slot. With header.staging the bytes come
// from the caller's registered staging region instead of the stream
// (InsertStagedChunk; server/local/staging_registry.h): the reactor holds the
// region exclusively until it finishes, and copies and checks those bytes
// exactly as streamed ones.
//
// With header.bulk and the daemon's bulk data plane (docs/data_plane.md
// "Insert"), the upload is begun placed (every slot reserved) and handed
// to a BulkReceiveTicket, and its offer goes out in the initial metadata
// ("kvh-bulk-offer-bin"); the client's data connections write the sent
// pages straight into the slots, and the commit waits for both the
// stream's half-close and the last connection (then the pages are checked
// against page_checksums with the hashes the receivers computed). A broken
// connection, a cancel or the deadline end the ticket; its upload is then
// aborted once no connection writes into it.
//
// Owned by gRPC's callback machinery: created by KvHarborService::Insert and
// deleted in OnDone. Only one read is outstanding at a time, so the read
// reactions never run concurrently; the bulk ticket's end arrives on a data
// connection's thread, so what it shares with them is under mu_ (lock
// order: the ticket's callback lock, then mu_); OnCancel acts only on a bulk
// upload (see there).
#ifndef KVHARBOR_SERVER_RPC_INSERT_REACTOR_H_
#define KVHARBOR_SERVER_RPC_INSERT_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/store/namespace.h"
#include "core/store/store.h"
#include "kvharbor/v1/kvharbor.pb.h"
#include "server/data/bulk_receive_ticket.h"
#include "server/data/bulk_ticket_table.h"
#include "server/local/staging_registry.h"
#include "server/rpc/call_tracker.h"
#include "server/rpc/idle_watchdog.h"
#include "server/security/auth.h"

namespace kvharbor {

class InsertReactor final : public grpc::ServerReadReactor<v1::InsertRequest> {
 public:
  // Finishes at once with `caller`'s error (draining, or the call is not
  // authorized); otherwise inserts only into namespaces the caller sees.
  // `idle` (null: not watched) is the call's entry in `watchdog`, which
  // the reactor unwatches when done.
  InsertReactor(grpc::CallbackServerContext* ctx, Store* store,
                CallTracker* calls, const CallRecord& call,
                absl::StatusOr<Caller> caller, v1::InsertResponse* response,
                IdleWatchdog* watchdog, IdleWatchdog::Entry* idle,
                StagingRegistry* staging, BulkTicketTable* bulk_tickets,
                uint16_t bulk_port);

  void OnReadDone(bool ok) override;
  void OnSendInitialMetadataDone(bool) override {}
  // A bulk upload waiting for its connections after the half-close has no
  // read outstanding to see a cancel (the client's, the deadline's, the
  // idle watchdog's): this ends it. Other uploads see it in OnReadDone.
  void OnCancel() override;
  void OnDone() override;

 private:
  absl::Status OnHeader(const v1::InsertHeader& header);
  absl::Status OnChunk(const v1::InsertChunk& chunk);
  absl::Status OnStaged(const v1::InsertStagedChunk& chunk);
  // Checks that `bytes` bytes at `offset` continue the upload, then writes
  // them (Upload::Write with `threads`); `field` names the message's data
  // field in errors.
  absl::Status Write(uint64_t offset, absl::string_view bytes,
                     absl::string_view field, int threads = 1);
  absl::Status OnEndOfStream();
  // header.bulk: hands `upload` (placed, host slots) to a receive ticket
  // and puts its offer in the initial metadata; false (the upload aborted)
  // when the plane has no room for another transfer (chunks then).
  absl::StatusOr<bool> BeginBulk(std::unique_ptr<Namespace::Upload> upload,
                                 const v1::InsertHeader& header);
  // The stream's half-close / the ticket's end (on a data thread); the one
  // that comes second commits (CommitBulk).
  void EndBulkStream();
  void OnBulkDone(const absl::Status& status);
  void CommitBulk();
  // Aborts any upload, then finishes the RPC with `status` (once).
  void FinishWith(const absl::Status& status);
  // FinishWith's work once finished_ was claimed under mu_.
  void FinishClaimed(const absl::Status& status);
  bool finished();

  grpc::CallbackServerContext* const ctx_;
  Store* const store_;
  CallTracker* const calls_;
  IdleWatchdog* const watchdog_;
  IdleWatchdog::Entry* const idle_;
  StagingRegistry* const staging_registry_;  // null: no staging socket
  CallRecord call_;
  Caller caller_;
  v1::InsertResponse* const response_;
  v1::InsertRequest request_;  // reused for every read
  std::unique_ptr<Namespace::Upload> upload_;
  std::unique_ptr<StagingRegistry::Use> staging_;
  std::string namespace_name_;
  BulkTicketTable* const bulk_tickets_;  // null: no bulk data plane
  const uint16_t bulk_port_;
  std::shared_ptr<BulkReceiveTicket> bulk_;  // header.bulk accepted
  BulkToken bulk_token_{};
  std::vector<uint64_t> bulk_checksums_;  // the header's page_checksums
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool end_of_stream_ ABSL_GUARDED_BY(mu_) = false;
  bool bulk_done_ ABSL_GUARDED_BY(mu_) = false;
  bool bulk_active_ ABSL_GUARDED_BY(mu_) = false;  // bulk_ is set
  absl::Status bulk_status_ ABSL_GUARDED_BY(mu_);  // the ticket's end
  bool committing_ ABSL_GUARDED_BY(mu_) = false;   // CommitBulk began
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_RPC_INSERT_REACTOR_H_
