// Strict JSON parsing on top of nlohmann-json for the files kvharbor reads
// (safetensors headers, msmodelslim descriptions): duplicate keys at any
// level are refused (nlohmann would silently keep the last one) and nesting
// deeper than the caller's limit is refused while parsing, before anything
// deep is built. Pure function; thread-safe.
#ifndef KVHARBOR_CORE_BASE_STRICT_JSON_H_
#define KVHARBOR_CORE_BASE_STRICT_JSON_H_

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvharbor {

// Parses `text` as one JSON value. Errors are InvalidArgument and read
// "<what>: json: <problem>". Depth counts containers: `{"a": [1]}` has
// depth 2.
absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text,
                                               int max_depth,
                                               absl::string_view what);

// A printable, length-limited, quoted form of a name from a file, for
// error messages.
std::string QuotedName(absl::string_view name);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_BASE_STRICT_JSON_H_
