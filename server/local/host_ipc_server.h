// HostIpcServer: the Unix domain socket that hands the shared host arena to
// local clients (same-host Fetch through shared memory).
//
// With store.host_ipc_socket set, the daemon backs its host page pools by
// one memfd (core/memory/host_arena.h) and serves this socket. Every connection
// is answered at once with one message, a HostIpcGreeting (magic, the daemon's
// random 64-bit id, the arena size) carrying a READ-ONLY descriptor of the
// memfd (SCM_RIGHTS), and is then closed; the client sends nothing. The
// read-only descriptor is opened once through /proc/self/fd, so a client can
// map the arena PROT_READ only: it can never write another client's (or
// tenant's) pages. The socket file is made with `mode` (0600 by default:
// only the daemon's user), a stale one left by a crashed daemon is removed
// at start (a live daemon on the path is an error), and the file is removed
// again at Stop. Nothing else outlives the daemon: the memfd has no name.
//
// Memory: the server owns its listening socket and the read-only
// descriptor; the arena must outlive it (the Daemon stops it first).
//
// Thread-safety: Start and Stop from one thread (the daemon's); the accept
// thread is internal. Stop is idempotent and also runs in the destructor.
#ifndef KVHARBOR_SERVER_LOCAL_HOST_IPC_SERVER_H_
#define KVHARBOR_SERVER_LOCAL_HOST_IPC_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/memory/host_arena.h"
#include "server/local/unix_listener.h"
#include "types/host_ipc_wire.h"

namespace kvharbor {

// Config section store: host_ipc_socket and host_ipc_socket_mode.
struct HostIpcOptions {
  std::string socket;           // "" = off
  uint32_t socket_mode = 0600;  // permission bits of the socket file
};

// Longest socket path: sockaddr_un.sun_path (107 bytes and a NUL) less the
// staging socket's suffix (".stage", types/staging_wire.h), which is served
// beside it.
inline constexpr size_t kMaxHostIpcSocketPath = 101;

// InvalidArgument "<prefix>: store.host_ipc_socket..." for a path that is
// not absolute or too long, or a mode with bits outside 0770 (others may
// never map an arena holding every tenant's pages).
absl::Status ValidateHostIpcOptions(const HostIpcOptions& options,
                                    absl::string_view prefix);

class HostIpcServer {
 public:
  // Binds `options.socket` and starts answering. `arena_fd` is the arena's
  // read-write memfd (not taken over). FailedPrecondition naming
  // store.host_ipc_socket when the path is held by a live daemon or by
  // something that is not a socket; Unavailable when bind/listen fail.
  static absl::StatusOr<std::unique_ptr<HostIpcServer>> Start(
      const HostIpcOptions& options, int arena_fd, uint64_t arena_bytes,
      uint64_t daemon_id);
  ~HostIpcServer();
  HostIpcServer(const HostIpcServer&) = delete;
  HostIpcServer& operator=(const HostIpcServer&) = delete;

  const std::string& path() const { return listener_->path(); }
  // Connections answered so far.
  uint64_t served() const { return served_.load(); }
  // Stops the thread, closes the socket and removes the socket file (only
  // if it is still the one this server made).
  void Stop();

 private:
  HostIpcServer(std::unique_ptr<UnixListener> listener, int ro_fd,
                HostIpcGreeting greeting);
  void Loop();
  void Answer(int conn);

  const std::unique_ptr<UnixListener> listener_;
  const int ro_fd_;
  const HostIpcGreeting greeting_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> served_{0};
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_LOCAL_HOST_IPC_SERVER_H_
