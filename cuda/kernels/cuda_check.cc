#include "cuda/kernels/cuda_check.h"

#include "absl/strings/str_format.h"

namespace kvharbor {
namespace gpu {

absl::Status GpuLibraryError(GpuErrorClass error_class, const char* call,
                             absl::string_view what, const char* file,
                             int line) {
  const std::string msg =
      absl::StrFormat("%s failed: %s at %s:%d", call, what, file, line);
  switch (error_class) {
    case GpuErrorClass::kOutOfMemory:
      return absl::ResourceExhaustedError(msg);
    case GpuErrorClass::kInvalidArgument:
      return absl::InvalidArgumentError(msg);
    case GpuErrorClass::kUnsupported:
      return absl::FailedPreconditionError(msg);
    case GpuErrorClass::kOther:
      break;
  }
  return absl::InternalError(msg);
}

absl::Status CudaError(cudaError_t err, const char* call, const char* file,
                       int line) {
  const GpuErrorClass c =
      ClassifyGpuError(err, cudaErrorMemoryAllocation,
                       {cudaErrorInvalidValue, cudaErrorInvalidDevicePointer},
                       {cudaErrorNoDevice, cudaErrorInsufficientDriver});
  return GpuLibraryError(c, call,
                         absl::StrFormat("%s (%s)", cudaGetErrorName(err),
                                         cudaGetErrorString(err)),
                         file, line);
}

absl::Status CublasError(cublasStatus_t st, const char* call, const char* file,
                         int line) {
  const GpuErrorClass c = ClassifyGpuError(
      st, CUBLAS_STATUS_ALLOC_FAILED, {CUBLAS_STATUS_INVALID_VALUE},
      {CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_STATUS_ARCH_MISMATCH});
  return GpuLibraryError(c, call,
                         absl::StrFormat("%s (%s)", cublasGetStatusName(st),
                                         cublasGetStatusString(st)),
                         file, line);
}

void DrainAndDestroyStream(int device, cudaStream_t stream) {
  cudaSetDevice(device);
  if (stream == nullptr) return;
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
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
