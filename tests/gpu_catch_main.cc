// The main of the GPU test binaries (kvharbor_cuda_tests and the GPU e2e
// tests): on a machine where the CUDA runtime finds no device it runs nothing
// and exits with kSkipExitCode, so CTest reports those tests as skipped (the
// `gpu` label, tests/CMakeLists.txt) instead of failing; listing the tests
// (catch_discover_tests, --list-*) needs no device. Otherwise as
// tests/catch_main.cc.
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

#include "tests/catch_session.h"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    listing = listing || std::strncmp(argv[i], "--list", 6) == 0 ||
              std::strcmp(argv[i], "-l") == 0 ||
              std::strcmp(argv[i], "-h") == 0 ||
              std::strcmp(argv[i], "--help") == 0;
  }
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (!listing && (err != cudaSuccess || devices == 0)) {
    std::printf("SKIPPED: no CUDA device (cudaGetDeviceCount: %s, %d devices)\n",
                err == cudaSuccess ? "ok" : cudaGetErrorString(err), devices);
    return kvharbor::testing::kSkipExitCode;
  }
  return kvharbor::testing::RunCatchSession(argc, argv);
}
