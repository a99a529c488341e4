#include "server/local/host_ipc_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

namespace {

constexpr char kKey[] = "store.host_ipc_socket";
// How often the accept thread looks at the stop flag.
constexpr int kPollMillis = 100;

std::string Errno(int err) { return std::strerror(err); }

sockaddr_un Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

// A socket file left at `path`: removed when nobody answers on it (a
// crashed daemon's), an error when a daemon does or it is not a socket.
absl::Status ClearStale(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(kKey, ": cannot inspect '", path, "': ", Errno(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(kKey, ": '", path,
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
          kKey, ": '", path,
          "' is served by a running daemon; give each daemon its own path"));
    }
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(absl::StrCat(
        kKey, ": cannot remove the stale socket '", path, "': ", Errno(errno)));
  }
  spdlog::info("host ipc: removed the stale socket {}", path);
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateHostIpcOptions(const HostIpcOptions& o,
                                    absl::string_view prefix) {
  if ((o.socket_mode & ~0770u) != 0 || (o.socket_mode & 0600u) != 0600u) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: store.host_ipc_socket_mode: %04o must grant the owner read and "
        "write and nothing to others (at most 0770): the arena holds every "
        "namespace's pages",
        prefix, o.socket_mode));
  }
  if (o.socket.empty()) return absl::OkStatus();
  if (o.socket[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ": ", kKey, ": '", o.socket, "' must be an absolute path"));
  }
  if (o.socket.size() > kMaxHostIpcSocketPath ||
      o.socket.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s: the path has %u bytes; a Unix socket path "
                        "holds at most %u",
                        prefix, kKey, o.socket.size(), kMaxHostIpcSocketPath));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HostIpcServer>> HostIpcServer::Start(
    const HostIpcOptions& options, int arena_fd, uint64_t arena_bytes,
    uint64_t daemon_id) {
  if (absl::Status s = ValidateHostIpcOptions(options, "options"); !s.ok()) {
    return s;
  }
  if (options.socket.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(kKey, ": empty"));
  }
  if (absl::Status s = ClearStale(options.socket); !s.ok()) return s;
  // The descriptor clients get: opening the memfd again read-only through
  // /proc makes a file whose mappings can never be writable.
  const int ro_fd = open(absl::StrCat("/proc/self/fd/", arena_fd).c_str(),
                         O_RDONLY | O_CLOEXEC);
  if (ro_fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        kKey,
        ": cannot open a read-only descriptor of the arena: ", Errno(errno)));
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    close(ro_fd);
    return absl::UnavailableError(
        absl::StrCat(kKey, ": socket: ", Errno(errno)));
  }
  const sockaddr_un addr = Address(options.socket);
  struct stat st {};
  // Nobody can connect before listen(), so the file's mode is fixed before
  // any client could use the umask's default.
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      chmod(options.socket.c_str(), options.socket_mode) != 0 ||
      lstat(options.socket.c_str(), &st) != 0 || listen(fd, 64) != 0) {
    const int err = errno;
    close(fd);
    close(ro_fd);
    unlink(options.socket.c_str());
    return absl::UnavailableError(absl::StrCat(
        kKey, ": cannot serve on '", options.socket, "': ", Errno(err)));
  }
  HostIpcGreeting g{};
  std::memcpy(g.magic, kHostIpcMagic, sizeof(g.magic));
  g.version = kHostIpcVersion;
  g.daemon_id = daemon_id;
  g.arena_bytes = arena_bytes;
  std::unique_ptr<HostIpcServer> server(
      new HostIpcServer(options.socket, fd, ro_fd, g, st.st_dev, st.st_ino));
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

HostIpcServer::HostIpcServer(std::string path, int listen_fd, int ro_fd,
                             HostIpcGreeting greeting, dev_t dev, ino_t ino)
    : path_(std::move(path)),
      listen_fd_(listen_fd),
      ro_fd_(ro_fd),
      greeting_(greeting),
      dev_(dev),
      ino_(ino) {}

HostIpcServer::~HostIpcServer() { Stop(); }

void HostIpcServer::Loop() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    const int n = poll(&p, 1, kPollMillis);
    if (n <= 0 || (p.revents & POLLIN) == 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    Answer(conn);
    close(conn);
  }
}

void HostIpcServer::Answer(int conn) {
  // A client that does not read must not stall the thread: the message is
  // tiny, so a short send timeout only trips for a broken peer.
  timeval tv{1, 0};
  setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  HostIpcGreeting g = greeting_;
  HostIpcMessage m(&g);
  msghdr& msg = m.msg;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &ro_fd_, sizeof(int));
  if (sendmsg(conn, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(g))) {
    served_.fetch_add(1);
  } else {
    spdlog::debug("host ipc: a client went away before its greeting: {}",
                  Errno(errno));
  }
}

void HostIpcServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(ro_fd_);
  // Only our own file: a daemon started on the same path after this one
  // (which found ours stale) must keep its socket.
  struct stat st {};
  if (lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ &&
      st.st_ino == ino_) {
    unlink(path_.c_str());
  }
}

}  // namespace kvharbor
