#include "server/device_setup.h"

#include <algorithm>

#ifdef KVHARBOR_HAVE_CUDA
#include "cuda/calibration_pca_gpu.h"
#include "cuda/device_tier.h"
#endif

namespace kvharbor {

bool DeviceTierCompiledIn() {
#ifdef KVHARBOR_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<StoreOptions> OpenDeviceTier(StoreOptions options) {
#ifdef KVHARBOR_HAVE_CUDA
  absl::StatusOr<std::shared_ptr<gpu::CudaDeviceTier>> tier =
      gpu::CudaDeviceTier::Create(options.device, options.device_pool_bytes);
  if (!tier.ok()) return tier.status();
  options.device_tier = *std::move(tier);
  // Online KVTC calibrations run their PCA on the same GPU (falling back to
  // the CPU PCA when it fails, e.g. for device memory the arena holds).
  gpu::GpuCalibrationPcaOptions pca_options;
  pca_options.device = options.device;
  absl::StatusOr<std::unique_ptr<gpu::GpuCalibrationPca>> pca =
      gpu::GpuCalibrationPca::Create(pca_options);
  if (pca.ok()) {
    options.online_calibrate = MakeOnlineKvtcCalibrateFn(
        std::shared_ptr<const CalibrationPca>(*std::move(pca)));
  }
  options.pool_budget_bytes = options.device_tier->arena_bytes();
  options.default_namespace_bytes =
      std::min(options.default_namespace_bytes, options.pool_budget_bytes);
  return options;
#else
  return absl::FailedPreconditionError(
      "store.device_pool_bytes: this kvharbord was built without the GPU "
      "tier (cmake -DKVHARBOR_GPU_TIER=ON)");
#endif
}

}  // namespace kvharbor
