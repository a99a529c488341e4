// Encode/Decode of the bulk data plane's handshake (types/bulk_wire.h).
#include "types/bulk_wire.h"

#include <algorithm>
#include <cstring>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"

namespace kvharbor {

namespace {

constexpr char kHelloMagic[8] = {'K', 'V', 'H', 'B', 'U', 'L', 'K', 'H'};
constexpr char kAcceptMagic[8] = {'K', 'V', 'H', 'B', 'U', 'L', 'K', 'A'};

absl::Status CheckHeader(absl::Span<const uint8_t> bytes, size_t size,
                         const char (&magic)[8], const char* what) {
  if (bytes.size() != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", bytes.size(), " bytes, expected ", size));
  }
  if (std::memcmp(bytes.data(), magic, 8) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".magic: not a kvharbor bulk data plane peer"));
  }
  const uint32_t version = absl::little_endian::Load32(bytes.data() + 8);
  if (version != kBulkVersion) {
    return absl::InvalidArgumentError(absl::StrCat(what, ".version: ", version,
                                                   " (this build speaks ",
                                                   kBulkVersion, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

std::array<uint8_t, kBulkHelloBytes> EncodeBulkHello(const BulkHello& h) {
  std::array<uint8_t, kBulkHelloBytes> out{};
  std::memcpy(out.data(), kHelloMagic, 8);
  absl::little_endian::Store32(out.data() + 8, h.version);
  absl::little_endian::Store32(out.data() + 12, h.index);
  absl::little_endian::Store32(out.data() + 16, h.connections);
  std::memcpy(out.data() + 20, h.token.data(), kBulkTokenBytes);
  return out;
}

absl::StatusOr<BulkHello> DecodeBulkHello(absl::Span<const uint8_t> bytes) {
  if (absl::Status s =
          CheckHeader(bytes, kBulkHelloBytes, kHelloMagic, "bulk hello");
      !s.ok()) {
    return s;
  }
  BulkHello h;
  h.index = absl::little_endian::Load32(bytes.data() + 12);
  h.connections = absl::little_endian::Load32(bytes.data() + 16);
  if (h.connections == 0 || h.connections > kBulkMaxConnections) {
    return absl::InvalidArgumentError(
        absl::StrCat("bulk hello.connections: ", h.connections, " is not 1 to ",
                     kBulkMaxConnections));
  }
  if (h.index >= h.connections) {
    return absl::InvalidArgumentError(
        absl::StrCat("bulk hello.index: ", h.index,
                     " is not below connections (", h.connections, ")"));
  }
  std::memcpy(h.token.data(), bytes.data() + 20, kBulkTokenBytes);
  return h;
}

std::array<uint8_t, kBulkAcceptBytes> EncodeBulkAccept(const BulkAccept& a) {
  std::array<uint8_t, kBulkAcceptBytes> out{};
  std::memcpy(out.data(), kAcceptMagic, 8);
  absl::little_endian::Store32(out.data() + 8, kBulkVersion);
  absl::little_endian::Store32(out.data() + 12, static_cast<uint32_t>(a.code));
  std::memcpy(out.data() + 16, a.error.data(),
              std::min(a.error.size(), kBulkErrorBytes));
  return out;
}

absl::StatusOr<BulkAccept> DecodeBulkAccept(absl::Span<const uint8_t> bytes) {
  if (absl::Status s =
          CheckHeader(bytes, kBulkAcceptBytes, kAcceptMagic, "bulk accept");
      !s.ok()) {
    return s;
  }
  BulkAccept a;
  a.code = static_cast<int32_t>(absl::little_endian::Load32(bytes.data() + 12));
  const char* text = reinterpret_cast<const char*>(bytes.data() + 16);
  a.error.assign(text, strnlen(text, kBulkErrorBytes));
  return a;
}

}  // namespace kvharbor
