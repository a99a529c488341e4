#include "core/memory/host_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace kvharbor {

absl::StatusOr<std::shared_ptr<HostArena>> HostArena::Create(
    uint64_t bytes, const char* field) {
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: a shared host arena needs > 0 bytes", field));
  }
  const long page = sysconf(_SC_PAGESIZE);
  const uint64_t align = page > 0 ? static_cast<uint64_t>(page) : 4096;
  if (bytes > UINT64_MAX - align) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %u bytes is too large", field, bytes));
  }
  bytes = (bytes + align - 1) / align * align;
  const int fd = memfd_create("kvharbor-host-arena", MFD_CLOEXEC);
  if (fd < 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: memfd_create failed: %s", field, std::strerror(errno)));
  }
  // ftruncate only sets the size: tmpfs commits pages as they are written.
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: cannot size the shared host arena to %u bytes: %s",
                        field, bytes, std::strerror(err)));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: cannot map the shared host arena of %u bytes: %s",
                        field, bytes, std::strerror(err)));
  }
  return std::shared_ptr<HostArena>(
      new HostArena(fd, static_cast<uint8_t*>(p), bytes, align));
}

HostArena::HostArena(int fd, uint8_t* base, uint64_t bytes, uint64_t align)
    : fd_(fd),
      base_(base),
      bytes_(bytes),
      ranges_(bytes, align, "the shared host arena") {}

HostArena::~HostArena() {
  munmap(base_, bytes_);
  close(fd_);
}

absl::StatusOr<uint64_t> HostArena::Take(uint64_t n) {
  if (n == 0 || n > bytes_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the shared host arena of %u bytes cannot hold %u bytes", bytes_, n));
  }
  return ranges_.Take(n);
}

void HostArena::Give(uint64_t offset, uint64_t n) {
  n = ranges_.Round(n);
  // Return the memory now: a deleted namespace must not keep its pages
  // committed in the file (munmap would not free shared file pages). A
  // failure only leaves the memory committed until it is reused.
  fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            static_cast<off_t>(offset), static_cast<off_t>(n));
  ++generation_;
  ranges_.Give(offset, n);
}

}  // namespace kvharbor
