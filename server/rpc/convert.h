// Conversions between kvharbor.v1 protobuf messages and core types.
//
// This is the only place that translates proto <-> core (house rule: only
// server/ converts, and within server/ only this file). Conversions from
// proto validate: enum values that are unspecified (where that is not
// allowed) or unknown are rejected with InvalidArgument, and every message
// names the field with the caller's prefix ("spec.geometry.dtype: ...").
// Conversions to proto only fill the given message.
//
// Stateless free functions; thread-safe.
#ifndef KVHARBOR_SERVER_RPC_CONVERT_H_
#define KVHARBOR_SERVER_RPC_CONVERT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/index/radix_index.h"
#include "core/store/namespace.h"
#include "core/store/store.h"
#include "kvharbor/v1/kvharbor.pb.h"
#include "server/rpc/fetch_transform.h"
#include "types/geometry.h"
#include "types/tier.h"

namespace kvharbor {

// DTYPE_UNSPECIFIED and values outside the enum are rejected.
absl::StatusOr<DType> DTypeFromProto(int value, absl::string_view field);
v1::DType DTypeToProto(DType dtype);

// PAGE_LAYOUT_UNSPECIFIED means the default layout; unknown values are
// rejected.
absl::StatusOr<PageLayout> PageLayoutFromProto(int value,
                                               absl::string_view field);
v1::PageLayout PageLayoutToProto(PageLayout layout);

// Converts and validates (Geometry::Validate) with `field` as prefix.
absl::StatusOr<Geometry> GeometryFromProto(const v1::Geometry& proto,
                                           absl::string_view field);
void GeometryToProto(const Geometry& geometry, v1::Geometry* proto);

// Checks the name and the geometry (required); capacity and codec are
// checked by the store, which knows the budget and the codec registry.
absl::StatusOr<NamespaceSpec> NamespaceSpecFromProto(
    const v1::NamespaceSpec& proto, absl::string_view field);
// The spec of a live namespace, defaults filled in.
void NamespaceConfigToProto(const NamespaceConfig& config,
                            v1::NamespaceSpec* proto);

void NamespaceStatsToProto(const NamespaceStats& stats,
                           v1::NamespaceStats* proto);
void GlobalStatsToProto(const GlobalStats& stats, v1::GlobalStats* proto);
// Spec and stats of `ns`.
void NamespaceInfoToProto(const Namespace& ns, v1::NamespaceInfo* proto);
// Online calibration options; errors name `field`.<sub-field>.
absl::StatusOr<OnlineCalibrationOptions> OnlineCalibrationFromProto(
    const v1::OnlineCalibration& proto, absl::string_view field);
void CalibrationInfoToProto(const CalibrationInfo& info,
                            v1::CalibrationInfo* proto);

// Tiers: core and proto values agree. TierFromProto rejects unknown values.
v1::Tier TierToProto(Tier tier);
absl::StatusOr<Tier> TierFromProto(int value, absl::string_view field);
// FETCH_FORMAT_RAW (the default) or FETCH_FORMAT_COMPRESSED; unknown values
// are rejected.
absl::StatusOr<FetchFormat> FetchFormatFromProto(int value,
                                                 absl::string_view field);

// FETCH_TRANSFORM_NONE (the default) or FETCH_TRANSFORM_KVCM; unknown
// values are rejected.
absl::StatusOr<FetchTransform> FetchTransformFromProto(int value,
                                                       absl::string_view field);

// KEY_KIND_TOKENS (the default), KEY_KIND_PAGE_KEYS or KEY_KIND_PAGE_HASHES;
// unknown values are rejected.
absl::StatusOr<KeyKind> KeyKindFromProto(int value, absl::string_view field);

// A request's sequence as namespace `ns`'s index elements: its token ids as
// they are (a token namespace), or its page keys encoded
// (core/index/page_key.h). The field of the other key kind is
// InvalidArgument naming it; a key of a wrong length names
// "<prefix>page_keys[i]". `prefix` is "" or "header.".
struct Elements {
  std::vector<Token> storage;  // encoded page keys
  absl::Span<const Token> elements;
};
absl::StatusOr<Elements> SequenceFromProto(
    const Namespace& ns, const google::protobuf::RepeatedField<int32_t>& ids,
    const google::protobuf::RepeatedPtrField<std::string>& keys,
    absl::string_view prefix);

// Token ids as the core sees them (no copy: int32 in both).
absl::Span<const Token> TokensFromProto(
    const google::protobuf::RepeatedField<int32_t>& ids);
absl::Span<const PageHandle> HandlesFromProto(
    const google::protobuf::RepeatedField<uint64_t>& handles);
absl::Span<const uint64_t> ChecksumsFromProto(
    const google::protobuf::RepeatedField<uint64_t>& checksums);

// A lease time to live in milliseconds; 0 means the daemon's default (the
// core treats a zero Duration that way).
absl::Duration TtlFromProto(uint32_t ttl_ms);
// Unix milliseconds, 0 for an infinite past (no lease).
int64_t UnixMillisToProto(absl::Time t);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_RPC_CONVERT_H_
