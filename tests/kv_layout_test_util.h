// Engine KV-cache layouts for tests (types/kv_layout.h): the layouts of
// vLLM, FlashInfer, SGLang (layer-first and page-first), an HF dense cache,
// and a padded one whose head rows are not 16-byte aligned, built over
// memory a test allocates (host vectors, or device memory in tests/cuda);
// and the element-by-element expectation every scatter and gather is
// compared with. Header-only.
#ifndef KVHARBOR_TESTS_KV_LAYOUT_TEST_UTIL_H_
#define KVHARBOR_TESTS_KV_LAYOUT_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "types/geometry.h"
#include "types/kv_layout.h"

namespace kvharbor {
namespace testing {

enum class EngineLayout {
  kVllm,              // per layer [2, blocks, page, H, D]
  kFlashInfer,        // per layer [blocks, 2, page, H, D]
  kSglangLayerFirst,  // per layer K and V [slots, H, D]
  kSglangPageFirst,   // one [2, slots, L, H, D]
  kHfDense,           // per layer K and V [1, H, blocks * page, D]
  kPadded,            // per layer K and V [blocks, page, H, D + 1]
};

inline const char* EngineLayoutName(EngineLayout e) {
  switch (e) {
    case EngineLayout::kVllm:
      return "vllm";
    case EngineLayout::kFlashInfer:
      return "flashinfer";
    case EngineLayout::kSglangLayerFirst:
      return "sglang_layer_first";
    case EngineLayout::kSglangPageFirst:
      return "sglang_page_first";
    case EngineLayout::kHfDense:
      return "hf_dense";
    case EngineLayout::kPadded:
      return "padded";
  }
  return "?";
}

inline std::vector<EngineLayout> AllEngineLayouts() {
  return {EngineLayout::kVllm,
          EngineLayout::kFlashInfer,
          EngineLayout::kSglangLayerFirst,
          EngineLayout::kSglangPageFirst,
          EngineLayout::kHfDense,
          EngineLayout::kPadded};
}

// An allocation of `bytes`: its address (host or device).
using LayoutAlloc = std::function<uint64_t(uint64_t bytes)>;

// Layers [layer_begin, layer_begin + num_layers) of geometry `g` in engine
// layout `e`, `num_blocks` blocks, memory from `alloc` (every buffer's size
// recorded in k_bytes / v_bytes).
inline PagedKvLayout MakeEngineLayout(EngineLayout e, const Geometry& g,
                                      uint32_t layer_begin, uint32_t num_layers,
                                      uint64_t num_blocks,
                                      const LayoutAlloc& alloc) {
  const uint64_t es = DTypeSize(g.dtype);
  const uint64_t H = g.num_kv_heads, D = g.head_dim, P = g.page_size;
  const uint64_t block = P * H * D;
  PagedKvLayout l;
  l.dtype = g.dtype;
  l.layer_begin = layer_begin;
  l.num_kv_heads = g.num_kv_heads;
  l.head_dim = g.head_dim;
  l.block_size = g.page_size;
  l.num_blocks = num_blocks;
  l.head_stride = D;
  l.token_stride = H * D;
  l.block_stride = block;
  auto both = [&](uint64_t k_elems, uint64_t v_elems) {
    l.k.push_back(alloc(k_elems * es));
    l.k_bytes.push_back(k_elems * es);
    l.v.push_back(alloc(v_elems * es));
    l.v_bytes.push_back(v_elems * es);
  };
  if (e == EngineLayout::kSglangPageFirst) {
    const uint64_t L = num_layers, slots = num_blocks * P;
    const uint64_t total = 2 * slots * L * H * D;
    const uint64_t base = alloc(total * es);
    l.token_stride = L * H * D;
    l.block_stride = P * L * H * D;
    for (uint64_t j = 0; j < L; ++j) {
      l.k.push_back(base + j * H * D * es);
      l.k_bytes.push_back((total - j * H * D) * es);
      l.v.push_back(base + (slots * L * H * D + j * H * D) * es);
      l.v_bytes.push_back((total - slots * L * H * D - j * H * D) * es);
    }
    return l;
  }
  for (uint32_t j = 0; j < num_layers; ++j) {
    switch (e) {
      case EngineLayout::kVllm: {
        const uint64_t base = alloc(2 * num_blocks * block * es);
        l.k.push_back(base);
        l.k_bytes.push_back(2 * num_blocks * block * es);
        l.v.push_back(base + num_blocks * block * es);
        l.v_bytes.push_back(num_blocks * block * es);
        break;
      }
      case EngineLayout::kFlashInfer: {
        l.block_stride = 2 * block;
        const uint64_t base = alloc(2 * num_blocks * block * es);
        l.k.push_back(base);
        l.k_bytes.push_back(2 * num_blocks * block * es);
        l.v.push_back(base + block * es);
        l.v_bytes.push_back((2 * num_blocks - 1) * block * es);
        break;
      }
      case EngineLayout::kSglangLayerFirst:
        // One spare slot page at the end, as engines keep padding.
        both((num_blocks + 1) * block, (num_blocks + 1) * block);
        break;
      case EngineLayout::kHfDense:
        l.head_stride = num_blocks * P * D;
        l.token_stride = D;
        l.block_stride = P * D;
        both(H * num_blocks * P * D, H * num_blocks * P * D);
        break;
      case EngineLayout::kPadded:
        l.head_stride = D + 1;
        l.token_stride = H * (D + 1);
        l.block_stride = P * H * (D + 1);
        both(num_blocks * P * H * (D + 1), num_blocks * P * H * (D + 1));
        break;
      case EngineLayout::kSglangPageFirst:
        break;
    }
  }
  return l;
}

// Host memory for MakeEngineLayout, kept alive by the owner.
struct HostAllocs {
  std::vector<std::vector<uint8_t>> buffers;
  LayoutAlloc alloc() {
    return [this](uint64_t bytes) {
      buffers.emplace_back(bytes, 0xA5);  // a sentinel no copy writes
      return reinterpret_cast<uint64_t>(buffers.back().data());
    };
  }
};

// `n` pages of `g` of random bytes.
inline std::vector<std::vector<uint8_t>> RandomPages(const Geometry& g,
                                                     size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint8_t>> pages(n);
  for (auto& p : pages) {
    p.resize(g.PageBytes());
    for (auto& b : p) b = static_cast<uint8_t>(rng());
  }
  return pages;
}

// Calls `fn(page_byte, layer_byte_address)` for every element byte page i
// of `pages` maps to in `l`: (page, layer in range, K or V, token, head,
// d, byte). The one definition of the mapping tests compare against.
inline void ForEachMappedByte(
    const Geometry& g, const PagedKvLayout& l, size_t num_pages,
    const std::vector<int64_t>& block_ids,
    const std::function<void(size_t page, uint64_t page_byte,
                             uint64_t address)>& fn) {
  const uint64_t es = DTypeSize(g.dtype);
  for (size_t i = 0; i < num_pages; ++i) {
    for (uint32_t j = 0; j < l.num_layers(); ++j) {
      for (int kv = 0; kv < 2; ++kv) {
        const uint64_t base = kv == 0 ? l.k[j] : l.v[j];
        const uint64_t page_block =
            PageBlockElementOffset(g, kv, l.layer_begin + j);
        for (uint32_t t = 0; t < g.page_size; ++t) {
          for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
            for (uint32_t d = 0; d < g.head_dim; ++d) {
              const uint64_t pe =
                  page_block + (uint64_t{t} * g.num_kv_heads + h) * g.head_dim +
                  d;
              const uint64_t le =
                  l.ElementOffset(static_cast<uint64_t>(block_ids[i]), t, h) +
                  d;
              for (uint64_t b = 0; b < es; ++b) {
                fn(i, pe * es + b, base + le * es + b);
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_KV_LAYOUT_TEST_UTIL_H_
