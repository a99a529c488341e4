#include "server/daemon/logging.h"

#include <grpc/support/log.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

namespace {

bool ParseLevel(absl::string_view name, spdlog::level::level_enum* level) {
  const std::string n(name);
  *level = spdlog::level::from_str(n);
  // from_str maps anything unknown to off.
  return *level != spdlog::level::off || n == "off";
}

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one.
size_t Utf8Length(absl::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  size_t n = 0;
  uint32_t cp = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  // Overlong forms, surrogates and code points past U+10FFFF.
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return n;
}

// gRPC's own log lines (bind errors and the like), as spdlog lines so that
// JSON output stays one object per line.
void GrpcLogToSpdlog(gpr_log_func_args* args) {
  spdlog::level::level_enum level = spdlog::level::err;
  if (args->severity == GPR_LOG_SEVERITY_DEBUG) {
    level = spdlog::level::debug;
  } else if (args->severity == GPR_LOG_SEVERITY_INFO) {
    level = spdlog::level::info;
  }
  spdlog::log(level, "grpc: {} ({}:{})", args->message, args->file, args->line);
}

}  // namespace

absl::Status ValidateLogOptions(absl::string_view format,
                                absl::string_view level,
                                absl::string_view prefix) {
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ": log.format: '", format, "' is not text or json"));
  }
  spdlog::level::level_enum unused;
  if (!ParseLevel(level, &unused)) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ": log.level: '", level,
        "' is not trace, debug, info, warn, error, critical or off"));
  }
  return absl::OkStatus();
}

absl::Status ConfigureLogging(absl::string_view format, absl::string_view level,
                              absl::string_view prefix) {
  absl::Status s = ValidateLogOptions(format, level, prefix);
  if (!s.ok()) return s;
  spdlog::level::level_enum l;
  ParseLevel(level, &l);
  if (format == "json") {
    spdlog::set_formatter(std::make_unique<JsonLogFormatter>());
    gpr_set_log_function(GrpcLogToSpdlog);
  } else {
    spdlog::set_formatter(std::make_unique<spdlog::pattern_formatter>());
  }
  spdlog::set_level(l);
  return absl::OkStatus();
}

void AppendJsonEscaped(absl::string_view text, std::string* out) {
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    const auto u = static_cast<uint8_t>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '\r') {
      out->append("\\r");
    } else if (c == '\t') {
      out->append("\\t");
    } else if (u < 0x20 || u == 0x7F) {
      absl::StrAppendFormat(out, "\\u%04x", u);
    } else if (u >= 0x80) {
      const size_t n = Utf8Length(text, i);
      if (n == 0) {
        out->append("\\ufffd");
        ++i;
      } else {
        out->append(text.data() + i, n);
        i += n;
      }
      continue;
    } else {
      out->push_back(c);
    }
    ++i;
  }
}

void JsonLogFormatter::format(const spdlog::details::log_msg& msg,
                              spdlog::memory_buf_t& dest) {
  std::string line = "{\"ts\":\"";
  line += absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::FromChrono(msg.time),
                           absl::UTCTimeZone());
  line += "\",\"level\":\"";
  const auto level = spdlog::level::to_string_view(msg.level);
  line.append(level.data(), level.size());
  line += "\",\"msg\":\"";
  AppendJsonEscaped(absl::string_view(msg.payload.data(), msg.payload.size()),
                    &line);
  line += "\"}\n";
  dest.append(line.data(), line.data() + line.size());
}

std::unique_ptr<spdlog::formatter> JsonLogFormatter::clone() const {
  return std::make_unique<JsonLogFormatter>();
}

}  // namespace kvharbor
