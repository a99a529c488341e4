// Loader (and, for tests and tools, writer) of the int8 KV-cache ("C8")
// parameters in msmodelslim quantized weights (spec: shared/seeds/001):
//   <dir>/quant_model_description.json: a JSON object of string values:
//     "model_quant_type" (e.g. "W8A16"), "kv_cache_type" (must be "C8"), and
//     one entry per weight name;
//   <dir>/quant_model_weight.safetensors: the weights, including per layer
//     four 1-D tensors of num_kv_heads * head_dim elements, F32 or F16:
//       <base>.<k_linear>.kv_cache_scale   <base>.<k_linear>.kv_cache_offset
//       <base>.<v_linear>.kv_cache_scale   <base>.<v_linear>.kv_cache_offset
//     where <base> is the merged qkv Linear ("...layers.0.self_attention.
//     query_key_value", k_linear = "k_proj") or the attention module that
//     holds separate projections ("model.layers.0.self_attn.k_proj..."). The
//     layer index is the number after the last "layers" name component.
//
// Everything is checked, and an error names the file, tensor and field:
// kv_cache_type, model_quant_type, description values, every KV tensor's
// description entry (and every description entry's tensor), layer indices
// against the geometry, duplicates, one <base> per layer, dtype (the seed
// allows float32 or float16 only; BF16 is refused), shape, and values
// (scale finite > 0, offset finite in [-128, 127]: msmodelslim is signed;
// unsigned exports must subtract 128 from offsets first, as the seed says).
//
// Only the header and the KV tensors of the safetensors file are read.
// Pure functions; thread-safe.
#ifndef KVHARBOR_CORE_CODEC_C8_MSMODELSLIM_C8_H_
#define KVHARBOR_CORE_CODEC_C8_MSMODELSLIM_C8_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/safetensors.h"
#include "core/codec/c8/int8_c8_codec.h"
#include "types/geometry.h"

namespace kvharbor {

inline constexpr char kMsModelSlimDescriptionFile[] =
    "quant_model_description.json";
inline constexpr char kMsModelSlimWeightFile[] =
    "quant_model_weight.safetensors";
// Description files are small (one line per weight); refuse absurd ones.
inline constexpr uint64_t kMaxDescriptionBytes = uint64_t{64} << 20;

struct C8NameOptions {
  // Name component of the K and V projections before "kv_cache_scale".
  std::string k_linear = "k_proj";
  std::string v_linear = "v_proj";
};

absl::StatusOr<C8Scales> LoadC8ScalesFromMsModelSlim(
    const std::string& dir, const Geometry& geometry,
    const C8NameOptions& names = {});

// The same from a description's text and an opened weight file.
absl::StatusOr<C8Scales> ParseC8ScalesFromMsModelSlim(
    absl::string_view description_json, const SafetensorsFile& weights,
    uint32_t num_layers, uint32_t kv_channels, const C8NameOptions& names = {});

// ---- Writer (tests, fuzz corpus, conversion tools).
enum class C8NameStyle {
  kMergedQkv,   // transformer.encoder.layers.N.self_attention.query_key_value
  kSeparateKv,  // model.layers.N.self_attn (k_proj / v_proj)
};

struct MsModelSlimC8Files {
  std::map<std::string, std::string> description;  // the JSON object
  std::vector<SafetensorsTensorData> tensors;      // in file order

  std::string DescriptionJson() const;
};

// Description and tensors for `scales` (with model_quant_type "W8A16" when
// the scales carry none), values stored as `dtype` (F32, F16 or BF16; BF16
// only to build files the loader must refuse).
absl::StatusOr<MsModelSlimC8Files> BuildMsModelSlimC8Files(
    const C8Scales& scales, C8NameStyle style, StDType dtype);
absl::Status WriteMsModelSlimC8Files(const std::string& dir,
                                     const MsModelSlimC8Files& files);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_C8_MSMODELSLIM_C8_H_
