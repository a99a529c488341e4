#include "types/layer_range.h"

#include "absl/strings/str_format.h"

namespace kvharbor {

absl::StatusOr<LayerRange> ResolveLayerRange(const Geometry& g, uint32_t begin,
                                             uint32_t end,
                                             absl::string_view begin_field,
                                             absl::string_view end_field) {
  if (begin == 0 && end == 0) return LayerRange{0, g.num_layers};
  if (end == 0 || end > g.num_layers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %u is outside the namespace's %u layers (give 1..%u, or 0 "
        "with %s 0 for every layer)",
        end_field, end, g.num_layers, g.num_layers, begin_field));
  }
  if (begin >= end) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %u must be below %s (%u)", begin_field, begin, end_field, end));
  }
  return LayerRange{begin, end};
}

uint64_t KvLayerBytes(const Geometry& g) {
  return uint64_t{g.page_size} * g.num_kv_heads * g.head_dim *
         DTypeSize(g.dtype);
}

uint64_t KvLayerOffset(const Geometry& g, uint32_t layer, int kv) {
  return PageBlockElementOffset(g, kv, layer) * DTypeSize(g.dtype);
}

PageRuns LayerRuns(const Geometry& g, LayerRange r) {
  PageRuns runs;
  const uint64_t b = KvLayerBytes(g);
  if (g.Resolved().layout == PageLayout::kLayerKvTokenHeadDim) {
    runs.count = 1;
    runs.offset[0] = KvLayerOffset(g, r.begin, 0);
    runs.bytes[0] = 2 * b * r.count();
    return runs;
  }
  runs.count = 2;
  for (int kv = 0; kv < 2; ++kv) {
    runs.offset[kv] = KvLayerOffset(g, r.begin, kv);
    runs.bytes[kv] = b * r.count();
  }
  return runs;
}

}  // namespace kvharbor
