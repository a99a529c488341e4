// The wire message of the daemon's host IPC socket (same-host Fetch through
// shared memory, docs/operations.md): the one message a connection receives,
// with a read-only descriptor of the shared host arena attached. The daemon
// (server/local/host_ipc_server.h) and the SDK (include/kvharbor/host_ipc.h)
// both include this header, so the two ends cannot disagree on the layout.
//
// Native byte order: both ends run on one host. Plain structs; no state.
#ifndef KVHARBOR_TYPES_HOST_IPC_WIRE_H_
#define KVHARBOR_TYPES_HOST_IPC_WIRE_H_

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvharbor {

// magic is kHostIpcMagic; version kHostIpcVersion.
struct HostIpcGreeting {
  char magic[8];
  uint32_t version;
  uint32_t reserved;
  uint64_t daemon_id;
  uint64_t arena_bytes;
};
static_assert(sizeof(HostIpcGreeting) == 32, "HostIpcGreeting is 32 bytes");
inline constexpr char kHostIpcMagic[8] = {'K', 'V', 'H', 'A',
                                          'R', 'E', 'N', 'A'};
inline constexpr uint32_t kHostIpcVersion = 1;

// The sendmsg / recvmsg frame of one fixed-size message of the daemon's
// same-host sockets (a greeting here; a register of types/staging_wire.h):
// the message (owned by the caller; it must outlive this) as the data, room
// for one descriptor (SCM_RIGHTS) as the control data. Not copyable: msg
// points into it.
struct HostIpcMessage {
  explicit HostIpcMessage(HostIpcGreeting* greeting)
      : HostIpcMessage(greeting, sizeof(*greeting)) {}
  HostIpcMessage(void* data, size_t bytes) : iov{data, bytes} {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
  }
  HostIpcMessage(const HostIpcMessage&) = delete;
  HostIpcMessage& operator=(const HostIpcMessage&) = delete;

  // Attaches descriptor `fd` to the message to send.
  void AttachFd(int fd) {
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }

  iovec iov;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
};

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_HOST_IPC_WIRE_H_
