// HostArena: one shareable host-memory arena (a memfd) cut into namespace
// page pools, for same-host Fetch through shared memory.
//
// With store.host_ipc_socket set, the daemon makes ONE HostArena the size of
// its pool budget and every namespace's HostPagePool takes a byte range of
// it instead of mapping its own anonymous memory. The arena is a
// memfd_create file (MFD_CLOEXEC) mapped MAP_SHARED, so the server can hand
// a read-only descriptor of it to a local client
// (server/local/host_ipc_server.h, greeting in types/host_ipc_wire.h), which
// then copies leased pages straight out of it. A memfd is anonymous: it has no
// name in any file system, so nothing is left behind when the daemon dies; the
// kernel frees the memory once the last process holding the descriptor or a
// mapping lets go. Pages are committed lazily (tmpfs), like the anonymous
// mapping they replace.
//
// Sealed: once the daemon has mapped it read-write, the memfd gets mode 0400
// and the seals F_SEAL_FUTURE_WRITE (no new writable mapping, no write(),
// no hole punching: Linux 5.1 or later), F_SEAL_SHRINK and F_SEAL_GROW (a
// truncation would turn the daemon's accesses into SIGBUS) and F_SEAL_SEAL.
// So no process can write into the arena through any descriptor of it, not
// even root reopening /proc/<pid>/fd/N O_RDWR; only the daemon's own mapping,
// made before the seal, stays writable. The price: memory written into the
// arena can never be given back to the system (punching holes is a write),
// so a range given back keeps its committed pages (and their stale bytes)
// until a later pool reuses it; the arena's size bounds what it commits.
//
// Memory: the arena owns its descriptor and mapping until destroyed; pools
// cut from it hold a shared pointer, so the arena outlives them.
//
// Thread-safe: Take/Give go through a thread-safe RangeAllocator; fd(),
// base() and bytes() are immutable.
#ifndef KVHARBOR_CORE_MEMORY_HOST_ARENA_H_
#define KVHARBOR_CORE_MEMORY_HOST_ARENA_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/statusor.h"
#include "core/memory/range_allocator.h"

namespace kvharbor {

class HostArena {
 public:
  // A memfd of `bytes` (rounded up to whole system pages), mapped read-write
  // and shared, then sealed (see above). InvalidArgument naming `field` for 0
  // bytes; ResourceExhausted (with errno's text) when the file or the mapping
  // cannot be made; FailedPrecondition naming `field` when the kernel cannot
  // seal it (F_SEAL_FUTURE_WRITE needs Linux 5.1).
  static absl::StatusOr<std::shared_ptr<HostArena>> Create(
      uint64_t bytes, const char* field = "store.pool_budget_bytes");
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // The read-write memfd (owned; close-on-exec). Hand out a read-only
  // descriptor of it (open("/proc/self/fd/N", O_RDONLY)), never this one.
  int fd() const { return fd_; }
  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t free_bytes() const { return ranges_.free_bytes(); }

  // Offset of a free range of `n` bytes (first fit, page-aligned), or
  // ResourceExhausted saying how much is free.
  absl::StatusOr<uint64_t> Take(uint64_t n);
  // Gives a range back. Its memory stays committed (the seal forbids
  // punching holes) and is reused by the next pool that takes it; a client
  // mapping it may still read the old bytes there, which GetHostHandles
  // never describes as a page (and the SDK checks every copy's checksum).
  void Give(uint64_t offset, uint64_t n);
  // How many times Give took a range back (for a later pool, whose pages
  // land where the old ones were): a client that pinned parts of
  // its mapping (cudaHostRegister keeps the pages it saw) registers them
  // again when this changes (GetHostHandles reports it).
  uint64_t generation() const { return generation_.load(); }

  // The seals every arena carries (F_GET_SEALS returns at least these).
  static int RequiredSeals();

 private:
  HostArena(int fd, uint8_t* base, uint64_t bytes, uint64_t align);

  const int fd_;
  uint8_t* const base_;
  const uint64_t bytes_;
  RangeAllocator ranges_;  // aligned to the system page size
  std::atomic<uint64_t> generation_{0};
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_MEMORY_HOST_ARENA_H_
