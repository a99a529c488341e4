// Chooses and opens the GPU tier 0 of the daemon's store (docs/tiers.md,
// "GPU pool"; docs/operations.md, "GPU").
//
// The device tier lives in a plugin library (server/daemon/gpu_tier_plugin.h)
// so that a daemon that uses no GPU links and maps no CUDA library. Setup:
//   1. store.device_pool_bytes 0, or "auto" with store.host_ipc_socket set:
//      host pools; nothing CUDA is loaded.
//   2. The NVIDIA driver (libcuda.so.1, loaded for the question and then
//      unloaded) is asked how many GPUs it sees (CUDA_VISIBLE_DEVICES
//      applies). None, or not GPU store.device: host pools.
//   3. The plugin is loaded (linked-in entry, else dlopen) and opens a
//      device arena on that GPU: store.device_pool_bytes bytes, or with
//      "auto" DefaultDevicePoolBytes of the GPU's free memory. Every
//      namespace pool is then cut from it and the arena is the pool budget.
//      Online KVTC calibrations then run their PCA on that GPU
//      (cuda/calibration/calibration_pca_gpu.h through the plugin; the CPU PCA
//      when the GPU one cannot be made or fails).
// A device pool that was asked for explicitly and cannot be opened is a
// warning, and the daemon keeps host pools (as when the build has no GPU
// tier). Stateless apart from the loaded plugin (loaded once per process,
// never unloaded); thread-safe.
#ifndef KVHARBOR_SERVER_DAEMON_DEVICE_SETUP_H_
#define KVHARBOR_SERVER_DAEMON_DEVICE_SETUP_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/store/store.h"
#include "server/daemon/gpu_tier_plugin.h"

namespace kvharbor {

// The "auto" device pool: 1/16 of the GPU's free memory when the daemon
// starts, at most 8 GiB, rounded down to whole MiB; less than 256 MiB is
// not worth an arena (host pools then). Why so small a share: the daemon
// usually shares its GPU with the engine it serves (same-host IPC needs
// that), and engines take a fixed fraction of the GPU's TOTAL memory at
// start (vLLM gpu_memory_utilization 0.9, SGLang mem_fraction_static
// ~0.88); 1/16 (6.25%) leaves them that and their CUDA context. 8 GiB holds
// two 32K-token prefixes of a Llama-3.1-8B-shaped model (4 GiB each);
// operators size it with store.device_pool_bytes.
inline constexpr uint64_t kDefaultDevicePoolDivisor = 16;
inline constexpr uint64_t kMaxDefaultDevicePoolBytes = uint64_t{8} << 30;
inline constexpr uint64_t kMinDefaultDevicePoolBytes = uint64_t{256} << 20;
uint64_t DefaultDevicePoolBytes(uint64_t gpu_free_bytes);

// Whether this build made the GPU tier plugin (cmake KVHARBOR_GPU_TIER,
// on by default when CUDA is found).
bool GpuTierBuilt();

// What the NVIDIA driver sees: `count` GPUs, or none and why.
struct GpuProbe {
  int count = 0;
  std::string none_reason;  // set when count == 0
};
GpuProbe ProbeGpus();

// The plugin: the entry linked into this program (kvharbor_gpu_tier_entry),
// else $KVHARBOR_GPU_TIER_PLUGIN, else libkvharbor_gpu_tier.so next to the
// executable, in ../lib from it, in the installed library directory
// relative to it, or on the loader's path. Loaded once.
absl::StatusOr<const GpuTierPlugin*> LoadGpuTierPlugin();
// dlopen of exactly `path`, with the ABI and version checks.
absl::StatusOr<const GpuTierPlugin*> LoadGpuTierPluginFrom(
    const std::string& path);

// The outcome of SetUpDeviceTier.
struct DeviceTierSetup {
  // The options the store runs with: with a device tier, device_tier set
  // and pool_budget_bytes (and, capped by it, default_namespace_bytes) the
  // arena's size.
  StoreOptions options;
  std::string log_line;  // where the pools live, and why
  bool warning = false;  // a device pool asked for could not be opened
};
// `auto_pool`: store.device_pool_bytes "auto" (kvharbord's default);
// otherwise options.device_pool_bytes as given (0: host pools). `host_ipc`:
// store.host_ipc_socket is set. A device_tier already in `options` (tests,
// embedders) is kept as it is.
DeviceTierSetup SetUpDeviceTier(StoreOptions options, bool auto_pool,
                                bool host_ipc);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DAEMON_DEVICE_SETUP_H_
