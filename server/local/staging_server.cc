#include "server/local/staging_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

namespace {

// How often the serving thread looks at the stop flag and the deadlines.
constexpr int kPollMillis = 100;

StagingGrant Refusal(const absl::Status& why) {
  StagingGrant g{};
  std::memcpy(g.magic, kStagingMagic, sizeof(g.magic));
  g.version = kStagingVersion;
  g.code = static_cast<int32_t>(why.code());
  const std::string text = std::string(why.message());
  std::memcpy(g.error, text.data(), std::min(text.size(), sizeof(g.error) - 1));
  return g;
}

// The region of `fd` checked and mapped read-only; `fd` is not closed.
absl::StatusOr<std::unique_ptr<StagingMapping>> MapRegion(int fd,
                                                          uint64_t bytes,
                                                          uint64_t max_bytes) {
  if (bytes == 0 || bytes > max_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "register.bytes: %u; a staging region holds 1..%u bytes", bytes,
        max_bytes));
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(
        "register: the descriptor is not a memfd (memfd_create with "
        "MFD_ALLOW_SEALING)");
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(
        "register: the memfd lacks F_SEAL_SHRINK (add it with "
        "fcntl(F_ADD_SEALS) before registering: the daemon's mapping must "
        "never lose its pages)");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size < 0 ||
      static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("register.bytes: %u, but the memfd holds %d bytes",
                        bytes, static_cast<int64_t>(st.st_size)));
  }
  // Populated at once: the client allocated the pages (its StagingRegion
  // touched them), so this maps what is there, and no Insert later takes
  // a page fault per 4 KiB while it copies.
  // The client must have allocated every page itself: mapping (or later
  // reading) holes would make the daemon allocate a client's memory.
  if (static_cast<uint64_t>(st.st_blocks) * 512 < bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "register: only %u of the %u bytes are allocated; write every page of "
        "the region before registering it",
        static_cast<uint64_t>(st.st_blocks) * 512, bytes));
  }
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("register: cannot map the region: ", ErrnoText(errno)));
  }
  return std::make_unique<StagingMapping>(static_cast<const uint8_t*>(p),
                                          bytes);
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagingServer>> StagingServer::Start(
    const StagingServerOptions& options, StagingRegistry* registry,
    uint64_t daemon_id) {
  absl::StatusOr<std::unique_ptr<UnixListener>> listener = UnixListener::Listen(
      options.socket, options.socket_mode, "store.host_ipc_socket (staging)");
  if (!listener.ok()) return listener.status();
  std::unique_ptr<StagingServer> server(
      new StagingServer(*std::move(listener), options, registry, daemon_id));
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

StagingServer::StagingServer(std::unique_ptr<UnixListener> listener,
                             StagingServerOptions options,
                             StagingRegistry* registry, uint64_t daemon_id)
    : listener_(std::move(listener)),
      options_(std::move(options)),
      registry_(registry),
      daemon_id_(daemon_id) {}

StagingServer::~StagingServer() { Stop(); }

void StagingServer::Loop() {
  std::vector<pollfd> fds;
  while (!stop_.load()) {
    fds.assign(1, pollfd{listener_->fd(), POLLIN, 0});
    for (const Conn& c : conns_) fds.push_back(pollfd{c.fd, POLLIN, 0});
    const int n = poll(fds.data(), fds.size(), kPollMillis);
    if (n < 0) continue;
    const absl::Time now = absl::Now();
    std::vector<Conn> kept;
    kept.reserve(conns_.size());
    for (size_t i = 0; i < conns_.size(); ++i) {
      Conn& c = conns_[i];
      bool keep = true;
      if (fds[i + 1].revents != 0) {
        keep = OnReadable(c);
      } else if (c.id == 0 && now > c.deadline) {
        spdlog::debug("staging: a client did not register in time");
        keep = false;
      }
      if (keep) {
        kept.push_back(c);
      } else {
        CloseConn(c);
      }
    }
    conns_ = std::move(kept);
    if ((fds[0].revents & POLLIN) != 0) AcceptOne();
  }
}

void StagingServer::AcceptOne() {
  const int fd =
      accept4(listener_->fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return;
  if (conns_.size() >= options_.max_connections) {
    spdlog::warn(
        "staging: {} connections are open, the most it serves; closing a "
        "new one",
        conns_.size());
    close(fd);
    return;
  }
  Conn c;
  c.fd = fd;
  c.deadline = absl::Now() + options_.register_timeout;
  conns_.push_back(c);
}

bool StagingServer::OnReadable(Conn& c) {
  StagingRegister req{};
  iovec iov{&req, sizeof(req)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t got = recvmsg(c.fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  // Every descriptor that came along is ours to close, whatever follows.
  std::vector<int> fds;
  for (cmsghdr* h = CMSG_FIRSTHDR(&msg); h != nullptr;
       h = CMSG_NXTHDR(&msg, h)) {
    if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
      fds.push_back(fd);
    }
  }
  const auto close_all = [&] {
    for (int fd : fds) close(fd);
  };
  if (got < 0 && (errno == EAGAIN || errno == EINTR)) {
    close_all();
    return true;
  }
  if (c.id != 0 || got <= 0) {
    // A registered client only ever closes; anything else ends it too.
    close_all();
    return false;
  }
  StagingGrant grant;
  if (got != static_cast<ssize_t>(sizeof(req)) ||
      (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 ||
      std::memcmp(req.magic, kStagingMagic, sizeof(req.magic)) != 0 ||
      req.version != kStagingVersion) {
    grant = Refusal(absl::InvalidArgumentError(
        "register: not a StagingRegister of this version "
        "(types/staging_wire.h)"));
  } else if (fds.size() != 1) {
    grant = Refusal(absl::InvalidArgumentError(absl::StrFormat(
        "register: %u descriptors attached; attach the region's memfd alone",
        fds.size())));
  } else {
    grant = Register(req, fds[0], &c.id);
  }
  close_all();  // a mapping keeps the region; the descriptor is not needed
  const ssize_t sent = send(c.fd, &grant, sizeof(grant), MSG_NOSIGNAL);
  if (sent != static_cast<ssize_t>(sizeof(grant)) || grant.code != 0) {
    return false;
  }
  granted_.fetch_add(1);
  return true;
}

StagingGrant StagingServer::Register(const StagingRegister& req, int fd,
                                     uint64_t* id) {
  absl::StatusOr<std::unique_ptr<StagingMapping>> mapping =
      MapRegion(fd, req.bytes, options_.max_region_bytes);
  if (!mapping.ok()) return Refusal(mapping.status());
  absl::StatusOr<StagingRegistry::Grant> g =
      registry_->Add(*std::move(mapping));
  if (!g.ok()) return Refusal(g.status());
  StagingGrant grant{};
  std::memcpy(grant.magic, kStagingMagic, sizeof(grant.magic));
  grant.version = kStagingVersion;
  grant.daemon_id = daemon_id_;
  grant.id = g->id;
  std::memcpy(grant.key, g->key.data(), sizeof(grant.key));
  grant.bytes = req.bytes;
  *id = g->id;
  return grant;
}

void StagingServer::CloseConn(Conn& c) {
  if (c.id != 0) registry_->Remove(c.id);
  close(c.fd);
  c.fd = -1;
  c.id = 0;
}

void StagingServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  for (Conn& c : conns_) CloseConn(c);
  conns_.clear();
  listener_->Close();
}

}  // namespace kvharbor
