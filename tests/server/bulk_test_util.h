// Helpers of the bulk data plane tests (tests/server/bulk_*_test.cc): a
// daemon with the plane, raw loopback TCP connections to the daemon's plane and
// the hello / accept handshake of one connection index of an offer
// (types/bulk_wire.h). Test-only; no state.
#ifndef KVHARBOR_TESTS_SERVER_BULK_TEST_UTIL_H_
#define KVHARBOR_TESTS_SERVER_BULK_TEST_UTIL_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>

#include "kvharbor/v1/kvharbor.pb.h"
#include "tests/server/server_test_util.h"
#include "types/bulk_wire.h"

namespace kvharbor {
namespace testing {

// The test daemon's options (server_test_util.h) with the plane on a free
// loopback port.
inline DaemonOptions BulkOptions() {
  DaemonOptions o = TestOptions();
  o.data_plane.listen = "127.0.0.1:0";
  return o;
}

inline int Connect(uint32_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  timeval t{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
  return fd;
}

inline bool ReadN(int fd, void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Opens connection `index` of `offer` and returns its accept (the socket
// stays open in *fd when accepted).
inline BulkAccept Hello(const ::kvharbor::v1::BulkOffer& offer, uint32_t index,
                        int* fd, uint32_t connections = 0) {
  *fd = Connect(offer.port());
  BulkHello h;
  h.index = index;
  h.connections = connections != 0 ? connections : offer.connections();
  std::memcpy(h.token.data(), offer.token().data(), kBulkTokenBytes);
  const auto bytes = EncodeBulkHello(h);
  REQUIRE(send(*fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(bytes.size()));
  std::array<uint8_t, kBulkAcceptBytes> in{};
  REQUIRE(ReadN(*fd, in.data(), in.size()));
  absl::StatusOr<BulkAccept> a = DecodeBulkAccept(in);
  REQUIRE(a.ok());
  return *a;
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_SERVER_BULK_TEST_UTIL_H_
