#include "core/calibration/kv_samples.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/byte_io.h"
#include "core/base/status_macros.h"
#include "core/codec/codec.h"
#include "types/geometry.h"

namespace kvharbor {
namespace {

constexpr const char* kReserved[] = {
    "format",   "format_version", "num_layers", "num_kv_heads",
    "head_dim", "rope_style",     "rope_theta", "keys_roped"};

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("kv_samples: ", field, ": ", what));
}

absl::StatusOr<std::string> Meta(const SafetensorsHeader& h,
                                 absl::string_view key) {
  auto it = h.metadata.find(std::string(key));
  if (it == h.metadata.end()) {
    return Invalid(absl::StrCat("__metadata__.", key), "is missing");
  }
  return it->second;
}

absl::StatusOr<uint32_t> MetaU32(const SafetensorsHeader& h,
                                 absl::string_view key) {
  KVH_ASSIGN_OR_RETURN(const std::string s, Meta(h, key));
  uint32_t v = 0;
  if (!absl::SimpleAtoi(s, &v)) {
    return Invalid(absl::StrCat("__metadata__.", key),
                   absl::StrCat("'", s, "' is not an unsigned integer"));
  }
  return v;
}

absl::StatusOr<RopeStyle> ParseRopeStyle(absl::string_view s) {
  for (RopeStyle r :
       {RopeStyle::kNone, RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    if (s == RopeStyleName(r)) return r;
  }
  return Invalid(
      "__metadata__.rope_style",
      absl::StrCat("'", s, "' is not one of none, interleaved, half_split"));
}

absl::Status CheckTensor(const SafetensorsHeader& h, absl::string_view name,
                         const std::vector<uint64_t>& want_shape,
                         bool want_float) {
  const SafetensorsTensor* t = h.Find(name);
  const std::string f = absl::StrCat("tensors['", name, "']");
  if (t == nullptr) return Invalid(f, "is missing");
  if (want_float) {
    if (t->dtype != StDType::kF32 && t->dtype != StDType::kF16 &&
        t->dtype != StDType::kBF16) {
      return Invalid(f + ".dtype", absl::StrCat(StDTypeName(t->dtype),
                                                " is not F32, F16 or BF16"));
    }
  } else if (t->dtype != StDType::kI64) {
    return Invalid(f + ".dtype",
                   absl::StrCat(StDTypeName(t->dtype), " is not I64"));
  }
  if (t->shape != want_shape) {
    std::string got, want;
    for (uint64_t d : t->shape)
      absl::StrAppend(&got, got.empty() ? "" : ",", d);
    for (uint64_t d : want_shape)
      absl::StrAppend(&want, want.empty() ? "" : ",", d);
    return Invalid(f + ".shape", absl::StrCat("[", got, "], expected [", want,
                                              "] from the metadata"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status KvSamples::Validate() const {
  Geometry g;
  g.num_layers = num_layers;
  g.num_kv_heads = num_kv_heads;
  g.head_dim = head_dim;
  g.page_size = 1;
  g.dtype = DType::kFP32;
  {
    const absl::Status s = g.Validate("__metadata__");
    if (!s.ok()) return Invalid("geometry", s.message());
  }
  if (tokens == 0) return Invalid("tensors['k'].shape[0]", "no tokens");
  if (tokens > kMaxKvSampleElements / FeaturesPerToken()) {
    return Invalid(
        "tensors['k']",
        absl::StrFormat("%u tokens x %u features is over the limit "
                        "of %u elements",
                        tokens, FeaturesPerToken(), kMaxKvSampleElements));
  }
  const uint64_t n = tokens * FeaturesPerToken();
  if (k.size() != n) return Invalid("tensors['k']", "size mismatch");
  if (v.size() != n) return Invalid("tensors['v']", "size mismatch");
  if (positions.size() != tokens) {
    return Invalid("tensors['positions']", "size mismatch");
  }
  if (rope_style != RopeStyle::kNone && rope_style != RopeStyle::kInterleaved &&
      rope_style != RopeStyle::kHalfSplit) {
    return Invalid("__metadata__.rope_style", "unknown value");
  }
  if (rope_style != RopeStyle::kNone) {
    if (!(rope_theta > 1.0f) || !std::isfinite(rope_theta)) {
      return Invalid("__metadata__.rope_theta",
                     absl::StrCat(rope_theta,
                                  " must be finite and > 1 when "
                                  "rope_style is not none"));
    }
    if (head_dim % 2 != 0) {
      return Invalid("__metadata__.head_dim",
                     absl::StrCat(head_dim, " must be even for RoPE"));
    }
  }
  for (uint64_t i = 0; i < tokens; ++i) {
    if (positions[i] < 0 ||
        static_cast<uint64_t>(positions[i]) > kMaxFirstPosition) {
      return Invalid(absl::StrCat("tensors['positions'][", i, "]"),
                     absl::StrCat(positions[i], " is out of range [0, 2^53)"));
    }
  }
  for (const auto& [name, data] :
       {std::pair<const char*, const std::vector<float>*>{"k", &k},
        {"v", &v}}) {
    for (uint64_t i = 0; i < data->size(); ++i) {
      if (!std::isfinite((*data)[i])) {
        const uint64_t f = FeaturesPerToken();
        return Invalid(absl::StrFormat("tensors['%s'][%u]", name, i / f),
                       absl::StrFormat("feature %u is not finite", i % f));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// ParseKvSamples' metadata: format, version, geometry, RoPE and the extra
// keys, into `s`.
absl::Status ParseKvSamplesMetadata(const SafetensorsHeader& h, KvSamples* s) {
  KVH_ASSIGN_OR_RETURN(const std::string format, Meta(h, "format"));
  if (format != kKvSamplesFormat) {
    return Invalid(
        "__metadata__.format",
        absl::StrCat("'", format, "', expected '", kKvSamplesFormat, "'"));
  }
  KVH_ASSIGN_OR_RETURN(const uint32_t version, MetaU32(h, "format_version"));
  if (version != kKvSamplesVersion) {
    return Invalid("__metadata__.format_version",
                   absl::StrCat(version, " is not supported (this build reads ",
                                kKvSamplesVersion, ")"));
  }
  KVH_ASSIGN_OR_RETURN(s->num_layers, MetaU32(h, "num_layers"));
  KVH_ASSIGN_OR_RETURN(s->num_kv_heads, MetaU32(h, "num_kv_heads"));
  KVH_ASSIGN_OR_RETURN(s->head_dim, MetaU32(h, "head_dim"));
  KVH_ASSIGN_OR_RETURN(const std::string rope, Meta(h, "rope_style"));
  KVH_ASSIGN_OR_RETURN(s->rope_style, ParseRopeStyle(rope));
  if (s->rope_style != RopeStyle::kNone) {
    KVH_ASSIGN_OR_RETURN(const std::string theta, Meta(h, "rope_theta"));
    if (!absl::SimpleAtof(theta, &s->rope_theta)) {
      return Invalid("__metadata__.rope_theta",
                     absl::StrCat("'", theta, "' is not a number"));
    }
    KVH_ASSIGN_OR_RETURN(const std::string roped, Meta(h, "keys_roped"));
    if (roped != "true" && roped != "false") {
      return Invalid("__metadata__.keys_roped",
                     absl::StrCat("'", roped, "' is not true or false"));
    }
    s->keys_roped = roped == "true";
  } else {
    s->keys_roped = false;
  }
  for (const auto& [key, value] : h.metadata) {
    bool reserved = false;
    for (const char* r : kReserved) reserved |= key == r;
    if (!reserved) s->extra[key] = value;
  }
  return absl::OkStatus();
}

// ParseKvSamples' tensor table: k, v and positions with their shapes and
// dtypes, and the sample's size; sets s->tokens.
absl::Status CheckKvSamplesTensors(const SafetensorsHeader& h, KvSamples* s) {
  const SafetensorsTensor* kt = h.Find("k");
  if (kt == nullptr) return Invalid("tensors['k']", "is missing");
  if (kt->shape.size() != 4) {
    return Invalid("tensors['k'].shape",
                   absl::StrCat(kt->shape.size(),
                                " dimensions, expected 4 [tokens, layers, "
                                "kv_heads, head_dim]"));
  }
  s->tokens = kt->shape[0];
  const std::vector<uint64_t> shape = {s->tokens, s->num_layers,
                                       s->num_kv_heads, s->head_dim};
  KVH_RETURN_IF_ERROR(CheckTensor(h, "k", shape, true));
  KVH_RETURN_IF_ERROR(CheckTensor(h, "v", shape, true));
  KVH_RETURN_IF_ERROR(CheckTensor(h, "positions", {s->tokens}, false));
  if (h.tensors.size() != 3) {
    return Invalid("tensors", absl::StrCat(h.tensors.size(),
                                           " tensors; version 1 has exactly k, "
                                           "v and positions"));
  }
  // Geometry before the (possibly large) reads, so a bad header costs
  // nothing.
  {
    Geometry g;
    g.num_layers = s->num_layers;
    g.num_kv_heads = s->num_kv_heads;
    g.head_dim = s->head_dim;
    g.page_size = 1;
    g.dtype = DType::kFP32;
    const absl::Status st = g.Validate("__metadata__");
    if (!st.ok()) return Invalid("geometry", st.message());
    if (s->tokens > kMaxKvSampleElements / s->FeaturesPerToken()) {
      return Invalid("tensors['k'].shape", "over the element limit");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KvSamples> ParseKvSamples(const SafetensorsFile& file) {
  const SafetensorsHeader& h = file.header();
  KvSamples s;
  KVH_RETURN_IF_ERROR(ParseKvSamplesMetadata(h, &s));
  KVH_RETURN_IF_ERROR(CheckKvSamplesTensors(h, &s));
  KVH_ASSIGN_OR_RETURN(s.k, file.ReadTensorAsFloat("k"));
  KVH_ASSIGN_OR_RETURN(s.v, file.ReadTensorAsFloat("v"));
  KVH_ASSIGN_OR_RETURN(const std::string pos,
                       file.ReadTensorBytes("positions"));
  if (pos.size() != s.tokens * 8) {
    return Invalid("tensors['positions']", "size mismatch");
  }
  s.positions.resize(s.tokens);
  std::memcpy(s.positions.data(), pos.data(), pos.size());
  KVH_RETURN_IF_ERROR(s.Validate());
  return s;
}

absl::StatusOr<KvSamples> ReadKvSamples(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return PrefixStatus(path, file.status());
  auto s = ParseKvSamples(*file);
  if (!s.ok()) return PrefixStatus(path, s.status());
  return s;
}

absl::StatusOr<std::string> SerializeKvSamples(const KvSamples& samples,
                                               StDType dtype) {
  KVH_RETURN_IF_ERROR(samples.Validate());
  std::map<std::string, std::string> meta = samples.extra;
  meta["format"] = kKvSamplesFormat;
  meta["format_version"] = absl::StrCat(kKvSamplesVersion);
  meta["num_layers"] = absl::StrCat(samples.num_layers);
  meta["num_kv_heads"] = absl::StrCat(samples.num_kv_heads);
  meta["head_dim"] = absl::StrCat(samples.head_dim);
  meta["rope_style"] = std::string(RopeStyleName(samples.rope_style));
  if (samples.rope_style != RopeStyle::kNone) {
    meta["rope_theta"] = absl::StrFormat("%.9g", samples.rope_theta);
    meta["keys_roped"] = samples.keys_roped ? "true" : "false";
  }
  const std::vector<uint64_t> shape = {samples.tokens, samples.num_layers,
                                       samples.num_kv_heads, samples.head_dim};
  std::vector<SafetensorsTensorData> t(3);
  t[0].name = "k";
  t[0].dtype = dtype;
  t[0].shape = shape;
  KVH_ASSIGN_OR_RETURN(t[0].data, EncodeFloatTensor(samples.k, dtype));
  t[1].name = "v";
  t[1].dtype = dtype;
  t[1].shape = shape;
  KVH_ASSIGN_OR_RETURN(t[1].data, EncodeFloatTensor(samples.v, dtype));
  t[2].name = "positions";
  t[2].dtype = StDType::kI64;
  t[2].shape = {samples.tokens};
  t[2].data.assign(reinterpret_cast<const char*>(samples.positions.data()),
                   samples.positions.size() * 8);
  return SerializeSafetensors(t, meta);
}

absl::Status WriteKvSamples(const KvSamples& samples, StDType dtype,
                            const std::string& path) {
  return WriteSerialized(path, SerializeKvSamples(samples, dtype));
}

}  // namespace kvharbor
