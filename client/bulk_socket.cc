// client/bulk_socket.h.
#include "client/bulk_socket.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/base/socket_io.h"
#include "types/bulk_wire.h"

namespace kvharbor {
namespace client {

absl::Duration IoTimeout(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return absl::Minutes(1);
  return std::max(absl::Milliseconds(1), deadline - absl::Now());
}

absl::StatusOr<int> ConnectTcp(const std::string& host, uint32_t port,
                               absl::Time deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("bulk: cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("bulk: no address");
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // Linux bounds connect() by the send timeout.
    const timeval t = absl::ToTimeval(IoTimeout(deadline));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof(t));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      freeaddrinfo(found);
      return fd;
    }
    last = absl::UnavailableError(absl::StrCat(
        "bulk: connect to ", host, ":", port, ": ", std::strerror(errno)));
    close(fd);
  }
  freeaddrinfo(found);
  return last;
}

absl::Status BulkHandshake(int fd, const v1::BulkOffer& offer, uint32_t index) {
  BulkHello hello;
  hello.index = index;
  hello.connections = offer.connections();
  std::memcpy(hello.token.data(), offer.token().data(), kBulkTokenBytes);
  const auto hello_bytes = EncodeBulkHello(hello);
  std::array<uint8_t, kBulkAcceptBytes> accept_bytes{};
  if (SendFull(fd, hello_bytes.data(), hello_bytes.size()) != 0 ||
      RecvFull(fd, accept_bytes.data(), accept_bytes.size()) != 0) {
    return absl::UnavailableError(absl::StrCat("bulk: connection ", index,
                                               " closed during its handshake"));
  }
  absl::StatusOr<BulkAccept> accept = DecodeBulkAccept(accept_bytes);
  if (!accept.ok()) return absl::InternalError(accept.status().message());
  if (accept->code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(accept->code),
                        absl::StrCat("bulk: the daemon refused connection ",
                                     index, ": ", accept->error));
  }
  return absl::OkStatus();
}

}  // namespace client
}  // namespace kvharbor
