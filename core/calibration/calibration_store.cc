#include "core/calibration/calibration_store.h"

#include <xxh3.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/byte_io.h"
#include "core/base/status_macros.h"

namespace kvharbor {

namespace {

constexpr char kCalMagic[8] = {'K', 'V', 'H', 'C', 'A', 'L', 'B', '1'};
constexpr char kStateMagic[8] = {'K', 'V', 'H', 'C', 'A', 'L', 'S', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxCodecName = 64;
constexpr char kPrefix[] = "calibration-";
constexpr char kSuffix[] = ".kvhcal";
constexpr char kStateName[] = "calibrations.kvhstate";
constexpr char kTmpSuffix[] = ".tmp";
// Far above any calibration a namespace accepts (an 8192-feature KVTC
// basis pair is 512 MiB); only guards the read of a damaged size.
constexpr uint64_t kMaxFileBytes = uint64_t{8} << 30;

void PutString(ByteWriter* w, const std::string& s) {
  w->Put<uint32_t>(static_cast<uint32_t>(s.size()));
  w->PutBytes(s.data(), s.size());
}

absl::Status ReadString(ByteReader* r, absl::string_view field,
                        std::string* out) {
  uint32_t len = 0;
  KVH_RETURN_IF_ERROR(r->Read(&len, field));
  if (len > kMaxCodecName) {
    return absl::DataLossError(absl::StrCat(field, ": length ", len));
  }
  KVH_RETURN_IF_ERROR(r->Need(len, field));
  out->assign(reinterpret_cast<const char*>(r->cursor()), len);
  return r->Skip(len, field);
}

std::string Seal(ByteWriter w) {
  w.Put<uint64_t>(XXH3_64bits(w.bytes().data(), w.size()));
  return w.Release();
}

// Checks size, checksum, magic and version; returns a reader of the body
// past the version.
absl::StatusOr<ByteReader> Open(absl::string_view bytes, const char* magic,
                                absl::string_view what) {
  if (bytes.size() < 8 + sizeof(uint32_t) + sizeof(uint64_t)) {
    return absl::DataLossError(
        absl::StrCat(what, ": ", bytes.size(), " bytes is too short"));
  }
  const size_t body = bytes.size() - sizeof(uint64_t);
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + body, sizeof(stored));
  if (XXH3_64bits(bytes.data(), body) != stored) {
    return absl::DataLossError(absl::StrCat(what, ": checksum mismatch"));
  }
  if (std::memcmp(bytes.data(), magic, 8) != 0) {
    return absl::DataLossError(absl::StrCat(what, ": bad magic"));
  }
  ByteReader r(AsBytes(bytes.substr(0, body)), what);
  KVH_RETURN_IF_ERROR(r.Skip(8, "magic"));
  uint32_t version = 0;
  KVH_RETURN_IF_ERROR(r.Read(&version, "version"));
  if (version != kVersion) {
    return absl::DataLossError(
        absl::StrCat(what, ": version ", version, " unsupported"));
  }
  return r;
}

}  // namespace

std::string SerializePersistedCalibration(const PersistedCalibration& cal) {
  ByteWriter w;
  w.PutBytes(kCalMagic, sizeof(kCalMagic));
  w.Put<uint32_t>(kVersion);
  PutString(&w, cal.codec);
  w.Put<uint64_t>(cal.fingerprint);
  w.Put<uint32_t>(cal.source);
  w.Put<int64_t>(cal.created_unix_micros);
  w.Put<uint64_t>(cal.bytes.size());
  w.PutBytes(cal.bytes.data(), cal.bytes.size());
  return Seal(std::move(w));
}

absl::StatusOr<PersistedCalibration> ParsePersistedCalibration(
    absl::string_view bytes) {
  KVH_ASSIGN_OR_RETURN(ByteReader r,
                       Open(bytes, kCalMagic, "persisted calibration"));
  PersistedCalibration cal;
  KVH_RETURN_IF_ERROR(ReadString(&r, "codec", &cal.codec));
  KVH_RETURN_IF_ERROR(r.Read(&cal.fingerprint, "fingerprint"));
  KVH_RETURN_IF_ERROR(r.Read(&cal.source, "source"));
  KVH_RETURN_IF_ERROR(r.Read(&cal.created_unix_micros, "created"));
  uint64_t len = 0;
  KVH_RETURN_IF_ERROR(r.Read(&len, "bytes_len"));
  if (len != r.remaining()) {
    return absl::DataLossError(
        "persisted calibration: bytes_len disagrees with the file size");
  }
  cal.bytes.assign(reinterpret_cast<const char*>(r.cursor()), len);
  return cal;
}

std::string SerializeCalibrationState(const PersistedCalibrationState& state) {
  ByteWriter w;
  w.PutBytes(kStateMagic, sizeof(kStateMagic));
  w.Put<uint32_t>(kVersion);
  PutString(&w, state.spec_codec);
  w.Put<uint64_t>(state.spec_fingerprint);
  PutString(&w, state.active_codec);
  w.Put<uint64_t>(state.active_fingerprint);
  w.Put<uint8_t>(state.pinned ? 1 : 0);
  return Seal(std::move(w));
}

absl::StatusOr<PersistedCalibrationState> ParseCalibrationState(
    absl::string_view bytes) {
  KVH_ASSIGN_OR_RETURN(ByteReader r,
                       Open(bytes, kStateMagic, "calibration state"));
  PersistedCalibrationState s;
  uint8_t pinned = 0;
  KVH_RETURN_IF_ERROR(ReadString(&r, "spec_codec", &s.spec_codec));
  KVH_RETURN_IF_ERROR(r.Read(&s.spec_fingerprint, "spec_fingerprint"));
  KVH_RETURN_IF_ERROR(ReadString(&r, "active_codec", &s.active_codec));
  KVH_RETURN_IF_ERROR(r.Read(&s.active_fingerprint, "active_fingerprint"));
  KVH_RETURN_IF_ERROR(r.Read(&pinned, "pinned"));
  if (pinned > 1 || r.remaining() != 0) {
    return absl::DataLossError("calibration state: malformed tail");
  }
  s.pinned = pinned == 1;
  return s;
}

CalibrationStore::CalibrationStore(std::string dir,
                                   std::shared_ptr<const FileOps> ops)
    : dir_(std::move(dir)),
      ops_(ops != nullptr ? std::move(ops) : RealFileOps()) {}

std::string CalibrationStore::PathOf(uint64_t fingerprint) const {
  return absl::StrFormat("%s/%s%016x%s", dir_, kPrefix, fingerprint, kSuffix);
}

std::string CalibrationStore::StatePath() const {
  return absl::StrCat(dir_, "/", kStateName);
}

absl::Status CalibrationStore::Write(const PersistedCalibration& cal) const {
  return WriteFileAtomically(*ops_, dir_, PathOf(cal.fingerprint),
                             SerializePersistedCalibration(cal));
}

absl::Status CalibrationStore::WriteState(
    const PersistedCalibrationState& state) const {
  return WriteFileAtomically(*ops_, dir_, StatePath(),
                             SerializeCalibrationState(state));
}

void CalibrationStore::Remove(uint64_t fingerprint) const {
  ops_->Unlink(PathOf(fingerprint).c_str());
}

CalibrationStore::ScanResult CalibrationStore::Scan() const {
  ScanResult out;
  auto drop = [&](const std::string& path, absl::string_view why) {
    ops_->Unlink(path.c_str());
    out.dropped.push_back(
        absl::StrCat("dropped persisted calibration file ", path, ": ", why));
  };
  for (const std::string& name : ListDirectory(dir_)) {
    const std::string path = absl::StrCat(dir_, "/", name);
    const bool ours = absl::StartsWith(name, kPrefix) || name == kStateName ||
                      name == absl::StrCat(kStateName, kTmpSuffix);
    if (!ours) continue;
    if (absl::EndsWith(name, kTmpSuffix)) {
      drop(path, "unfinished write");
      continue;
    }
    absl::StatusOr<std::string> bytes = ReadWholeFile(path, kMaxFileBytes);
    if (name == kStateName) {
      absl::StatusOr<PersistedCalibrationState> s =
          bytes.ok()
              ? ParseCalibrationState(*bytes)
              : absl::StatusOr<PersistedCalibrationState>(bytes.status());
      if (!s.ok()) {
        drop(path, s.status().message());
      } else {
        out.state = *std::move(s);
      }
      continue;
    }
    uint64_t fp = 0;
    if (!ParseHexFileName(name, kPrefix, kSuffix, &fp)) continue;
    absl::StatusOr<PersistedCalibration> cal =
        bytes.ok() ? ParsePersistedCalibration(*bytes)
                   : absl::StatusOr<PersistedCalibration>(bytes.status());
    if (!cal.ok()) {
      drop(path, cal.status().message());
    } else if (cal->fingerprint != fp) {
      drop(path, "its fingerprint disagrees with its name");
    } else {
      out.calibrations.push_back(*std::move(cal));
    }
  }
  return out;
}

}  // namespace kvharbor
