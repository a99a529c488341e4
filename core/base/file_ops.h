// FileOps: the file system calls the disk tier writes through, as a
// replaceable interface so tests can inject faults (disk full, I/O errors,
// failed renames) where they really happen instead of faking a whole tier.
//
// The methods mirror POSIX: they return what the system call returns (-1
// with errno set on failure), so the disk tier's error handling is the same
// for real and injected faults. RealFileOps() forwards to the system calls;
// DiskTier uses it unless NamespaceConfig::file_ops says otherwise.
//
// WriteFileAtomically and ReadWholeFile are the disk tier's and the
// persisted calibrations' (core/calibration/calibration_store.h) one way to
// write and read a whole file.
//
// Memory: stateless for the real implementation; a FileOps is shared
// (std::shared_ptr) by the tiers that use it. Thread-safe: implementations
// must allow concurrent calls (the real one is; test doubles use atomics or
// a mutex).
#ifndef KVHARBOR_CORE_BASE_FILE_OPS_H_
#define KVHARBOR_CORE_BASE_FILE_OPS_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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
  // Not pure: test doubles that inject no fault here need not forward it.
  virtual int Fchmod(int fd, mode_t mode) const;
};

// The process-wide real implementation (never null, never destroyed).
const std::shared_ptr<const FileOps>& RealFileOps();

// Writes `bytes` to `path` in directory `dir` through `ops`: temp file
// (path + ".tmp", mode 0600 whatever the umask: page bytes and calibrations
// are the daemon's alone), fsync, rename, fsync of the directory, so a crash
// leaves the old file or the new one. On error the temp file is removed;
// Internal naming the call and the path.
absl::Status WriteFileAtomically(const FileOps& ops, const std::string& dir,
                                 const std::string& path,
                                 absl::string_view bytes);

// Creates directory `dir` with mode 0700 whatever the umask; an existing
// directory is left as it is. Returns 0 or -1 with errno (EEXIST is not an
// error).
int MakePrivateDirectory(const std::string& dir);

// Reads all of `fd` and closes it (reads use the system calls directly).
// DataLoss naming `what` on a read error.
absl::StatusOr<std::string> ReadAllAndClose(int fd, absl::string_view what);

// The entry names of `dir` (empty when it cannot be read).
std::vector<std::string> ListDirectory(const std::string& dir);
// The number of a file named `prefix` + hex digits + `suffix`; false for
// any other name.
bool ParseHexFileName(absl::string_view name, absl::string_view prefix,
                      absl::string_view suffix, uint64_t* id);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_BASE_FILE_OPS_H_
