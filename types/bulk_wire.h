// The wire of the daemon's bulk data plane (docs/data_plane.md "Wire"): the
// TCP connections that carry a Fetch's page bytes outside the gRPC stream.
//
// The client gets a BulkOffer on the Fetch stream (proto), opens
// `connections` TCP connections to the offer's port and sends on each one a
// BulkHello naming the offer's token and the connection's index. The
// daemon answers with a BulkAccept; when it accepted (code 0) the raw bytes
// of that connection's stripes follow, pages back to back, and the daemon
// closes the connection after the last one. Nothing else is sent either
// way: a page's checksum is in the offer, and a transfer's status is the
// Fetch stream's.
//
// Both ends may run on different hosts: every field is little-endian and
// goes through Encode/Decode, never a struct copy. Plain functions; no state.
#ifndef KVHARBOR_TYPES_BULK_WIRE_H_
#define KVHARBOR_TYPES_BULK_WIRE_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvharbor {

inline constexpr uint32_t kBulkVersion = 1;
inline constexpr uint32_t kBulkTokenBytes = 32;
// Most connections one transfer may use (BulkFetch.connections).
inline constexpr uint32_t kBulkMaxConnections = 16;

using BulkToken = std::array<uint8_t, kBulkTokenBytes>;

// Client -> daemon, the first bytes of a connection.
struct BulkHello {
  uint32_t version = kBulkVersion;
  uint32_t index = 0;        // this connection's index in the offer
  uint32_t connections = 0;  // the offer's count, repeated as a check
  BulkToken token{};
};
inline constexpr size_t kBulkHelloBytes = 8 + 4 + 4 + 4 + kBulkTokenBytes;

// Daemon -> client: code 0 (then the stripes follow) or an absl::StatusCode
// and why (the daemon then closes the connection).
struct BulkAccept {
  int32_t code = 0;
  std::string error;  // at most kBulkErrorBytes bytes on the wire
};
inline constexpr size_t kBulkErrorBytes = 200;
inline constexpr size_t kBulkAcceptBytes = 8 + 4 + 4 + kBulkErrorBytes;

std::array<uint8_t, kBulkHelloBytes> EncodeBulkHello(const BulkHello& h);
// INVALID_ARGUMENT naming what is wrong (magic, version, index, connections).
absl::StatusOr<BulkHello> DecodeBulkHello(absl::Span<const uint8_t> bytes);

std::array<uint8_t, kBulkAcceptBytes> EncodeBulkAccept(const BulkAccept& a);
absl::StatusOr<BulkAccept> DecodeBulkAccept(absl::Span<const uint8_t> bytes);

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_BULK_WIRE_H_
