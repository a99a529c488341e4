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
#include "server/local/unix_listener.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

namespace {

constexpr char kKey[] = "store.host_ipc_socket";
// How often the accept thread looks at the stop flag.
constexpr int kPollMillis = 100;

std::string Errno(int err) { return ErrnoText(err); }

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
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %s: the path has %u bytes; a Unix socket path "
        "holds at most %u (the staging socket beside it adds .stage)",
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
  // The descriptor clients get: opening the memfd again read-only through
  // /proc makes a file whose mappings can never be writable.
  const int ro_fd = open(absl::StrCat("/proc/self/fd/", arena_fd).c_str(),
                         O_RDONLY | O_CLOEXEC);
  if (ro_fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        kKey,
        ": cannot open a read-only descriptor of the arena: ", Errno(errno)));
  }
  absl::StatusOr<std::unique_ptr<UnixListener>> listener =
      UnixListener::Listen(options.socket, options.socket_mode, kKey);
  if (!listener.ok()) {
    close(ro_fd);
    return listener.status();
  }
  HostIpcGreeting g{};
  std::memcpy(g.magic, kHostIpcMagic, sizeof(g.magic));
  g.version = kHostIpcVersion;
  g.daemon_id = daemon_id;
  g.arena_bytes = arena_bytes;
  std::unique_ptr<HostIpcServer> server(
      new HostIpcServer(*std::move(listener), ro_fd, g));
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

HostIpcServer::HostIpcServer(std::unique_ptr<UnixListener> listener, int ro_fd,
                             HostIpcGreeting greeting)
    : listener_(std::move(listener)), ro_fd_(ro_fd), greeting_(greeting) {}

HostIpcServer::~HostIpcServer() { Stop(); }

void HostIpcServer::Loop() {
  while (!stop_.load()) {
    pollfd p{listener_->fd(), POLLIN, 0};
    const int n = poll(&p, 1, kPollMillis);
    if (n <= 0 || (p.revents & POLLIN) == 0) continue;
    const int conn = accept4(listener_->fd(), nullptr, nullptr, SOCK_CLOEXEC);
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
  m.AttachFd(ro_fd_);
  if (sendmsg(conn, &m.msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(g))) {
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
  close(ro_fd_);
  listener_->Close();
}

}  // namespace kvharbor
