// Whole sends and receives (core/base/socket_io.h).
#include "core/base/socket_io.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/time/clock.h"

namespace kvharbor {

std::string SocketErrorText(int result) {
  if (result == kPeerClosed) return "closed by the peer";
  if (result == ETIMEDOUT || result == EAGAIN || result == EWOULDBLOCK) {
    return "timed out";
  }
  return std::strerror(result);
}

int SendFull(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return kPeerClosed;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

int RecvFull(int fd, void* out, size_t n, absl::Time deadline) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    if (deadline != absl::InfiniteFuture() && absl::Now() > deadline) {
      return ETIMEDOUT;
    }
    const ssize_t r = recv(fd, p, n, MSG_WAITALL);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno;
    if (r == 0) return kPeerClosed;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return 0;
}

int SendPieces(int fd, absl::Span<iovec> pieces,
               const std::function<void(uint64_t)>& on_sent) {
  size_t first = 0;
  while (first < pieces.size() && pieces[first].iov_len == 0) ++first;
  while (first < pieces.size()) {
    msghdr m{};
    m.msg_iov = pieces.data() + first;
    m.msg_iovlen = pieces.size() - first;
    const ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return kPeerClosed;
    if (on_sent) on_sent(static_cast<uint64_t>(w));
    for (uint64_t left = static_cast<uint64_t>(w); left > 0;) {
      iovec& p = pieces[first];
      const uint64_t take = std::min<uint64_t>(left, p.iov_len);
      p.iov_base = static_cast<uint8_t*>(p.iov_base) + take;
      p.iov_len -= take;
      left -= take;
      if (p.iov_len == 0) ++first;
    }
    while (first < pieces.size() && pieces[first].iov_len == 0) ++first;
  }
  return 0;
}

}  // namespace kvharbor
