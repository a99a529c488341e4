#include "kvharbor/host_ipc.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <xxhash.h>  // the library's XXH3 (not xxh3.h's inlined copy)
#if defined(__x86_64__)
// libxxhash's runtime dispatch (AVX2/AVX-512 where the CPU has them, about
// 4x the baseline SSE2 XXH3 here); same hash values. Called by name only.
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "types/host_ipc_wire.h"

namespace kvharbor {
namespace client {

namespace {

constexpr size_t kMaxPath = sizeof(sockaddr_un{}.sun_path) - 1;

// Closes a descriptor on every path out of Connect.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

absl::Status Unavailable(const std::string& path, absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(
      "socket_path: '", path, "' (the daemon's host IPC socket): ", what));
}

// One recvmsg of the greeting and its descriptor.
absl::Status Receive(int sock, const std::string& path, HostIpcGreeting* g,
                     Fd* fd) {
  HostIpcMessage m(g);
  msghdr& msg = m.msg;
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  } while (n < 0 && errno == EINTR);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(sizeof(int))) {
      std::memcpy(&fd->fd, CMSG_DATA(c), sizeof(int));
    }
  }
  if (n != static_cast<ssize_t>(sizeof(*g)) ||
      std::memcmp(g->magic, kHostIpcMagic, sizeof(kHostIpcMagic)) != 0 ||
      g->version != kHostIpcVersion) {
    return Unavailable(path, "no kvharbor arena greeting");
  }
  if (fd->fd < 0 || (msg.msg_flags & MSG_CTRUNC) != 0) {
    return Unavailable(path, "the greeting carried no descriptor");
  }
  return absl::OkStatus();
}

// Copies in pieces small enough to stay in the core's cache and hashes each
// piece of the DESTINATION right after copying it: the copy is what the
// caller gets, so the copy is what is checked (a slot reused during or
// before the copy cannot slip through), and the hash reads cache instead
// of memory. Equal to XXH3_64bits(dst, n).
constexpr size_t kCopyPiece = 64 << 10;

uint64_t CopyAndHash(uint8_t* dst, const uint8_t* src, size_t n,
                     XXH3_state_t* state) {
  XXH3_64bits_reset(state);
  for (size_t off = 0; off < n; off += kCopyPiece) {
    const size_t len = std::min(kCopyPiece, n - off);
    std::memcpy(dst + off, src + off, len);
#if defined(__x86_64__)
    XXH3_64bits_update_dispatch(state, dst + off, len);
#else
    XXH3_64bits_update(state, dst + off, len);
#endif
  }
  return XXH3_64bits_digest(state);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const HostArenaMapping>>
HostArenaMapping::Connect(const std::string& path, uint64_t daemon_id,
                          uint64_t arena_bytes) {
  if (path.empty() || path.size() > kMaxPath) {
    return Unavailable(path, "not a usable Unix socket path");
  }
  Fd sock{socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (sock.fd < 0) return Unavailable(path, std::strerror(errno));
  // The daemon answers at once; a stuck peer must not hang a Fetch.
  timeval tv{2, 0};
  setsockopt(sock.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (connect(sock.fd, reinterpret_cast<const sockaddr*>(&addr),
              sizeof(addr)) != 0) {
    return Unavailable(path, std::strerror(errno));
  }
  HostIpcGreeting g{};
  Fd arena;
  if (absl::Status s = Receive(sock.fd, path, &g, &arena); !s.ok()) return s;
  if (g.daemon_id != daemon_id) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "daemon_id: the socket '%s' is served by daemon %016x, not by %016x "
        "that answered GetHostHandles (another or a restarted daemon)",
        path, g.daemon_id, daemon_id));
  }
  struct stat st {};
  if (g.arena_bytes != arena_bytes || fstat(arena.fd, &st) != 0 ||
      static_cast<uint64_t>(st.st_size) < arena_bytes) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "arena_bytes: the daemon said %u, its socket %u and the descriptor "
        "holds %d",
        arena_bytes, g.arena_bytes, static_cast<int64_t>(st.st_size)));
  }
  void* p = mmap(nullptr, arena_bytes, PROT_READ, MAP_SHARED, arena.fd, 0);
  if (p == MAP_FAILED) {
    return Unavailable(
        path, absl::StrCat("cannot map the arena: ", std::strerror(errno)));
  }
  return std::shared_ptr<const HostArenaMapping>(new HostArenaMapping(
      static_cast<const uint8_t*>(p), arena_bytes, daemon_id));
}

HostArenaMapping::~HostArenaMapping() {
  munmap(const_cast<uint8_t*>(data_), bytes_);
}

HostIpc& HostIpc::Default() {
  static HostIpc* ipc = new HostIpc();  // never destroyed: used at exit
  return *ipc;
}

absl::StatusOr<std::shared_ptr<const HostArenaMapping>> HostIpc::Get(
    const HostHandles& h, bool* connected) {
  if (connected != nullptr) *connected = false;
  {
    absl::MutexLock l(&mu_);
    auto it = maps_.find(h.socket_path);
    if (it != maps_.end() && it->second->daemon_id() == h.daemon_id &&
        it->second->bytes() == h.arena_bytes) {
      return it->second;
    }
  }
  // Connected outside the lock: fetches of other daemons go on meanwhile.
  absl::StatusOr<std::shared_ptr<const HostArenaMapping>> map =
      HostArenaMapping::Connect(h.socket_path, h.daemon_id, h.arena_bytes);
  if (!map.ok()) return map.status();
  if (connected != nullptr) *connected = true;
  absl::MutexLock l(&mu_);
  maps_[h.socket_path] = *map;
  // Mappings of daemons whose socket is gone would keep their arenas'
  // memory alive for nothing; a daemon that comes back maps anew anyway.
  for (auto it = maps_.begin(); it != maps_.end();) {
    struct stat st {};
    const bool gone =
        lstat(it->first.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode);
    it = gone ? maps_.erase(it) : std::next(it);
  }
  return *map;
}

bool HostIpc::Cached(const std::string& socket_path) {
  absl::MutexLock l(&mu_);
  return maps_.count(socket_path) > 0;
}

absl::Status CopyHostPages(const HostArenaMapping& map, const HostHandles& h,
                           size_t first, size_t count,
                           const HostPageDestination& destination) {
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(
      XXH3_createState(), XXH3_freeState);
  if (state == nullptr) return absl::ResourceExhaustedError("XXH3 state");
  if (first > h.pages.size() || count > h.pages.size() - first) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pages: [%u, %u) is not within the lease's %u pages",
                        first, first + count, h.pages.size()));
  }
  for (size_t i = first; i < first + count; ++i) {
    const HostPage& p = h.pages[i];
    if (p.offset > map.bytes() || map.bytes() - p.offset < p.bytes) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "pages[%u]: offset %u + %u bytes lies outside the %u-byte arena", i,
          p.offset, p.bytes, map.bytes()));
    }
    const uint32_t index = static_cast<uint32_t>(i - first);
    absl::StatusOr<uint8_t*> dst = destination(index, p.bytes);
    if (!dst.ok()) return dst.status();
    const uint64_t got =
        CopyAndHash(*dst, map.data() + p.offset, p.bytes, state.get());
    if (got != p.checksum) {
      return absl::DataLossError(absl::StrFormat(
          "pages[%u]: page %u (handle %#x, %u bytes) copied from shared "
          "memory: checksum mismatch: the copy hashes to %#016x, the daemon "
          "said %#016x (the lease ran out and the slot was reused)",
          i, index, p.handle, p.bytes, got, p.checksum));
    }
  }
  return absl::OkStatus();
}

}  // namespace client
}  // namespace kvharbor
