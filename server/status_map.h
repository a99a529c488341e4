// ToGrpcStatus: the one place where an absl::Status becomes a grpc::Status.
//
// absl::StatusCode and grpc::StatusCode share their numeric values (both
// follow google.rpc.Code), so the code is carried over unchanged and the
// message verbatim: core messages already name the offending field.
// Stateless and thread-safe.
#ifndef KVHARBOR_SERVER_STATUS_MAP_H_
#define KVHARBOR_SERVER_STATUS_MAP_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kvharbor {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_STATUS_MAP_H_
