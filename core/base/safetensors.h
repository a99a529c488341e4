// A small reader and writer for the safetensors format
// (https://github.com/huggingface/safetensors), enough for loading
// quantization parameters (core/codec/c8/int8_c8_codec.h) from model weight
// files.
//
// File layout: u64 little-endian N, then N bytes of UTF-8 JSON (an object
// mapping tensor name -> {"dtype", "shape", "data_offsets": [begin, end]},
// plus an optional "__metadata__" object of string -> string), then the
// data section. Offsets are relative to the data section.
//
// The parser checks everything the reference implementation checks, and a
// little more, before any tensor byte is read:
//   * N >= 2, N <= kMaxSafetensorsHeaderBytes, 8 + N <= file size;
//   * the JSON (parsed with nlohmann-json) is one object, with no duplicate
//     keys at any level and nesting at most 3 deep;
//   * each tensor entry has exactly the keys dtype (a known dtype name),
//     shape (array of unsigned integers) and data_offsets (two unsigned
//     integers, begin <= end);
//   * end - begin == product(shape) * dtype size, computed without overflow;
//   * sorted by begin, the tensors tile the data section exactly: the first
//     begins at 0, each begins where the previous ends (no gap, no overlap),
//     the last ends at the end of the file;
//   * __metadata__, when present, is an object of strings.
// Every error is InvalidArgument and names the field, e.g.
// "safetensors header: tensors['a.b'].data_offsets: ...".
//
// Memory: SafetensorsFile owns the parsed header; a file opened from a path
// keeps no descriptor open and reads tensor bytes on demand (so a large
// weight file is never loaded whole); one made from bytes owns a copy.
// Thread-safety: a SafetensorsFile is immutable after creation; its const
// methods may be called concurrently.
#ifndef KVHARBOR_CORE_BASE_SAFETENSORS_H_
#define KVHARBOR_CORE_BASE_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvharbor {

// The reference implementation's header limit.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

enum class StDType {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kF16,
  kBF16,
  kU32,
  kI32,
  kF32,
  kF64,
  kI64,
  kU64,
  kF8E4M3,
  kF8E5M2,
};
// Name as written in the header ("F32", "BF16", "F8_E4M3", ...).
absl::string_view StDTypeName(StDType dtype);
absl::StatusOr<StDType> ParseStDType(absl::string_view name);
size_t StDTypeSize(StDType dtype);

struct SafetensorsTensor {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<uint64_t> shape;  // empty = scalar (one element)
  uint64_t begin = 0;           // offsets in the data section
  uint64_t end = 0;
  uint64_t num_elements = 0;
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;  // 8 + N: where the data section starts
  uint64_t data_bytes = 0;   // size of the data section
  std::vector<SafetensorsTensor> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;

  // nullptr when absent.
  const SafetensorsTensor* Find(absl::string_view name) const;
};

// Parses and checks the JSON header `json` (the N bytes after the length)
// for a data section of `data_bytes` bytes.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json,
                                                         uint64_t data_bytes);

class SafetensorsFile {
 public:
  // Reads and checks only the header; tensor bytes are read by ReadTensor.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  // A whole file held in memory (tests, fuzzing, small files).
  static absl::StatusOr<SafetensorsFile> FromBytes(std::string bytes);

  const SafetensorsHeader& header() const { return *header_; }

  // Raw little-endian bytes of tensor `name`. NotFound for an unknown name.
  absl::StatusOr<std::string> ReadTensorBytes(absl::string_view name) const;
  // Elements of a floating-point tensor (F32, F16, BF16, F64) as float32.
  // F64 values outside the float range become +-inf (callers validate).
  // InvalidArgument for other dtypes.
  absl::StatusOr<std::vector<float>> ReadTensorAsFloat(
      absl::string_view name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;                          // empty for FromBytes
  std::shared_ptr<const std::string> bytes_;  // FromBytes only
  uint64_t file_size_ = 0;
  std::shared_ptr<const SafetensorsHeader> header_;
};

// ---- Writer.
struct SafetensorsTensorData {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<uint64_t> shape;
  std::string data;  // raw little-endian element bytes
};

// Serializes tensors in the given order (offsets contiguous from 0) with the
// header padded with spaces to a multiple of 8 bytes, as the reference
// writer does. Checks names (non-empty, unique, not "__metadata__") and that
// each data size matches its shape and dtype.
absl::StatusOr<std::string> SerializeSafetensors(
    absl::Span<const SafetensorsTensorData> tensors,
    const std::map<std::string, std::string>& metadata);
absl::Status WriteSafetensorsFile(
    const std::string& path, absl::Span<const SafetensorsTensorData> tensors,
    const std::map<std::string, std::string>& metadata);

// Convenience for writers: float32 values as F32, F16 or BF16 bytes
// (round to nearest even). InvalidArgument for other dtypes.
absl::StatusOr<std::string> EncodeFloatTensor(absl::Span<const float> values,
                                              StDType dtype);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_BASE_SAFETENSORS_H_
