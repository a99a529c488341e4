// BulkServer (server/data/bulk_server.h).
#include "server/data/bulk_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/base/host_port.h"
#include "core/base/socket_io.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

namespace {

std::string Errno(int err) { return std::strerror(err); }

absl::StatusOr<int> ListenTcp(const std::string& text, uint16_t* port) {
  absl::string_view host_view;
  int number = 0;
  if (!SplitHostPort(text, &host_view, &number)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data_plane.listen: '", text, "' is not HOST:PORT ([V6]:PORT)"));
  }
  // getaddrinfo takes an IPv6 address without its brackets.
  if (absl::StartsWith(host_view, "[") && absl::EndsWith(host_view, "]")) {
    host_view = host_view.substr(1, host_view.size() - 2);
  }
  const std::string host(host_view), service = absl::StrCat(number);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_plane.listen: '", text, "': ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("no address");
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = absl::UnavailableError(Errno(errno));
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 256) != 0) {
      last = absl::UnavailableError(
          absl::StrCat("data_plane.listen: '", text, "': ", Errno(errno)));
      close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    *port = ntohs(bound.ss_family == AF_INET6
                      ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                      : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    freeaddrinfo(found);
    return fd;
  }
  freeaddrinfo(found);
  return last;
}

void SendAccept(int fd, const absl::Status& s) {
  BulkAccept a;
  a.code = static_cast<int32_t>(s.code());
  a.error = std::string(s.message());
  const auto bytes = EncodeBulkAccept(a);
  // Best effort: the peer of a refusal may be gone.
  (void)SendFull(fd, bytes.data(), bytes.size());
}

}  // namespace

absl::StatusOr<std::unique_ptr<BulkServer>> BulkServer::Start(
    const BulkServerOptions& options, BulkTicketTable* tickets) {
  uint16_t port = 0;
  absl::StatusOr<int> fd = ListenTcp(options.listen, &port);
  if (!fd.ok()) return fd.status();
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(*fd);
    return absl::InternalError(
        absl::StrCat("data plane: eventfd: ", Errno(errno)));
  }
  std::unique_ptr<BulkServer> server(
      new BulkServer(options, tickets, *fd, wake, port));
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

BulkServer::BulkServer(BulkServerOptions options, BulkTicketTable* tickets,
                       int fd, int wake, uint16_t port)
    : options_(std::move(options)),
      tickets_(tickets),
      listen_fd_(fd),
      wake_fd_(wake),
      port_(port) {}

BulkServer::~BulkServer() {
  Stop();
  close(listen_fd_);
  close(wake_fd_);
}

void BulkServer::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    for (int fd : open_) shutdown(fd, SHUT_RDWR);
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (acceptor_.joinable()) acceptor_.join();
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(
      +[](absl::flat_hash_set<int>* open) { return open->empty(); }, &open_));
}

void BulkServer::AcceptLoop() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("data plane: poll: {}", Errno(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: the pending connection stays readable, so
      // wait a little instead of spinning (a peer that left: at once).
      if (errno == EMFILE || errno == ENFILE) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      continue;
    }
    {
      absl::MutexLock l(&mu_);
      if (stopping_) {
        close(fd);
        return;
      }
      if (open_.size() >= options_.max_connections) {
        refused_.fetch_add(1);
        SendAccept(fd, absl::ResourceExhaustedError(absl::StrCat(
                           "data_plane.max_connections: ", open_.size(),
                           " connections are open, the daemon's limit; "
                           "retry later")));
        close(fd);
        continue;
      }
      open_.insert(fd);
    }
    std::thread([this, fd] { Serve(fd); }).detach();
  }
}

void BulkServer::Serve(int fd) {
  const timeval hello_timeout = absl::ToTimeval(options_.hello_timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &hello_timeout,
             sizeof(hello_timeout));
  std::array<uint8_t, kBulkHelloBytes> bytes{};
  if (RecvFull(fd, bytes.data(), bytes.size(),
               absl::Now() + options_.hello_timeout) == 0) {
    absl::StatusOr<BulkHello> hello = DecodeBulkHello(bytes);
    absl::StatusOr<std::shared_ptr<BulkTicket>> ticket =
        hello.ok()
            ? tickets_->Claim(*hello, fd)
            : absl::StatusOr<std::shared_ptr<BulkTicket>>(hello.status());
    if (ticket.ok()) {
      ServeClaimed(fd, *hello, *ticket);
    } else {
      spdlog::debug("data plane: refused a connection: {}",
                    ticket.status().ToString());
      SendAccept(fd, ticket.status());
    }
  }
  // Still registered, so Stop's shutdown cannot hit a reused descriptor.
  absl::MutexLock l(&mu_);
  close(fd);
  open_.erase(fd);
}

void BulkServer::ServeClaimed(int fd, const BulkHello& hello,
                              const std::shared_ptr<BulkTicket>& ticket) {
  SendAccept(fd, absl::OkStatus());
  // Either way, a peer that moves nothing for this long is dropped.
  const timeval idle = absl::ToTimeval(options_.idle_timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &idle, sizeof(idle));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &idle, sizeof(idle));
  ticket->Finished(hello.index, ticket->Transfer(fd, hello.index, &moved_));
}

}  // namespace kvharbor
