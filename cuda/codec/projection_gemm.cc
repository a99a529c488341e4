#include "cuda/codec/projection_gemm.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "cuda/kernels/cuda_check.h"
#include "types/enum_names.h"

namespace kvharbor {
namespace gpu {
namespace {

// Indexed by KvtcGemmMode's value.
constexpr const char* kGemmModeNames[] = {"fp32", "tf32", "bf16"};

absl::Status CheckDims(absl::string_view what, uint64_t rows, uint64_t features,
                       uint64_t components, const void* a, const void* b,
                       const void* c) {
  if (a == nullptr || b == nullptr || c == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": null matrix pointer"));
  }
  for (auto [name, v] : {std::pair<const char*, uint64_t>{"rows", rows},
                         {"features", features},
                         {"components", components}}) {
    if (v == 0 || v > INT_MAX) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s.%s: %u is out of range [1, %d]", what, name, v, INT_MAX));
    }
  }
  return absl::OkStatus();
}

absl::Status Bind(cublasHandle_t handle, void* workspace,
                  size_t workspace_bytes, cudaStream_t stream) {
  if (handle == nullptr) {
    return absl::InvalidArgumentError("cublas: null handle");
  }
  KVH_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream));
  if (workspace != nullptr) {
    KVH_CUBLAS_RETURN_IF_ERROR(
        cublasSetWorkspace(handle, workspace, workspace_bytes));
  }
  return absl::OkStatus();
}

// C[m][n] (column-major) = op(A) * B, both column-major views.
absl::Status Gemm(KvtcGemmMode mode, cublasHandle_t handle,
                  cublasOperation_t op_a, int m, int n, int k, const void* a,
                  int lda, const void* b, int ldb, float* c, int ldc) {
  const float one = 1.0f;
  const float zero = 0.0f;
  switch (mode) {
    case KvtcGemmMode::kFp32:
      KVH_CUBLAS_RETURN_IF_ERROR(cublasSgemm(handle, op_a, CUBLAS_OP_N, m, n, k,
                                             &one, static_cast<const float*>(a),
                                             lda, static_cast<const float*>(b),
                                             ldb, &zero, c, ldc));
      return absl::OkStatus();
    case KvtcGemmMode::kTf32:
    case KvtcGemmMode::kBf16: {
      // TF32: fp32 inputs rounded to TF32 by the tensor cores; BF16: bf16
      // inputs. Both accumulate in fp32 into fp32 C.
      const bool bf16 = mode == KvtcGemmMode::kBf16;
      const cudaDataType_t in = bf16 ? CUDA_R_16BF : CUDA_R_32F;
      KVH_CUBLAS_RETURN_IF_ERROR(
          cublasGemmEx(handle, op_a, CUBLAS_OP_N, m, n, k, &one, a, in, lda, b,
                       in, ldb, &zero, c, CUDA_R_32F, ldc,
                       bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32,
                       CUBLAS_GEMM_DEFAULT));
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("gemm_mode: unknown value ", static_cast<int>(mode)));
}

// Both directions after their common checks: `in` [rows][features] (project)
// or [rows][components] (reconstruct) times P or P^T into `out`.
template <typename Args>
absl::Status ProjectionGemm(const char* what, const Args& args, const void* in,
                            float* out, bool reconstruct, cublasHandle_t handle,
                            void* workspace, size_t workspace_bytes,
                            cudaStream_t stream) {
  KVH_RETURN_IF_ERROR(CheckDims(what, args.rows, args.features, args.components,
                                in, args.projection, out));
  KVH_RETURN_IF_ERROR(Bind(handle, workspace, workspace_bytes, stream));
  const int c = static_cast<int>(args.components);
  const int f = static_cast<int>(args.features);
  const int r = static_cast<int>(args.rows);
  if (!reconstruct) {
    // Column-major: Y^T[c][r] = P^T[c][f] * X^T[f][r]; P row-major [f][c] is
    // P^T column-major with ld c.
    return Gemm(args.mode, handle, CUBLAS_OP_N, c, r, f, args.projection, c, in,
                f, out, c);
  }
  // Column-major: X^T[f][r] = (P^T)^T[f][c] * Y^T[c][r].
  return Gemm(args.mode, handle, CUBLAS_OP_T, f, r, c, args.projection, c, in,
              c, out, f);
}

}  // namespace

absl::string_view KvtcGemmModeName(KvtcGemmMode mode) {
  return EnumName(mode, kGemmModeNames);
}

absl::StatusOr<KvtcGemmMode> ParseKvtcGemmMode(absl::string_view name) {
  return ParseEnum<KvtcGemmMode>("gemm_mode", name, kGemmModeNames);
}

size_t GemmInputElementBytes(KvtcGemmMode mode) {
  return mode == KvtcGemmMode::kBf16 ? 2 : 4;
}

absl::Status LaunchProject(const ProjectArgs& args, cublasHandle_t handle,
                           void* workspace, size_t workspace_bytes,
                           cudaStream_t stream) {
  return ProjectionGemm("project", args, args.x, args.y, /*reconstruct=*/false,
                        handle, workspace, workspace_bytes, stream);
}

absl::Status LaunchReconstruct(const ReconstructArgs& args,
                               cublasHandle_t handle, void* workspace,
                               size_t workspace_bytes, cudaStream_t stream) {
  return ProjectionGemm("reconstruct", args, args.y, args.x,
                        /*reconstruct=*/true, handle, workspace,
                        workspace_bytes, stream);
}

}  // namespace gpu
}  // namespace kvharbor
