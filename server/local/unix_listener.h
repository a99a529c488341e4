// UnixListener: a listening Unix domain socket at a file path, made the way
// both of the daemon's same-host sockets need (server/local/host_ipc_server.h,
// server/local/staging_server.h): a stale file left by a crashed daemon is
// removed, a live daemon on the path is an error, the file's mode is set
// before listen() so that no client ever connects under the umask's mode,
// and at Close the file is removed only if it is still the one this
// listener made.
//
// Memory: owns the listening descriptor. Thread-compatible: Listen and Close
// from one thread; fd() may be polled by the thread that owns the listener.
#ifndef KVHARBOR_SERVER_LOCAL_UNIX_LISTENER_H_
#define KVHARBOR_SERVER_LOCAL_UNIX_LISTENER_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvharbor {

class UnixListener {
 public:
  // Binds `path` with permission bits `mode` and listens. `key` names the
  // config key the path came from in every error (FailedPrecondition for a
  // path held by a live daemon or by something that is not a socket,
  // Unavailable when socket/bind/listen fail).
  static absl::StatusOr<std::unique_ptr<UnixListener>> Listen(
      const std::string& path, uint32_t mode, absl::string_view key);
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Closes the socket and removes the file if it is still ours (a daemon
  // started on the same path after this one found ours stale and must keep
  // its own). Idempotent; the destructor calls it.
  void Close();

 private:
  UnixListener(std::string path, int fd, dev_t dev, ino_t ino)
      : path_(std::move(path)), fd_(fd), dev_(dev), ino_(ino) {}

  const std::string path_;
  int fd_;
  const dev_t dev_;
  const ino_t ino_;
};

// strerror(err) as a std::string.
std::string ErrnoText(int err);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_LOCAL_UNIX_LISTENER_H_
