// The CPU reference scatter and gather (core/memory/paged_kv_copy.h) over
// every engine layout of tests/kv_layout_test_util.h, every dtype, both page
// layouts and layer ranges: each byte lands where the element mapping says,
// nothing outside the addressed elements changes, gather undoes scatter;
// bad input is refused before anything is written.
#include "core/memory/paged_kv_copy.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/kv_layout_test_util.h"

namespace kvharbor {
namespace {

using testing::EngineLayout;
using testing::HostAllocs;

Geometry MakeGeometry(DType dtype, PageLayout layout) {
  Geometry g;
  g.num_layers = 4;
  g.num_kv_heads = 3;
  g.head_dim = 8;
  g.page_size = 4;
  g.dtype = dtype;
  g.layout = layout;
  return g;
}

std::vector<const uint8_t*> Pointers(
    const std::vector<std::vector<uint8_t>>& pages) {
  std::vector<const uint8_t*> out;
  for (const auto& p : pages) out.push_back(p.data());
  return out;
}

// Every byte of every buffer of `allocs`: the mapped ones equal their page
// byte, all others still hold the 0xA5 sentinel.
void CheckScattered(const Geometry& g, const PagedKvLayout& l,
                    const std::vector<std::vector<uint8_t>>& pages,
                    const std::vector<int64_t>& blocks,
                    const HostAllocs& allocs) {
  std::set<uint64_t> written;
  size_t wrong = 0;
  testing::ForEachMappedByte(
      g, l, pages.size(), blocks,
      [&](size_t page, uint64_t page_byte, uint64_t address) {
        written.insert(address);
        if (*reinterpret_cast<const uint8_t*>(address) !=
            pages[page][page_byte]) {
          ++wrong;
        }
      });
  CHECK(wrong == 0);
  size_t stray = 0;
  for (const auto& buf : allocs.buffers) {
    for (size_t b = 0; b < buf.size(); ++b) {
      const uint64_t address = reinterpret_cast<uint64_t>(buf.data() + b);
      if (written.count(address) == 0 && buf[b] != 0xA5) ++stray;
    }
  }
  CHECK(stray == 0);
}

TEST_CASE("CPU scatter and gather over engine layouts, dtypes, page layouts",
          "[core][paged_kv_copy]") {
  for (DType dtype :
       {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3}) {
    for (PageLayout pl :
         {PageLayout::kKvLayerTokenHeadDim, PageLayout::kLayerKvTokenHeadDim}) {
      for (EngineLayout e : testing::AllEngineLayouts()) {
        for (auto [begin, n] : {std::pair<uint32_t, uint32_t>{0, 4}, {1, 2}}) {
          const Geometry g = MakeGeometry(dtype, pl);
          INFO(DTypeName(dtype) << " " << PageLayoutName(pl) << " "
                                << testing::EngineLayoutName(e) << " layers ["
                                << begin << ", " << begin + n << ")");
          HostAllocs allocs;
          const PagedKvLayout l =
              testing::MakeEngineLayout(e, g, begin, n, 7, allocs.alloc());
          const auto pages = testing::RandomPages(g, 5, 11);
          const std::vector<int64_t> blocks = {6, 0, 3, 2, 5};
          REQUIRE(ScatterPagesToLayout(g, l, Pointers(pages), blocks).ok());
          CheckScattered(g, l, pages, blocks, allocs);
          if (n != g.num_layers) {
            std::vector<uint8_t> out(g.PageBytes());
            uint8_t* dst = out.data();
            const absl::Status s =
                GatherLayoutToPages(g, l, absl::MakeConstSpan(blocks.data(), 1),
                                    absl::MakeConstSpan(&dst, 1));
            CHECK(absl::StartsWith(s.message(), "layout.num_layers"));
            continue;
          }
          std::vector<std::vector<uint8_t>> back(
              5, std::vector<uint8_t>(g.PageBytes(), 0));
          std::vector<uint8_t*> dsts;
          for (auto& p : back) dsts.push_back(p.data());
          REQUIRE(GatherLayoutToPages(g, l, blocks, dsts).ok());
          CHECK(back == pages);
        }
      }
    }
  }
}

TEST_CASE("CPU scatter refuses bad input and writes nothing",
          "[core][paged_kv_copy]") {
  const Geometry g =
      MakeGeometry(DType::kBF16, PageLayout::kKvLayerTokenHeadDim);
  HostAllocs allocs;
  const PagedKvLayout good = testing::MakeEngineLayout(EngineLayout::kVllm, g,
                                                       0, 4, 4, allocs.alloc());
  const auto pages = testing::RandomPages(g, 2, 3);
  const auto ptrs = Pointers(pages);
  auto expect = [&](const PagedKvLayout& l, std::vector<int64_t> blocks,
                    const std::string& field) {
    const absl::Status s = ScatterPagesToLayout(g, l, ptrs, blocks);
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StartsWith(s.message(), field));
    for (const auto& buf : allocs.buffers) {
      CHECK(std::all_of(buf.begin(), buf.end(),
                        [](uint8_t b) { return b == 0xA5; }));
    }
  };
  expect(good, {0, 4}, "block_ids[1]");
  expect(good, {-1, 0}, "block_ids[0]");
  expect(good, {2, 2}, "block_ids[1]");
  expect(good, {0}, "block_ids:");
  PagedKvLayout l = good;
  l.device = 0;
  expect(l, {0, 1}, "layout.device");
  l = good;
  l.num_kv_heads = 2;
  expect(l, {0, 1}, "layout.num_kv_heads");
  l = good;
  l.dtype = DType::kFP16;
  expect(l, {0, 1}, "layout.dtype");
  l = good;
  l.v_bytes[2] -= 2;  // V fills its buffer to the end: one element short
  expect(l, {0, 1}, "layout.v[2]");
  std::vector<const uint8_t*> with_null = ptrs;
  with_null[1] = nullptr;
  const absl::Status s = ScatterPagesToLayout(g, good, with_null, {0, 1});
  CHECK(absl::StartsWith(s.message(), "pages[1]"));
}

}  // namespace
}  // namespace kvharbor
