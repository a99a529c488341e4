// WrapText: words of a help text laid out in lines of at most `width`
// columns, each indented -- the --help output of kvharbord and the kvharbor
// CLI.
//
// A pure function over its arguments; thread-safe.
#ifndef KVHARBOR_CORE_BASE_TEXT_WRAP_H_
#define KVHARBOR_CORE_BASE_TEXT_WRAP_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace kvharbor {

// `text`'s words (split at spaces) in lines of `indent` spaces plus words,
// each line ending in '\n' and at most `width` columns wide unless one word
// alone is wider. Empty text gives "".
std::string WrapText(absl::string_view text, size_t indent, size_t width = 80);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_BASE_TEXT_WRAP_H_
