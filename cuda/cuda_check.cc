#include "cuda/cuda_check.h"

#include "absl/strings/str_format.h"

namespace kvharbor {
namespace gpu {

absl::Status CudaError(cudaError_t err, const char* call, const char* file,
                       int line) {
  const std::string msg = absl::StrFormat("%s failed: %s (%s) at %s:%d", call,
                                          cudaGetErrorName(err),
                                          cudaGetErrorString(err), file, line);
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
      return absl::InvalidArgumentError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status CublasError(cublasStatus_t st, const char* call, const char* file,
                         int line) {
  const std::string msg = absl::StrFormat(
      "%s failed: %s (%s) at %s:%d", call, cublasGetStatusName(st),
      cublasGetStatusString(st), file, line);
  switch (st) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(msg);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(msg);
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::StatusOr<bool> ResolveNativeFp8(Fp8Path path) {
  if (path == Fp8Path::kSoftware) return false;
  int device = 0;
  KVH_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  int major = 0, minor = 0;
  KVH_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &major, cudaDevAttrComputeCapabilityMajor, device));
  KVH_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &minor, cudaDevAttrComputeCapabilityMinor, device));
  const bool has = major * 10 + minor >= 89;
  if (path == Fp8Path::kNative && !has) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "fp8_path: native FP8 conversion needs compute capability 8.9+, "
        "device %d is %d.%d",
        device, major, minor));
  }
  return has;
}

}  // namespace gpu
}  // namespace kvharbor
