// The KVCM token-merging compressor (core/transform/kvcm_compressor.h; weights
// core/transform/kvcm_format.h) on the GPU: the per-prefix MLP Linear, ReLU,
// Linear, ReLU, Linear through cuBLAS (cublasSgemm, float32; bias and ReLU in a
// kernel), and the whole length-reducing transform of KvcmCompressor::Apply
// (image segment then text segment, f-token groups gathered into rows, the
// tail and short segments copied) with the same output order and length.
// LOSSY and LENGTH-CHANGING, as the CPU transform.
//
// Accuracy: the matrix products sum in cuBLAS's order, the CPU's in
// OpenBLAS's, so results agree to a relative tolerance, not bit for bit
// (tests/cuda/kvcm_gpu_test.cc: max |gpu - cpu| / max |cpu| <= 1e-4 per
// call; bias, ReLU, gather and copies are exact).
//
// Layouts: MLP input [rows][f * head_dim] (token-major within a row), output
// [rows][head_dim]; sequences as core/transform/kv_transform.h: [2 (K,
// V)][layer] [token][kv_head][head_dim] float32. All device memory caller-owned
// except KvcmDeviceWeights, which owns its device copy of the weights (freed on
// destruction). The cuBLAS handle belongs to the caller; launchers set its
// stream (one thread at a time per handle). KvcmDeviceWeights is immutable
// after Upload and may be shared by threads.
#ifndef KVHARBOR_CUDA_CODEC_KVCM_GPU_H_
#define KVHARBOR_CUDA_CODEC_KVCM_GPU_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/transform/kvcm_format.h"

namespace kvharbor {
namespace gpu {

// One Linear in device memory: y = W x + b, W [rows][cols] row-major.
struct KvcmDeviceLinear {
  uint32_t rows = 0;
  uint32_t cols = 0;
  const float* weight = nullptr;
  const float* bias = nullptr;  // [rows], or null when the block has none
};

class KvcmDeviceWeights {
 public:
  // Validates `weights` and copies them to the current device (blocking).
  static absl::StatusOr<std::unique_ptr<KvcmDeviceWeights>> Upload(
      const KvcmWeights& weights);
  ~KvcmDeviceWeights();
  KvcmDeviceWeights(const KvcmDeviceWeights&) = delete;
  KvcmDeviceWeights& operator=(const KvcmDeviceWeights&) = delete;

  const KvcmHeader& header() const { return header_; }
  bool has_image() const { return has_image_; }
  uint32_t head_dim() const { return head_dim_; }
  const KvcmDeviceLinear& linear(uint32_t layer, KvcmPrefix prefix,
                                 uint32_t index) const {
    return layers_[layer][static_cast<uint32_t>(prefix) * 3 + index];
  }
  // Largest hidden widths (slot 0 and slot 3 outputs) over all MLPs.
  uint32_t max_h1() const { return max_h1_; }
  uint32_t max_h2() const { return max_h2_; }

 private:
  KvcmDeviceWeights() = default;
  KvcmHeader header_;
  bool has_image_ = false;
  uint32_t head_dim_ = 0;
  uint32_t max_h1_ = 0, max_h2_ = 0;
  void* buffer_ = nullptr;
  std::vector<std::vector<KvcmDeviceLinear>> layers_;
};

struct KvcmMlpArgs {
  KvcmDeviceLinear linear[3];  // slots 0, 3, 6 of one prefix and layer
  uint64_t rows = 0;           // < 2^31
  const float* in = nullptr;   // [rows][linear[0].cols]
  float* out = nullptr;        // [rows][linear[2].rows]
};
// The two hidden activations.
size_t KvcmMlpWorkspaceBytes(const KvcmMlpArgs& args);
absl::Status LaunchKvcmMlp(const KvcmMlpArgs& args, cublasHandle_t handle,
                           void* workspace, size_t workspace_bytes,
                           cudaStream_t stream);

// Rows per MLP call of the compressor (bounds its workspace).
inline constexpr uint64_t kKvcmGpuChunkRows = 16384;

struct KvcmCompressArgs {
  const KvcmDeviceWeights* weights = nullptr;
  uint32_t num_kv_heads = 0;
  uint64_t image_tokens = 0;  // leading image tokens (0 = all text)
  uint64_t in_tokens = 0;
  const float* in = nullptr;  // [2][layer][in_tokens][kv_head][head_dim]
  float* out = nullptr;       // [2][layer][KvcmGpuOutputTokens][...]
};
// KvcmCompressor::OutputTokens for these weights.
uint64_t KvcmGpuOutputTokens(const KvcmDeviceWeights& w, uint64_t image_tokens,
                             uint64_t in_tokens);
size_t KvcmCompressWorkspaceBytes(const KvcmCompressArgs& args);
absl::Status LaunchKvcmCompress(const KvcmCompressArgs& args,
                                cublasHandle_t handle, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_CODEC_KVCM_GPU_H_
