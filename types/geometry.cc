#include "types/geometry.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "types/enum_names.h"

namespace kvharbor {
namespace {

// Indexed by DType's value.
constexpr const char* kDTypeNames[] = {"unspecified", "bf16", "fp16", "fp32",
                                       "fp8_e4m3"};

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kFP16:
      return 2;
    case DType::kFP32:
      return 4;
    case DType::kFP8E4M3:
      return 1;
    case DType::kUnspecified:
      break;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  return EnumName(dtype, kDTypeNames);
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  // kUnspecified, the proto's unset value, is not a name a user writes.
  return ParseEnum<DType>("dtype", name,
                          absl::MakeConstSpan(kDTypeNames).subspan(1), 1);
}

absl::string_view PageLayoutName(PageLayout layout) {
  return EnumName(layout, {"unspecified", "kv_layer_token_head_dim",
                           "layer_kv_token_head_dim"});
}

namespace {

absl::Status CheckRange(absl::string_view prefix, absl::string_view field,
                        uint32_t value, uint32_t max) {
  if (value == 0 || value > max) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s.%s: %u is out of range [1, %u]", prefix, field, value, max));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Geometry::Validate(absl::string_view prefix) const {
  for (auto [field, value, max] : {std::tuple<const char*, uint32_t, uint32_t>{
                                       "num_layers", num_layers, kMaxLayers},
                                   {"num_kv_heads", num_kv_heads, kMaxKvHeads},
                                   {"head_dim", head_dim, kMaxHeadDim},
                                   {"page_size", page_size, kMaxPageSize}}) {
    absl::Status s = CheckRange(prefix, field, value, max);
    if (!s.ok()) return s;
  }
  if (DTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s.dtype: unknown value %d", prefix, static_cast<int>(dtype)));
  }
  if (layout != PageLayout::kKvLayerTokenHeadDim &&
      layout != PageLayout::kLayerKvTokenHeadDim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s.layout: unknown value %d", prefix, static_cast<int>(layout)));
  }
  if (!std::isfinite(rope_theta) || rope_theta < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s.rope_theta: %g must be finite and >= 0", prefix, rope_theta));
  }
  if (PageBytes() > kMaxPageBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: a page would be %u bytes, over the limit of %u bytes", prefix,
        PageBytes(), kMaxPageBytes));
  }
  return absl::OkStatus();
}

std::string Geometry::DebugString() const {
  return absl::StrFormat(
      "layers=%u kv_heads=%u head_dim=%u page_size=%u dtype=%s layout=%s "
      "page_bytes=%u",
      num_layers, num_kv_heads, head_dim, page_size, DTypeName(dtype),
      PageLayoutName(layout), PageBytes());
}

}  // namespace kvharbor
