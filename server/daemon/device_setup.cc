#include "server/daemon/device_setup.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/calibration/online_calibration.h"
#include "server/daemon/config.h"

// Defined when the program links kvharbor_gpu_tier_entry; null otherwise
// (kvharbord), and the plugin is loaded with dlopen.
#pragma weak kvharbor_gpu_tier_plugin_v1

namespace kvharbor {

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string DlError() {
  const char* e = dlerror();
  return e != nullptr ? std::string(e) : std::string("unknown dlopen error");
}

// The directory of the running executable, with a trailing '/'; "" if
// unknown.
std::string ExecutableDir() {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  std::string dir(self, n);
  return dir.substr(0, dir.rfind('/') + 1);
}

std::string HostPoolsLine(const StoreOptions& o, absl::string_view why) {
  return absl::StrCat("device tier: none (", why,
                      "); namespace pools live in host memory (pool budget ",
                      HumanBytes(o.pool_budget_bytes), ")");
}

}  // namespace

uint64_t DefaultDevicePoolBytes(uint64_t gpu_free_bytes) {
  const uint64_t share = std::min(gpu_free_bytes / kDefaultDevicePoolDivisor,
                                  kMaxDefaultDevicePoolBytes);
  const uint64_t rounded = share / kMiB * kMiB;
  return rounded < kMinDefaultDevicePoolBytes ? 0 : rounded;
}

bool GpuTierBuilt() {
#ifdef KVHARBOR_GPU_TIER_BUILT
  return true;
#else
  return false;
#endif
}

GpuProbe ProbeGpus() {
  GpuProbe probe;
  // The driver API through dlopen: no CUDA header or library at build time,
  // and nothing stays mapped when there is no GPU.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    probe.none_reason = absl::StrCat("no NVIDIA driver: ", DlError());
    return probe;
  }
  using InitFn = int (*)(unsigned int);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
  if (init == nullptr || count == nullptr) {
    probe.none_reason = "libcuda.so.1 lacks cuInit or cuDeviceGetCount";
  } else if (const int err = init(0); err != 0) {
    // 100 is CUDA_ERROR_NO_DEVICE.
    probe.none_reason = err == 100
                            ? std::string("the NVIDIA driver sees no GPU")
                            : absl::StrCat("cuInit failed with CUresult ", err);
  } else if (const int err = count(&probe.count); err != 0) {
    probe.count = 0;
    probe.none_reason = absl::StrCat("cuDeviceGetCount failed with ", err);
  } else if (probe.count == 0) {
    probe.none_reason = "the NVIDIA driver sees no GPU";
  }
  // With a GPU, the plugin's CUDA runtime loads the driver again; without,
  // nothing of it stays.
  dlclose(lib);
  return probe;
}

absl::StatusOr<const GpuTierPlugin*> LoadGpuTierPluginFrom(
    const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU tier plugin: cannot load ", path, ": ", DlError()));
  }
  using EntryFn = const GpuTierPlugin* (*)();
  auto entry = reinterpret_cast<EntryFn>(dlsym(lib, kGpuTierPluginSymbol));
  const GpuTierPlugin* plugin = entry != nullptr ? entry() : nullptr;
  if (plugin == nullptr) {
    dlclose(lib);
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU tier plugin: ", path, " has no ", kGpuTierPluginSymbol));
  }
  if (plugin->abi_version != kGpuTierPluginAbi ||
      std::string(plugin->version) != KVHARBOR_VERSION) {
    const std::string found = absl::StrFormat(
        "ABI %u, version %s", plugin->abi_version, plugin->version);
    dlclose(lib);
    return absl::FailedPreconditionError(absl::StrFormat(
        "GPU tier plugin: %s is from another build (%s; this kvharbord: ABI "
        "%u, version %s)",
        path, found, kGpuTierPluginAbi, KVHARBOR_VERSION));
  }
  return plugin;  // never unloaded: the tier's objects live in it
}

absl::StatusOr<const GpuTierPlugin*> LoadGpuTierPlugin() {
  static absl::once_flag once;
  static absl::StatusOr<const GpuTierPlugin*>* loaded = nullptr;
  absl::call_once(once, [] {
    if (&kvharbor_gpu_tier_plugin_v1 != nullptr) {
      loaded = new absl::StatusOr<const GpuTierPlugin*>(
          kvharbor_gpu_tier_plugin_v1());
      return;
    }
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("KVHARBOR_GPU_TIER_PLUGIN")) {
      candidates.push_back(env);
    } else {
      const std::string dir = ExecutableDir();
      if (!dir.empty()) {
        candidates.push_back(dir + kGpuTierPluginFile);
        candidates.push_back(dir + "../lib/" + kGpuTierPluginFile);
        // The installed layout (e.g. bin/ and lib/x86_64-linux-gnu/).
        candidates.push_back(dir + KVHARBOR_BIN_TO_LIB + "/" +
                             kGpuTierPluginFile);
      }
    }
    std::string tried;
    for (const std::string& c : candidates) {
      if (access(c.c_str(), R_OK) != 0) continue;
      loaded =
          new absl::StatusOr<const GpuTierPlugin*>(LoadGpuTierPluginFrom(c));
      return;
    }
    // Last: the loader's search path (LD_LIBRARY_PATH, ldconfig).
    loaded = new absl::StatusOr<const GpuTierPlugin*>(
        LoadGpuTierPluginFrom(kGpuTierPluginFile));
  });
  return *loaded;
}

namespace {

// Online KVTC calibrations run their PCA on the same GPU (the CPU PCA when
// the GPU one cannot be made, or fails at run time). Returns where, for the
// startup log line.
std::string AttachGpuPca(const GpuTierPlugin& plugin, StoreOptions* options) {
  absl::StatusOr<std::shared_ptr<const CalibrationPca>> pca =
      plugin.calibration_pca(options->device);
  if (!pca.ok()) {
    return absl::StrCat("; online calibrations' PCA on the CPU (",
                        pca.status().message(), ")");
  }
  options->online_calibrate = MakeOnlineKvtcCalibrateFn(*std::move(pca));
  return "; online calibrations' PCA on the GPU";
}

}  // namespace

DeviceTierSetup SetUpDeviceTier(StoreOptions options, bool auto_pool,
                                bool host_ipc) {
  DeviceTierSetup out;
  if (options.device_tier != nullptr) {
    out.options = std::move(options);
    out.log_line =
        absl::StrCat("device tier: ", out.options.device_tier->Describe(),
                     "; namespace pools live on the GPU");
    return out;
  }
  const auto host = [&](absl::string_view why, bool warning) {
    out.options = options;
    out.log_line = HostPoolsLine(options, why);
    out.warning = warning;
    return out;
  };
  // A pool asked for explicitly that cannot be had is worth a warning; the
  // default finding no GPU is not.
  const bool asked = !auto_pool && options.device_pool_bytes > 0;
  if (!auto_pool && options.device_pool_bytes == 0) {
    return host("store.device_pool_bytes is 0", false);
  }
  if (auto_pool && host_ipc) {
    return host(
        "store.device_pool_bytes auto, but store.host_ipc_socket is set: "
        "same-host clients read host pools through shared memory; give "
        "store.device_pool_bytes to use the GPU instead",
        false);
  }
  if (!GpuTierBuilt()) {
    return host(
        "this kvharbord was built without the GPU tier (no CUDA at build "
        "time, or cmake -DKVHARBOR_GPU_TIER=OFF)",
        asked);
  }
  const GpuProbe probe = ProbeGpus();
  if (probe.count == 0) return host(probe.none_reason, asked);
  if (options.device >= probe.count) {
    return host(absl::StrCat("store.device: GPU ", options.device,
                             " does not exist (", probe.count, " visible)"),
                asked);
  }
  absl::StatusOr<const GpuTierPlugin*> plugin = LoadGpuTierPlugin();
  // A GPU and a GPU-tier build, but no plugin: always worth a warning.
  if (!plugin.ok()) return host(plugin.status().message(), true);
  std::string sizing;
  uint64_t bytes = options.device_pool_bytes;
  if (auto_pool) {
    absl::StatusOr<GpuMemoryInfo> mem = (*plugin)->memory(options.device);
    if (!mem.ok()) return host(mem.status().message(), true);
    bytes = DefaultDevicePoolBytes(mem->free_bytes);
    if (bytes == 0) {
      return host(absl::StrCat("GPU ", options.device, " (", mem->name,
                               ") has only ", HumanBytes(mem->free_bytes),
                               " free; the default device pool needs 16 x ",
                               HumanBytes(kMinDefaultDevicePoolBytes)),
                  false);
    }
    sizing = absl::StrCat(" (store.device_pool_bytes auto: 1/",
                          kDefaultDevicePoolDivisor, " of the ",
                          HumanBytes(mem->free_bytes), " free, at most ",
                          HumanBytes(kMaxDefaultDevicePoolBytes), ")");
  }
  absl::StatusOr<std::shared_ptr<DeviceTier>> tier =
      (*plugin)->open(options.device, bytes);
  if (!tier.ok()) return host(tier.status().message(), true);
  out.options = std::move(options);
  out.options.device_pool_bytes = bytes;
  out.options.device_tier = *std::move(tier);
  out.options.pool_budget_bytes = out.options.device_tier->arena_bytes();
  out.options.default_namespace_bytes = std::min(
      out.options.default_namespace_bytes, out.options.pool_budget_bytes);
  const std::string pca_where = AttachGpuPca(**plugin, &out.options);
  out.log_line =
      absl::StrCat("device tier: ", out.options.device_tier->Describe(), sizing,
                   "; namespace pools live on the GPU", pca_where);
  return out;
}

}  // namespace kvharbor
