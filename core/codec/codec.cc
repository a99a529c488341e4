#include "core/codec/codec.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "core/codec/codec_calibrations.h"
#include "core/codec/envelope.h"
#include "core/codec/fixed_payload_codec.h"
#include "core/codec/fp8/fp8_codec.h"
#include "types/enum_names.h"

namespace kvharbor {

absl::string_view CodecIdName(CodecId id) {
  return EnumName(id, {"identity", "kvtc", "int8_c8", "commvq", "fp8"},
                  /*first=*/1);
}

float* CodecWorkspace::Floats(int slot, size_t n) {
  std::vector<float>& v = floats_[slot];
  if (v.size() < n) v.resize(n);
  return v.data();
}

uint8_t* CodecWorkspace::Bytes(int slot, size_t n) {
  std::vector<uint8_t>& v = bytes_[slot];
  if (v.size() < n) v.resize(n);
  return v.data();
}

size_t CodecWorkspace::ReservedBytes() const {
  size_t total = 0;
  for (const auto& v : floats_) total += v.capacity() * sizeof(float);
  for (const auto& v : bytes_) total += v.capacity();
  return total;
}

absl::StatusOr<std::string> Codec::EncodeToString(
    absl::Span<const PageRef> pages, CodecWorkspace* workspace) const {
  KVH_ASSIGN_OR_RETURN(const size_t size, EncodedSize(pages));
  std::string out(size, '\0');
  KVH_ASSIGN_OR_RETURN(
      const size_t written,
      Encode(pages,
             absl::MakeSpan(reinterpret_cast<uint8_t*>(out.data()), out.size()),
             workspace));
  out.resize(written);
  return out;
}

namespace {

class IdentityCodec final : public FixedPayloadCodec {
 public:
  explicit IdentityCodec(const CodecParams& p) : FixedPayloadCodec(p) {}

  CodecId id() const override { return CodecId::kIdentity; }
  absl::string_view name() const override { return "identity"; }
  uint64_t PagePayloadBytes() const override { return geometry().PageBytes(); }

 private:
  absl::Status EncodePayload(absl::Span<const PageRef> pages, uint8_t* payload,
                             CodecWorkspace* ws) const override {
    const size_t page_bytes = geometry().PageBytes();
    for (size_t i = 0; i < pages.size(); ++i) {
      std::memcpy(payload + i * page_bytes, pages[i].data, page_bytes);
    }
    return absl::OkStatus();
  }

  absl::Status DecodePayload(absl::Span<const uint8_t> raw,
                             absl::Span<const MutablePageRef> pages,
                             CodecWorkspace* ws) const override {
    const size_t page_bytes = geometry().PageBytes();
    for (size_t i = 0; i < pages.size(); ++i) {
      std::memcpy(pages[i].data, raw.data() + i * page_bytes, page_bytes);
    }
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> CreateIdentityCodec(
    const CodecParams& params) {
  KVH_RETURN_IF_ERROR(params.geometry.Validate());
  return std::unique_ptr<Codec>(new IdentityCodec(params));
}

CodecRegistry& CodecRegistry::Default() {
  static CodecRegistry* const registry = [] {
    auto* r = new CodecRegistry();
    r->Register("identity", CreateIdentityCodec).IgnoreError();
    r->Register(kFp8CodecName, CreateFp8Codec).IgnoreError();
    RegisterCalibratedCodecs(r);
    return r;
  }();
  return *registry;
}

absl::Status CodecRegistry::Register(absl::string_view name, Factory factory,
                                     CalibrationReader reader) {
  if (name.empty()) return absl::InvalidArgumentError("codec name: is empty");
  absl::MutexLock lock(&mu_);
  if (!factories_
           .emplace(std::string(name),
                    Entry{std::move(factory), std::move(reader)})
           .second) {
    return absl::AlreadyExistsError(
        absl::StrCat("codec name: '", name, "' is already registered"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CodecRegistry::Entry> CodecRegistry::Find(
    absl::string_view name) const {
  {
    absl::MutexLock lock(&mu_);
    auto it = factories_.find(name);
    if (it != factories_.end() && it->second.factory) return it->second;
  }
  return absl::NotFoundError(
      absl::StrCat("codec name: unknown codec '", name,
                   "' (known: ", absl::StrJoin(Names(), ", "), ")"));
}

absl::StatusOr<std::unique_ptr<Codec>> CodecRegistry::Create(
    absl::string_view name, const CodecParams& params) const {
  KVH_ASSIGN_OR_RETURN(const Entry entry, Find(name));
  return entry.factory(params);
}

absl::StatusOr<bool> CodecRegistry::TakesCalibration(
    absl::string_view name) const {
  KVH_ASSIGN_OR_RETURN(const Entry entry, Find(name));
  return entry.reader != nullptr;
}

absl::StatusOr<std::string> CodecRegistry::ReadCalibration(
    absl::string_view name, const std::string& path,
    const Geometry& geometry) const {
  KVH_ASSIGN_OR_RETURN(const Entry entry, Find(name));
  if (!entry.reader) {
    return absl::FailedPreconditionError(
        absl::StrCat("codec '", name, "' takes no calibration"));
  }
  return entry.reader(path, geometry);
}

std::vector<std::string> CodecRegistry::Names() const {
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, unused] : factories_) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace kvharbor
