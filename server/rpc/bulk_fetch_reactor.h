// BulkFetchReactor: the server side of a Fetch whose bytes go on the bulk
// data plane (FetchRequest.bulk; docs/data_plane.md).
//
// It moves the call's pinned pages into a BulkSendTicket, files the ticket in
// the BulkTicketTable under a random token and writes ONE FetchResponse: the
// BulkOffer (token, port, stripe layout, and every page's handle, checksum
// and tier). The client's data connections then claim the ticket's indexes
// and the BulkServer sends the stripes; the reactor finishes the call with
// the transfer's status when the ticket ends (every connection's bytes
// written, or the first failure). The call's end ends the transfer
// whatever its cause: a cancel, its deadline, or limits.fetch_idle_timeout_ms
// with no bytes moving (the ticket notes progress as bytes go out) cancel
// the ticket, which shuts its connections down; OnDone drops the token, so
// the capability never outlives its call.
//
// Owned by gRPC's callback machinery: created by KvHarborService::Fetch,
// deleted in OnDone. Thread-safe: the transfer's end arrives on a data
// connection's thread; mu_ serializes it with the reactions. Lock order:
// the ticket's callback lock, then mu_ (the ticket's `done` callback takes
// mu_); the reactor never calls into the ticket while holding mu_.
#ifndef KVHARBOR_SERVER_RPC_BULK_FETCH_REACTOR_H_
#define KVHARBOR_SERVER_RPC_BULK_FETCH_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/store/pinned_pages.h"
#include "kvharbor/v1/kvharbor.pb.h"
#include "server/data/bulk_send_ticket.h"
#include "server/data/bulk_ticket_table.h"
#include "server/rpc/call_tracker.h"
#include "server/rpc/idle_watchdog.h"

namespace kvharbor {

class BulkFetchReactor final
    : public grpc::ServerWriteReactor<v1::FetchResponse> {
 public:
  // `idle` (null: not watched) is the call's entry in `watchdog`.
  BulkFetchReactor(CallTracker* calls, const CallRecord& call,
                   PinnedPages pages, const BulkTicket::Options& options,
                   PageRuns runs, BulkTicketTable* table, uint16_t port,
                   IdleWatchdog* watchdog, IdleWatchdog::Entry* idle);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // The ticket's `done`: every connection finished, or one failed.
  void OnTransferDone(const absl::Status& status);
  void FinishLocked(const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills offer_ from the ticket's pages.
  void BuildOffer(const PinnedPages& pages, const BulkTicket::Options& options,
                  const PageRuns& runs, uint16_t port);

  CallTracker* const calls_;
  BulkTicketTable* const table_;
  IdleWatchdog* const watchdog_;
  IdleWatchdog::Entry* const idle_;
  std::shared_ptr<BulkSendTicket> ticket_;
  BulkToken token_{};
  bool filed_ = false;  // token_ is in table_
  v1::FetchResponse offer_;
  absl::Mutex mu_;
  CallRecord call_ ABSL_GUARDED_BY(mu_);
  bool written_ ABSL_GUARDED_BY(mu_) = false;        // the offer went out
  bool transfer_done_ ABSL_GUARDED_BY(mu_) = false;  // the ticket ended
  absl::Status transfer_status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_RPC_BULK_FETCH_REACTOR_H_
