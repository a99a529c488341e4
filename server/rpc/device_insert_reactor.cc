#include "server/rpc/device_insert_reactor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "server/rpc/convert.h"
#include "server/rpc/request_checks.h"
#include "server/rpc/status_map.h"

namespace kvharbor {

void DeviceUploadTable::Add(std::shared_ptr<DeviceUpload> upload) {
  absl::MutexLock l(&mu_);
  uploads_.push_back(std::move(upload));
}

size_t DeviceUploadTable::AbortExpired(absl::Time now) {
  std::vector<std::shared_ptr<DeviceUpload>> live;
  {
    absl::MutexLock l(&mu_);
    std::vector<std::weak_ptr<DeviceUpload>> keep;
    for (std::weak_ptr<DeviceUpload>& w : uploads_) {
      if (std::shared_ptr<DeviceUpload> u = w.lock()) {
        live.push_back(std::move(u));
        keep.push_back(std::move(w));
      }
    }
    uploads_ = std::move(keep);
  }
  size_t aborted = 0;
  for (const std::shared_ptr<DeviceUpload>& u : live) {
    std::unique_ptr<Namespace::Upload> dead;
    {
      absl::MutexLock l(&u->mu);
      if (u->upload == nullptr || u->expiry >= now) continue;
      dead = std::move(u->upload);
      u->expired = true;
    }
    dead.reset();  // aborts: the slots go back (outside u->mu)
    ++aborted;
  }
  return aborted;
}

size_t DeviceUploadTable::size() const {
  absl::MutexLock l(&mu_);
  return uploads_.size();
}

DeviceInsertReactor::DeviceInsertReactor(grpc::CallbackServerContext* ctx,
                                         Store* store, CallTracker* calls,
                                         DeviceUploadTable* table,
                                         const CallRecord& call,
                                         absl::StatusOr<Caller> caller,
                                         IdleWatchdog* watchdog,
                                         IdleWatchdog::Entry* idle)
    : ctx_(ctx),
      store_(store),
      calls_(calls),
      table_(table),
      watchdog_(watchdog),
      idle_(idle),
      call_(call) {
  if (!caller.ok()) {
    FinishWith(caller.status());
    return;
  }
  caller_ = *std::move(caller);
  StartRead(&request_);
}

void DeviceInsertReactor::OnReadDone(bool ok) {
  // A call cancelled (its client died or gave up) or past its deadline
  // stores nothing and gives its slots back.
  if (const absl::Status alive = CallAlive(*ctx_, "DeviceInsert");
      !alive.ok()) {
    FinishWith(absl::Status(
        alive.code(),
        absl::StrCat(idle_ != nullptr && idle_->expired()
                         ? "limits.upload_idle_timeout_ms: DeviceInsert sent "
                           "no begin for too long; cancelled"
                         : alive.message(),
                     "; the insert was aborted")));
    return;
  }
  // The begin arrived (or the stream ended): from here the upload's TTL
  // bounds the wait.
  if (idle_ != nullptr) {
    watchdog_->Unwatch(idle_);
    idle_ = nullptr;
  }
  if (!ok) {
    FinishWith(stage_ == Stage::kBegin
                   ? absl::InvalidArgumentError(
                         "begin: the stream ended before the begin message")
                   : absl::AbortedError(
                         "commit: the stream ended before the commit; the "
                         "insert was aborted and nothing is stored"));
    return;
  }
  absl::Status status;
  if (request_.has_begin() && stage_ == Stage::kBegin) {
    status = OnBegin(request_.begin());
    if (status.ok()) stage_ = Stage::kSlotsSent;
  } else if (request_.has_commit() && stage_ == Stage::kCommit) {
    status = OnCommit(request_.commit());
    if (status.ok()) stage_ = Stage::kDoneSent;
  } else if (request_.has_begin()) {
    status = absl::InvalidArgumentError(
        "begin: a second begin in the stream (send it once, first)");
  } else if (request_.has_commit()) {
    status =
        absl::InvalidArgumentError("commit: arrived before the begin message");
  } else {
    status = absl::InvalidArgumentError(
        "kind: a DeviceInsertRequest must hold a begin or a commit");
  }
  if (!status.ok()) {
    FinishWith(status);
    return;
  }
  StartWrite(&response_);
}

void DeviceInsertReactor::OnWriteDone(bool ok) {
  if (!ok) {
    FinishWith(absl::CancelledError(
        "DeviceInsert: the client went away; the insert was aborted"));
    return;
  }
  if (stage_ == Stage::kSlotsSent) {
    stage_ = Stage::kCommit;
    StartRead(&request_);
    return;
  }
  FinishWith(absl::OkStatus());  // done was sent
}

absl::Status DeviceInsertReactor::OnBegin(const v1::DeviceInsertBegin& begin) {
  KVH_ASSIGN_OR_RETURN(
      std::shared_ptr<Namespace> ns,
      FindNamespace(*store_, begin.namespace_(), "begin.namespace", caller_));
  KVH_ASSIGN_OR_RETURN(DeviceIpcExport ipc, ExportDeviceIpc(store_->options()));
  absl::Span<const Token> tokens = TokensFromProto(begin.token_ids());
  KVH_RETURN_IF_ERROR(ValidateTokens(
      tokens, ns->config().max_tokens_per_request, "begin.token_ids"));
  const NamespaceConfig& config = ns->config();
  const absl::Duration ttl =
      begin.ttl_ms() == 0
          ? config.default_lease_ttl
          : std::min(absl::Milliseconds(begin.ttl_ms()), config.max_lease_ttl);
  // The client writes every slot itself: all are reserved now.
  Namespace::InsertSpec spec;
  spec.elements = tokens;
  spec.placed = true;
  absl::StatusOr<std::unique_ptr<Namespace::Upload>> upload =
      ns->BeginInsert(spec);
  if (!upload.ok()) return UnderPrefix(upload.status(), "begin");
  namespace_name_ = ns->name();
  v1::DeviceInsertSlots* slots = response_.mutable_slots();
  slots->set_ipc_handle(ipc.handle);
  slots->set_device(ipc.device);
  slots->set_device_uuid(ipc.device_uuid);
  slots->set_arena_bytes(ipc.arena_bytes);
  slots->set_first_page((*upload)->skip_pages());
  const uint64_t page_bytes = ns->page_bytes();
  for (uint32_t p = (*upload)->skip_pages(); p < (*upload)->num_pages(); ++p) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>((*upload)->SlotData(p));
    // Every pool of a daemon with a device tier is cut from its arena;
    // anything else would point the client at foreign bytes.
    if (addr < ipc.arena_base || addr - ipc.arena_base > ipc.arena_bytes ||
        ipc.arena_bytes - (addr - ipc.arena_base) < page_bytes) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "begin.namespace: '%s' keeps its pages outside the device arena",
          ns->name()));
    }
    v1::DeviceSlot* s = slots->add_slots();
    s->set_offset(addr - ipc.arena_base);
    s->set_bytes(page_bytes);
  }
  upload_ = std::make_shared<DeviceUpload>();
  {
    absl::MutexLock l(&upload_->mu);
    upload_->upload = *std::move(upload);
    upload_->ttl = ttl;
    upload_->expiry = absl::Now() + ttl;
    slots->set_expires_unix_ms(UnixMillisToProto(upload_->expiry));
  }
  table_->Add(upload_);
  return absl::OkStatus();
}

absl::Status DeviceInsertReactor::OnCommit(
    const v1::DeviceInsertCommit& commit) {
  std::unique_ptr<Namespace::Upload> up;
  {
    absl::MutexLock l(&upload_->mu);
    if (upload_->expired) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "begin.ttl_ms: the insert was not committed within %s; it was "
          "aborted and nothing is stored (begin again, with a longer TTL if "
          "the copies take that long)",
          absl::FormatDuration(upload_->ttl)));
    }
    // Taken out so that the reaper no longer sees it; the GPU check and
    // the commit run without the lock.
    up = std::move(upload_->upload);
  }
  if (up == nullptr) {
    return absl::FailedPreconditionError("commit: the insert already ended");
  }
  absl::Status accepted = up->AcceptPlaced(absl::MakeConstSpan(
      commit.page_checksums().data(), commit.page_checksums().size()));
  if (!accepted.ok()) return UnderPrefix(accepted, "commit");
  KVH_ASSIGN_OR_RETURN(Namespace::InsertOutcome out, up->Commit());
  v1::InsertResponse* done = response_.mutable_done();
  done->set_already_present_tokens(out.already_present_tokens);
  done->set_pages_stored(out.pages_stored);
  done->set_pages_evicted(out.pages_evicted);
  return absl::OkStatus();
}

void DeviceInsertReactor::Abort() {
  if (upload_ == nullptr) return;
  std::unique_ptr<Namespace::Upload> dead;
  {
    absl::MutexLock l(&upload_->mu);
    dead = std::move(upload_->upload);
  }
  dead.reset();
}

void DeviceInsertReactor::FinishWith(const absl::Status& status) {
  if (stage_ == Stage::kFinished) return;
  stage_ = Stage::kFinished;
  if (!status.ok()) {
    // Abort before finishing, so that a client that sees the error also
    // sees the slots back in the pool.
    Abort();
    LogCallFailure("DeviceInsert", namespace_name_, status);
  }
  Finish(calls_->Finishing(&call_, status));
}

void DeviceInsertReactor::OnDone() {
  Abort();  // an insert the call did not commit
  if (idle_ != nullptr) watchdog_->Unwatch(idle_);
  calls_->End(call_);
  delete this;
}

}  // namespace kvharbor
