// libFuzzer target: the KVCM compressor weight (.bin) parser on arbitrary
// bytes.
//
// Whatever parses must satisfy the format's promises (trapped otherwise):
// the file is canonical (re-serializing gives the same bytes, since values
// are finite and dtype conversions round-trip), and the compressor built
// from it runs on a short sequence and produces OutputTokens() tokens.
//
// KVCM_FUZZ_WRITE_CORPUS=DIR writes the seed corpus (small valid weight
// files: text-only and full, fp16/bf16/fp32, with and without metadata and
// biases) into DIR and exits; the seeds are checked in under
// fuzz/corpus/kvcm/.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/transform/kvcm_compressor.h"
#include "core/transform/kvcm_format.h"
#include "fuzz/fuzz_util.h"

namespace kvharbor {
namespace {

KvcmWeights SeedWeights(uint32_t layers, uint32_t hd, uint32_t f,
                        uint32_t blocks, KvcmDType dtype, bool metadata) {
  KvcmWeights w;
  w.header.dtype = dtype;
  w.header.num_layers = layers;
  w.header.num_heads = 2;
  w.header.head_dim = hd;
  w.header.hidden_size = 2 * hd;
  w.header.compression_factor = f;
  w.header.min_seq_len = 1;
  w.header.weight_count_per_layer = blocks;
  if (metadata) w.header.metadata = "{\"v\":1}";
  const uint32_t dims[4] = {f * hd, 3, 5, hd};
  uint32_t k = 0;
  w.layers.resize(layers);
  for (auto& layer : w.layers) {
    for (uint32_t b = 0; b < blocks; ++b) {
      KvcmLinear lin;
      lin.cols = dims[b % 3];
      lin.rows = dims[b % 3 + 1];
      for (uint32_t i = 0; i < lin.rows * lin.cols; ++i) {
        lin.weight.push_back(0.125f * float(k++ % 9) - 0.5f);
      }
      if (b % 2 == 0) lin.bias.assign(lin.rows, 0.25f);
      layer.push_back(std::move(lin));
    }
  }
  return w;
}

void WriteCorpus(const std::string& dir) {
  int n = 0;
  const KvcmWeights seeds[] = {
      SeedWeights(1, 2, 2, kKvcmTextOnlyBlocks, KvcmDType::kFP32, false),
      SeedWeights(2, 2, 3, kKvcmFullBlocks, KvcmDType::kFP16, true),
      SeedWeights(1, 4, 2, kKvcmFullBlocks, KvcmDType::kBF16, false),
      SeedWeights(1, 1, 4, kKvcmTextOnlyBlocks, KvcmDType::kFP16, true),
  };
  for (const KvcmWeights& w : seeds) {
    auto bytes = SerializeKvcmWeights(w);
    if (!bytes.ok() ||
        !ParseKvcmWeights(absl::MakeConstSpan(
                              reinterpret_cast<const uint8_t*>(bytes->data()),
                              bytes->size()))
             .ok()) {
      std::fprintf(stderr, "seed %d is not valid\n", n);
      std::exit(1);
    }
    const std::string path = dir + "/weights_" + std::to_string(n++);
    WriteSeedOrDie(path, bytes->data(), bytes->size());
  }
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
}

}  // namespace
}  // namespace kvharbor

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (const char* dir = std::getenv("KVCM_FUZZ_WRITE_CORPUS")) {
    kvharbor::WriteCorpus(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvharbor;
  auto w = ParseKvcmWeights(absl::MakeConstSpan(data, size));
  if (!w.ok()) return 0;
  auto again = SerializeKvcmWeights(*w);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->size() == size &&
             std::memcmp(again->data(), data, size) == 0);
  const uint32_t hd = w->EffectiveHeadDim();
  const uint32_t f = w->header.compression_factor;
  const uint32_t layers = w->header.num_layers;
  auto shared = std::make_shared<const KvcmWeights>(std::move(*w));
  auto comp = KvcmCompressor::Create(shared, layers, 2, hd, {f});
  FUZZ_CHECK(comp.ok());
  const uint64_t tokens = 3 * uint64_t{f} + 1;
  if (tokens * hd * layers > (1u << 16)) return 0;  // keep runs fast
  auto out_tokens = (*comp)->OutputTokens(tokens);
  FUZZ_CHECK(out_tokens.ok() && *out_tokens <= tokens);
  KvSequenceShape in_shape{layers, 2, hd, tokens};
  KvSequenceShape out_shape = in_shape;
  out_shape.num_tokens = *out_tokens;
  std::vector<float> in(in_shape.Elements());
  for (size_t i = 0; i < in.size(); ++i) in[i] = 0.01f * float(i % 101);
  std::vector<float> out(out_shape.Elements());
  FUZZ_CHECK(
      (*comp)->Apply({in_shape, in.data()}, {out_shape, out.data()}).ok());
  return 0;
}
