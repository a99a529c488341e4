// Geometry of a namespace's KV pages: how many bytes a page holds and how they
// are laid out.
//
// A page is `page_size` tokens of K and V for every layer. Geometry is a plain
// value type (copyable, thread-compatible); Validate() is the one place that
// decides what geometries kvharbor accepts, so every entry point (RPC, config
// file, tests) gets the same limits and the same error messages.
#ifndef KVHARBOR_TYPES_GEOMETRY_H_
#define KVHARBOR_TYPES_GEOMETRY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvharbor {

// Element type of stored KV. Values match the proto enum (kvharbor.v1.DType);
// kUnspecified is the proto's unset value, which Validate refuses.
enum class DType : int {
  kUnspecified = 0,
  kBF16 = 1,
  kFP16 = 2,
  kFP32 = 3,
  kFP8E4M3 = 4,
};

// Byte size of one element of `dtype`; 0 for kUnspecified or an unknown value.
size_t DTypeSize(DType dtype);
// "bf16", "fp16", "fp32", "fp8_e4m3"; "unspecified" or "unknown" otherwise.
absl::string_view DTypeName(DType dtype);
// Inverse of DTypeName for the four element types; InvalidArgument naming
// "dtype" otherwise.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// Order of the dimensions inside one page. Values match the proto enum
// (kvharbor.v1.PageLayout); kUnspecified, the proto's unset value, means
// kKvLayerTokenHeadDim (Geometry::Resolved) and is refused by Validate.
enum class PageLayout : int {
  kUnspecified = 0,
  // [2 (K then V)][layer][token][kv_head][head_dim], contiguous.
  kKvLayerTokenHeadDim = 1,
  // [layer][2 (K then V)][token][kv_head][head_dim], contiguous.
  kLayerKvTokenHeadDim = 2,
};
absl::string_view PageLayoutName(PageLayout layout);

// Limits, chosen so that every product below fits comfortably in 64 bits and
// one page stays within what a single pool slot can reasonably hold.
inline constexpr uint32_t kMaxLayers = 1024;
inline constexpr uint32_t kMaxKvHeads = 1024;
inline constexpr uint32_t kMaxHeadDim = 4096;
inline constexpr uint32_t kMaxPageSize = 4096;
inline constexpr uint64_t kMaxPageBytes = uint64_t{256} << 20;  // 256 MiB

struct Geometry {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t page_size = 0;  // tokens per page
  DType dtype = DType::kBF16;
  PageLayout layout = PageLayout::kKvLayerTokenHeadDim;
  // RoPE parameters of the model, for codecs that undo RoPE on keys. 0 = none.
  float rope_theta = 0.0f;

  // Elements of K (or V) for one token across all layers and heads.
  uint64_t ElementsPerTokenPerKv() const {
    return uint64_t{num_layers} * num_kv_heads * head_dim;
  }
  uint64_t ElementsPerPage() const {
    return 2 * ElementsPerTokenPerKv() * page_size;
  }
  uint64_t PageBytes() const { return ElementsPerPage() * DTypeSize(dtype); }

  // This geometry with a kUnspecified layout read as kKvLayerTokenHeadDim,
  // the daemon's default (a geometry the daemon returns is resolved).
  Geometry Resolved() const {
    Geometry g = *this;
    if (g.layout == PageLayout::kUnspecified) {
      g.layout = PageLayout::kKvLayerTokenHeadDim;
    }
    return g;
  }

  // Checks every field; the message names the offending field as
  // "<prefix>.<field>" so RPC callers see e.g. "geometry.head_dim".
  absl::Status Validate(absl::string_view prefix = "geometry") const;

  std::string DebugString() const;
  bool operator==(const Geometry& o) const {
    return num_layers == o.num_layers && num_kv_heads == o.num_kv_heads &&
           head_dim == o.head_dim && page_size == o.page_size &&
           dtype == o.dtype && layout == o.layout && rope_theta == o.rope_theta;
  }
};

// Element index (not byte) in a page of token 0 of the K (kv = 0) or V
// (kv = 1) block of layer `layer`. Within a block, tokens are rows of
// num_kv_heads * head_dim contiguous elements ([token][kv_head][head_dim])
// in both page layouts; only the order of the (kv, layer) blocks differs.
inline uint64_t PageBlockElementOffset(const Geometry& g, int kv,
                                       uint32_t layer) {
  const uint64_t block =
      uint64_t{g.page_size} * g.num_kv_heads * uint64_t{g.head_dim};
  const uint64_t index = g.layout == PageLayout::kLayerKvTokenHeadDim
                             ? uint64_t{layer} * 2 + kv
                             : uint64_t(kv) * g.num_layers + layer;
  return index * block;
}

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_GEOMETRY_H_
