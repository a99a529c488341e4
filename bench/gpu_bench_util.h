// Helpers of the benchmarks that drive the SDK's GPU transfers against
// kvharbord children (hit_path_bench, layerwise_load_bench): a CUDA call
// check and a StatusOr unwrap that exit on failure, the Llama-3.1-8B KV
// geometry they measure (32 layers x 8 KV heads x 128, bf16, 16-token
// pages of 2 MiB) and a vLLM-layout cache of it (LlamaVllmCache, which owns
// its memory; not thread-safe). Header only.
#ifndef KVHARBOR_BENCH_GPU_BENCH_UTIL_H_
#define KVHARBOR_BENCH_GPU_BENCH_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/kvtc_bench_util.h"
#include "types/geometry.h"
#include "types/kv_layout.h"

#define CUDA_CHECK(call)                                                 \
  do {                                                                   \
    const cudaError_t e_ = (call);                                       \
    if (e_ != cudaSuccess) {                                             \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(e_));                              \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

namespace kvharbor {
namespace bench {

inline constexpr uint32_t kLlamaLayers = 32, kLlamaHeads = 8, kLlamaDim = 128,
                          kLlamaPage = 16;

template <typename T>
T Must(absl::StatusOr<T> v) {
  BENCH_CHECK(v.status());
  return *std::move(v);
}

inline Geometry LlamaKvGeometry() {
  Geometry g;
  g.num_layers = kLlamaLayers;
  g.num_kv_heads = kLlamaHeads;
  g.head_dim = kLlamaDim;
  g.page_size = kLlamaPage;
  g.dtype = DType::kBF16;
  g.rope_theta = 500000.0f;
  return g;
}

// A vLLM cache of LlamaKvGeometry with `blocks` blocks: per layer one
// [2, blocks, 16, 8, 128] bf16 allocation on GPU `device`, or in host memory
// (device -1).
class LlamaVllmCache {
 public:
  LlamaVllmCache(uint64_t blocks, int device) {
    const uint64_t block = uint64_t{kLlamaPage} * kLlamaHeads * kLlamaDim;
    const uint64_t bytes = 2 * blocks * block * 2;
    layout_.dtype = DType::kBF16;
    layout_.num_blocks = blocks;
    layout_.block_stride = block;
    layout_.token_stride = kLlamaHeads * kLlamaDim;
    layout_.head_stride = kLlamaDim;
    layout_.device = device;
    for (uint32_t l = 0; l < kLlamaLayers; ++l) {
      void* p = nullptr;
      if (device >= 0) {
        CUDA_CHECK(cudaMalloc(&p, bytes));
      } else {
        host_.emplace_back(bytes);
        p = host_.back().data();
      }
      device_.push_back(device >= 0 ? p : nullptr);
      layout_.k.push_back(reinterpret_cast<uint64_t>(p));
      layout_.v.push_back(reinterpret_cast<uint64_t>(p) + bytes / 2);
    }
  }
  ~LlamaVllmCache() {
    for (void* p : device_) {
      if (p != nullptr) cudaFree(p);
    }
  }
  LlamaVllmCache(const LlamaVllmCache&) = delete;
  LlamaVllmCache& operator=(const LlamaVllmCache&) = delete;

  // Every layer.
  const PagedKvLayout& layout() const { return layout_; }
  // The layout of layers [begin, end).
  PagedKvLayout Layers(uint32_t begin, uint32_t end) const {
    PagedKvLayout l = layout_;
    l.layer_begin = begin;
    l.k.assign(layout_.k.begin() + begin, layout_.k.begin() + end);
    l.v.assign(layout_.v.begin() + begin, layout_.v.begin() + end);
    return l;
  }

 private:
  PagedKvLayout layout_;
  std::vector<std::vector<uint8_t>> host_;
  std::vector<void*> device_;
};

}  // namespace bench
}  // namespace kvharbor

#endif  // KVHARBOR_BENCH_GPU_BENCH_UTIL_H_
