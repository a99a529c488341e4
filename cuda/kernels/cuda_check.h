// Turning CUDA runtime and cuBLAS results into absl::Status.
//
// Every CUDA/cuBLAS call in cuda/ goes through one of these macros, so a
// failure comes back as a Status whose message holds the call's text, the
// error's name and description, and the source location. Kernel launches use
// KVH_CUDA_CHECK_LAUNCH (cudaGetLastError right after the launch). Pure
// functions; thread-safe.
#ifndef KVHARBOR_CUDA_KERNELS_CUDA_CHECK_H_
#define KVHARBOR_CUDA_KERNELS_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <initializer_list>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cuda/kernels/kvtc_device_types.h"

namespace kvharbor {
namespace gpu {

absl::Status CudaError(cudaError_t err, const char* call, const char* file,
                       int line);
absl::Status CublasError(cublasStatus_t st, const char* call, const char* file,
                         int line);

// The Status of a failed GPU library call: ResourceExhausted when it ran out
// of memory, InvalidArgument for a bad argument, FailedPrecondition when the
// device cannot do it, Internal otherwise. CudaError, CublasError and
// cuda/calibration/pca_gpu.cc's cuSOLVER errors classify their codes through
// it.
enum class GpuErrorClass {
  kOutOfMemory,
  kInvalidArgument,
  kUnsupported,
  kOther
};

// The class of a library's result `code`, given its out-of-memory code and
// its codes for bad arguments and for what the device cannot do.
template <typename Code>
GpuErrorClass ClassifyGpuError(Code code, Code out_of_memory,
                               std::initializer_list<Code> invalid,
                               std::initializer_list<Code> unsupported) {
  if (code == out_of_memory) return GpuErrorClass::kOutOfMemory;
  for (Code c : invalid) {
    if (code == c) return GpuErrorClass::kInvalidArgument;
  }
  for (Code c : unsupported) {
    if (code == c) return GpuErrorClass::kUnsupported;
  }
  return GpuErrorClass::kOther;
}

// The message: "<call> failed: <what> at <file>:<line>".
absl::Status GpuLibraryError(GpuErrorClass error_class, const char* call,
                             absl::string_view what, const char* file,
                             int line);

// Makes `device` current, waits for the work queued on `stream` and destroys
// it (nothing for a null stream). For destructors, before they free the
// buffers that work used; errors are ignored (there is no one to tell).
void DrainAndDestroyStream(int device, cudaStream_t stream);

// Whether kernels should use the sm_89+ FP8 instructions on the current
// device: kAuto picks them when available; kNative on an older device is
// FailedPrecondition.
absl::StatusOr<bool> ResolveNativeFp8(Fp8Path path);

}  // namespace gpu
}  // namespace kvharbor

// Returns error_fn(result, text, __FILE__, __LINE__) from the enclosing
// function when `expr` (evaluated once) is not `success`.
#define KVH_GPU_RETURN_IF_ERROR(expr, text, success, error_fn)    \
  do {                                                            \
    const auto kvh_gpu_result_ = (expr);                          \
    if (kvh_gpu_result_ != (success)) {                           \
      return error_fn(kvh_gpu_result_, text, __FILE__, __LINE__); \
    }                                                             \
  } while (0)

#define KVH_CUDA_RETURN_IF_ERROR(call) \
  KVH_GPU_RETURN_IF_ERROR(call, #call, cudaSuccess, ::kvharbor::gpu::CudaError)

#define KVH_CUBLAS_RETURN_IF_ERROR(call)                      \
  KVH_GPU_RETURN_IF_ERROR(call, #call, CUBLAS_STATUS_SUCCESS, \
                          ::kvharbor::gpu::CublasError)

// Use right after a <<<...>>> launch; `text` names the launch.
#define KVH_CUDA_CHECK_LAUNCH(text)                              \
  KVH_GPU_RETURN_IF_ERROR(cudaGetLastError(), text, cudaSuccess, \
                          ::kvharbor::gpu::CudaError)

#endif  // KVHARBOR_CUDA_KERNELS_CUDA_CHECK_H_
