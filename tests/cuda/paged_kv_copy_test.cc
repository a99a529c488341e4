// The paged-KV scatter and gather kernels (cuda/kernels/paged_kv_scatter.h,
// cuda/kernels/paged_kv_gather.h) against the CPU reference
// (core/memory/paged_kv_copy.h) on identical data: every engine layout of
// tests/kv_layout_test_util.h, every dtype, both page layouts, layer ranges,
// pages from a contiguous batch and from a table of addresses, full-width
// and narrow vectors; every byte of every layout buffer is compared, so a
// stray write shows as a changed sentinel.
#include "core/memory/paged_kv_copy.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/kernels/paged_kv_gather.h"
#include "cuda/kernels/paged_kv_scatter.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/kv_layout_test_util.h"

namespace kvharbor {
namespace gpu {
namespace {

using kvharbor::testing::EngineLayout;
using kvharbor::testing::HostAllocs;
using testing::DeviceBuf;

// Device buffers for MakeEngineLayout, filled with the host sentinel.
struct DeviceAllocs {
  std::vector<std::unique_ptr<DeviceBuf>> buffers;
  kvharbor::testing::LayoutAlloc alloc() {
    return [this](uint64_t bytes) {
      buffers.push_back(std::make_unique<DeviceBuf>(bytes));
      buffers.back()->Fill(0xA5);
      return reinterpret_cast<uint64_t>(buffers.back()->bytes());
    };
  }
};

template <typename T>
std::unique_ptr<DeviceBuf> Upload(const std::vector<T>& v) {
  auto d = std::make_unique<DeviceBuf>(v.size() * sizeof(T));
  d->Upload(v.data(), v.size() * sizeof(T));
  return d;
}

// The device tables of a layout: block ids, K and V bases.
struct Tables {
  std::unique_ptr<DeviceBuf> blocks, k, v;
  Tables(const PagedKvLayout& l, const std::vector<int64_t>& block_ids)
      : blocks(Upload(block_ids)), k(Upload(l.k)), v(Upload(l.v)) {}
};

uint32_t LayoutAlign(const PagedKvLayout& l) {
  uint64_t all = 0;
  for (uint64_t b : l.k) all |= b;
  for (uint64_t b : l.v) all |= b;
  return AlignmentOf(all);
}

Geometry MakeGeometry(DType dtype, PageLayout pl, uint32_t heads,
                      uint32_t dim) {
  Geometry g;
  g.num_layers = 4;
  g.num_kv_heads = heads;
  g.head_dim = dim;
  g.page_size = 4;
  g.dtype = dtype;
  g.layout = pl;
  return g;
}

void CheckBuffersEqual(const HostAllocs& host, const DeviceAllocs& dev) {
  REQUIRE(host.buffers.size() == dev.buffers.size());
  for (size_t i = 0; i < host.buffers.size(); ++i) {
    std::vector<uint8_t> got(dev.buffers[i]->size());
    dev.buffers[i]->Download(got.data(), got.size());
    INFO("buffer " << i);
    CHECK(got == host.buffers[i]);
  }
}

void RunCase(const Geometry& g, EngineLayout e, uint32_t begin, uint32_t n,
             bool page_table, uint32_t max_vector) {
  constexpr uint64_t kBlocks = 9;
  constexpr size_t kPages = 6;
  HostAllocs host;
  DeviceAllocs dev;
  const PagedKvLayout hl = kvharbor::testing::MakeEngineLayout(
      e, g, begin, n, kBlocks, host.alloc());
  const PagedKvLayout dl =
      kvharbor::testing::MakeEngineLayout(e, g, begin, n, kBlocks, dev.alloc());
  const auto pages = kvharbor::testing::RandomPages(g, kPages, 7);
  const std::vector<int64_t> block_ids = {8, 1, 4, 0, 7, 3};
  const uint64_t pb = g.PageBytes();

  // Pages on the device: a batch, or shuffled slots of a bigger arena
  // reached through an address table.
  DeviceBuf arena((kPages + 3) * pb);
  std::vector<uint64_t> ptrs(kPages);
  const std::vector<size_t> slot = {5, 0, 8, 2, 7, 3};
  for (size_t i = 0; i < kPages; ++i) {
    const size_t at = page_table ? slot[i] : i;
    arena.Upload(pages[i].data(), pb, at * pb);
    ptrs[i] = reinterpret_cast<uint64_t>(arena.bytes() + at * pb);
  }
  auto ptr_table = Upload(ptrs);
  Tables t(dl, block_ids);
  const PagedKvShape shape = MakePagedKvShape(g, *ResolveLayout(dl, g));

  std::vector<const uint8_t*> host_pages;
  for (const auto& p : pages) host_pages.push_back(p.data());
  KVH_STATUS_REQUIRE(ScatterPagesToLayout(g, hl, host_pages, block_ids));
  PagedKvScatterArgs a;
  a.shape = shape;
  a.num_pages = kPages;
  if (page_table) {
    a.page_ptrs = ptr_table->as<uint64_t>();
    a.page_align = AlignmentOf(pb);
  } else {
    a.page_base = arena.bytes();
    a.page_pitch = pb;
  }
  a.block_ids = t.blocks->as<int64_t>();
  a.k_bases = t.k->as<uint64_t>();
  a.v_bases = t.v->as<uint64_t>();
  a.layout_align = LayoutAlign(dl);
  a.max_vector_bytes = max_vector;
  KVH_STATUS_REQUIRE(LaunchPagedKvScatter(a, nullptr));
  KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
  CheckBuffersEqual(host, dev);
  if (n != g.num_layers) return;

  // Gather back, into zeroed pages: the pages again.
  DeviceBuf out((kPages + 3) * pb);
  out.Fill(0);
  std::vector<uint64_t> out_ptrs(kPages);
  for (size_t i = 0; i < kPages; ++i) {
    out_ptrs[i] = reinterpret_cast<uint64_t>(out.bytes() +
                                             (page_table ? slot[i] : i) * pb);
  }
  auto out_table = Upload(out_ptrs);
  PagedKvGatherArgs ga;
  ga.shape = shape;
  ga.num_pages = kPages;
  if (page_table) {
    ga.page_ptrs = out_table->as<uint64_t>();
    ga.page_align = AlignmentOf(pb);
  } else {
    ga.page_base = out.bytes();
    ga.page_pitch = pb;
  }
  ga.block_ids = a.block_ids;
  ga.k_bases = a.k_bases;
  ga.v_bases = a.v_bases;
  ga.layout_align = a.layout_align;
  ga.max_vector_bytes = max_vector;
  KVH_STATUS_REQUIRE(LaunchPagedKvGather(ga, nullptr));
  KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
  for (size_t i = 0; i < kPages; ++i) {
    std::vector<uint8_t> got(pb);
    out.Download(got.data(), pb, (page_table ? slot[i] : i) * pb);
    INFO("page " << i);
    CHECK(got == pages[i]);
  }
}

TEST_CASE("paged KV scatter and gather equal the CPU reference",
          "[gpu][paged_kv]") {
  for (DType dtype :
       {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3}) {
    for (PageLayout pl :
         {PageLayout::kKvLayerTokenHeadDim, PageLayout::kLayerKvTokenHeadDim}) {
      for (auto [heads, dim] : {std::pair<uint32_t, uint32_t>{2, 16}, {3, 6}}) {
        const Geometry g = MakeGeometry(dtype, pl, heads, dim);
        for (EngineLayout e : kvharbor::testing::AllEngineLayouts()) {
          for (auto [begin, n] :
               {std::pair<uint32_t, uint32_t>{0, 4}, {1, 2}}) {
            for (bool table : {false, true}) {
              for (uint32_t vec : {16u, 1u}) {
                INFO(DTypeName(dtype)
                     << " " << PageLayoutName(pl) << " heads " << heads
                     << " dim " << dim << " "
                     << kvharbor::testing::EngineLayoutName(e) << " layers ["
                     << begin << ", " << begin + n << ") table " << table
                     << " max vector " << vec);
                RunCase(g, e, begin, n, table, vec);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("paged KV copies pick the widest vector the alignments allow",
          "[gpu][paged_kv]") {
  Geometry g =
      MakeGeometry(DType::kBF16, PageLayout::kKvLayerTokenHeadDim, 8, 128);
  g.page_size = 16;
  HostAllocs host;
  PagedKvLayout l = kvharbor::testing::MakeEngineLayout(EngineLayout::kVllm, g,
                                                        0, 4, 4, host.alloc());
  PagedKvShape s = MakePagedKvShape(g, *ResolveLayout(l, g));
  CHECK(s.run_elements == 16 * 8 * 128);
  CHECK(PagedKvVectorBytes(s, 256, 256, 16) == 16);
  CHECK(PagedKvVectorBytes(s, 256, 4, 16) == 4);
  CHECK(PagedKvVectorBytes(s, 2, 256, 16) == 2);
  l = kvharbor::testing::MakeEngineLayout(EngineLayout::kPadded, g, 0, 4, 4,
                                          host.alloc());
  s = MakePagedKvShape(g, *ResolveLayout(l, g));
  CHECK(s.run_elements == 128);
  CHECK(PagedKvVectorBytes(s, 256, 256, 16) == 2);  // rows of 129 elements
}

TEST_CASE("paged KV scatter skips block ids outside the layout",
          "[gpu][paged_kv]") {
  const Geometry g =
      MakeGeometry(DType::kFP32, PageLayout::kKvLayerTokenHeadDim, 2, 16);
  DeviceAllocs dev;
  const PagedKvLayout dl = kvharbor::testing::MakeEngineLayout(
      EngineLayout::kVllm, g, 0, 4, 3, dev.alloc());
  const auto pages = kvharbor::testing::RandomPages(g, 2, 1);
  DeviceBuf batch(2 * g.PageBytes());
  batch.Upload(pages[0].data(), g.PageBytes());
  batch.Upload(pages[1].data(), g.PageBytes(), g.PageBytes());
  Tables t(dl, {3, -1});
  PagedKvScatterArgs a;
  a.shape = MakePagedKvShape(g, *ResolveLayout(dl, g));
  a.num_pages = 2;
  a.page_base = batch.bytes();
  a.page_pitch = g.PageBytes();
  a.block_ids = t.blocks->as<int64_t>();
  a.k_bases = t.k->as<uint64_t>();
  a.v_bases = t.v->as<uint64_t>();
  a.layout_align = LayoutAlign(dl);
  KVH_STATUS_REQUIRE(LaunchPagedKvScatter(a, nullptr));
  KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
  for (const auto& b : dev.buffers) {
    std::vector<uint8_t> got(b->size());
    b->Download(got.data(), got.size());
    CHECK(std::all_of(got.begin(), got.end(),
                      [](uint8_t x) { return x == 0xA5; }));
  }
  a.k_bases = nullptr;
  CHECK(LaunchPagedKvScatter(a, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpu
}  // namespace kvharbor
