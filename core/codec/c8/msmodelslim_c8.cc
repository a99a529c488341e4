#include "core/codec/c8/msmodelslim_c8.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/base/byte_io.h"
#include "core/base/status_macros.h"
#include "core/base/strict_json.h"

namespace kvharbor {
namespace {

// Parameters of one layer, in C8Scales order.
enum Param { kKScale = 0, kKOffset = 1, kVScale = 2, kVOffset = 3 };
constexpr int kNumParams = 4;
constexpr const char* kParamField[kNumParams] = {"k_scale", "k_offset",
                                                 "v_scale", "v_offset"};

struct Found {
  std::string name;  // tensor name, empty when not seen
  std::string base;  // name before ".<linear>.kv_cache_*"
};

absl::Status DescError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(kMsModelSlimDescriptionFile, ": ", field, ": ", what));
}

absl::Status WeightError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(kMsModelSlimWeightFile, ": ", field, ": ", what));
}

// Suffix of parameter `p` for the given projection names.
std::string ParamSuffix(const C8NameOptions& o, int p) {
  const std::string& linear = p < kVScale ? o.k_linear : o.v_linear;
  const char* what = (p == kKScale || p == kVScale) ? "scale" : "offset";
  return absl::StrCat(".", linear, ".kv_cache_", what);
}

// Which parameter `name` holds (-1 for none) and its base.
int Classify(const C8NameOptions& o, absl::string_view name,
             std::string* base) {
  for (int p = 0; p < kNumParams; ++p) {
    const std::string suffix = ParamSuffix(o, p);
    if (name.size() > suffix.size() && absl::EndsWith(name, suffix)) {
      *base = std::string(name.substr(0, name.size() - suffix.size()));
      return p;
    }
  }
  return -1;
}

// The number after the last "layers" component of `base`.
absl::StatusOr<uint32_t> LayerIndex(absl::string_view base) {
  const std::vector<absl::string_view> parts = absl::StrSplit(base, '.');
  for (size_t i = parts.size(); i-- > 1;) {
    if (parts[i - 1] != "layers") continue;
    const absl::string_view num = parts[i];
    uint32_t layer = 0;
    const bool digits =
        !num.empty() && num.size() <= 9 &&
        num.find_first_not_of("0123456789") == absl::string_view::npos &&
        (num.size() == 1 || num[0] != '0');
    if (digits && absl::SimpleAtoi(num, &layer)) return layer;
  }
  return absl::InvalidArgumentError(
      "no layer index (a decimal number after a 'layers' name component)");
}

absl::Status CheckDescription(const nlohmann::json& d) {
  if (!d.is_object()) return DescError("json", "must be a JSON object");
  for (const auto& [key, value] : d.items()) {
    if (!value.is_string()) {
      return DescError(QuotedName(key), "value must be a string");
    }
  }
  if (!d.contains("model_quant_type")) {
    return DescError("model_quant_type", "is missing");
  }
  const std::string& mqt = d["model_quant_type"].get_ref<const std::string&>();
  if (mqt.empty() || mqt.size() > 64 ||
      mqt.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwx"
                            "yz0123456789_") != std::string::npos) {
    return DescError(
        "model_quant_type",
        absl::StrCat(QuotedName(mqt), " is not a quantization type name"));
  }
  if (!d.contains("kv_cache_type")) {
    return DescError("kv_cache_type",
                     "is missing: the weights were exported without KV-cache "
                     "quantization");
  }
  const std::string& kct = d["kv_cache_type"].get_ref<const std::string&>();
  if (kct != "C8") {
    return DescError(
        "kv_cache_type",
        absl::StrCat(QuotedName(kct), " is not supported (want C8)"));
  }
  return absl::OkStatus();
}

// Finds the four tensors of every layer; checks layers, duplicates and
// that one layer's tensors share a base.
absl::StatusOr<std::vector<std::array<Found, kNumParams>>> FindKvTensors(
    const SafetensorsHeader& h, uint32_t num_layers, const C8NameOptions& o) {
  std::vector<std::array<Found, kNumParams>> layers(num_layers);
  for (const SafetensorsTensor& t : h.tensors) {
    std::string base;
    const int p = Classify(o, t.name, &base);
    if (p < 0) continue;
    const std::string field = absl::StrCat("tensor ", QuotedName(t.name));
    auto layer = LayerIndex(base);
    if (!layer.ok()) return WeightError(field, layer.status().message());
    if (*layer >= num_layers) {
      return WeightError(field, absl::StrFormat("layer %u is beyond the "
                                                "geometry's %u layers",
                                                *layer, num_layers));
    }
    Found& f = layers[*layer][p];
    if (!f.name.empty()) {
      return WeightError(
          field, absl::StrFormat("layer %u's %s is also given by %s", *layer,
                                 kParamField[p], QuotedName(f.name)));
    }
    f.name = t.name;
    f.base = std::move(base);
  }
  for (uint32_t l = 0; l < num_layers; ++l) {
    for (int p = 0; p < kNumParams; ++p) {
      const Found& f = layers[l][p];
      if (f.name.empty()) {
        return WeightError(
            absl::StrFormat("layer %u %s", l, kParamField[p]),
            absl::StrCat("missing: no tensor named '<...>layers.", l, "<...>",
                         ParamSuffix(o, p), "'"));
      }
      if (f.base != layers[l][0].base) {
        return WeightError(
            absl::StrFormat("layer %u %s", l, kParamField[p]),
            absl::StrCat(QuotedName(f.name), " does not share the prefix of ",
                         QuotedName(layers[l][0].name)));
      }
    }
  }
  return layers;
}

absl::Status ReadParam(const SafetensorsFile& w, const std::string& name,
                       uint32_t layer, int p, uint32_t kv_channels,
                       std::vector<float>* dst) {
  const std::string field = absl::StrCat("tensor ", QuotedName(name));
  const SafetensorsTensor* t = w.header().Find(name);
  if (t->dtype != StDType::kF32 && t->dtype != StDType::kF16) {
    return WeightError(field + ".dtype",
                       absl::StrCat(StDTypeName(t->dtype),
                                    " is not allowed: kv_cache_scale and "
                                    "kv_cache_offset are float32 or float16"));
  }
  if (t->shape.size() != 1 || t->shape[0] != kv_channels) {
    std::string shape = "[";
    for (size_t i = 0; i < t->shape.size(); ++i) {
      absl::StrAppend(&shape, i ? ", " : "", t->shape[i]);
    }
    return WeightError(
        field + ".shape",
        absl::StrFormat("%s], but the geometry has num_kv_heads * head_dim = "
                        "%u channels",
                        shape, kv_channels));
  }
  KVH_ASSIGN_OR_RETURN(const std::vector<float> v, w.ReadTensorAsFloat(name));
  const bool is_scale = p == kKScale || p == kVScale;
  for (uint32_t c = 0; c < kv_channels; ++c) {
    const float x = v[c];
    const bool ok = is_scale ? ValidC8Scale(x) : ValidC8Offset(x);
    if (!ok) {
      return WeightError(
          absl::StrCat(field, "[", c, "]"),
          absl::StrFormat("%g is invalid: %s", x,
                          is_scale ? "a scale must be finite and > 0"
                                   : "an offset must be finite and within "
                                     "[-128, 127] (signed int8)"));
    }
  }
  std::copy(v.begin(), v.end(), dst->begin() + uint64_t{layer} * kv_channels);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<C8Scales> ParseC8ScalesFromMsModelSlim(
    absl::string_view description_json, const SafetensorsFile& weights,
    uint32_t num_layers, uint32_t kv_channels, const C8NameOptions& names) {
  if (num_layers == 0 || num_layers > kMaxLayers || kv_channels == 0 ||
      kv_channels > uint64_t{kMaxKvHeads} * kMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "geometry: %u layers and %u kv channels are out of range", num_layers,
        kv_channels));
  }
  KVH_ASSIGN_OR_RETURN(
      const nlohmann::json desc,
      ParseStrictJson(description_json, 1, kMsModelSlimDescriptionFile));
  KVH_RETURN_IF_ERROR(CheckDescription(desc));
  const SafetensorsHeader& h = weights.header();
  // Every KV entry of the description has its tensor, and vice versa.
  for (const auto& [key, unused] : desc.items()) {
    std::string base;
    if (Classify(names, key, &base) >= 0 && h.Find(key) == nullptr) {
      return WeightError(absl::StrCat("tensor ", QuotedName(key)),
                         "is listed in the description but missing");
    }
  }
  KVH_ASSIGN_OR_RETURN(const auto layers, FindKvTensors(h, num_layers, names));
  C8Scales s;
  s.num_layers = num_layers;
  s.kv_channels = kv_channels;
  s.model_quant_type = desc["model_quant_type"].get<std::string>();
  std::vector<float>* arrays[kNumParams] = {&s.k_scale, &s.k_offset, &s.v_scale,
                                            &s.v_offset};
  for (auto* a : arrays) a->resize(uint64_t{num_layers} * kv_channels);
  for (uint32_t l = 0; l < num_layers; ++l) {
    for (int p = 0; p < kNumParams; ++p) {
      const std::string& name = layers[l][p].name;
      if (!desc.contains(name)) {
        return DescError(QuotedName(name),
                         "missing: every kv_cache tensor needs an entry");
      }
      KVH_RETURN_IF_ERROR(
          ReadParam(weights, name, l, p, kv_channels, arrays[p]));
    }
  }
  KVH_RETURN_IF_ERROR(s.Validate());
  return s;
}

absl::StatusOr<C8Scales> LoadC8ScalesFromMsModelSlim(
    const std::string& dir, const Geometry& geometry,
    const C8NameOptions& names) {
  KVH_RETURN_IF_ERROR(geometry.Validate());
  const std::string desc_path =
      absl::StrCat(dir, "/", kMsModelSlimDescriptionFile);
  KVH_ASSIGN_OR_RETURN(const std::string desc,
                       ReadWholeFile(desc_path, kMaxDescriptionBytes));
  KVH_ASSIGN_OR_RETURN(
      const SafetensorsFile weights,
      SafetensorsFile::Open(absl::StrCat(dir, "/", kMsModelSlimWeightFile)));
  auto s = ParseC8ScalesFromMsModelSlim(
      desc, weights, geometry.num_layers,
      geometry.num_kv_heads * geometry.head_dim, names);
  if (!s.ok()) {
    return absl::Status(s.status().code(),
                        absl::StrCat(dir, ": ", s.status().message()));
  }
  return s;
}

std::string MsModelSlimC8Files::DescriptionJson() const {
  return nlohmann::json(description).dump(1);
}

absl::StatusOr<MsModelSlimC8Files> BuildMsModelSlimC8Files(
    const C8Scales& scales, C8NameStyle style, StDType dtype) {
  KVH_RETURN_IF_ERROR(scales.Validate());
  MsModelSlimC8Files f;
  f.description["model_quant_type"] =
      scales.model_quant_type.empty() ? "W8A16" : scales.model_quant_type;
  f.description["kv_cache_type"] = "C8";
  const C8NameOptions names;
  const std::vector<float>* arrays[kNumParams] = {
      &scales.k_scale, &scales.k_offset, &scales.v_scale, &scales.v_offset};
  const uint32_t c = scales.kv_channels;
  for (uint32_t l = 0; l < scales.num_layers; ++l) {
    const std::string base =
        style == C8NameStyle::kMergedQkv
            ? absl::StrCat("transformer.encoder.layers.", l,
                           ".self_attention.query_key_value")
            : absl::StrCat("model.layers.", l, ".self_attn");
    for (int p = 0; p < kNumParams; ++p) {
      SafetensorsTensorData t;
      t.name = base + ParamSuffix(names, p);
      t.dtype = dtype;
      t.shape = {c};
      const float* v = arrays[p]->data() + uint64_t{l} * c;
      KVH_ASSIGN_OR_RETURN(t.data,
                           EncodeFloatTensor(absl::MakeConstSpan(v, c), dtype));
      f.description[t.name] = f.description["model_quant_type"];
      f.tensors.push_back(std::move(t));
    }
  }
  return f;
}

absl::Status WriteMsModelSlimC8Files(const std::string& dir,
                                     const MsModelSlimC8Files& files) {
  KVH_RETURN_IF_ERROR(
      WriteWholeFile(absl::StrCat(dir, "/", kMsModelSlimDescriptionFile),
                     files.DescriptionJson()));
  return WriteSafetensorsFile(absl::StrCat(dir, "/", kMsModelSlimWeightFile),
                              files.tensors, {});
}

}  // namespace kvharbor
