#include "core/store/namespace_config.h"

#include <cstdio>

#include "absl/strings/str_format.h"

namespace kvharbor {

absl::Status ValidateTokens(absl::Span<const Token> tokens, uint32_t max_tokens,
                            absl::string_view field) {
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: empty", field));
  }
  if (tokens.size() > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %u tokens, over the limit of %u per request",
                        field, tokens.size(), max_tokens));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s[%u]: token id %d is negative", field, i, tokens[i]));
    }
  }
  return absl::OkStatus();
}

void LogWarning(const NamespaceConfig& config, const std::string& line) {
  if (config.warn) {
    config.warn(line);
  } else {
    LogEvent(config, line);
  }
}

void LogEvent(const NamespaceConfig& config, const std::string& line) {
  if (config.log) {
    config.log(line);
  } else {
    std::fprintf(stderr, "kvharbor namespace '%s': %s\n", config.name.c_str(),
                 line.c_str());
  }
}

}  // namespace kvharbor
