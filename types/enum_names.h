// EnumName / FindEnum / ParseEnum: an enum's names as one list indexed by
// value, serving both directions (value -> name for logs, stats and files;
// name -> value for flags, configs and file metadata), so that each enum
// states its names once instead of in a switch and again in a parser.
//
// `names[i]` names the value `first + i`: the enums this serves number their
// values consecutively (they are stored or sent on the wire and never
// renumbered). Header only; pure functions, thread-safe; the names are
// string literals, so the returned views never dangle.
#ifndef KVHARBOR_TYPES_ENUM_NAMES_H_
#define KVHARBOR_TYPES_ENUM_NAMES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvharbor {

// The name of `value`; "unknown" for a number outside the list (an
// out-of-range integer cast to the enum).
template <typename E>
absl::string_view EnumName(E value, absl::Span<const char* const> names,
                           int64_t first = 0) {
  const int64_t i = static_cast<int64_t>(value) - first;
  if (i < 0 || i >= static_cast<int64_t>(names.size())) return "unknown";
  return names[i];
}

// The value named `name`, if one is.
template <typename E>
std::optional<E> FindEnum(absl::string_view name,
                          absl::Span<const char* const> names,
                          int64_t first = 0) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (name == names[i]) return static_cast<E>(first + i);
  }
  return std::nullopt;
}

// FindEnum, or InvalidArgument "<field>: unknown value '<name>' (want a, b or
// c)" listing the accepted names.
template <typename E>
absl::StatusOr<E> ParseEnum(absl::string_view field, absl::string_view name,
                            absl::Span<const char* const> names,
                            int64_t first = 0) {
  if (std::optional<E> e = FindEnum<E>(name, names, first)) return *e;
  std::string want;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(
        &want, i == 0 ? "" : (i + 1 == names.size() ? " or " : ", "), names[i]);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown value '", name, "' (want ", want, ")"));
}

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_ENUM_NAMES_H_
