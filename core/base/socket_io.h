// Whole sends and receives on a connected stream socket, for both ends of
// the bulk data plane (server/data/, client/bulk_*.cc): EINTR is retried,
// MSG_NOSIGNAL turns a peer that left into an error instead of SIGPIPE, and
// a partial write or read is resumed until every byte moved.
//
// Plain functions over caller-owned descriptors and buffers; thread-safe
// (no state).
#ifndef KVHARBOR_CORE_BASE_SOCKET_IO_H_
#define KVHARBOR_CORE_BASE_SOCKET_IO_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"
#include "absl/types/span.h"

namespace kvharbor {

// What a whole send or receive ended with: 0 when every byte moved,
// kPeerClosed when the peer closed first, ETIMEDOUT when `deadline` passed
// between reads, else the errno of the failed call (EAGAIN: the socket's
// SO_SNDTIMEO / SO_RCVTIMEO ran out).
inline constexpr int kPeerClosed = -1;

// A result above in words: "closed by the peer", "timed out" (ETIMEDOUT,
// EAGAIN), or strerror.
std::string SocketErrorText(int result);

int SendFull(int fd, const void* data, size_t n);
// `deadline` is checked between reads, so a peer that trickles bytes is
// cut at the first read after it.
int RecvFull(int fd, void* out, size_t n,
             absl::Time deadline = absl::InfiniteFuture());
// Sends every byte of `pieces` with sendmsg, resuming after partial writes
// (the pieces are consumed as they go); `on_sent(n)` (may be empty) after
// each write of n bytes.
int SendPieces(int fd, absl::Span<iovec> pieces,
               const std::function<void(uint64_t)>& on_sent = nullptr);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_BASE_SOCKET_IO_H_
