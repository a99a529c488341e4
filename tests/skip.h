// Skipping a test that cannot run here (etcd, promtool or a GPU missing) so
// that CTest reports it as skipped ("Not Run"), never as passed. Catch2 v2
// (Debian 12) has no SKIP(): MarkSkipped() prints the reason and records it,
// and the test main (tests/catch_session.h) then exits with kSkipExitCode,
// which every registered test declares as its SKIP_RETURN_CODE
// (tests/CMakeLists.txt). A test that fails still exits with its failure
// count (never kSkipExitCode), so a skip never hides a failure. Header-only;
// the flag is one per process (not thread-safe: call it from the test thread).
#ifndef KVHARBOR_TESTS_SKIP_H_
#define KVHARBOR_TESTS_SKIP_H_

#include <catch2/catch.hpp>
#include <string>

namespace kvharbor {
namespace testing {

// The exit status meaning "skipped" (the automake / CTest convention).
inline constexpr int kSkipExitCode = 77;

inline bool& SkippedFlag() {
  static bool skipped = false;
  return skipped;
}

// Marks the running test as skipped and says why; the caller returns.
inline void MarkSkipped(const std::string& why) {
  WARN("SKIPPED: " << why);
  SkippedFlag() = true;
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_SKIP_H_
