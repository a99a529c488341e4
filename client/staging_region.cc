// client::StagingRegion (include/kvharbor/staging_region.h): the memfd, its
// seal and mapping, and the registration on the daemon's staging socket
// (types/staging_wire.h).
#include "kvharbor/staging_region.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "types/host_ipc_wire.h"
#include "types/staging_wire.h"

namespace kvharbor {
namespace client {

namespace {

// The daemon answers at once; a peer that does not is not a daemon.
constexpr int kGrantMillis = 5000;

// Writes every page of [p, p + bytes) once, on up to 8 threads: a new
// memfd's pages are allocated (and zeroed) by the kernel on first touch, at
// about 1-2 GB/s per thread; done here in parallel, the daemon's mapping
// (MAP_POPULATE) and CUDA's registration then find them all present.
void Touch(uint8_t* p, uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const auto touch = [&](uint64_t begin, uint64_t end) {
    for (uint64_t at = begin; at < end; at += page) p[at] = 0;
  };
  const unsigned threads = static_cast<unsigned>(std::clamp<uint64_t>(
      bytes / (uint64_t{64} << 20), 1,
      std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
  std::vector<std::thread> workers;
  const uint64_t pages = (bytes + page - 1) / page;
  for (unsigned w = 1; w < threads; ++w) {
    workers.emplace_back(touch, pages * w / threads * page,
                         std::min(bytes, pages * (w + 1) / threads * page));
  }
  touch(0, std::min(bytes, pages / threads * page));
  for (std::thread& t : workers) t.join();
}

std::string Errno(int err) { return std::strerror(err); }

absl::StatusOr<int> Connect(absl::string_view path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket_path: '", path, "' is empty or too long for a Unix socket"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return absl::UnavailableError(absl::StrCat("socket: ", Errno(errno)));
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) !=
      0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat(
        "socket_path: cannot connect to the staging socket '", path,
        "' (the daemon is on another host or serves none): ", Errno(err)));
  }
  return fd;
}

// Sends the register with `memfd` attached and reads the grant.
absl::StatusOr<StagingGrant> Exchange(int conn, int memfd, uint64_t bytes) {
  StagingRegister req{};
  std::memcpy(req.magic, kStagingMagic, sizeof(req.magic));
  req.version = kStagingVersion;
  req.bytes = bytes;
  HostIpcMessage m(&req, sizeof(req));
  m.AttachFd(memfd);
  if (sendmsg(conn, &m.msg, MSG_NOSIGNAL) !=
      static_cast<ssize_t>(sizeof(req))) {
    return absl::UnavailableError(
        absl::StrCat("staging: cannot send the register: ", Errno(errno)));
  }
  StagingGrant grant{};
  size_t got = 0;
  while (got < sizeof(grant)) {
    pollfd p{conn, POLLIN, 0};
    if (poll(&p, 1, kGrantMillis) <= 0) {
      return absl::DeadlineExceededError(
          "staging: the daemon did not answer the register");
    }
    const ssize_t n = recv(conn, reinterpret_cast<char*>(&grant) + got,
                           sizeof(grant) - got, 0);
    if (n <= 0) {
      return absl::UnavailableError(
          "staging: the daemon closed the connection before its answer");
    }
    got += static_cast<size_t>(n);
  }
  if (std::memcmp(grant.magic, kStagingMagic, sizeof(grant.magic)) != 0 ||
      grant.version != kStagingVersion) {
    return absl::UnavailableError(
        "staging: the socket's answer is not a StagingGrant of this version");
  }
  if (grant.code != 0) {
    grant.error[sizeof(grant.error) - 1] = '\0';
    const int code = grant.code;
    return absl::Status(
        code > 0 && code <= 16 ? static_cast<absl::StatusCode>(code)
                               : absl::StatusCode::kUnknown,
        absl::StrCat("staging: the daemon refused the region: ", grant.error));
  }
  return grant;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagingRegion>> StagingRegion::Create(
    absl::string_view socket_path, uint64_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("bytes: 0; a staging region holds bytes");
  }
  const int memfd =
      memfd_create("kvharbor-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("staging: memfd_create: ", Errno(errno)));
  }
  void* p = MAP_FAILED;
  if (ftruncate(memfd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0 ||
      (p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd,
                0)) == MAP_FAILED) {
    const int err = errno;
    close(memfd);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "bytes: cannot make a %u-byte staging region: %s", bytes, Errno(err)));
  }
  Touch(static_cast<uint8_t*>(p), bytes);
  absl::StatusOr<int> conn = Connect(socket_path);
  std::unique_ptr<StagingRegion> r(
      new StagingRegion(static_cast<uint8_t*>(p), bytes, memfd,
                        conn.ok() ? *conn : -1, std::string(socket_path)));
  if (!conn.ok()) return conn.status();
  absl::StatusOr<StagingGrant> grant = Exchange(*conn, memfd, bytes);
  if (!grant.ok()) return grant.status();
  r->daemon_id_ = grant->daemon_id;
  r->id_ = grant->id;
  r->key_.assign(reinterpret_cast<const char*>(grant->key), sizeof(grant->key));
  return r;
}

StagingRegion::StagingRegion(uint8_t* data, uint64_t bytes, int memfd, int conn,
                             std::string socket_path)
    : data_(data),
      bytes_(bytes),
      memfd_(memfd),
      conn_(conn),
      socket_path_(std::move(socket_path)) {}

StagingRegion::~StagingRegion() {
  // Closing the connection unregisters the region on the daemon.
  if (conn_ >= 0) close(conn_);
  munmap(data_, bytes_);
  close(memfd_);
}

}  // namespace client
}  // namespace kvharbor
