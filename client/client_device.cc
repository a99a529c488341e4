// Client::GetDeviceHandles: same-host zero copy (docs/tiers.md). The SDK
// only carries the description; mapping the arena needs CUDA and lives in
// client/cuda/device_ipc.h, outside this CPU-only library.
#include <grpcpp/grpcpp.h>

#include <string>

#include "client/client.h"
#include "client/client_impl.h"
#include "client/proto_convert.h"

namespace kvharbor {

absl::StatusOr<client::DeviceHandles> Client::GetDeviceHandles(
    absl::string_view ns, uint64_t lease_id, const CallOptions& call) {
  v1::GetDeviceHandlesRequest req;
  req.set_namespace_(std::string(ns));
  req.set_lease_id(lease_id);
  v1::GetDeviceHandlesResponse resp;
  absl::Status s =
      impl_->Unary(&v1::KvHarbor::Stub::GetDeviceHandles, req, &resp, call);
  if (!s.ok()) return s;
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
}

}  // namespace kvharbor
