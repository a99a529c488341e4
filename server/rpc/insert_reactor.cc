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
                             StagingRegistry* staging)
    : ctx_(ctx),
      store_(store),
      calls_(calls),
      watchdog_(watchdog),
      idle_(idle),
      staging_registry_(staging),
      call_(call),
      response_(response) {
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
  if (!ok) {
    // The client half-closed (the call is alive): commit.
    FinishWith(OnEndOfStream());
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
  StartRead(&request_);
}

absl::Status InsertReactor::OnHeader(const v1::InsertHeader& header) {
  if (upload_ != nullptr) {
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
  absl::StatusOr<std::unique_ptr<Namespace::Upload>> upload =
      ns->BeginInsert(spec);
  if (!upload.ok()) return UnderPrefix(upload.status(), "header");
  upload_ = *std::move(upload);
  namespace_name_ = ns->name();
  // Accepted: the client may wait for this before it sends data (proto:
  // InsertHeader). Sent once; gRPC orders it before the status.
  ctx_->AddInitialMetadata("kvh-sent-pages",
                           absl::StrCat(upload_->sent_pages()));
  StartSendInitialMetadata();
  return absl::OkStatus();
}

absl::Status InsertReactor::OnChunk(const v1::InsertChunk& chunk) {
  return Write(chunk.offset(), chunk.data(), "chunk");
}

absl::Status InsertReactor::OnStaged(const v1::InsertStagedChunk& chunk) {
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

void InsertReactor::FinishWith(const absl::Status& status) {
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
  watchdog_->Unwatch(idle_);
  calls_->End(call_);
  delete this;
}

}  // namespace kvharbor
