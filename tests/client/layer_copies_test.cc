// The copy plan of a layer-wise load out of whole pages (client/
// layer_copies.h), against a reference that slices each page layer by layer
// with the geometry's own offsets: both page layouts, every kind of range,
// pages back to back, shuffled and with gaps, with and without registration
// boundaries (no copy may read across one).
#include "client/layer_copies.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

namespace kvharbor {
namespace client {
namespace {

Geometry SmallGeometry(PageLayout layout) {
  Geometry g;
  g.num_layers = 5;
  g.num_kv_heads = 2;
  g.head_dim = 4;
  g.page_size = 3;
  g.dtype = DType::kBF16;
  g.layout = layout;
  return g;
}

// Layers r of the page at `src`, as a page of a geometry of r.count()
// layers: each (layer, K or V) block taken on its own.
void ReferenceLayerPage(const Geometry& g, LayerRange r, const uint8_t* src,
                        uint8_t* dst) {
  Geometry sub = g;
  sub.num_layers = r.count();
  const uint64_t b = KvLayerBytes(g);
  for (uint32_t l = r.begin; l < r.end; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      std::memcpy(dst + KvLayerOffset(sub, l - r.begin, kv),
                  src + KvLayerOffset(g, l, kv), b);
    }
  }
}

std::vector<uint64_t> Offsets(int kind, size_t n, uint64_t pb) {
  std::vector<uint64_t> at(n);
  for (size_t i = 0; i < n; ++i) at[i] = i * pb;  // back to back
  if (kind == 1) {                                // shuffled
    std::mt19937 rng(7);
    std::shuffle(at.begin(), at.end(), rng);
  } else if (kind == 2) {  // runs of three with gaps between them
    for (size_t i = 0; i < n; ++i) at[i] = (i / 3) * 4 * pb + (i % 3) * pb + 16;
  }
  return at;
}

TEST_CASE("layer copies equal the layer-by-layer reference",
          "[client][layer_copies]") {
  for (PageLayout layout :
       {PageLayout::kKvLayerTokenHeadDim, PageLayout::kLayerKvTokenHeadDim}) {
    const Geometry g = SmallGeometry(layout);
    const uint64_t pb = g.PageBytes();
    for (LayerRange r : {LayerRange{0, 5}, LayerRange{0, 1}, LayerRange{2, 4},
                         LayerRange{4, 5}, LayerRange{1, 5}}) {
      for (int kind : {0, 1, 2}) {
        for (uint64_t boundary : {uint64_t{0}, pb * 3 / 2 + 10, 7 * pb}) {
          INFO("layout " << static_cast<int>(layout) << " layers [" << r.begin
                         << ", " << r.end << ") offsets " << kind
                         << " boundary " << boundary);
          const size_t n = 11;
          const std::vector<uint64_t> at = Offsets(kind, n, pb);
          std::vector<uint8_t> src(*std::max_element(at.begin(), at.end()) +
                                   pb);
          std::mt19937 rng(3);
          for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
          const uint64_t lpb = LayerPageBytes(g, r);
          CHECK(lpb == 2 * uint64_t{r.count()} * KvLayerBytes(g));
          std::vector<uint8_t> want(n * lpb), got(n * lpb, 0);
          for (size_t i = 0; i < n; ++i) {
            ReferenceLayerPage(g, r, src.data() + at[i], want.data() + i * lpb);
          }
          const std::vector<StridedCopy> plan =
              PlanLayerCopies(g, r, at, boundary);
          ApplyLayerCopies(plan, src.data(), got.data());
          CHECK(got == want);
          uint64_t moved = 0;
          for (const StridedCopy& c : plan) {
            moved += c.width * c.height;
            REQUIRE(c.height >= 1);
            const uint64_t last =
                c.src + (c.height - 1) * c.src_pitch + c.width - 1;
            if (boundary != 0) CHECK(c.src / boundary == last / boundary);
          }
          CHECK(moved == n * lpb);  // only the range's bytes
          if (kind == 0 && boundary == 0) {
            // Back-to-back pages: one copy per run of the page; a whole
            // page range is a single contiguous copy.
            const size_t runs =
                r.count() == g.num_layers ||
                        layout == PageLayout::kLayerKvTokenHeadDim
                    ? 1
                    : 2;
            CHECK(plan.size() == runs);
            if (r.count() == g.num_layers) CHECK(plan[0].height == 1);
          }
        }
      }
    }
  }
}

TEST_CASE("layer copies of no page are none", "[client][layer_copies]") {
  const Geometry g = SmallGeometry(PageLayout::kKvLayerTokenHeadDim);
  CHECK(PlanLayerCopies(g, LayerRange{1, 2}, {}, 0).empty());
}

}  // namespace
}  // namespace client
}  // namespace kvharbor
