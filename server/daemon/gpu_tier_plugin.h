// The GPU tier as a plugin: what libkvharbor_gpu_tier.so exports and
// kvharbord calls (server/daemon/device_setup.cc).
//
// kvharbord itself links no CUDA library: linking the CUDA runtime and
// cuBLAS costs a daemon about 150 MiB of resident memory even when it never
// touches a GPU (the dynamic loader relocates libcublasLt's tables at
// start: measured 176 MiB idle RSS against 24 MiB without them). So the
// device tier (cuda/tier/device_tier.h) is built, whenever CUDA is found, into
// a library of its own that the daemon loads with dlopen() only once it has
// found a GPU (through the driver, libcuda.so.1) and means to use it. A
// program that links the entry object (target kvharbor_gpu_tier_entry, as
// the GPU tests do) gets the same entry without dlopen().
//
// The table crosses the library boundary with C++ types (absl::StatusOr,
// std::shared_ptr, core's DeviceTier), so the plugin must come from the
// same build as the daemon: Load checks abi_version and the version string
// and refuses any other (an error naming the file). The objects the plugin
// returns stay valid while the library is loaded, which is until the
// process exits (it is never unloaded). The functions are thread-safe.
#ifndef KVHARBOR_SERVER_DAEMON_GPU_TIER_PLUGIN_H_
#define KVHARBOR_SERVER_DAEMON_GPU_TIER_PLUGIN_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/calibration/calibration_pca.h"
#include "core/store/device_tier.h"

namespace kvharbor {

// Bumped whenever GpuTierPlugin or a type it passes changes.
inline constexpr uint32_t kGpuTierPluginAbi = 2;
// The plugin's file name (next to kvharbord, in ../lib from it, or on the
// loader's path) and its one exported symbol.
inline constexpr char kGpuTierPluginFile[] = "libkvharbor_gpu_tier.so";
inline constexpr char kGpuTierPluginSymbol[] = "kvharbor_gpu_tier_plugin_v1";

struct GpuMemoryInfo {
  std::string name;  // cudaDeviceProp.name
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

struct GpuTierPlugin {
  uint32_t abi_version;  // kGpuTierPluginAbi of the build that made it
  const char* version;   // the project version (PROJECT_VERSION)
  // Name and memory of GPU `device` (cudaMemGetInfo: this makes the
  // process's CUDA context on it). Errors name store.device.
  absl::StatusOr<GpuMemoryInfo> (*memory)(int device);
  // CudaDeviceTier::Create: an arena of `bytes` on `device`. Errors name
  // store.device / store.device_pool_bytes.
  absl::StatusOr<std::shared_ptr<DeviceTier>> (*open)(int device,
                                                      uint64_t bytes);
  // The GPU PCA online KVTC calibrations run on
  // (cuda/calibration/calibration_pca_gpu.h) on `device`; the daemon uses the
  // CPU PCA when this fails.
  absl::StatusOr<std::shared_ptr<const CalibrationPca>> (*calibration_pca)(
      int device);
};

}  // namespace kvharbor

extern "C" {
// The plugin's entry (defined in server/daemon/gpu_tier_plugin.cc).
const kvharbor::GpuTierPlugin* kvharbor_gpu_tier_plugin_v1();
}

#endif  // KVHARBOR_SERVER_DAEMON_GPU_TIER_PLUGIN_H_
