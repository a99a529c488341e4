// libFuzzer target: the safetensors reader (header JSON through nlohmann-json)
// and the msmodelslim C8 loader on arbitrary bytes.
//
// Input: byte 0: num_layers - 1 (mod 4), byte 1: kv channels - 1 (mod 16),
// bytes 2-5: little-endian length n of the description JSON (clamped), then
// n bytes of quant_model_description.json, then the safetensors file.
// Whatever parses must satisfy the reader's promises (trapped otherwise):
// every tensor is readable at its declared size, re-serializing the tensors
// gives a file that parses to the same header, and loaded C8 scales
// validate and survive a write/read round trip.
//
// SAFETENSORS_FUZZ_WRITE_CORPUS=DIR writes the seed corpus (valid C8 weight
// pairs in both naming styles and dtypes, and plain safetensors files) into
// DIR and exits; the seeds are checked in under fuzz/corpus/safetensors/.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/base/safetensors.h"
#include "core/codec/c8/msmodelslim_c8.h"
#include "fuzz/fuzz_util.h"

namespace kvharbor {
namespace {

std::string Input(uint8_t layers_minus_1, uint8_t channels_minus_1,
                  const std::string& desc, const std::string& file) {
  std::string s;
  s.push_back(static_cast<char>(layers_minus_1));
  s.push_back(static_cast<char>(channels_minus_1));
  const uint32_t n = desc.size();
  s.append(reinterpret_cast<const char*>(&n), 4);
  return s + desc + file;
}

void CheckFile(const SafetensorsFile& f) {
  std::vector<SafetensorsTensorData> again;
  for (const SafetensorsTensor& t : f.header().tensors) {
    auto bytes = f.ReadTensorBytes(t.name);
    FUZZ_CHECK(bytes.ok() && bytes->size() == t.end - t.begin);
    if (t.dtype == StDType::kF32 || t.dtype == StDType::kF16 ||
        t.dtype == StDType::kBF16 || t.dtype == StDType::kF64) {
      auto v = f.ReadTensorAsFloat(t.name);
      FUZZ_CHECK(v.ok() && v->size() == t.num_elements);
    }
    again.push_back({t.name, t.dtype, t.shape, std::move(*bytes)});
  }
  auto out = SerializeSafetensors(again, f.header().metadata);
  FUZZ_CHECK(out.ok());
  auto back = SafetensorsFile::FromBytes(*out);
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(back->header().tensors.size() == f.header().tensors.size());
  FUZZ_CHECK(back->header().metadata == f.header().metadata);
  for (size_t i = 0; i < again.size(); ++i) {
    const SafetensorsTensor& a = f.header().tensors[i];
    const SafetensorsTensor& b = back->header().tensors[i];
    FUZZ_CHECK(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape);
  }
}

void CheckScales(const C8Scales& s, const std::string& desc) {
  FUZZ_CHECK(s.Validate().ok());
  auto files =
      BuildMsModelSlimC8Files(s, C8NameStyle::kSeparateKv, StDType::kF32);
  FUZZ_CHECK(files.ok());
  auto bytes = SerializeSafetensors(files->tensors, {});
  FUZZ_CHECK(bytes.ok());
  auto f = SafetensorsFile::FromBytes(*bytes);
  FUZZ_CHECK(f.ok());
  auto back = ParseC8ScalesFromMsModelSlim(files->DescriptionJson(), *f,
                                           s.num_layers, s.kv_channels);
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(back->k_scale == s.k_scale && back->v_offset == s.v_offset);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

void WriteCorpus(const std::string& dir) {
  int n = 0;
  C8Scales s;
  s.num_layers = 2;
  s.kv_channels = 4;
  for (uint32_t i = 0; i < 8; ++i) {
    s.k_scale.push_back(0.125f * (i + 1));
    s.v_scale.push_back(0.0625f * (i + 2));
    s.k_offset.push_back(float(i) - 3.0f);
    s.v_offset.push_back(0.0f);
  }
  for (auto style : {C8NameStyle::kMergedQkv, C8NameStyle::kSeparateKv}) {
    for (auto dtype : {StDType::kF32, StDType::kF16}) {
      auto files = BuildMsModelSlimC8Files(s, style, dtype);
      auto bytes = SerializeSafetensors(files->tensors, {{"format", "pt"}});
      auto f = SafetensorsFile::FromBytes(*bytes);
      if (!files.ok() || !bytes.ok() || !f.ok() ||
          !ParseC8ScalesFromMsModelSlim(files->DescriptionJson(), *f, 2, 4)
               .ok()) {
        std::fprintf(stderr, "seed %d does not load\n", n);
        std::exit(1);
      }
      WriteFile(dir + "/c8_" + std::to_string(n++),
                Input(1, 3, files->DescriptionJson(), *bytes));
    }
  }
  // Plain files: every dtype, scalars, empty tensors, metadata.
  std::vector<SafetensorsTensorData> t = {
      {"a", StDType::kF64, {2}, std::string(16, '\x01')},
      {"b.weight", StDType::kI8, {2, 3}, "abcdef"},
      {"c", StDType::kBF16, {}, "\x80\x3f"},
      {"empty", StDType::kU32, {0, 4}, ""},
      {"flag", StDType::kBool, {1}, "\x01"},
      {"f8", StDType::kF8E4M3, {3}, "\x10\x20\x30"}};
  auto plain = SerializeSafetensors(t, {{"format", "pt"}, {"k", "v"}});
  WriteFile(dir + "/plain_" + std::to_string(n++), Input(0, 0, "{}", *plain));
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
}

}  // namespace
}  // namespace kvharbor

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (const char* dir = std::getenv("SAFETENSORS_FUZZ_WRITE_CORPUS")) {
    kvharbor::WriteCorpus(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvharbor;
  if (size < 6) return 0;
  const uint32_t layers = 1 + data[0] % 4;
  const uint32_t channels = 1 + data[1] % 16;
  uint32_t desc_len;
  std::memcpy(&desc_len, data + 2, 4);
  desc_len = std::min<uint32_t>(desc_len, size - 6);
  const std::string desc(reinterpret_cast<const char*>(data + 6), desc_len);
  std::string file(reinterpret_cast<const char*>(data + 6 + desc_len),
                   size - 6 - desc_len);
  auto f = SafetensorsFile::FromBytes(std::move(file));
  if (!f.ok()) return 0;
  CheckFile(*f);
  auto scales = ParseC8ScalesFromMsModelSlim(desc, *f, layers, channels);
  if (scales.ok()) CheckScales(*scales, desc);
  return 0;
}
