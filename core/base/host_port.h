// SplitHostPort: the "HOST:PORT" addresses of the daemon's config (listen,
// metrics.listen, data_plane.listen), parsed one way for every listener.
//
// Views into the caller's string; thread-safe (no state).
#ifndef KVHARBOR_CORE_BASE_HOST_PORT_H_
#define KVHARBOR_CORE_BASE_HOST_PORT_H_

#include "absl/strings/string_view.h"

namespace kvharbor {

// Splits "HOST:PORT" (HOST may be a bracketed IPv6 address, returned with
// its brackets; PORT 0..65535); false when `listen` is not of that form.
bool SplitHostPort(absl::string_view listen, absl::string_view* host,
                   int* port);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_BASE_HOST_PORT_H_
