// The entry of libkvharbor_gpu_tier.so (server/daemon/gpu_tier_plugin.h): the
// table kvharbord finds with dlsym, over cuda/tier/device_tier.h. Also built as
// an object of its own (kvharbor_gpu_tier_entry) for programs that link the
// GPU tier in, such as the GPU tests.
#include "server/daemon/gpu_tier_plugin.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda/calibration/calibration_pca_gpu.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/tier/device_tier.h"

#ifndef KVHARBOR_VERSION
#error "KVHARBOR_VERSION (the project version) must be defined by the build"
#endif

namespace kvharbor {
namespace {

absl::StatusOr<GpuMemoryInfo> Memory(int device) {
  int count = 0;
  KVH_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store.device: GPU ", device, " does not exist (", count, " visible)"));
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  GpuMemoryInfo info;
  size_t free_bytes = 0, total_bytes = 0;
  KVH_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  cudaDeviceProp prop;
  KVH_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  info.name = prop.name;
  info.free_bytes = free_bytes;
  info.total_bytes = total_bytes;
  return info;
}

absl::StatusOr<std::shared_ptr<DeviceTier>> Open(int device, uint64_t bytes) {
  absl::StatusOr<std::shared_ptr<gpu::CudaDeviceTier>> tier =
      gpu::CudaDeviceTier::Create(device, bytes);
  if (!tier.ok()) return tier.status();
  return std::shared_ptr<DeviceTier>(*std::move(tier));
}

absl::StatusOr<std::shared_ptr<const CalibrationPca>> CalibrationPcaOn(
    int device) {
  gpu::GpuCalibrationPcaOptions options;
  options.device = device;
  absl::StatusOr<std::unique_ptr<gpu::GpuCalibrationPca>> pca =
      gpu::GpuCalibrationPca::Create(options);
  if (!pca.ok()) return pca.status();
  return std::shared_ptr<const CalibrationPca>(*std::move(pca));
}

constexpr GpuTierPlugin kPlugin = {kGpuTierPluginAbi, KVHARBOR_VERSION, &Memory,
                                   &Open, &CalibrationPcaOn};

}  // namespace
}  // namespace kvharbor

extern "C" __attribute__((visibility("default"))) const kvharbor::GpuTierPlugin*
kvharbor_gpu_tier_plugin_v1() {
  return &kvharbor::kPlugin;
}
