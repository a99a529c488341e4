// SplitHostPort (core/base/host_port.h).
#include "core/base/host_port.h"

#include "absl/strings/numbers.h"

namespace kvharbor {

bool SplitHostPort(absl::string_view listen, absl::string_view* host,
                   int* port) {
  const size_t colon = listen.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  *host = listen.substr(0, colon);
  absl::string_view port_text = listen.substr(colon + 1);
  return !port_text.empty() && absl::SimpleAtoi(port_text, port) &&
         *port >= 0 && *port <= 65535 &&
         port_text.find_first_not_of("0123456789") == absl::string_view::npos;
}

}  // namespace kvharbor
