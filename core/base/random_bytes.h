// FillRandom: bytes from the kernel's CSPRNG (getrandom(2)) for the daemon's
// secrets: staging registration keys (server/local/staging_registry.h) and
// bulk data plane tokens (server/data/bulk_ticket_table.h).
//
// The caller owns the buffer. Thread-safe (no state).
#ifndef KVHARBOR_CORE_BASE_RANDOM_BYTES_H_
#define KVHARBOR_CORE_BASE_RANDOM_BYTES_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvharbor {

// Fills [out, out + bytes); INTERNAL naming `what` ("staging", ...) when the
// kernel refuses (EINTR is retried).
absl::Status FillRandom(void* out, size_t bytes, absl::string_view what);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_BASE_RANDOM_BYTES_H_
