// libFuzzer target: the CommVQ codebook file parser on arbitrary bytes.
//
// Each input runs as it is and again with its checksum recomputed, so that
// mutations also reach the checks behind the checksum. Whatever parses must
// satisfy the format's promises (trapped otherwise):
// the file is canonical (re-serializing gives the same bytes), its
// fingerprint is its checksum, and the encoder built from it codes and
// decodes a token of every layer.
//
// COMMVQ_CODEBOOK_FUZZ_WRITE_CORPUS=DIR writes the seed corpus (small valid
// codebook files of several shapes and RoPE styles) into DIR and exits; the
// seeds are checked in under fuzz/corpus/commvq_codebook/.
#include <xxh3.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/codec/commvq/commvq_codebooks.h"
#include "core/codec/commvq/commvq_format.h"
#include "fuzz/fuzz_util.h"

namespace kvharbor {
namespace {

void WriteCorpus(const std::string& dir) {
  struct Shape {
    RopeStyle rope;
    uint32_t layers, heads, head_dim, levels, group, stages, rows, vstages;
  };
  const Shape shapes[] = {
      {RopeStyle::kNone, 1, 1, 8, 4, 2, 2, 2, 2},
      {RopeStyle::kInterleaved, 2, 1, 4, 2, 1, 1, 1, 3},
      {RopeStyle::kHalfSplit, 1, 2, 4, 8, 4, 1, 3, 1},
      {RopeStyle::kHalfSplit, 1, 1, 2, 16, 1, 1, 1, 1},
  };
  int n = 0;
  for (const Shape& s : shapes) {
    CommVqCodebooks cb;
    CommVqConfig& c = cb.config;
    c.num_layers = s.layers;
    c.num_kv_heads = s.heads;
    c.head_dim = s.head_dim;
    c.rope_style = s.rope;
    c.rope_theta = s.rope == RopeStyle::kNone ? 0.0f : 10000.0f;
    c.key_levels = s.levels;
    c.key_group_pairs = s.group;
    c.key_stages = s.stages;
    c.value_stage_rows = s.rows;
    c.value_stages = s.vstages;
    for (uint64_t i = 0; i < c.key_floats(); ++i)
      cb.key.push_back(0.01f * (i % 37) - 0.2f);
    for (uint64_t i = 0; i < c.value_floats(); ++i)
      cb.value.push_back(0.02f * (i % 29) - 0.3f);
    auto bytes = SerializeCommVqCodebooks(cb);
    if (!bytes.ok() || !ParseCommVqCodebooks(
                            absl::MakeConstSpan(
                                reinterpret_cast<const uint8_t*>(bytes->data()),
                                bytes->size()))
                            .ok()) {
      std::fprintf(stderr, "seed %d is not valid\n", n);
      std::exit(1);
    }
    const std::string path = dir + "/codebook_" + std::to_string(n++);
    WriteSeedOrDie(path, bytes->data(), bytes->size());
  }
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
}

}  // namespace
}  // namespace kvharbor

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (const char* dir = std::getenv("COMMVQ_CODEBOOK_FUZZ_WRITE_CORPUS")) {
    kvharbor::WriteCorpus(dir);
    std::exit(0);
  }
  return 0;
}

namespace kvharbor {
namespace {

void CheckOne(const uint8_t* data, size_t size) {
  auto cb = ParseCommVqCodebooks(absl::MakeConstSpan(data, size));
  if (!cb.ok()) return;
  auto again = SerializeCommVqCodebooks(*cb);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->size() == size &&
             std::memcmp(again->data(), data, size) == 0);
  uint64_t stored;
  std::memcpy(&stored, data + size - 8, 8);
  FUZZ_CHECK(stored == cb->Fingerprint());
  auto shared = std::make_shared<const CommVqCodebooks>(std::move(*cb));
  auto enc = CommVqEncoder::Create(shared);
  if (!enc.ok()) return;  // tables over the limit
  const CommVqConfig& c = shared->config;
  std::vector<float> v(c.dim()), out(c.dim()), scratch((*enc)->ScratchFloats());
  std::vector<uint16_t> codes(c.key_codes());
  std::vector<uint8_t> bits((c.value_rows() + 7) / 8);
  for (uint32_t i = 0; i < c.dim(); ++i) v[i] = 0.1f * float(i % 7) - 0.3f;
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    (*enc)->EncodeKey(l, v.data(), codes.data(), scratch.data());
    for (uint16_t code : codes) FUZZ_CHECK(code < c.key_levels);
    DecodeCommVqKey(*shared, l, codes.data(), out.data());
    (*enc)->EncodeValue(l, v.data(), bits.data(), scratch.data());
    DecodeCommVqValue(*shared, l, bits.data(), out.data());
  }
}

}  // namespace
}  // namespace kvharbor

// Runs the input as it is, and once more with its trailing checksum
// recomputed so that mutations reach the checks behind the checksum.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvharbor::CheckOne(data, size);
  if (size < 8) return 0;
  std::vector<uint8_t> resealed(data, data + size);
  const uint64_t h = XXH3_64bits(resealed.data(), size - 8);
  std::memcpy(resealed.data() + size - 8, &h, 8);
  kvharbor::CheckOne(resealed.data(), size);
  return 0;
}
