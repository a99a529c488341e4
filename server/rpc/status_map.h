// ToGrpcStatus: the one place where an absl::Status becomes a grpc::Status;
// LogCallFailure: how a failed streaming call that carries data is logged.
//
// absl::StatusCode and grpc::StatusCode share their numeric values (both
// follow google.rpc.Code), so the code is carried over unchanged and the
// message verbatim: core messages already name the offending field.
// Stateless and thread-safe.
#ifndef KVHARBOR_SERVER_RPC_STATUS_MAP_H_
#define KVHARBOR_SERVER_RPC_STATUS_MAP_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvharbor {

grpc::Status ToGrpcStatus(const absl::Status& status);

// Logs a failed call of `rpc` into namespace `ns`: DATA_LOSS (the data was
// rejected) as a warning naming the namespace, other failures at debug
// level. Nothing for OK.
void LogCallFailure(absl::string_view rpc, absl::string_view ns,
                    const absl::Status& status);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_RPC_STATUS_MAP_H_
