// GetDeviceHandles: same-host zero copy (docs/tiers.md "Same-host zero
// copy"). The daemon's device tier exports the CUDA IPC handle of its one
// arena (cuda/tier/device_tier.h), the namespace says where the lease's pages
// lie in it (Namespace::DevicePagesOfLease), and the lease keeps them there;
// with stage_cold the namespace first decodes the lease's cold pages into
// device slots (Namespace::StageLeaseOnDevice).
// Tenancy and role are Fetch's: the namespace must be the caller's, the
// lease must be one of its leases, and the read role suffices.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "server/rpc/convert.h"
#include "server/rpc/service.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

absl::StatusOr<DeviceIpcExport> ExportDeviceIpc(const StoreOptions& options) {
  if (options.device_tier == nullptr) {
    return absl::FailedPreconditionError(
        "store.device_pool_bytes: this daemon has no device tier (its pages "
        "are in host memory), so there are no device handles; use Fetch "
        "and Insert");
  }
  if (!options.allow_ipc) {
    return absl::FailedPreconditionError(
        "store.allow_ipc: CUDA IPC handles are off on this daemon (the "
        "handle maps the whole device arena; an operator turns it on with "
        "store.allow_ipc: true); use Fetch and Insert");
  }
  return options.device_tier->ExportIpc();
}

absl::Status KvHarborService::DoGetDeviceHandles(
    const Caller& caller, const v1::GetDeviceHandlesRequest& req,
    v1::GetDeviceHandlesResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns, RequestNamespace(caller, req));
  KVH_RETURN_IF_ERROR(CheckLeaseId(req.lease_id()));
  KVH_ASSIGN_OR_RETURN(DeviceIpcExport ipc, ExportDeviceIpc(store_->options()));
  if (req.stage_cold()) {
    // Cold pages decoded into device slots first (core/store/
    // namespace_stage.cc); the lease then follows their new handles.
    KVH_ASSIGN_OR_RETURN(const uint32_t staged,
                         ns->StageLeaseOnDevice(req.lease_id()));
    if (staged > 0) {
      spdlog::debug(
          "GetDeviceHandles: staged {} cold page(s) of lease {} "
          "in '{}' on the device",
          staged, req.lease_id(), ns->name());
    }
  }
  KVH_ASSIGN_OR_RETURN(
      Namespace::LeaseDevicePages leased,
      ns->DevicePagesOfLease(req.lease_id(), ipc.arena_base, ipc.arena_bytes));
  resp->set_ipc_handle(ipc.handle);
  resp->set_device(ipc.device);
  resp->set_device_uuid(ipc.device_uuid);
  resp->set_arena_bytes(ipc.arena_bytes);
  for (const Namespace::DevicePage& p : leased.pages) {
    v1::DevicePage* out = resp->add_pages();
    out->set_page_handle(p.handle);
    out->set_offset(p.offset);
    out->set_bytes(p.bytes);
  }
  resp->set_lease_expires_unix_ms(UnixMillisToProto(leased.expiry));
  return absl::OkStatus();
}

}  // namespace kvharbor
