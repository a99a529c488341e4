#include "server/rpc/insert_reactor.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "server/rpc/convert.h"
#include "server/rpc/request_checks.h"
#include "server/rpc/status_map.h"

namespace kvharbor {

namespace {
// Threads that copy one staged chunk into the upload's slots.
constexpr unsigned kMaxStagedCopyThreads = 8;
}  // namespace

InsertReactor::InsertReactor(grpc::CallbackServerContext* ctx, Store* store,
                             CallTracker* calls, const CallRecord& call,
                             absl::StatusOr<Caller> caller,
                             v1::InsertResponse* response,
                             IdleWatchdog* watchdog, IdleWatchdog::Entry* idle,
                             StagingRegistry* staging,
                             BulkTicketTable* bulk_tickets, uint16_t bulk_port)
    : ctx_(ctx),
      store_(store),
      calls_(calls),
      watchdog_(watchdog),
      idle_(idle),
      staging_registry_(staging),
      call_(call),
      response_(response),
      bulk_tickets_(bulk_tickets),
      bulk_port_(bulk_port) {
  if (!caller.ok()) {
    FinishWith(caller.status());
    return;
  }
  caller_ = *std::move(caller);
  StartRead(&request_);
}

void InsertReactor::OnReadDone(bool ok) {
  // Checked before every message, and before a commit: a call that was
  // cancelled or ran past its deadline stores nothing and gives its staged
  // slots back (FinishWith aborts the upload).
  if (const absl::Status alive = CallAlive(*ctx_, "Insert"); !alive.ok()) {
    FinishWith(absl::Status(
        alive.code(),
        absl::StrCat(idle_ != nullptr && idle_->expired()
                         ? "limits.upload_idle_timeout_ms: Insert received "
                           "nothing for too long; cancelled"
                         : alive.message(),
                     "; the upload was aborted")));
    return;
  }
  NoteProgress(idle_);
  if (finished()) return;  // a bulk transfer failed meanwhile
  if (!ok) {
    // The client half-closed (the call is alive): commit (a bulk upload
    // once its connections are done too).
    if (bulk_ != nullptr) {
      EndBulkStream();
    } else {
      FinishWith(OnEndOfStream());
    }
    return;
  }
  absl::Status status;
  switch (request_.kind_case()) {
    case v1::InsertRequest::kHeader:
      status = OnHeader(request_.header());
      break;
    case v1::InsertRequest::kChunk:
      status = OnChunk(request_.chunk());
      break;
    case v1::InsertRequest::kStaged:
      status = OnStaged(request_.staged());
      break;
    case v1::InsertRequest::KIND_NOT_SET:
      status = absl::InvalidArgumentError(
          "kind: an InsertRequest must hold a header, a chunk or a staged "
          "chunk");
      break;
  }
  if (!status.ok()) {
    FinishWith(status);
    return;
  }
  // A bulk transfer that failed on a data thread may have finished the call
  // since: no read after Finish.
  absl::MutexLock l(&mu_);
  if (!finished_) StartRead(&request_);
}

absl::Status InsertReactor::OnHeader(const v1::InsertHeader& header) {
  if (upload_ != nullptr || bulk_ != nullptr) {
    return absl::InvalidArgumentError(
        "header: a second header in the stream (send it once, first)");
  }
  KVH_ASSIGN_OR_RETURN(
      std::shared_ptr<Namespace> ns,
      FindNamespace(*store_, header.namespace_(), "header.namespace", caller_));
  if (header.has_staging()) {
    if (staging_registry_ == nullptr) {
      return absl::FailedPreconditionError(
          "header.staging: this daemon serves no staging socket (it needs "
          "store.host_ipc_socket and host pools); stream the bytes instead");
    }
    KVH_ASSIGN_OR_RETURN(staging_, staging_registry_->Acquire(
                                       header.staging().id(),
                                       header.staging().key(), caller_.tenant));
  }
  KVH_ASSIGN_OR_RETURN(Elements seq,
                       SequenceFromProto(*ns, header.token_ids(),
                                         header.page_keys(), "header."));
  // The namespace checks the rest (whole pages, the skipped prefix, the
  // checksum count) and names the header's fields.
  Namespace::InsertSpec spec;
  spec.elements = seq.elements;
  spec.checksums = ChecksumsFromProto(header.page_checksums());
  spec.skip_pages = header.skip_pages();
  spec.prefix_lease_id = header.prefix_lease_id();
  spec.layer_major = header.layer_major();
  if (header.has_bulk()) {
    KVH_RETURN_IF_ERROR(CheckBulk(header.bulk(), "header.bulk"));
  }
  // The bulk plane writes whole pages into host slots, all reserved now.
  spec.placed = header.has_bulk() && bulk_tickets_ != nullptr &&
                !header.layer_major() && staging_ == nullptr;
  absl::StatusOr<std::unique_ptr<Namespace::Upload>> upload =
      ns->BeginInsert(spec);
  if (upload.ok() && spec.placed &&
      ((*upload)->slot_memory() != MemoryKind::kHost ||
       (*upload)->sent_pages() == 0)) {
    // A device pool (or nothing to send): the chunks of the stream.
    upload->reset();
    spec.placed = false;
    upload = ns->BeginInsert(spec);
  }
  if (!upload.ok()) return UnderPrefix(upload.status(), "header");
  namespace_name_ = ns->name();
  if (spec.placed) {
    KVH_ASSIGN_OR_RETURN(bool on_plane, BeginBulk(*std::move(upload), header));
    if (on_plane) return absl::OkStatus();
    spec.placed = false;  // the plane is full: chunks
    upload = ns->BeginInsert(spec);
    if (!upload.ok()) return UnderPrefix(upload.status(), "header");
  }
  upload_ = *std::move(upload);
  // Accepted: the client may wait for this before it sends data (proto:
  // InsertHeader). Sent once; gRPC orders it before the status.
  ctx_->AddInitialMetadata("kvh-sent-pages",
                           absl::StrCat(upload_->sent_pages()));
  StartSendInitialMetadata();
  return absl::OkStatus();
}

absl::StatusOr<bool> InsertReactor::BeginBulk(
    std::unique_ptr<Namespace::Upload> upload, const v1::InsertHeader& header) {
  const uint32_t sent = upload->sent_pages();
  const uint64_t page_bytes = upload->total_bytes() / sent;
  bulk_checksums_.assign(header.page_checksums().begin(),
                         header.page_checksums().end());
  BulkTicket::Options options;
  options.connections = header.bulk().connections();
  options.stripe_pages = header.bulk().stripe_pages();
  auto ticket = std::make_shared<BulkReceiveTicket>(
      std::move(upload), options, page_bytes,
      [this](const absl::Status& s) { OnBulkDone(s); });
  absl::StatusOr<BulkToken> token = bulk_tickets_->Add(ticket);
  if (!token.ok()) {
    // The plane is full: this insert streams its chunks instead (the
    // placed upload goes back with the ticket, and is begun again).
    ticket->Detach();
    ticket->Cancel(token.status());
    return false;
  }
  bulk_ = std::move(ticket);
  bulk_token_ = *token;
  bulk_->SetProgress([idle = idle_] { NoteProgress(idle); });
  v1::BulkOffer offer;
  offer.set_token(std::string(reinterpret_cast<const char*>(bulk_token_.data()),
                              bulk_token_.size()));
  offer.set_port(bulk_port_);
  offer.set_connections(options.connections);
  offer.set_stripe_pages(options.stripe_pages);
  offer.set_page_bytes(page_bytes);
  ctx_->AddInitialMetadata("kvh-sent-pages", absl::StrCat(sent));
  ctx_->AddInitialMetadata("kvh-bulk-offer-bin", offer.SerializeAsString());
  StartSendInitialMetadata();
  absl::MutexLock l(&mu_);
  bulk_active_ = true;
  return true;
}

void InsertReactor::OnCancel() {
  {
    absl::MutexLock l(&mu_);
    if (!bulk_active_ || committing_ || finished_) return;
    finished_ = true;
  }
  FinishClaimed(absl::CancelledError(
      idle_ != nullptr && idle_->expired()
          ? "limits.upload_idle_timeout_ms: no bulk bytes arrived for too "
            "long; cancelled; the upload was aborted"
          : "Insert: the call was cancelled (or its deadline passed); the "
            "upload was aborted"));
}

void InsertReactor::EndBulkStream() {
  absl::Status failed;
  {
    absl::MutexLock l(&mu_);
    end_of_stream_ = true;
    if (!bulk_done_) return;  // the last connection commits
    failed = bulk_status_;
  }
  if (!failed.ok()) {
    FinishWith(failed);  // the transfer's own error, not a commit's
    return;
  }
  CommitBulk();
}

void InsertReactor::OnBulkDone(const absl::Status& status) {
  {
    absl::MutexLock l(&mu_);
    bulk_done_ = true;
    bulk_status_ = status;
    if (status.ok() && !end_of_stream_) return;  // the half-close commits
  }
  if (!status.ok()) {
    FinishWith(status);
    return;
  }
  CommitBulk();
}

void InsertReactor::CommitBulk() {
  {
    // From here the commit is this call's outcome: a cancel arriving now
    // no longer finishes the call (OnCancel), so a client never sees
    // CANCELLED for pages that were stored.
    absl::MutexLock l(&mu_);
    if (finished_) return;
    committing_ = true;
  }
  std::vector<uint64_t> hashes;
  std::unique_ptr<Namespace::Upload> upload = bulk_->TakeUpload(&hashes);
  if (upload == nullptr) {
    FinishWith(absl::InternalError("bulk: the transfer ended incomplete"));
    return;
  }
  // Only the written pages are checked: the dropped (cached) ones were
  // stored before.
  absl::Span<const uint64_t> declared = bulk_checksums_;
  if (!declared.empty()) declared.remove_prefix(bulk_->written_from());
  absl::Status s = upload->AcceptPlaced(declared, hashes);
  if (!s.ok()) {
    // A mismatch names page_checksums[i], a field of the header.
    FinishWith(UnderPrefix(s, "header"));
    return;
  }
  absl::StatusOr<Namespace::InsertOutcome> out = upload->Commit();
  if (out.ok()) {
    response_->set_already_present_tokens(out->already_present_tokens);
    response_->set_pages_stored(out->pages_stored);
    response_->set_pages_evicted(out->pages_evicted);
  }
  FinishWith(out.status());
}

absl::Status InsertReactor::OnChunk(const v1::InsertChunk& chunk) {
  if (bulk_ != nullptr) {
    return absl::InvalidArgumentError(
        "chunk: this Insert's bytes come on the bulk data plane (its "
        "header.bulk was accepted); send no chunks");
  }
  return Write(chunk.offset(), chunk.data(), "chunk");
}

absl::Status InsertReactor::OnStaged(const v1::InsertStagedChunk& chunk) {
  if (bulk_ != nullptr) {
    return absl::InvalidArgumentError(
        "staged: this Insert's bytes come on the bulk data plane");
  }
  if (upload_ != nullptr && staging_ == nullptr) {
    return absl::InvalidArgumentError(
        "staged: a staged chunk in an Insert whose header names no staging "
        "region (header.staging)");
  }
  if (upload_ == nullptr) return Write(chunk.offset(), {}, "staged");
  KVH_ASSIGN_OR_RETURN(absl::Span<const uint8_t> bytes,
                       staging_->Bytes(chunk.staging_offset(), chunk.length(),
                                       "staged.staging_offset"));
  // The bytes are already in this host's memory: copied (and hashed) by
  // several threads, so that one client's insert moves at memory speed.
  static const int threads = static_cast<int>(std::clamp(
      std::thread::hardware_concurrency(), 1u, kMaxStagedCopyThreads));
  return Write(chunk.offset(),
               absl::string_view(reinterpret_cast<const char*>(bytes.data()),
                                 bytes.size()),
               "staged", threads);
}

absl::Status InsertReactor::Write(uint64_t offset, absl::string_view data,
                                  absl::string_view field, int threads) {
  if (upload_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": arrived before the header (the header must come first)"));
  }
  const uint64_t received = upload_->bytes_received();
  const uint64_t total = upload_->total_bytes();
  if (offset != received) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s.offset: %u, but %u bytes were received so far (chunks must "
        "arrive in order, none missing)",
        field, offset, received));
  }
  if (data.size() > total - received) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s.data: %u bytes at offset %u run past the declared size of %u "
        "bytes (%u sent pages of %u bytes)",
        field, data.size(), offset, total, upload_->sent_pages(),
        upload_->sent_pages() == 0 ? 0 : total / upload_->sent_pages()));
  }
  absl::Status status = upload_->Write(offset, data, threads);
  // A checksum mismatch names page_checksums[i], a field of the header.
  if (status.code() == absl::StatusCode::kDataLoss) {
    return UnderPrefix(status, "header");
  }
  return status;
}

absl::Status InsertReactor::OnEndOfStream() {
  if (upload_ == nullptr) {
    return absl::InvalidArgumentError(
        "header: the stream ended before the header was sent");
  }
  if (upload_->bytes_received() != upload_->total_bytes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "chunk.data: the stream ended after %u of %u bytes; the upload was "
        "aborted",
        upload_->bytes_received(), upload_->total_bytes()));
  }
  KVH_ASSIGN_OR_RETURN(Namespace::InsertOutcome out, upload_->Commit());
  upload_.reset();
  // The client may reuse the region as soon as it has the status.
  staging_.reset();
  response_->set_already_present_tokens(out.already_present_tokens);
  response_->set_pages_stored(out.pages_stored);
  response_->set_pages_evicted(out.pages_evicted);
  return absl::OkStatus();
}

bool InsertReactor::finished() {
  absl::MutexLock l(&mu_);
  return finished_;
}

void InsertReactor::FinishWith(const absl::Status& status) {
  {
    absl::MutexLock l(&mu_);
    if (finished_) return;
    finished_ = true;
  }
  FinishClaimed(status);
}

void InsertReactor::FinishClaimed(const absl::Status& status) {
  // A transfer still running stops (its connections are shut down); the
  // ticket aborts its upload once none writes.
  if (bulk_ != nullptr && !status.ok()) bulk_->Cancel(status);
  if (!status.ok()) {
    // Abort before finishing, so that a client that sees the error also sees
    // the slots back in the pool.
    upload_.reset();
    staging_.reset();
    LogCallFailure("Insert", namespace_name_, status);
  }
  // The client may send its next call as soon as it has the status; OnDone
  // can come later (server/rpc/call_tracker.h).
  Finish(calls_->Finishing(&call_, status));
}

void InsertReactor::OnDone() {
  upload_.reset();  // aborts an upload the call did not commit
  staging_.reset();
  if (bulk_ != nullptr) {
    // No ticket callback reaches this reactor after Detach; the token opens
    // nothing more.
    bulk_->Detach();
    bulk_tickets_->Remove(bulk_token_);
    bulk_->Cancel(absl::CancelledError("Insert: the call ended"));
    bulk_.reset();
  }
  watchdog_->Unwatch(idle_);
  calls_->End(call_);
  delete this;
}

}  // namespace kvharbor
