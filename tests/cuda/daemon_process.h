// A kvharbord child process for the GPU tests and benchmarks of the hit
// paths (tests/cuda/hit_path_e2e.cc, bench/hit_path_bench.cc): CUDA IPC
// cannot map an arena in the process that exported it, so the daemon runs
// apart. The binary is the kvharbord next to the calling executable (the
// GPU bundle's .gpu/bin), else $KVHARBORD, else the build tree's
// (KVHARBORD_PATH). Header-only.
#ifndef KVHARBOR_TESTS_CUDA_DAEMON_PROCESS_H_
#define KVHARBOR_TESTS_CUDA_DAEMON_PROCESS_H_

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvharbor/client.h"
#include "tests/server/subprocess.h"

namespace kvharbor {
namespace testing {

inline std::string KvharbordPath() {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string dir(self, n);
    dir.resize(dir.rfind('/') + 1);
    if (access((dir + "kvharbord").c_str(), X_OK) == 0) {
      return dir + "kvharbord";
    }
  }
  if (const char* env = std::getenv("KVHARBORD")) return env;
#ifdef KVHARBORD_PATH
  return KVHARBORD_PATH;
#else
  return "kvharbord";
#endif
}

// Starts kvharbord with `config_yaml` (written to `dir`/`name`.yaml) and
// `args`, its output in `dir`/`name`.log.
inline std::unique_ptr<Kvharbord> StartChildDaemon(
    const std::string& dir, const std::string& name,
    const std::string& config_yaml, std::vector<std::string> args = {}) {
  const std::string config = dir + "/" + name + ".yaml";
  std::ofstream(config) << config_yaml;
  args.push_back("--config=" + config);
  return std::make_unique<Kvharbord>(KvharbordPath(), std::move(args),
                                     dir + "/" + name + ".log");
}

// A client of `d` that waits for it to come up, taking messages of 1 GiB
// (GetCalibration returns a whole calibration in one message: a KVTC one of
// an 8B model is hundreds of MiB).
inline absl::StatusOr<std::unique_ptr<Client>> ConnectChild(
    const Kvharbord& d, ClientOptions o = {}) {
  o.address = d.address();
  o.wait_for_ready = true;
  o.default_timeout = absl::Seconds(60);
  o.max_message_bytes = 1 << 30;
  return Client::Create(o);
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_CUDA_DAEMON_PROCESS_H_
