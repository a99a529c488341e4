// Helpers of the benchmarks that drive the SDK's GPU transfers against
// kvharbord children (hit_path_bench, layerwise_load_bench): a CUDA call
// check and a StatusOr unwrap that exit on failure, and the Llama-3.1-8B KV
// geometry they measure (32 layers x 8 KV heads x 128, bf16, 16-token
// pages of 2 MiB). Header only; no state.
#ifndef KVHARBOR_BENCH_GPU_BENCH_UTIL_H_
#define KVHARBOR_BENCH_GPU_BENCH_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/statusor.h"
#include "bench/kvtc_bench_util.h"
#include "types/geometry.h"

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

}  // namespace bench
}  // namespace kvharbor

#endif  // KVHARBOR_BENCH_GPU_BENCH_UTIL_H_
