// Opens the GPU tier 0 of the daemon's store (docs/tiers.md, "GPU pool").
//
// With store.device_pool_bytes > 0, OpenDeviceTier makes a CudaDeviceTier
// (cuda/device_tier.h) on GPU store.device and returns the store options
// the daemon should run with: every namespace pool then comes from the
// device arena, whose size becomes the pool budget, and online KVTC
// calibrations run their PCA on that GPU (cuda/calibration_pca_gpu.h; the
// CPU PCA when the GPU one cannot be made or fails). When kvharbord was built
// without the GPU tier (-DKVHARBOR_GPU_TIER=ON), or no such GPU is found
// at run time, it returns the error
// (naming the field) and the daemon keeps host pools.
// Stateless; thread-safe.
#ifndef KVHARBOR_SERVER_DEVICE_SETUP_H_
#define KVHARBOR_SERVER_DEVICE_SETUP_H_

#include "absl/status/statusor.h"
#include "core/store/store.h"

namespace kvharbor {

// Whether this build has the CUDA tier (KVHARBOR_HAVE_CUDA).
bool DeviceTierCompiledIn();

// `options` with device_tier set, online_calibrate on the GPU PCA, and
// pool_budget_bytes (and, capped by it, default_namespace_bytes) set to the
// arena size.
absl::StatusOr<StoreOptions> OpenDeviceTier(StoreOptions options);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DEVICE_SETUP_H_
