// GetHostHandles: same-host Fetch through shared memory (docs/operations.md
// "Same-host Fetch"). The store's host pools are cut from one shared memfd
// (core/memory/host_arena.h) that the daemon's Unix socket hands out read-only
// (server/local/host_ipc_server.h); the namespace says where the lease's pages
// lie in it and what their checksums are (Namespace::HostPagesOfLease), and
// the lease keeps them there. Tenancy and role are Fetch's: the namespace
// must be the caller's, the lease one of its leases, and the read role
// suffices.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "server/rpc/convert.h"
#include "server/rpc/service.h"

namespace kvharbor {

absl::Status KvHarborService::DoGetHostHandles(
    const Caller& caller, const v1::GetHostHandlesRequest& req,
    v1::GetHostHandlesResponse* resp) {
  KVH_ASSIGN_OR_RETURN(auto ns, RequestNamespace(caller, req));
  KVH_RETURN_IF_ERROR(CheckLeaseId(req.lease_id()));
  const StoreOptions& options = store_->options();
  if (options_.host_ipc_socket.empty() || options.host_arena == nullptr) {
    return absl::FailedPreconditionError(
        "store.host_ipc_socket: same-host Fetch through shared memory is off "
        "on this daemon (an operator turns it on by setting "
        "store.host_ipc_socket to a socket path); use Fetch");
  }
  if (options.device_tier != nullptr) {
    return absl::FailedPreconditionError(
        "store.host_ipc_socket: this daemon keeps its pages in the device "
        "arena, not in the shared host arena; use Fetch or GetDeviceHandles");
  }
  KVH_ASSIGN_OR_RETURN(
      Namespace::LeaseHostPages leased,
      ns->HostPagesOfLease(req.lease_id(), *options.host_arena));
  resp->set_socket_path(options_.host_ipc_socket);
  resp->set_daemon_id(options_.daemon_id);
  resp->set_arena_bytes(options.host_arena->bytes());
  resp->mutable_pages()->Reserve(static_cast<int>(leased.pages.size()));
  for (const Namespace::HostPage& p : leased.pages) {
    v1::HostPage* out = resp->add_pages();
    out->set_page_handle(p.handle);
    out->set_offset(p.offset);
    out->set_bytes(p.bytes);
    out->set_checksum(p.checksum);
  }
  resp->set_lease_expires_unix_ms(UnixMillisToProto(leased.expiry));
  resp->set_arena_generation(options.host_arena->generation());
  return absl::OkStatus();
}

}  // namespace kvharbor
