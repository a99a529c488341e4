// The KVTC projection through cuBLAS, in one of three arithmetic modes:
//   kFp32: cublasSgemm, full float32 (the seed's choice; the CPU reference
//          uses the same math through OpenBLAS, rounding differs);
//   kTf32: cublasGemmEx, float32 data, CUBLAS_COMPUTE_32F_FAST_TF32 (tensor
//          cores, inputs rounded to 10-bit mantissas, float32 accumulate);
//   kBf16: cublasGemmEx, bfloat16 inputs, float32 accumulate and output.
//
// Encode: Y[rows][components] = X[rows][features] * P[features][components].
// Decode: X[rows][features] = Y[rows][components] * P^T.
// All matrices row-major in device memory owned by the caller; as cuBLAS is
// column-major, the row-major products are computed as their transposes
// without copies (seed: C[pca,batch] = A[pca,feat] * B[feat,batch]).
// The handle belongs to the caller (default math mode); a launcher sets its
// stream and, when given, its workspace, so cuBLAS allocates nothing.
// Thread-safety: as the cuBLAS handle (one thread at a time per handle).
#ifndef KVHARBOR_CUDA_CODEC_PROJECTION_GEMM_H_
#define KVHARBOR_CUDA_CODEC_PROJECTION_GEMM_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvharbor {
namespace gpu {

enum class KvtcGemmMode : int {
  kFp32 = 0,
  kTf32 = 1,
  kBf16 = 2,
};
absl::string_view KvtcGemmModeName(KvtcGemmMode mode);
absl::StatusOr<KvtcGemmMode> ParseKvtcGemmMode(absl::string_view name);
// Bytes of one X / Y / P element as the mode's GEMM reads it (4 or 2).
size_t GemmInputElementBytes(KvtcGemmMode mode);

struct ProjectArgs {
  KvtcGemmMode mode = KvtcGemmMode::kFp32;
  uint64_t rows = 0;
  uint64_t features = 0;
  uint64_t components = 0;
  const void* x = nullptr;           // [rows][features], fp32 or bf16
  const void* projection = nullptr;  // [features][components], same type
  float* y = nullptr;                // [rows][components]
};

struct ReconstructArgs {
  KvtcGemmMode mode = KvtcGemmMode::kFp32;
  uint64_t rows = 0;
  uint64_t features = 0;
  uint64_t components = 0;
  const void* y = nullptr;           // [rows][components], fp32 or bf16
  const void* projection = nullptr;  // [features][components], same type
  float* x = nullptr;                // [rows][features]
};

// cuBLAS workspace to hand to the launchers (NVIDIA's recommendation for
// Hopper: 32 MiB).
inline constexpr size_t kProjectionGemmWorkspaceBytes = size_t{32} << 20;
inline size_t ProjectWorkspaceBytes(const ProjectArgs&) {
  return kProjectionGemmWorkspaceBytes;
}
inline size_t ReconstructWorkspaceBytes(const ReconstructArgs&) {
  return kProjectionGemmWorkspaceBytes;
}

absl::Status LaunchProject(const ProjectArgs& args, cublasHandle_t handle,
                           void* workspace, size_t workspace_bytes,
                           cudaStream_t stream);
absl::Status LaunchReconstruct(const ReconstructArgs& args,
                               cublasHandle_t handle, void* workspace,
                               size_t workspace_bytes, cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_CODEC_PROJECTION_GEMM_H_
