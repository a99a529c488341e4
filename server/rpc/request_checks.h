// Request checks the service and its stream reactors share: naming the
// field an error is about, finding a namespace the caller may see, the lease
// id and device IPC checks. Kept apart from service.h so that the reactors
// (which the service includes) do not include the service back.
//
// Stateless functions; thread-safe.
#ifndef KVHARBOR_SERVER_RPC_REQUEST_CHECKS_H_
#define KVHARBOR_SERVER_RPC_REQUEST_CHECKS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/store/device_tier.h"
#include "core/store/namespace.h"
#include "core/store/store.h"
#include "kvharbor/v1/kvharbor.pb.h"
#include "server/security/auth.h"

namespace kvharbor {

// Makes `status`'s message start with `field`: kept when it does already,
// "namespace: ..." becomes "header.namespace: ..." for field
// "header.namespace", and anything else gets "field: " in front.
absl::Status NameField(const absl::Status& status, absl::string_view field);
// Puts a core message that names a top-level field under `prefix`:
// "token_ids: ..." becomes "header.token_ids: ..." for prefix "header".
// Messages that name no field are kept.
absl::Status UnderPrefix(const absl::Status& status, absl::string_view prefix);

// Finds a namespace by name: InvalidArgument for a malformed name, NotFound
// for an unknown one or one of another tenant (the same message); both
// messages start with `field`.
absl::StatusOr<std::shared_ptr<Namespace>> FindNamespace(
    const Store& store, absl::string_view name, absl::string_view field,
    const Caller& caller);
// The device arena's IPC description, if this daemon hands it out:
// FailedPrecondition naming store.device_pool_bytes without a device tier,
// store.allow_ipc when IPC is off (server/rpc/device_handles.cc).
absl::StatusOr<DeviceIpcExport> ExportDeviceIpc(const StoreOptions& options);
// InvalidArgument naming lease_id for 0 (no lease has it), else OK.
absl::Status CheckLeaseId(uint64_t lease_id);
// A BulkTransfer's fields (FetchRequest.bulk, InsertHeader.bulk): 1 to
// kBulkMaxConnections connections and stripe_pages >= 1, else
// InvalidArgument naming `field`.connections / .stripe_pages.
absl::Status CheckBulk(const v1::BulkTransfer& bulk, absl::string_view field);
// The namespaces `caller` may see, sorted by name.
std::vector<std::shared_ptr<Namespace>> VisibleNamespaces(const Store& store,
                                                          const Caller& caller);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_RPC_REQUEST_CHECKS_H_
