// kvharbor-calibrate: offline calibration from a KV sample file
// (docs/kv_samples.md): KVTC calibration files (docs/kvtc_format.md) or,
// with --codec=commvq, a CommVQ codebook file (docs/commvq_format.md). Run
// with --help for the options; tools/calibrate_cli.h does the work.
#include <cstdio>
#include <string>
#include <vector>

#include "tools/calibrate_cli.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  auto parsed = kvharbor::ParseCalibrateArgs(args);
  if (!parsed.ok()) {
    std::fprintf(stderr, "kvharbor-calibrate: %s\n%s",
                 std::string(parsed.status().message()).c_str(),
                 kvharbor::kCalibrateUsage);
    return 2;
  }
  if (parsed->help) {
    std::fputs(kvharbor::kCalibrateUsage, stdout);
    return 0;
  }
  const absl::Status st = kvharbor::RunCalibrate(*parsed);
  if (!st.ok()) {
    std::fprintf(stderr, "kvharbor-calibrate: %s\n",
                 std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
