// Turning CUDA runtime and cuBLAS results into absl::Status.
//
// Every CUDA/cuBLAS call in cuda/ goes through one of these macros, so a
// failure comes back as a Status whose message holds the call's text, the
// error's name and description, and the source location. Kernel launches use
// KVH_CUDA_CHECK_LAUNCH (cudaGetLastError right after the launch). Pure
// functions; thread-safe.
#ifndef KVHARBOR_CUDA_CUDA_CHECK_H_
#define KVHARBOR_CUDA_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda/kvtc_device_types.h"

namespace kvharbor {
namespace gpu {

absl::Status CudaError(cudaError_t err, const char* call, const char* file,
                       int line);
absl::Status CublasError(cublasStatus_t st, const char* call, const char* file,
                         int line);

// Whether kernels should use the sm_89+ FP8 instructions on the current
// device: kAuto picks them when available; kNative on an older device is
// FailedPrecondition.
absl::StatusOr<bool> ResolveNativeFp8(Fp8Path path);

}  // namespace gpu
}  // namespace kvharbor

#define KVH_CUDA_RETURN_IF_ERROR(call)                                  \
  do {                                                                  \
    const cudaError_t kvh_cuda_err_ = (call);                           \
    if (kvh_cuda_err_ != cudaSuccess) {                                 \
      return ::kvharbor::gpu::CudaError(kvh_cuda_err_, #call, __FILE__, \
                                        __LINE__);                      \
    }                                                                   \
  } while (0)

#define KVH_CUBLAS_RETURN_IF_ERROR(call)                                   \
  do {                                                                     \
    const cublasStatus_t kvh_cublas_st_ = (call);                          \
    if (kvh_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                         \
      return ::kvharbor::gpu::CublasError(kvh_cublas_st_, #call, __FILE__, \
                                          __LINE__);                       \
    }                                                                      \
  } while (0)

// Use right after a <<<...>>> launch; `text` names the launch.
#define KVH_CUDA_CHECK_LAUNCH(text)                                    \
  do {                                                                 \
    const cudaError_t kvh_cuda_err_ = cudaGetLastError();              \
    if (kvh_cuda_err_ != cudaSuccess) {                                \
      return ::kvharbor::gpu::CudaError(kvh_cuda_err_, text, __FILE__, \
                                        __LINE__);                     \
    }                                                                  \
  } while (0)

#endif  // KVHARBOR_CUDA_CUDA_CHECK_H_
