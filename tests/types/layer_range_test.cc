// Tests of the layer-range geometry (types/layer_range.h): the checks, and
// that the runs and offsets address exactly the right elements of a page in
// both layouts (against a page whose every element names itself).
#include "types/layer_range.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

namespace kvharbor {
namespace {

Geometry Geo(PageLayout layout) {
  Geometry g;
  g.num_layers = 5;
  g.num_kv_heads = 2;
  g.head_dim = 3;
  g.page_size = 4;
  g.dtype = DType::kFP32;
  g.layout = layout;
  return g;
}

// A page whose element at (kv, layer, token, head, dim) holds the code
// kv * 10000 + layer * 1000 + token * 100 + head * 10 + dim, placed as the
// layout says.
std::vector<float> NamedPage(const Geometry& g) {
  std::vector<float> page(g.ElementsPerPage());
  const uint64_t per_kv_layer =
      uint64_t{g.page_size} * g.num_kv_heads * g.head_dim;
  for (int kv = 0; kv < 2; ++kv) {
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      const uint64_t base =
          g.layout == PageLayout::kLayerKvTokenHeadDim
              ? (uint64_t{l} * 2 + static_cast<uint64_t>(kv)) * per_kv_layer
              : (static_cast<uint64_t>(kv) * g.num_layers + l) * per_kv_layer;
      for (uint64_t e = 0; e < per_kv_layer; ++e) {
        const uint64_t t = e / (g.num_kv_heads * g.head_dim);
        const uint64_t h = e / g.head_dim % g.num_kv_heads;
        const uint64_t d = e % g.head_dim;
        page[base + e] =
            static_cast<float>(kv * 10000 + l * 1000 + t * 100 + h * 10 + d);
      }
    }
  }
  return page;
}

TEST_CASE("LayerRange: checks name the field") {
  const Geometry g = Geo(PageLayout::kKvLayerTokenHeadDim);
  auto all = ResolveLayerRange(g, 0, 0, "layer_begin", "layer_end");
  REQUIRE(all.ok());
  CHECK(all->begin == 0);
  CHECK(all->end == 5);
  CHECK(ResolveLayerRange(g, 4, 5, "b", "e").ok());
  auto past = ResolveLayerRange(g, 0, 6, "layer_begin", "layer_end");
  CHECK(past.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(past.status().message().substr(0, 11) == "layer_end: ");
  auto empty = ResolveLayerRange(g, 3, 3, "layer_begin", "layer_end");
  CHECK(empty.status().message() ==
        "layer_begin: 3 must be below layer_end (3)");
  auto begin_only = ResolveLayerRange(g, 2, 0, "layer_begin", "layer_end");
  CHECK(begin_only.status().message().substr(0, 11) == "layer_end: ");
}

TEST_CASE("LayerRange: runs and offsets address the right elements") {
  const PageLayout layout = GENERATE(PageLayout::kKvLayerTokenHeadDim,
                                     PageLayout::kLayerKvTokenHeadDim);
  const Geometry g = Geo(layout);
  const std::vector<float> page = NamedPage(g);
  const uint64_t kvb = KvLayerBytes(g);
  CHECK(kvb == 4 * 2 * 3 * 4);
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const uint64_t off = KvLayerOffset(g, l, kv);
      REQUIRE(off % 4 == 0);
      CHECK(page[off / 4] == static_cast<float>(kv * 10000 + l * 1000));
      CHECK(page[(off + kvb) / 4 - 1] ==
            static_cast<float>(kv * 10000 + l * 1000 + 312));  // t3 h1 d2
    }
  }
  const LayerRange r{1, 4};
  const PageRuns runs = LayerRuns(g, r);
  CHECK(runs.total() == 2 * kvb * r.count());
  // The bytes the runs select, in order: the layout restricted to 1..4.
  std::vector<float> sent;
  for (int i = 0; i < runs.count; ++i) {
    sent.insert(sent.end(), page.begin() + runs.offset[i] / 4,
                page.begin() + (runs.offset[i] + runs.bytes[i]) / 4);
  }
  std::vector<float> want;
  const uint64_t n = kvb / 4;
  const auto add = [&](int kv, uint32_t l) {
    const uint64_t off = KvLayerOffset(g, l, kv) / 4;
    want.insert(want.end(), page.begin() + off, page.begin() + off + n);
  };
  if (layout == PageLayout::kLayerKvTokenHeadDim) {
    CHECK(runs.count == 1);
    for (uint32_t l = r.begin; l < r.end; ++l) {
      add(0, l);
      add(1, l);
    }
  } else {
    CHECK(runs.count == 2);
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t l = r.begin; l < r.end; ++l) add(kv, l);
    }
  }
  CHECK(sent == want);
}

}  // namespace
}  // namespace kvharbor
