// The command line of kvharbor-calibrate (tools/calibrate_main.cc), as a
// library so that tests can run it: --codec=kvtc (default) writes KVTC
// calibration files (core/calibration/kvtc_calibrate.h), --codec=commvq a
// CommVQ codebook file (tools/commvq_calibrate.h). Progress goes to stderr,
// results to stdout. KVTC's PCA runs on the CPU or, in builds with CUDA
// (KVHARBOR_CALIBRATE_GPU), on a GPU (--device;
// cuda/calibration/calibration_pca_gpu.h). Thread-compatible; no state.
#ifndef KVHARBOR_TOOLS_CALIBRATE_CLI_H_
#define KVHARBOR_TOOLS_CALIBRATE_CLI_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/calibration/kvtc_calibrate.h"
#include "tools/commvq_calibrate.h"

namespace kvharbor {

extern const char kCalibrateUsage[];

enum class CalibrateCodec { kKvtc, kCommVq };

// auto: the GPU when this build has CUDA and a GPU is present.
enum class CalibrateDevice { kAuto, kCpu, kGpu };

// The GPU PCA's flags (plain values, so CPU-only builds parse them too).
struct GpuPcaFlags {
  std::string solver = "auto";  // auto | syevd | subspace
  bool tf32 = false;            // TF32 tensor cores for the covariance
  uint64_t chunk_rows = 4096;   // rows per covariance GEMM
};

struct CalibrateArgs {
  CalibrateCodec codec = CalibrateCodec::kKvtc;
  std::string samples;
  std::string out;
  bool quiet = false;
  bool help = false;      // --help: print kCalibrateUsage, do nothing else
  CalibrateOptions kvtc;  // kvtc.pca is set by RunCalibrate per `device`
  CalibrateDevice device = CalibrateDevice::kAuto;
  GpuPcaFlags gpu;
  CommVqCalibrateOptions commvq;
};

// `args` without the program name. Flags take "--flag value" or
// "--flag=value"; errors are InvalidArgument naming the flag.
absl::StatusOr<CalibrateArgs> ParseCalibrateArgs(
    const std::vector<std::string>& args);

// Reads the samples, calibrates and writes PREFIX.<ratio>x.kvtc per ratio
// (kvtc) or PREFIX.commvq (commvq).
absl::Status RunCalibrate(const CalibrateArgs& args);

// Whether this build can calibrate on a GPU (built with CUDA).
bool CalibrateGpuBuilt();

// The PCA engine `args` asks for: null for the CPU; FailedPrecondition
// naming --device when a GPU is asked for and none can be used.
absl::StatusOr<std::shared_ptr<const CalibrationPca>> MakeCalibrationPca(
    const CalibrateArgs& args);

// The commvq output path for `--out PREFIX`.
std::string CommVqOutputPath(const std::string& prefix);

}  // namespace kvharbor

#endif  // KVHARBOR_TOOLS_CALIBRATE_CLI_H_
