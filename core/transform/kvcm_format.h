// KVCM compressor weights: reader and writer of the `.bin` format of
// shared/seeds/000 (version 1; InfiniLM's Compressor::loadWeights format).
//
// All integers little-endian:
//   Header, 44 bytes: magic u32 (0x4B56434D), version u32 (1), dtype_code
//     u16 (0 fp16, 1 bf16, 2 fp32), reserved u16 (0), num_layers u32,
//     num_heads u32 (optional, may be 0), head_dim u32 (optional sanity
//     field, may be 0), hidden_size u32 (optional, may be 0),
//     compression_factor u32, min_seq_len u32, weight_count_per_layer u32,
//     metadata_size_bytes u32;
//   metadata: metadata_size_bytes opaque bytes;
//   for each layer, for each of weight_count_per_layer blocks:
//     WeightMeta, 12 bytes: rows u32, cols u32, has_bias u32 (0 or 1);
//     rows * cols weights (row-major, PyTorch Linear [out][in]) in dtype;
//     rows bias values when has_bias == 1;
//   nothing after the last block.
// Blocks per layer are prefix-major, slot-minor: prefixes compress_tk,
// compress_tv, compress_ik, compress_iv (text keys/values, image
// keys/values), slots 0, 3, 6 (the three Linear layers of each prefix's
// nn.Sequential). weight_count_per_layer is 12, or 6 for a text-only file
// (compress_tk and compress_tv only).
//
// Beyond the byte layout the reader checks what the compressor needs: each
// prefix is Linear(f * head_dim -> h1), Linear(h1 -> h2), Linear(h2 ->
// head_dim) with f = compression_factor, and every value is finite. head_dim
// comes from the header, or (header 0) from compress_tk's last layer. Errors
// are InvalidArgument naming the field ("kvcm file: header.dtype_code: ...",
// "kvcm file: layer 3 compress_tv[slot 6].cols: ...").
//
// Memory: KvcmWeights owns its weights, converted to float32 on load.
// Plain value type; functions are pure and thread-safe.
#ifndef KVHARBOR_CORE_TRANSFORM_KVCM_FORMAT_H_
#define KVHARBOR_CORE_TRANSFORM_KVCM_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvharbor {

inline constexpr uint32_t kKvcmMagic = 0x4B56434D;
inline constexpr uint32_t kKvcmVersion = 1;
inline constexpr size_t kKvcmHeaderBytes = 44;
inline constexpr size_t kKvcmWeightMetaBytes = 12;
inline constexpr uint32_t kKvcmLinearsPerPrefix = 3;
inline constexpr uint32_t kKvcmSlots[kKvcmLinearsPerPrefix] = {0, 3, 6};
inline constexpr uint32_t kKvcmTextOnlyBlocks = 6;
inline constexpr uint32_t kKvcmFullBlocks = 12;
// Limits that keep every product below within 64 bits and BLAS's int.
inline constexpr uint32_t kKvcmMaxFactor = 4096;
inline constexpr uint32_t kKvcmMaxDim = 1u << 20;  // rows, cols
inline constexpr uint64_t kKvcmMaxMatrixElements = uint64_t{1} << 31;
inline constexpr uint32_t kKvcmMaxMetadataBytes = 16u << 20;
inline constexpr uint32_t kKvcmMaxHeads = 1u << 16;
inline constexpr uint32_t kKvcmMaxHiddenSize = 1u << 24;

enum class KvcmDType : uint16_t { kFP16 = 0, kBF16 = 1, kFP32 = 2 };
size_t KvcmDTypeSize(KvcmDType dtype);

enum class KvcmPrefix : uint32_t {
  kTextKey = 0,     // compress_tk
  kTextValue = 1,   // compress_tv
  kImageKey = 2,    // compress_ik
  kImageValue = 3,  // compress_iv
};
absl::string_view KvcmPrefixName(KvcmPrefix prefix);

struct KvcmLinear {
  uint32_t rows = 0;          // out features
  uint32_t cols = 0;          // in features
  std::vector<float> weight;  // [rows][cols]
  std::vector<float> bias;    // [rows], empty when the block has none
};

struct KvcmHeader {
  KvcmDType dtype = KvcmDType::kFP32;
  uint32_t num_layers = 0;
  uint32_t num_heads = 0;
  uint32_t head_dim = 0;
  uint32_t hidden_size = 0;
  uint32_t compression_factor = 0;
  uint32_t min_seq_len = 0;
  uint32_t weight_count_per_layer = 0;
  std::string metadata;  // metadata_size_bytes = metadata.size()
};

struct KvcmWeights {
  KvcmHeader header;
  // [layer][block], block = prefix * 3 + linear index (slot 0, 3, 6).
  std::vector<std::vector<KvcmLinear>> layers;

  bool has_image() const {
    return header.weight_count_per_layer == kKvcmFullBlocks;
  }
  const KvcmLinear& linear(uint32_t layer, KvcmPrefix prefix,
                           uint32_t index) const {
    return layers[layer][static_cast<uint32_t>(prefix) * 3 + index];
  }
  // head_dim the MLPs produce (the header's, or compress_tk's output).
  uint32_t EffectiveHeadDim() const;

  // Checks header fields, block counts, MLP shapes and finiteness.
  absl::Status Validate() const;
};

absl::StatusOr<KvcmWeights> ParseKvcmWeights(absl::Span<const uint8_t> bytes);
// Converts the weights to header.dtype (round to nearest even for fp16 and
// bf16). Refuses weights that do not Validate().
absl::StatusOr<std::string> SerializeKvcmWeights(const KvcmWeights& weights);

absl::StatusOr<KvcmWeights> ReadKvcmWeightsFile(const std::string& path);
absl::Status WriteKvcmWeightsFile(const KvcmWeights& weights,
                                  const std::string& path);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_TRANSFORM_KVCM_FORMAT_H_
