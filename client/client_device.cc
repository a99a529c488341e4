// Same-host zero copy on the SDK's side (docs/tiers.md): GetDeviceHandles
// (optionally staging cold pages onto the device first) and DeviceInsert
// (include/kvharbor/device_upload.h). The SDK only carries descriptions;
// mapping the arena and copying need CUDA and live in client/cuda/, outside
// this CPU-only library.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "client/failed_write.h"
#include "client/proto_convert.h"
#include "kvharbor/client.h"

namespace kvharbor {

bool client::DeviceInsertUnavailable(const absl::Status& begin) {
  return begin.code() == absl::StatusCode::kFailedPrecondition ||
         begin.code() == absl::StatusCode::kUnimplemented;
}

absl::StatusOr<client::DeviceHandles> Client::GetDeviceHandles(
    absl::string_view ns, uint64_t lease_id, const CallOptions& call) {
  return GetDeviceHandles(ns, lease_id, client::DeviceHandlesOptions(), call);
}

absl::StatusOr<client::DeviceHandles> Client::GetDeviceHandles(
    absl::string_view ns, uint64_t lease_id,
    const client::DeviceHandlesOptions& options, const CallOptions& call) {
  v1::GetDeviceHandlesRequest req;
  req.set_namespace_(std::string(ns));
  req.set_lease_id(lease_id);
  req.set_stage_cold(options.stage_cold);
  return impl_->Call(
      &v1::KvHarbor::Stub::GetDeviceHandles, req, call,
      [](const v1::GetDeviceHandlesResponse& resp) {
        client::DeviceHandles out;
        out.ipc_handle = resp.ipc_handle();
        out.device = resp.device();
        out.device_uuid = resp.device_uuid();
        out.arena_bytes = resp.arena_bytes();
        out.pages.reserve(resp.pages_size());
        for (const v1::DevicePage& p : resp.pages()) {
          out.pages.push_back({p.page_handle(), p.offset(), p.bytes()});
        }
        out.lease_expiry = client::FromUnixMillis(resp.lease_expires_unix_ms());
        return out;
      });
}

struct client::DeviceUpload::State {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::DeviceInsertRequest,
                                           v1::DeviceInsertResponse>>
      stream;
  bool ended = false;  // committed, aborted or failed

  // The call's status once the stream can give nothing more.
  absl::Status Finish() {
    ended = true;
    return client::FromGrpcStatus(stream->Finish());
  }
  // The same after gRPC refused a write (client/failed_write.h).
  absl::Status FinishAfterFailedWrite() {
    ended = true;
    return client::FromGrpcStatus(client::FinishAfterFailedWrite(
        &ctx, [&] { return stream->Finish(); }, "DeviceInsert"));
  }
};

client::DeviceUpload::DeviceUpload(std::unique_ptr<State> state,
                                   DeviceInsertSlots slots)
    : state_(std::move(state)), slots_(std::move(slots)) {}

client::DeviceUpload::~DeviceUpload() { Abort(); }

void client::DeviceUpload::Abort() {
  if (state_ == nullptr || state_->ended) return;
  // Cancelling tells the daemon at once; it aborts the insert.
  state_->ctx.TryCancel();
  state_->Finish().IgnoreError();  // CANCELLED, as asked
}

absl::StatusOr<client::InsertResult> client::DeviceUpload::Commit(
    absl::Span<const uint64_t> checksums) {
  if (state_->ended) {
    return absl::FailedPreconditionError(
        "commit: this insert already ended (committed, aborted or failed)");
  }
  v1::DeviceInsertRequest req;
  req.mutable_commit()->mutable_page_checksums()->Add(checksums.begin(),
                                                      checksums.end());
  v1::DeviceInsertResponse resp;
  if (!state_->stream->Write(req)) {
    absl::Status s = state_->FinishAfterFailedWrite();
    if (!s.ok()) return s;
    // gRPC refused the write, yet the daemon ended the call OK: it did
    // commit, but its answer was not read.
    return absl::UnavailableError(
        "commit: the stream broke while sending the commit, after which the "
        "daemon ended the call OK; its answer was lost (Match tells what is "
        "stored)");
  }
  const bool answered =
      state_->stream->WritesDone() && state_->stream->Read(&resp);
  absl::Status s = state_->Finish();
  if (!s.ok()) return s;
  if (!answered || !resp.has_done()) {
    return absl::InternalError("commit: the daemon ended without an answer");
  }
  return FromProto(resp.done());
}

absl::StatusOr<std::unique_ptr<client::DeviceUpload>> Client::BeginDeviceInsert(
    absl::string_view ns, absl::Span<const client::Token> tokens,
    absl::Duration ttl, const CallOptions& call) {
  if (ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ttl: must be >= 0");
  }
  auto state = std::make_unique<client::DeviceUpload::State>();
  absl::Status s = impl_->Prepare(&state->ctx, call);
  if (!s.ok()) return s;
  state->stream = impl_->stub->DeviceInsert(&state->ctx);
  v1::DeviceInsertRequest req;
  v1::DeviceInsertBegin* begin = req.mutable_begin();
  begin->set_namespace_(std::string(ns));
  begin->mutable_token_ids()->Add(tokens.begin(), tokens.end());
  begin->set_ttl_ms(static_cast<uint32_t>(
      std::min<int64_t>(absl::ToInt64Milliseconds(ttl), UINT32_MAX)));
  v1::DeviceInsertResponse resp;
  const bool written = state->stream->Write(req);
  if (!written || !state->stream->Read(&resp)) {
    // The daemon refused the begin: its status says why.
    if (written) state->stream->WritesDone();
    s = written ? state->Finish() : state->FinishAfterFailedWrite();
    return s.ok() ? absl::InternalError(
                        "begin: the daemon ended the stream without slots")
                  : s;
  }
  if (!resp.has_slots()) {
    state->ctx.TryCancel();
    state->Finish().IgnoreError();
    return absl::InternalError("begin: the daemon answered without slots");
  }
  const v1::DeviceInsertSlots& r = resp.slots();
  client::DeviceInsertSlots slots;
  slots.ipc_handle = r.ipc_handle();
  slots.device = r.device();
  slots.device_uuid = r.device_uuid();
  slots.arena_bytes = r.arena_bytes();
  slots.first_page = r.first_page();
  for (const v1::DeviceSlot& d : r.slots()) {
    slots.slots.push_back({d.offset(), d.bytes()});
  }
  slots.expiry = client::FromUnixMillis(r.expires_unix_ms());
  return std::make_unique<client::DeviceUpload>(std::move(state),
                                                std::move(slots));
}

}  // namespace kvharbor
