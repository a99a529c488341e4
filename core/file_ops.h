// FileOps: the file system calls the disk tier writes through, as a
// replaceable interface so tests can inject faults (disk full, I/O errors,
// failed renames) where they really happen instead of faking a whole tier.
//
// The methods mirror POSIX: they return what the system call returns (-1
// with errno set on failure), so the disk tier's error handling is the same
// for real and injected faults. RealFileOps() forwards to the system calls;
// DiskTier uses it unless NamespaceConfig::file_ops says otherwise.
//
// Memory: stateless for the real implementation; a FileOps is shared
// (std::shared_ptr) by the tiers that use it. Thread-safe: implementations
// must allow concurrent calls (the real one is; test doubles use atomics or
// a mutex).
#ifndef KVHARBOR_CORE_FILE_OPS_H_
#define KVHARBOR_CORE_FILE_OPS_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>

namespace kvharbor {

class FileOps {
 public:
  virtual ~FileOps() = default;
  virtual int Open(const char* path, int flags, mode_t mode) const = 0;
  virtual ssize_t Write(int fd, const void* data, size_t n) const = 0;
  virtual int Fsync(int fd) const = 0;
  virtual int Close(int fd) const = 0;
  virtual int Rename(const char* from, const char* to) const = 0;
  virtual int Unlink(const char* path) const = 0;
};

// The process-wide real implementation (never null, never destroyed).
const std::shared_ptr<const FileOps>& RealFileOps();

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_FILE_OPS_H_
