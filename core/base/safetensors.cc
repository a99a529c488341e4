#include "core/base/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/byte_io.h"
#include "core/base/float_formats.h"
#include "core/base/status_macros.h"
#include "core/base/strict_json.h"

namespace kvharbor {
namespace {

using Json = nlohmann::json;

struct DTypeEntry {
  StDType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {StDType::kBool, "BOOL", 1},      {StDType::kU8, "U8", 1},
    {StDType::kI8, "I8", 1},          {StDType::kU16, "U16", 2},
    {StDType::kI16, "I16", 2},        {StDType::kF16, "F16", 2},
    {StDType::kBF16, "BF16", 2},      {StDType::kU32, "U32", 4},
    {StDType::kI32, "I32", 4},        {StDType::kF32, "F32", 4},
    {StDType::kF64, "F64", 8},        {StDType::kI64, "I64", 8},
    {StDType::kU64, "U64", 8},        {StDType::kF8E4M3, "F8_E4M3", 1},
    {StDType::kF8E5M2, "F8_E5M2", 1},
};

// The JSON nesting a valid header needs: object > tensor object > array >
// number. Anything deeper is refused while parsing, before it is built.
constexpr int kMaxJsonDepth = 3;

absl::Status HeaderError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors header: ", field, ": ", what));
}

absl::Status ParseShape(const Json& j, const std::string& field,
                        std::vector<uint64_t>* shape, uint64_t* elements) {
  if (!j.is_array()) return HeaderError(field, "must be an array");
  uint64_t n = 1;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_unsigned()) {
      return HeaderError(absl::StrCat(field, "[", i, "]"),
                         "must be an unsigned integer");
    }
    const uint64_t d = j[i].get<uint64_t>();
    shape->push_back(d);
    if (MulOverflows(n, d, &n)) {
      return HeaderError(field, "element count overflows 64 bits");
    }
  }
  *elements = n;
  return absl::OkStatus();
}

absl::Status ParseTensorEntry(const std::string& name, const Json& j,
                              SafetensorsTensor* t) {
  const std::string field = absl::StrCat("tensors[", QuotedName(name), "]");
  if (name.empty()) return HeaderError(field, "tensor name is empty");
  if (!j.is_object()) return HeaderError(field, "must be an object");
  for (const auto& [key, unused] : j.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return HeaderError(absl::StrCat(field, ".", QuotedName(key)),
                         "unknown key (allowed: dtype, shape, data_offsets)");
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!j.contains(key)) {
      return HeaderError(absl::StrCat(field, ".", key), "is missing");
    }
  }
  t->name = name;
  const Json& dtype = j["dtype"];
  if (!dtype.is_string()) {
    return HeaderError(field + ".dtype", "must be a string");
  }
  auto parsed = ParseStDType(dtype.get_ref<const std::string&>());
  if (!parsed.ok()) {
    return HeaderError(field + ".dtype", parsed.status().message());
  }
  t->dtype = *parsed;
  KVH_RETURN_IF_ERROR(
      ParseShape(j["shape"], field + ".shape", &t->shape, &t->num_elements));
  const Json& off = j["data_offsets"];
  const std::string off_field = field + ".data_offsets";
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned()) {
    return HeaderError(off_field, "must be [begin, end] unsigned integers");
  }
  t->begin = off[0].get<uint64_t>();
  t->end = off[1].get<uint64_t>();
  if (t->end < t->begin) {
    return HeaderError(off_field, absl::StrFormat("end %u is before begin %u",
                                                  t->end, t->begin));
  }
  uint64_t bytes = 0;
  if (MulOverflows(t->num_elements, StDTypeSize(t->dtype), &bytes)) {
    return HeaderError(field + ".shape", "byte size overflows 64 bits");
  }
  if (t->end - t->begin != bytes) {
    return HeaderError(
        off_field,
        absl::StrFormat("spans %u bytes, but shape and dtype %s need %u",
                        t->end - t->begin, StDTypeName(t->dtype), bytes));
  }
  return absl::OkStatus();
}

// Sorted by offset, the tensors must tile [0, data_bytes) exactly.
absl::Status CheckTiling(const std::vector<SafetensorsTensor>& tensors,
                         uint64_t data_bytes) {
  std::vector<const SafetensorsTensor*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
  });
  uint64_t expected = 0;
  for (const SafetensorsTensor* t : order) {
    if (t->begin != expected) {
      return HeaderError(
          absl::StrCat("tensors[", QuotedName(t->name), "].data_offsets"),
          absl::StrFormat("begins at %u, but the previous tensor ends at %u "
                          "(%s)",
                          t->begin, expected,
                          t->begin < expected ? "overlap" : "gap"));
    }
    expected = t->end;
  }
  if (expected != data_bytes) {
    return HeaderError(
        "data_offsets",
        absl::StrFormat("tensors end at %u, but the data section is %u bytes",
                        expected, data_bytes));
  }
  return absl::OkStatus();
}

float ElementAsFloat(StDType dtype, const uint8_t* p) {
  switch (dtype) {
    case StDType::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case StDType::kF16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return Fp16ToFloat(v);
    }
    case StDType::kBF16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return Bf16ToFloat(v);
    }
    default: {  // kF64, the only other dtype callers pass
      double v;
      std::memcpy(&v, p, 8);
      return static_cast<float>(v);
    }
  }
}

}  // namespace

absl::string_view StDTypeName(StDType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "unknown";
}

absl::StatusOr<StDType> ParseStDType(absl::string_view name) {
  for (const auto& e : kDTypes) {
    if (name == e.name) return e.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype ", QuotedName(name)));
}

size_t StDTypeSize(StDType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

const SafetensorsTensor* SafetensorsHeader::Find(absl::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const SafetensorsTensor& t,
                                absl::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json,
                                                         uint64_t data_bytes) {
  if (json.empty() || json[0] != '{') {
    return HeaderError("json", "must be a JSON object starting with '{'");
  }
  KVH_ASSIGN_OR_RETURN(const Json root, ParseStrictJson(json, kMaxJsonDepth,
                                                        "safetensors header"));
  if (!root.is_object()) return HeaderError("json", "must be an object");
  SafetensorsHeader h;
  h.data_offset = 8 + json.size();
  h.data_bytes = data_bytes;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        return HeaderError("__metadata__", "must be an object of strings");
      }
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return HeaderError(absl::StrCat("__metadata__[", QuotedName(mk), "]"),
                             "must be a string");
        }
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    SafetensorsTensor t;
    KVH_RETURN_IF_ERROR(ParseTensorEntry(key, value, &t));
    h.tensors.push_back(std::move(t));
  }
  KVH_RETURN_IF_ERROR(CheckTiling(h.tensors, data_bytes));
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return h;
}

namespace {

// Checks the 8-byte length prefix against the file size; returns N.
absl::StatusOr<uint64_t> CheckHeaderLength(const uint8_t* prefix,
                                           uint64_t file_size) {
  uint64_t n = 0;
  std::memcpy(&n, prefix, 8);
  if (n < 2) {
    return HeaderError("header_length",
                       absl::StrCat(n, " is too small for a JSON object"));
  }
  if (n > kMaxSafetensorsHeaderBytes) {
    return HeaderError("header_length",
                       absl::StrFormat("%u is over the limit of %u", n,
                                       kMaxSafetensorsHeaderBytes));
  }
  if (n > file_size - 8) {
    return HeaderError(
        "header_length",
        absl::StrFormat("%u runs past the end of the %u-byte file", n,
                        file_size));
  }
  return n;
}

}  // namespace

absl::StatusOr<SafetensorsFile> SafetensorsFile::FromBytes(std::string bytes) {
  if (bytes.size() < 8) {
    return HeaderError("header_length",
                       absl::StrCat("file is ", bytes.size(),
                                    " bytes, shorter than the 8-byte length"));
  }
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  KVH_ASSIGN_OR_RETURN(const uint64_t n, CheckHeaderLength(p, bytes.size()));
  KVH_ASSIGN_OR_RETURN(
      SafetensorsHeader h,
      ParseSafetensorsHeader(absl::string_view(bytes).substr(8, n),
                             bytes.size() - 8 - n));
  SafetensorsFile f;
  f.file_size_ = bytes.size();
  f.bytes_ = std::make_shared<const std::string>(std::move(bytes));
  f.header_ = std::make_shared<const SafetensorsHeader>(std::move(h));
  return f;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  const std::streamoff size = in.tellg();
  if (size < 8) {
    return HeaderError("header_length",
                       absl::StrCat(path, " is ", size,
                                    " bytes, shorter than the 8-byte length"));
  }
  uint8_t prefix[8];
  in.seekg(0);
  in.read(reinterpret_cast<char*>(prefix), 8);
  auto n = CheckHeaderLength(prefix, static_cast<uint64_t>(size));
  if (!n.ok()) {
    return absl::Status(n.status().code(),
                        absl::StrCat(path, ": ", n.status().message()));
  }
  std::string json(*n, '\0');
  in.read(json.data(), static_cast<std::streamsize>(*n));
  if (!in) return absl::UnavailableError(absl::StrCat(path, ": short read"));
  auto h = ParseSafetensorsHeader(json, static_cast<uint64_t>(size) - 8 - *n);
  if (!h.ok()) {
    return absl::Status(h.status().code(),
                        absl::StrCat(path, ": ", h.status().message()));
  }
  SafetensorsFile f;
  f.path_ = path;
  f.file_size_ = static_cast<uint64_t>(size);
  f.header_ = std::make_shared<const SafetensorsHeader>(std::move(*h));
  return f;
}

absl::StatusOr<std::string> SafetensorsFile::ReadTensorBytes(
    absl::string_view name) const {
  const SafetensorsTensor* t = header_->Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("safetensors: no tensor named ", QuotedName(name)));
  }
  const uint64_t n = t->end - t->begin;
  const uint64_t at = header_->data_offset + t->begin;
  if (bytes_ != nullptr) return bytes_->substr(at, n);
  std::ifstream in(path_, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat(path_, ": cannot open"));
  if (static_cast<uint64_t>(in.tellg()) != file_size_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": file changed size since it was opened"));
  }
  std::string out(n, '\0');
  in.seekg(static_cast<std::streamoff>(at));
  in.read(out.data(), static_cast<std::streamsize>(n));
  if (!in) return absl::UnavailableError(absl::StrCat(path_, ": short read"));
  return out;
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadTensorAsFloat(
    absl::string_view name) const {
  const SafetensorsTensor* t = header_->Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("safetensors: no tensor named ", QuotedName(name)));
  }
  if (t->dtype != StDType::kF32 && t->dtype != StDType::kF16 &&
      t->dtype != StDType::kBF16 && t->dtype != StDType::kF64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors: tensor ", QuotedName(name), " has dtype ",
        StDTypeName(t->dtype), "; a floating-point dtype is needed"));
  }
  KVH_ASSIGN_OR_RETURN(const std::string bytes, ReadTensorBytes(name));
  const size_t es = StDTypeSize(t->dtype);
  std::vector<float> out(t->num_elements);
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = ElementAsFloat(t->dtype, p + i * es);
  return out;
}

absl::StatusOr<std::string> SerializeSafetensors(
    absl::Span<const SafetensorsTensorData> tensors,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    header["__metadata__"] = nlohmann::ordered_json(metadata);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsTensorData& t : tensors) {
    const std::string field = absl::StrCat("tensors[", QuotedName(t.name), "]");
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(field + ": name is not allowed");
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(field + ": duplicate name");
    }
    uint64_t elements = 1;
    for (uint64_t d : t.shape) {
      if (MulOverflows(elements, d, &elements)) {
        return absl::InvalidArgumentError(field + ".shape: overflows");
      }
    }
    uint64_t bytes = 0;
    if (StDTypeSize(t.dtype) == 0 ||
        MulOverflows(elements, StDTypeSize(t.dtype), &bytes) ||
        bytes != t.data.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.data: %u bytes, but shape and dtype need %u",
                          field, t.data.size(), bytes));
    }
    header[t.name] = {{"dtype", std::string(StDTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  ByteWriter w;
  w.Put<uint64_t>(json.size());
  w.PutBytes(json.data(), json.size());
  for (const SafetensorsTensorData& t : tensors) {
    w.PutBytes(t.data.data(), t.data.size());
  }
  return w.Release();
}

absl::Status WriteSafetensorsFile(
    const std::string& path, absl::Span<const SafetensorsTensorData> tensors,
    const std::map<std::string, std::string>& metadata) {
  return WriteSerialized(path, SerializeSafetensors(tensors, metadata));
}

absl::StatusOr<std::string> EncodeFloatTensor(absl::Span<const float> values,
                                              StDType dtype) {
  ByteWriter w;
  for (float v : values) {
    switch (dtype) {
      case StDType::kF32:
        w.Put<float>(v);
        break;
      case StDType::kF16:
        w.Put<uint16_t>(FloatToFp16(v));
        break;
      case StDType::kBF16:
        w.Put<uint16_t>(FloatToBf16(v));
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("EncodeFloatTensor: dtype ", StDTypeName(dtype),
                         " is not F32, F16 or BF16"));
    }
  }
  return w.Release();
}

}  // namespace kvharbor
