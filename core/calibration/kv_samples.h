// KV samples: a dump of real KV-cache rows, the input of offline KVTC
// calibration (core/calibration/kvtc_calibrate.h). Stored as a safetensors file
// whose layout (version 1) is specified in docs/kv_samples.md: tensors "k" and
// "v" [tokens][layers][kv_heads][head_dim] (F32, F16 or BF16), "positions"
// [tokens] I64, and __metadata__ with the format name and version, geometry
// and RoPE settings. PyTorch users write it with safetensors.torch.save_file.
//
// KvSamples is a plain value (copyable, thread-compatible) holding the rows
// as float32 in memory. ReadKvSamples validates every field before returning
// and names the field in its errors; it never reads out of bounds.
#ifndef KVHARBOR_CORE_CALIBRATION_KV_SAMPLES_H_
#define KVHARBOR_CORE_CALIBRATION_KV_SAMPLES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/safetensors.h"
#include "core/codec/kvtc/kvtc_calibration.h"

namespace kvharbor {

inline constexpr char kKvSamplesFormat[] = "kvharbor.kv_samples";
inline constexpr uint32_t kKvSamplesVersion = 1;
// Refuse dumps whose K (or V) would not fit a sane amount of memory: 2^31
// floats (8 GiB) each.
inline constexpr uint64_t kMaxKvSampleElements = uint64_t{1} << 31;

struct KvSamples {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint64_t tokens = 0;
  RopeStyle rope_style = RopeStyle::kNone;
  float rope_theta = 0.0f;
  // Whether "k" holds keys with RoPE applied (as a cache holds them).
  bool keys_roped = true;
  std::vector<float> k;  // [tokens][layers][kv_heads][head_dim]
  std::vector<float> v;  // same shape
  // Position of each token in its sequence (0 starts a sequence).
  std::vector<int64_t> positions;
  // Other __metadata__ entries (e.g. "model", "source"), kept verbatim.
  std::map<std::string, std::string> extra;

  uint64_t FeaturesPerToken() const {
    return uint64_t{num_layers} * num_kv_heads * head_dim;
  }
  // Sizes, geometry limits (types/geometry.h), RoPE settings, positions in
  // [0, 2^53) and finite values. Messages name the field.
  absl::Status Validate() const;
};

absl::StatusOr<KvSamples> ParseKvSamples(const SafetensorsFile& file);
absl::StatusOr<KvSamples> ReadKvSamples(const std::string& path);
// Writes `samples` (which must Validate) with k and v in `dtype` (F32, F16 or
// BF16).
absl::StatusOr<std::string> SerializeKvSamples(const KvSamples& samples,
                                               StDType dtype);
absl::Status WriteKvSamples(const KvSamples& samples, StDType dtype,
                            const std::string& path);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CALIBRATION_KV_SAMPLES_H_
