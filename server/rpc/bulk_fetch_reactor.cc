// BulkFetchReactor (server/rpc/bulk_fetch_reactor.h).
#include "server/rpc/bulk_fetch_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/rpc/convert.h"
#include "server/rpc/fetch_reactor.h"
#include "server/rpc/status_map.h"

namespace kvharbor {

BulkFetchReactor::BulkFetchReactor(CallTracker* calls, const CallRecord& call,
                                   PinnedPages pages,
                                   const BulkTicket::Options& options,
                                   PageRuns runs, BulkTicketTable* table,
                                   uint16_t port, IdleWatchdog* watchdog,
                                   IdleWatchdog::Entry* idle)
    : calls_(calls),
      table_(table),
      watchdog_(watchdog),
      idle_(idle),
      call_(call) {
  BuildOffer(pages, options, runs, port);
  ticket_ = std::make_shared<BulkSendTicket>(
      std::move(pages), options, runs,
      [this](const absl::Status& s) { OnTransferDone(s); });
  ticket_->SetProgress([idle] { NoteProgress(idle); });
  absl::StatusOr<BulkToken> token = table_->Add(ticket_);
  if (!token.ok()) {
    // The SDK then streams (and does not ask for the plane for a while).
    absl::MutexLock l(&mu_);
    FinishLocked(absl::FailedPreconditionError(
        absl::StrCat("bulk: ", token.status().message(),
                     "; fetch without FetchRequest.bulk")));
    return;
  }
  token_ = *token;
  filed_ = true;
  offer_.mutable_bulk_offer()->set_token(
      std::string(reinterpret_cast<const char*>(token_.data()), token_.size()));
  StartWrite(&offer_);  // not under mu_: OnWriteDone takes it
}

void BulkFetchReactor::BuildOffer(const PinnedPages& pages,
                                  const BulkTicket::Options& options,
                                  const PageRuns& runs, uint16_t port) {
  v1::BulkOffer* o = offer_.mutable_bulk_offer();
  o->set_port(port);
  o->set_connections(options.connections);
  o->set_stripe_pages(options.stripe_pages);
  const bool compressed = pages.format() == FetchFormat::kCompressed;
  o->set_page_bytes(pages.size() == 0 || compressed ? 0
                    : runs.count == 0               ? pages.bytes(0).size()
                                                    : runs.total());
  for (size_t i = 0; i < pages.size(); ++i) {
    o->add_page_handles(pages.handle(i));
    o->add_page_tiers(TierToProto(pages.tier(i)));
    o->add_page_checksums(SentChecksum(pages, i, runs));
    if (compressed) {
      o->add_page_sizes(pages.bytes(i).size());
      o->add_page_codecs(std::string(pages.codec_name(i)));
      o->add_page_calibration_fingerprints(pages.calibration_fingerprint(i));
    }
  }
}

void BulkFetchReactor::OnWriteDone(bool ok) {
  absl::MutexLock l(&mu_);
  written_ = true;
  if (!ok) {
    FinishLocked(absl::CancelledError(
        "Fetch: the stream broke while writing the bulk offer"));
  } else if (transfer_done_) {
    FinishLocked(transfer_status_);
  }
  NoteProgress(idle_);
}

void BulkFetchReactor::OnTransferDone(const absl::Status& status) {
  absl::MutexLock l(&mu_);
  transfer_done_ = true;
  transfer_status_ = status;
  if (written_) FinishLocked(status);
}

void BulkFetchReactor::OnCancel() {
  const absl::Status why =
      idle_ != nullptr && idle_->expired()
          ? absl::CancelledError(
                "limits.fetch_idle_timeout_ms: no bulk bytes moved for too "
                "long; cancelled")
          : absl::CancelledError("Fetch: the call was cancelled");
  if (ticket_ != nullptr) ticket_->Cancel(why);
  absl::MutexLock l(&mu_);
  FinishLocked(why);
}

void BulkFetchReactor::FinishLocked(const absl::Status& status) {
  if (finished_) return;
  finished_ = true;
  const grpc::Status g = ToGrpcStatus(status);
  call_.code = g.error_code();
  calls_->ReleaseAdmission(&call_);
  Finish(g);
}

void BulkFetchReactor::OnDone() {
  // No `done` call can reach this reactor after Detach; the token opens
  // nothing more, and a transfer still running stops.
  ticket_->Detach();
  if (filed_) table_->Remove(token_);
  ticket_->Cancel(absl::CancelledError("Fetch: the call ended"));
  ticket_.reset();
  if (watchdog_ != nullptr) watchdog_->Unwatch(idle_);
  {
    absl::MutexLock l(&mu_);
    calls_->End(call_);
  }
  delete this;
}

}  // namespace kvharbor
