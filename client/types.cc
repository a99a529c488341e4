#include "client/types.h"

#include "absl/strings/str_cat.h"

namespace kvharbor {
namespace client {

size_t DTypeBytes(DType dtype) {
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
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kFP16:
      return "fp16";
    case DType::kFP32:
      return "fp32";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
    case DType::kUnspecified:
      break;
  }
  return "unspecified";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (DType d : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3}) {
    if (name == DTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "dtype: unknown value '", name, "' (want bf16, fp16, fp32 or fp8_e4m3)"));
}

absl::string_view PageLayoutName(PageLayout layout) {
  switch (layout) {
    case PageLayout::kKvLayerTokenHeadDim:
      return "kv_layer_token_head_dim";
    case PageLayout::kLayerKvTokenHeadDim:
      return "layer_kv_token_head_dim";
    case PageLayout::kUnspecified:
      break;
  }
  return "unspecified";
}

absl::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kRaw:
      return "raw";
    case Tier::kHostCompressed:
      return "host_compressed";
    case Tier::kDisk:
      return "disk";
  }
  return "unknown";
}

}  // namespace client
}  // namespace kvharbor
