// CalibrationStore: the calibrations a namespace's disk pages may reference,
// persisted in its disk_dir so that a warm restart re-indexes pages written
// with an uploaded or online calibration (or any codec other than the spec's)
// and decodes them with the calibration they were written with, and so that
// the namespace comes back with the active calibration it had.
//
// Two kinds of files, both written atomically through a FileOps
// (core/base/file_ops.h: temp file, fsync, rename, fsync of the directory) and
// both versioned and ending in an XXH3-64 checksum of everything before it
// (little-endian; docs/calibration.md "Warm restart"):
//
//   calibration-<fingerprint as 16 hex digits>.kvhcal, one per calibration:
//     "KVHCALB1" u32 version=1 u32 codec_len codec[codec_len]
//     u64 fingerprint u32 source i64 created_unix_micros
//     u64 bytes_len bytes[bytes_len] u64 xxh3
//   calibrations.kvhstate, the namespace's calibration state:
//     "KVHCALS1" u32 version=1 u32 len spec_codec u64 spec_fingerprint
//     u32 len active_codec u64 active_fingerprint u8 pinned u64 xxh3
//
// `bytes` are the codec's canonical calibration bytes (core/
// codec_calibrations.h); this layer checks the envelope only; the namespace
// validates the calibration fully by building its codec and comparing the
// fingerprint. The state records the spec's codec and calibration so that a
// namespace recreated with another spec ignores it.
//
// Memory: a CalibrationStore owns its directory name and shares its FileOps;
// results own their bytes. Thread-safe as far as the file system is: callers
// serialise writers of one directory (NamespaceCalibrations::persist_mu_).
#ifndef KVHARBOR_CORE_CALIBRATION_CALIBRATION_STORE_H_
#define KVHARBOR_CORE_CALIBRATION_CALIBRATION_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/file_ops.h"

namespace kvharbor {

struct PersistedCalibration {
  std::string codec;
  uint64_t fingerprint = 0;
  uint32_t source = 0;  // Namespace::CalibrationSource
  int64_t created_unix_micros = 0;
  std::string bytes;  // canonical calibration bytes
};

struct PersistedCalibrationState {
  std::string spec_codec;  // what the namespace's spec said
  uint64_t spec_fingerprint = 0;
  std::string active_codec;  // what was active
  uint64_t active_fingerprint = 0;
  bool pinned = false;
};

// Parse checks every size before reading and the trailing checksum
// (DataLoss on any mismatch).
std::string SerializePersistedCalibration(const PersistedCalibration& cal);
absl::StatusOr<PersistedCalibration> ParsePersistedCalibration(
    absl::string_view bytes);
std::string SerializeCalibrationState(const PersistedCalibrationState& state);
absl::StatusOr<PersistedCalibrationState> ParseCalibrationState(
    absl::string_view bytes);

class CalibrationStore {
 public:
  // `dir` must exist (the disk tier created it). `ops` null: RealFileOps().
  CalibrationStore(std::string dir, std::shared_ptr<const FileOps> ops);

  std::string PathOf(uint64_t fingerprint) const;
  std::string StatePath() const;

  absl::Status Write(const PersistedCalibration& cal) const;
  absl::Status WriteState(const PersistedCalibrationState& state) const;
  // A missing file is not an error.
  void Remove(uint64_t fingerprint) const;

  struct ScanResult {
    std::vector<PersistedCalibration> calibrations;  // envelope verified
    std::optional<PersistedCalibrationState> state;
    std::vector<std::string> dropped;  // one warning per removed file
  };
  // Reads every calibration file and the state; a corrupt one (or a
  // calibration file whose name disagrees with its fingerprint) is removed
  // and reported in `dropped`, as are unfinished temp files.
  ScanResult Scan() const;

 private:
  std::string dir_;
  std::shared_ptr<const FileOps> ops_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CALIBRATION_CALIBRATION_STORE_H_
