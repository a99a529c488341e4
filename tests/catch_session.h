// RunCatchSession: the body of every test binary's main (tests/catch_main.cc,
// tests/gpu_catch_main.cc). It runs Catch2 and maps the result to an exit
// status CTest reads: the failure count when something failed (moved off
// kSkipExitCode should it be exactly that), kSkipExitCode when a test called
// MarkSkipped (tests/skip.h) and nothing failed, 0 otherwise. Include it in
// one translation unit per binary, after defining CATCH_CONFIG_RUNNER.
#ifndef KVHARBOR_TESTS_CATCH_SESSION_H_
#define KVHARBOR_TESTS_CATCH_SESSION_H_

#include <catch2/catch.hpp>

#include "tests/skip.h"

namespace kvharbor {
namespace testing {

inline int RunCatchSession(int argc, char** argv) {
  const int failed = Catch::Session().run(argc, argv);
  if (failed != 0) return failed == kSkipExitCode ? failed + 1 : failed;
  return SkippedFlag() ? kSkipExitCode : 0;
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_CATCH_SESSION_H_
