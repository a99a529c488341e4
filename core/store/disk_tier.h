// DiskTier: the disk tier of one namespace, one file per compressed page.
//
// Each file holds one codec buffer plus what a warm restart needs to put the
// page back into the index without any other state: the token ids of the
// page's whole prefix (root through the end of the page), the page's first
// position, the codec name and the calibration fingerprint. The file ends in
// an XXH3-64 checksum of everything before it. Files are written atomically
// (temp file, fsync, rename, fsync of the directory), so a crash leaves the
// old state or the new one, never a torn file under a page's name; leftover
// temp files are deleted by Scan.
//
// File layout (little-endian; docs/tiers.md):
//   "KVHPAGE1" u32 version=1 u32 codec_len codec[codec_len]
//   u64 calibration_fingerprint u64 first_position u64 num_tokens
//   i32 tokens[num_tokens] u64 buffer_len buffer[buffer_len] u64 xxh3
//
// Every write-side file system call (open for writing, write, fsync, close,
// rename, unlink) goes through a FileOps (core/base/file_ops.h), so tests can
// make the disk full or failing; reads use the system calls directly.
//
// Memory: a DiskTier owns its directory name and shares its FileOps.
// DiskPage values own their bytes. Thread-safe: every method works on distinct
// files or is read-only; the owning Namespace hands out file ids, so no two
// writers share a file.
#ifndef KVHARBOR_CORE_STORE_DISK_TIER_H_
#define KVHARBOR_CORE_STORE_DISK_TIER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/file_ops.h"
#include "core/index/radix_index.h"

namespace kvharbor {

struct DiskPage {
  std::string codec;
  uint64_t calibration_fingerprint = 0;
  uint64_t first_position = 0;
  std::vector<Token> tokens;  // the whole prefix through this page
  std::string buffer;         // the codec buffer
};

// Serialises / parses the file format above. Parse checks every size before
// reading and the trailing checksum before returning (DataLoss on mismatch).
std::string SerializeDiskPage(const DiskPage& page);
absl::StatusOr<DiskPage> ParseDiskPage(absl::string_view bytes);

class DiskTier {
 public:
  // Creates `dir` when missing (one level). Errors name `field`. `ops`
  // null means RealFileOps().
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(
      std::string dir, absl::string_view field,
      std::shared_ptr<const FileOps> ops = nullptr);

  const std::string& dir() const { return dir_; }
  std::string PathOf(uint64_t id) const;

  // Writes page `id` atomically. On any error (disk full, I/O, directory
  // gone) the temp file is removed and no file named for `id` exists.
  absl::Status Write(uint64_t id, const DiskPage& page) const;
  // Opens page `id` for a later ReadOpened (cheap: callers hold a lock
  // while opening so the file cannot be removed between lookup and open).
  absl::StatusOr<int> OpenPage(uint64_t id) const;
  // Reads, verifies and closes `fd`.
  static absl::StatusOr<DiskPage> ReadOpened(int fd);
  // Removes page `id`'s file; a missing file is not an error.
  void Remove(uint64_t id) const;

  struct ScanResult {
    std::vector<std::pair<uint64_t, DiskPage>> pages;  // verified
    std::vector<std::string> dropped;  // one log line per removed file
    uint64_t max_id = 0;
  };
  // Reads and verifies every page file; a corrupt or unreadable one is
  // removed (never served) and reported in `dropped`, as are temp files.
  ScanResult Scan() const;

 private:
  DiskTier(std::string dir, std::shared_ptr<const FileOps> ops)
      : dir_(std::move(dir)), ops_(std::move(ops)) {}
  std::string dir_;
  std::shared_ptr<const FileOps> ops_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_DISK_TIER_H_
