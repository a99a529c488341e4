// KVH_CHECK: the one check for broken invariants in kvharbor.
//
//   KVH_CHECK(cond, format, args...);
//
// When `cond` is false the program prints "file:line: check failed: cond:
// message" (message formatted as absl::StrFormat) to stderr and aborts. It is
// for states the code itself must never reach (an index handing back a page
// the slot table never gave it, a GPU batch returning the wrong number of
// results), never for input: bad input from a client, a file or a config
// always gets an absl::Status naming the field. Always on, also in release
// builds; the condition is evaluated exactly once and the arguments only
// when it fails.
//
// Header plus core/base/check.cc; no state. Thread-safe.
#ifndef KVHARBOR_CORE_BASE_CHECK_H_
#define KVHARBOR_CORE_BASE_CHECK_H_

#include <string>

#include "absl/base/optimization.h"
#include "absl/strings/str_format.h"

namespace kvharbor::internal {

// Prints the failed check and aborts.
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              const std::string& message);

}  // namespace kvharbor::internal

#define KVH_CHECK(cond, ...)                                             \
  do {                                                                   \
    if (ABSL_PREDICT_FALSE(!(cond))) {                                   \
      ::kvharbor::internal::CheckFailed(__FILE__, __LINE__, #cond,       \
                                        ::absl::StrFormat(__VA_ARGS__)); \
    }                                                                    \
  } while (0)

#endif  // KVHARBOR_CORE_BASE_CHECK_H_
