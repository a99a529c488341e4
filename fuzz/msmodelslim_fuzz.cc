// libFuzzer target: the msmodelslim C8 loader's description JSON
// (quant_model_description.json, through core/base/strict_json.h) against
// fixed, valid weight files. The safetensors target mutates the description and
// the weight file together, so most of its inputs stop at the safetensors
// header; here every input reaches the description checks.
//
// Input: byte 0 selects the weight file (mod 4: merged qkv or separate k/v
// names, F32 or F16 tensors; 2 layers of 4 channels), the rest is the
// description. Whatever loads must be exactly the scales stored in the
// weight file (the description names tensors, it cannot change values), and
// validate (trapped otherwise).
//
// MSMODELSLIM_FUZZ_WRITE_CORPUS=DIR writes the seed corpus (each weight
// file's own description, and variants the loader accepts) into DIR and
// exits; the seeds are checked in under fuzz/corpus/msmodelslim/.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/base/safetensors.h"
#include "core/codec/c8/msmodelslim_c8.h"
#include "fuzz/fuzz_util.h"

namespace kvharbor {
namespace {

constexpr uint32_t kLayers = 2;
constexpr uint32_t kChannels = 4;

struct Variant {
  SafetensorsFile weights;
  std::string description;  // the writer's own
  C8Scales scales;          // what the writer's description loads
};

C8Scales SeedScales() {
  C8Scales s;
  s.num_layers = kLayers;
  s.kv_channels = kChannels;
  for (uint32_t i = 0; i < kLayers * kChannels; ++i) {
    s.k_scale.push_back(0.125f * (i + 1));
    s.v_scale.push_back(0.0625f * (i + 2));
    s.k_offset.push_back(float(i) - 3.0f);
    s.v_offset.push_back(i % 2 == 0 ? 0.0f : -128.0f);
  }
  return s;
}

const std::vector<Variant>& Variants() {
  static const std::vector<Variant>* const variants = [] {
    auto* out = new std::vector<Variant>();
    const C8Scales s = SeedScales();
    for (auto style : {C8NameStyle::kMergedQkv, C8NameStyle::kSeparateKv}) {
      for (auto dtype : {StDType::kF32, StDType::kF16}) {
        auto files = BuildMsModelSlimC8Files(s, style, dtype);
        FUZZ_CHECK(files.ok());
        auto bytes = SerializeSafetensors(files->tensors, {{"format", "pt"}});
        FUZZ_CHECK(bytes.ok());
        auto f = SafetensorsFile::FromBytes(*std::move(bytes));
        FUZZ_CHECK(f.ok());
        const std::string desc = files->DescriptionJson();
        auto loaded =
            ParseC8ScalesFromMsModelSlim(desc, *f, kLayers, kChannels);
        FUZZ_CHECK(loaded.ok());
        out->push_back({*std::move(f), desc, *std::move(loaded)});
      }
    }
    return out;
  }();
  return *variants;
}

void WriteFile(const std::string& path, uint8_t selector,
               const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fputc(selector, f);
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
}

void WriteCorpus(const std::string& dir) {
  const std::vector<Variant>& v = Variants();
  int n = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    WriteFile(dir + "/description_" + std::to_string(n++), i, v[i].description);
  }
  // Accepted variants: pretty-printed with other whitespace, and with the
  // model type spelled as another W8 scheme.
  std::string spaced;
  for (char ch : v[1].description) {
    spaced += ch;
    if (ch == ',' || ch == '{') spaced += "\n  ";
  }
  std::string w8a8 = v[2].description;
  const size_t at = w8a8.find("W8A16");
  if (at != std::string::npos) w8a8.replace(at, 5, "W8A8");
  for (const auto& [sel, text] :
       {std::make_pair(1, spaced), std::make_pair(2, w8a8)}) {
    auto loaded =
        ParseC8ScalesFromMsModelSlim(text, v[sel].weights, kLayers, kChannels);
    if (!loaded.ok()) {
      std::fprintf(stderr, "seed %d does not load: %s\n", n,
                   loaded.status().ToString().c_str());
      std::exit(1);
    }
    WriteFile(dir + "/description_" + std::to_string(n++), sel, text);
  }
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
}

}  // namespace
}  // namespace kvharbor

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (const char* dir = std::getenv("MSMODELSLIM_FUZZ_WRITE_CORPUS")) {
    kvharbor::WriteCorpus(dir);
    std::exit(0);
  }
  kvharbor::Variants();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvharbor;
  if (size == 0) return 0;
  const Variant& v = Variants()[data[0] % Variants().size()];
  const std::string desc(reinterpret_cast<const char*>(data + 1), size - 1);
  auto s = ParseC8ScalesFromMsModelSlim(desc, v.weights, kLayers, kChannels);
  if (!s.ok()) {
    FUZZ_CHECK(!s.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(s->Validate().ok());
  FUZZ_CHECK(s->num_layers == kLayers && s->kv_channels == kChannels);
  FUZZ_CHECK(s->k_scale == v.scales.k_scale && s->v_scale == v.scales.v_scale);
  FUZZ_CHECK(s->k_offset == v.scales.k_offset &&
             s->v_offset == v.scales.v_offset);
  return 0;
}
