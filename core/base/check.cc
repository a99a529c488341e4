#include "core/base/check.h"

#include <cstdio>
#include <cstdlib>

namespace kvharbor::internal {

void CheckFailed(const char* file, int line, const char* condition,
                 const std::string& message) {
  std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", file, line, condition,
               message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace kvharbor::internal
