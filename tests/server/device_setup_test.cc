// The daemon's choice of GPU tier (server/daemon/device_setup.h) on the CPU:
// the default pool size, every host-pool outcome with the line the daemon logs,
// the GPU tier plugin loading (CUDA builds) without a GPU, and -- on the real
// process -- that a kvharbord without a GPU maps no CUDA library and says
// where its pools live. The device-pool outcome is checked on the GPU
// machine (tests/cuda/gpu_daemon_e2e.cc).
#include "server/daemon/device_setup.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/server/subprocess.h"
#include "tests/temp_dir.h"

#ifndef KVHARBORD_PATH
#error "KVHARBORD_PATH (the built kvharbord) must be defined by the build"
#endif

namespace kvharbor {
namespace testing {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

StoreOptions HostStore() {
  StoreOptions o;
  o.pool_budget_bytes = 64 * kMiB;
  o.default_namespace_bytes = 8 * kMiB;
  return o;
}

TEST_CASE("The default device pool is 1/16 of the GPU's free memory, capped",
          "[server][device]") {
  CHECK(DefaultDevicePoolBytes(140 * kGiB) == 8 * kGiB);  // H200: the cap
  CHECK(DefaultDevicePoolBytes(80 * kGiB) == 5 * kGiB);   // H100 80GB
  CHECK(DefaultDevicePoolBytes(24 * kGiB) == 1536 * kMiB);
  // Whole MiB, rounded down.
  CHECK(DefaultDevicePoolBytes(16 * kGiB + 17) == 1 * kGiB);
  CHECK(DefaultDevicePoolBytes(5 * kGiB + 15 * kMiB) % kMiB == 0);
  // Below 256 MiB it is not worth an arena.
  CHECK(DefaultDevicePoolBytes(16 * 256 * kMiB) == 256 * kMiB);
  CHECK(DefaultDevicePoolBytes(16 * 256 * kMiB - 16 * kMiB) == 0);
  CHECK(DefaultDevicePoolBytes(0) == 0);
}

TEST_CASE("Host pools: the reason is in the log line", "[server][device]") {
  SECTION("store.device_pool_bytes 0") {
    DeviceTierSetup s = SetUpDeviceTier(HostStore(), /*auto_pool=*/false,
                                        /*host_ipc=*/false);
    CHECK(s.options.device_tier == nullptr);
    CHECK_FALSE(s.warning);
    CHECK(s.options.pool_budget_bytes == 64 * kMiB);
    INFO(s.log_line);
    CHECK(absl::StartsWith(s.log_line,
                           "device tier: none (store.device_pool_bytes is 0)"));
    CHECK(absl::StrContains(s.log_line, "live in host memory (pool budget"));
  }
  SECTION("auto with store.host_ipc_socket") {
    DeviceTierSetup s = SetUpDeviceTier(HostStore(), /*auto_pool=*/true,
                                        /*host_ipc=*/true);
    CHECK(s.options.device_tier == nullptr);
    CHECK_FALSE(s.warning);
    INFO(s.log_line);
    CHECK(absl::StrContains(s.log_line, "store.host_ipc_socket is set"));
  }
  const GpuProbe probe = ProbeGpus();
  if (probe.count > 0) {
    WARN("this machine has a GPU: the no-GPU outcomes are not checked here");
    return;
  }
  INFO(probe.none_reason);
  CHECK_FALSE(probe.none_reason.empty());
  SECTION("auto without a GPU: host pools, no warning") {
    DeviceTierSetup s = SetUpDeviceTier(HostStore(), /*auto_pool=*/true,
                                        /*host_ipc=*/false);
    CHECK(s.options.device_tier == nullptr);
    CHECK_FALSE(s.warning);
    INFO(s.log_line);
    // A build without the GPU tier says so instead of asking the driver.
    CHECK(absl::StrContains(
        s.log_line, GpuTierBuilt() ? probe.none_reason : "without the GPU"));
  }
  SECTION("a size given without a GPU: host pools, with a warning") {
    StoreOptions o = HostStore();
    o.device_pool_bytes = kGiB;
    DeviceTierSetup s = SetUpDeviceTier(o, /*auto_pool=*/false,
                                        /*host_ipc=*/false);
    CHECK(s.options.device_tier == nullptr);
    CHECK(s.warning);
    CHECK(s.options.pool_budget_bytes == 64 * kMiB);
  }
}

TEST_CASE("The GPU tier plugin loads without a GPU and says what it lacks",
          "[server][device]") {
  absl::StatusOr<const GpuTierPlugin*> none =
      LoadGpuTierPluginFrom("/nonexistent/libkvharbor_gpu_tier.so");
  CHECK(absl::IsFailedPrecondition(none.status()));
  CHECK(absl::StrContains(none.status().message(),
                          "/nonexistent/libkvharbor_gpu_tier.so"));
#ifdef KVHARBOR_GPU_TIER_PLUGIN_PATH
  // Every symbol of the plugin resolves (it is linked with --no-undefined,
  // and here the loader checks again), and its table is this build's.
  absl::StatusOr<const GpuTierPlugin*> p =
      LoadGpuTierPluginFrom(KVHARBOR_GPU_TIER_PLUGIN_PATH);
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  CHECK((*p)->abi_version == kGpuTierPluginAbi);
  if (ProbeGpus().count == 0) {
    // The CUDA runtime finds no driver or device: an error, not a crash.
    absl::StatusOr<GpuMemoryInfo> mem = (*p)->memory(0);
    INFO(mem.status().ToString());
    CHECK_FALSE(mem.ok());
    absl::StatusOr<std::shared_ptr<DeviceTier>> tier = (*p)->open(0, kMiB);
    CHECK_FALSE(tier.ok());
  }
#else
  CHECK_FALSE(GpuTierBuilt());
#endif
}

// The lines of kvharbord's output so far.
std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_CASE("kvharbord without a GPU maps no CUDA library and logs host pools",
          "[server][device][process]") {
  if (ProbeGpus().count > 0) {
    WARN("this machine has a GPU: kvharbord would use it");
    return;
  }
  TempDir dir;
  const std::string log = dir.path + "/kvharbord.log";
  // The defaults of README command 1 (store.device_pool_bytes auto).
  Kvharbord proc(KVHARBORD_PATH, {"--log_level=info", "--pool_bytes=64MiB"},
                 log);
  REQUIRE(proc.started());
  REQUIRE(proc.Connect() != nullptr);
  const std::string maps = ReadAll(absl::StrCat("/proc/", proc.pid(), "/maps"));
  REQUIRE_FALSE(maps.empty());
  CHECK_FALSE(absl::StrContains(maps, "libcudart"));
  CHECK_FALSE(absl::StrContains(maps, "libcublas"));
  CHECK_FALSE(absl::StrContains(maps, "libkvharbor_gpu_tier"));
  CHECK_FALSE(absl::StrContains(maps, "libcuda.so"));
  std::string out;
  for (int i = 0; i < 100; ++i) {
    out = ReadAll(log);
    if (absl::StrContains(out, "serving on")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  INFO(out);
  CHECK(absl::StrContains(out, "device tier: none ("));
  CHECK(absl::StrContains(out, "pool budget 64.00 MiB in host memory"));
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
