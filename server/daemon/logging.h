// kvharbord's log output: spdlog's default logger as text (spdlog's default
// pattern) or as JSON lines, one object per line:
//   {"ts":"2025-01-02T03:04:05.678901Z","level":"info","msg":"..."}
// ts is UTC with microseconds; msg is escaped per RFC 8259 (control
// characters as \uXXXX, bytes that are not UTF-8 as U+FFFD), so every line
// parses whatever a message contains.
//
// ConfigureLogging changes process-wide state (spdlog's formatter and level
// for every registered logger; with json, gRPC's log function too, so that
// gRPC's own messages come out as JSON lines); call it before starting
// threads that log, as
// kvharbord's main does. Embedders of the Daemon library leave it alone. The
// formatter itself is stateless and thread-safe.
#ifndef KVHARBOR_SERVER_DAEMON_LOGGING_H_
#define KVHARBOR_SERVER_DAEMON_LOGGING_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/formatter.h"

namespace kvharbor {

// Checks a log format ("text" or "json") and level (trace, debug, info,
// warn/warning, err/error, critical, off); errors read
// "<prefix>: log.format: ..." / "<prefix>: log.level: ...".
absl::Status ValidateLogOptions(absl::string_view format,
                                absl::string_view level,
                                absl::string_view prefix);

// Validates (errors as ValidateLogOptions's) and applies `format` and
// `level`.
absl::Status ConfigureLogging(absl::string_view format, absl::string_view level,
                              absl::string_view prefix);

class JsonLogFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg,
              spdlog::memory_buf_t& dest) override;
  std::unique_ptr<spdlog::formatter> clone() const override;
};

// Appends `text` as the contents of a JSON string (without the quotes).
void AppendJsonEscaped(absl::string_view text, std::string* out);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DAEMON_LOGGING_H_
