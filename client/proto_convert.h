// Conversions between the SDK's value types (include/kvharbor/types.h) and the
// generated kvharbor.v1 messages, and from grpc::Status to absl::Status.
//
// Internal to the SDK (not installed). Stateless functions; thread-safe.
#ifndef KVHARBOR_CLIENT_PROTO_CONVERT_H_
#define KVHARBOR_CLIENT_PROTO_CONVERT_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kvharbor/types.h"
#include "kvharbor/v1/kvharbor.pb.h"

namespace kvharbor {
namespace client {

// The one place gRPC statuses become absl ones: same code, same message.
absl::Status FromGrpcStatus(const grpc::Status& status);

void ToProto(const Geometry& g, v1::Geometry* out);
// The spec a client creates a namespace with: every field but tenant
// (the daemon's) and calibration_fingerprint (returned, not asked for).
void ToProto(const NamespaceSpec& spec, v1::NamespaceSpec* out);
void ToProto(const OnlineCalibration& o, v1::OnlineCalibration* out);
Geometry FromProto(const v1::Geometry& g);
// What the daemon returns: its resolved values, without the calibration
// bytes or path (never returned).
NamespaceSpec FromProto(const v1::NamespaceSpec& spec);
OnlineCalibration FromProto(const v1::OnlineCalibration& o);
NamespaceStats FromProto(const v1::NamespaceStats& s);
NamespaceInfo FromProto(const v1::NamespaceInfo& info);
GlobalStats FromProto(const v1::GlobalStats& g);

absl::Time FromUnixMillis(int64_t ms);

// The elements of `sequence` into a request's token_ids or page_keys.
void SequenceToProto(const Sequence& sequence,
                     google::protobuf::RepeatedField<int32_t>* token_ids,
                     google::protobuf::RepeatedPtrField<std::string>* keys);

// The header of an Insert stream (Insert, BeginInsert) of `sequence` into
// `ns`, its first `skip_pages` pages skipped (or those of `prefix_lease_id`).
void InsertHeaderToProto(absl::string_view ns, const Sequence& sequence,
                         uint32_t skip_pages, uint64_t prefix_lease_id,
                         v1::InsertHeader* out);
InsertResult FromProto(const v1::InsertResponse& r);
TreeDump FromProto(const v1::DumpTreeResponse& r);
Calibration FromProto(const v1::GetCalibrationResponse& r);

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_PROTO_CONVERT_H_
