#include "server/local/unix_listener.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

namespace {

sockaddr_un Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(),
              std::min(path.size(), sizeof(addr.sun_path) - 1));
  return addr;
}

// A socket file left at `path`: removed when nobody answers on it (a
// crashed daemon's), an error when a daemon does or it is not a socket.
absl::Status ClearStale(const std::string& path, absl::string_view key) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(key, ": cannot inspect '", path, "': ", ErrnoText(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(key, ": '", path,
                     "' exists and is not a socket; refusing to replace it"));
  }
  const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe >= 0) {
    const sockaddr_un addr = Address(path);
    const bool live = connect(probe, reinterpret_cast<const sockaddr*>(&addr),
                              sizeof(addr)) == 0;
    close(probe);
    if (live) {
      return absl::FailedPreconditionError(absl::StrCat(
          key, ": '", path,
          "' is served by a running daemon; give each daemon its own path"));
    }
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat(key, ": cannot remove the stale socket '", path,
                     "': ", ErrnoText(errno)));
  }
  spdlog::info("{}: removed the stale socket {}", std::string(key), path);
  return absl::OkStatus();
}

}  // namespace

std::string ErrnoText(int err) { return std::strerror(err); }

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Listen(
    const std::string& path, uint32_t mode, absl::string_view key) {
  if (path.empty() || path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        key, ": '", path, "' is empty or too long for a Unix socket path"));
  }
  if (absl::Status s = ClearStale(path, key); !s.ok()) return s;
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat(key, ": socket: ", ErrnoText(errno)));
  }
  const sockaddr_un addr = Address(path);
  struct stat st {};
  // Nobody can connect before listen(), so the file's mode is fixed before
  // any client could use the umask's default.
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      chmod(path.c_str(), mode) != 0 || lstat(path.c_str(), &st) != 0 ||
      listen(fd, 64) != 0) {
    const int err = errno;
    close(fd);
    unlink(path.c_str());
    return absl::UnavailableError(
        absl::StrCat(key, ": cannot serve on '", path, "': ", ErrnoText(err)));
  }
  return std::unique_ptr<UnixListener>(
      new UnixListener(path, fd, st.st_dev, st.st_ino));
}

UnixListener::~UnixListener() { Close(); }

void UnixListener::Close() {
  if (fd_ < 0) return;
  close(fd_);
  fd_ = -1;
  struct stat st {};
  if (lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ &&
      st.st_ino == ino_) {
    unlink(path_.c_str());
  }
}

}  // namespace kvharbor
