// FillRandom (core/base/random_bytes.h).
#include "core/base/random_bytes.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvharbor {

absl::Status FillRandom(void* out, size_t bytes, absl::string_view what) {
  auto* p = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = getrandom(p + done, bytes - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(
          absl::StrCat(what, ": getrandom: ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace kvharbor
