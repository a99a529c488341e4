#include "core/base/byte_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvharbor {

absl::Status ByteReader::Need(uint64_t n, absl::string_view field) const {
  if (n <= remaining()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: %s: needs %u bytes at offset %u, but only %u remain (file is %u "
      "bytes)",
      what_, field, n, pos_, remaining(), bytes_.size()));
}

absl::Status ByteReader::Skip(uint64_t n, absl::string_view field) {
  const absl::Status s = Need(n, field);
  if (s.ok()) pos_ += n;
  return s;
}

absl::Status ByteReader::ReadFloats(uint64_t count, std::vector<float>* out,
                                    absl::string_view field) {
  if (count > remaining() / sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %s: needs %u floats at offset %u, but only %u bytes remain", what_,
        field, count, pos_, remaining()));
  }
  out->resize(count);
  std::memcpy(out->data(), bytes_.data() + pos_, count * sizeof(float));
  pos_ += count * sizeof(float);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path,
                                          uint64_t max_bytes) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  const std::streamoff size = f.tellg();
  if (size < 0)
    return absl::UnavailableError(absl::StrCat(path, ": cannot stat"));
  if (static_cast<uint64_t>(size) > max_bytes) {
    return absl::OutOfRangeError(absl::StrFormat(
        "%s: %u bytes is over the limit of %u", path, size, max_bytes));
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  f.seekg(0);
  f.read(bytes.data(), size);
  if (!f || f.gcount() != size) {
    return absl::UnavailableError(absl::StrCat(path, ": short read"));
  }
  return bytes;
}

absl::Status CheckFormatVersion(absl::string_view what, absl::string_view field,
                                uint64_t version, uint64_t supported) {
  if (version == supported) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: %s: %u is not supported (this build reads %u)", what,
                      field, version, supported));
}

absl::Status CheckFixedField(absl::string_view what, absl::string_view field,
                             uint64_t value, uint64_t want) {
  if (value == want) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: %s: %u, want %u", what, field, value, want));
}

absl::Status WriteSerialized(const std::string& path,
                             const absl::StatusOr<std::string>& bytes) {
  if (!bytes.ok()) return bytes.status();
  return WriteWholeFile(path, *bytes);
}

absl::Status PrefixStatus(absl::string_view prefix,
                          const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(prefix, ": ", status.message()));
}

absl::Status WriteWholeFile(const std::string& path, absl::string_view bytes) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return absl::UnavailableError(absl::StrCat(tmp, ": cannot open"));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      return absl::UnavailableError(absl::StrCat(tmp, ": cannot write"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": errno ", err));
  }
  return absl::OkStatus();
}

}  // namespace kvharbor
