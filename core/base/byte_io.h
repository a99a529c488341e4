// Little-endian byte cursors for kvharbor's own binary files (KVCM compressor
// weights, CommVQ codebooks) and whole-file read/write helpers.
//
// ByteReader reads fixed-size little-endian values and float arrays from a
// caller-owned span and never reads past its end: a short read returns an
// InvalidArgument status naming the field, its offset and what was left.
// ByteWriter appends to a std::string it owns. Both are plain cursors (not
// thread-safe; use one per thread); the file helpers are thread-safe.
#ifndef KVHARBOR_CORE_BASE_BYTE_IO_H_
#define KVHARBOR_CORE_BASE_BYTE_IO_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvharbor {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "kvharbor's binary formats assume a little-endian host");

class ByteReader {
 public:
  // `what` prefixes every error ("kvcm file", "commvq codebook file").
  ByteReader(absl::Span<const uint8_t> bytes, absl::string_view what)
      : bytes_(bytes), what_(what) {}

  uint64_t offset() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }
  const uint8_t* cursor() const { return bytes_.data() + pos_; }

  // Fails (naming `field`) unless `n` more bytes are available.
  absl::Status Need(uint64_t n, absl::string_view field) const;
  // Skips `n` bytes (checked like Need).
  absl::Status Skip(uint64_t n, absl::string_view field);

  template <typename T>
  absl::Status Read(T* out, absl::string_view field) {
    static_assert(std::is_trivially_copyable<T>::value, "plain values only");
    const absl::Status s = Need(sizeof(T), field);
    if (!s.ok()) return s;
    std::memcpy(out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  // Reads `count` little-endian float32 values; the size is checked before
  // anything is allocated, so a huge count in a small file is refused cheaply.
  absl::Status ReadFloats(uint64_t count, std::vector<float>* out,
                          absl::string_view field);

 private:
  absl::Span<const uint8_t> bytes_;
  std::string what_;
  uint64_t pos_ = 0;
};

class ByteWriter {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable<T>::value, "plain values only");
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void PutBytes(const void* data, size_t n) {
    out_.append(static_cast<const char*>(data), n);
  }
  void PutFloats(absl::Span<const float> v) {
    PutBytes(v.data(), v.size() * sizeof(float));
  }
  size_t size() const { return out_.size(); }
  std::string& bytes() { return out_; }
  std::string Release() { return std::move(out_); }

 private:
  std::string out_;
};

// Unaligned little-endian store and load of a plain value at p + offset, for
// fixed-layout headers (the codec envelope, KVTC range records).
template <typename T>
inline void StoreLe(uint8_t* p, size_t offset, T v) {
  static_assert(std::is_trivially_copyable<T>::value, "plain values only");
  std::memcpy(p + offset, &v, sizeof(T));
}
template <typename T>
inline T LoadLe(const uint8_t* p, size_t offset) {
  static_assert(std::is_trivially_copyable<T>::value, "plain values only");
  T v;
  std::memcpy(&v, p + offset, sizeof(T));
  return v;
}

// a * b and a + b, true on 64-bit overflow.
inline bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
inline bool AddOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

// Whole file into memory. NotFound when it cannot be opened, OutOfRange when
// it is larger than `max_bytes` (checked before reading).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path,
                                          uint64_t max_bytes);
// Writes `bytes` to `path` through a temporary file in the same directory and
// a rename, so readers never see a half-written file.
absl::Status WriteWholeFile(const std::string& path, absl::string_view bytes);
// WriteWholeFile of a serializer's result (its error is returned as it is).
absl::Status WriteSerialized(const std::string& path,
                             const absl::StatusOr<std::string>& bytes);

inline absl::Span<const uint8_t> AsBytes(absl::string_view s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()),
                             s.size());
}

// The checks a binary header of one of kvharbor's formats starts with:
// InvalidArgument "<what>: <field>: <version> is not supported (this build
// reads <supported>)" unless version == supported; InvalidArgument
// "<what>: <field>: <value>, want <want>" unless value == want (sizes the
// format fixes).
absl::Status CheckFormatVersion(absl::string_view what, absl::string_view field,
                                uint64_t version, uint64_t supported);
absl::Status CheckFixedField(absl::string_view what, absl::string_view field,
                             uint64_t value, uint64_t want);

// `status` with "<prefix>: " before its message, same code (OK stays OK).
absl::Status PrefixStatus(absl::string_view prefix, const absl::Status& status);

// ReadWholeFile(path, max_bytes), then parse(AsBytes(contents)); the
// parser's errors are prefixed with the path (PrefixStatus).
template <typename Parse>
auto ParseWholeFile(const std::string& path, uint64_t max_bytes, Parse&& parse)
    -> decltype(parse(absl::Span<const uint8_t>())) {
  absl::StatusOr<std::string> bytes = ReadWholeFile(path, max_bytes);
  if (!bytes.ok()) return bytes.status();
  auto parsed = parse(AsBytes(*bytes));
  if (!parsed.ok()) return PrefixStatus(path, parsed.status());
  return parsed;
}

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_BASE_BYTE_IO_H_
