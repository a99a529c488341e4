// The SDK's side of the bulk data plane's connections (docs/data_plane.md
// "Wire"): TCP connections to the daemon's plane with the call's deadline
// as their timeouts, whole sends and receives, and the hello / accept
// handshake of one connection index of an offer (whole sends and receives:
// core/base/socket_io.h).
//
// Internal to the SDK (client/bulk_fetch.cc, client/bulk_insert.cc). Plain
// functions; the caller owns the descriptors.
#ifndef KVHARBOR_CLIENT_BULK_SOCKET_H_
#define KVHARBOR_CLIENT_BULK_SOCKET_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvharbor/v1/kvharbor.pb.h"

namespace kvharbor {
namespace client {

// A socket's receive and send timeout: what is left of the call's deadline,
// or a minute of silence for a call without one.
absl::Duration IoTimeout(absl::Time deadline);
// A TCP connection to host:port, its timeouts IoTimeout(deadline);
// UNAVAILABLE naming the address otherwise.
absl::StatusOr<int> ConnectTcp(const std::string& host, uint32_t port,
                               absl::Time deadline);
// Sends connection `index`'s hello for `offer` and reads the accept: OK,
// the daemon's refusal as its status (naming the connection), or
// UNAVAILABLE / INTERNAL for a broken or garbled handshake.
absl::Status BulkHandshake(int fd, const v1::BulkOffer& offer, uint32_t index);

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_BULK_SOCKET_H_
