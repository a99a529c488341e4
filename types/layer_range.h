// Layer ranges of a namespace's pages (docs/engines_api.md "Layer ranges"):
// which layers a Fetch carries (FetchRequest.layer_begin/layer_end) and where
// the K and V of each layer lie in a page, for the layer-major Insert
// (InsertHeader.layer_major), whose data arrives layer by layer.
//
// A page restricted to layers [begin, end) keeps the namespace's layout:
// kKvLayerTokenHeadDim -> [K of layers begin..end][V of layers begin..end],
// two contiguous runs of the page; kLayerKvTokenHeadDim -> [layers
// begin..end][K, V], one run. Plain value types and pure functions;
// thread-safe.
#ifndef KVHARBOR_TYPES_LAYER_RANGE_H_
#define KVHARBOR_TYPES_LAYER_RANGE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "types/geometry.h"

namespace kvharbor {

struct LayerRange {
  uint32_t begin = 0;
  uint32_t end = 0;  // exclusive
  uint32_t count() const { return end - begin; }
};

// (0, 0) = every layer of `g`; otherwise 0 <= begin < end <= g.num_layers.
// InvalidArgument naming `begin_field` or `end_field` otherwise.
absl::StatusOr<LayerRange> ResolveLayerRange(const Geometry& g, uint32_t begin,
                                             uint32_t end,
                                             absl::string_view begin_field,
                                             absl::string_view end_field);

// Bytes of K (or of V) of one layer of one page: page_size * num_kv_heads *
// head_dim elements.
uint64_t KvLayerBytes(const Geometry& g);

// Offset in a page (laid out as g.layout) of K (kv 0) or V (kv 1) of
// `layer`; KvLayerBytes(g) bytes from there hold it.
uint64_t KvLayerOffset(const Geometry& g, uint32_t layer, int kv);

// The byte runs of a page that hold layers `r`, in the order a layer-range
// Fetch sends them: K then V for kKvLayerTokenHeadDim (2 runs), one run for
// kLayerKvTokenHeadDim.
struct PageRuns {
  uint64_t offset[2] = {0, 0};
  uint64_t bytes[2] = {0, 0};
  int count = 0;
  uint64_t total() const { return bytes[0] + bytes[1]; }
};
PageRuns LayerRuns(const Geometry& g, LayerRange r);

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_LAYER_RANGE_H_
