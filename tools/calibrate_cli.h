// The command line of kvharbor-calibrate (tools/calibrate_main.cc), as a
// library so that tests can run it: --codec=kvtc (default) writes KVTC
// calibration files (core/kvtc_calibrate.h), --codec=commvq a CommVQ
// codebook file (tools/commvq_calibrate.h). Progress goes to stderr, results
// to stdout. Thread-compatible; no state.
#ifndef KVHARBOR_TOOLS_CALIBRATE_CLI_H_
#define KVHARBOR_TOOLS_CALIBRATE_CLI_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/kvtc_calibrate.h"
#include "tools/commvq_calibrate.h"

namespace kvharbor {

extern const char kCalibrateUsage[];

enum class CalibrateCodec { kKvtc, kCommVq };

struct CalibrateArgs {
  CalibrateCodec codec = CalibrateCodec::kKvtc;
  std::string samples;
  std::string out;
  bool quiet = false;
  bool help = false;  // --help: print kCalibrateUsage, do nothing else
  CalibrateOptions kvtc;
  CommVqCalibrateOptions commvq;
};

// `args` without the program name. Flags take "--flag value" or
// "--flag=value"; errors are InvalidArgument naming the flag.
absl::StatusOr<CalibrateArgs> ParseCalibrateArgs(
    const std::vector<std::string>& args);

// Reads the samples, calibrates and writes PREFIX.<ratio>x.kvtc per ratio
// (kvtc) or PREFIX.commvq (commvq).
absl::Status RunCalibrate(const CalibrateArgs& args);

// The commvq output path for `--out PREFIX`.
std::string CommVqOutputPath(const std::string& prefix);

}  // namespace kvharbor

#endif  // KVHARBOR_TOOLS_CALIBRATE_CLI_H_
