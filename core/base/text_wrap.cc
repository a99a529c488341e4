#include "core/base/text_wrap.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvharbor {

std::string WrapText(absl::string_view text, size_t indent, size_t width) {
  const std::string pad(indent, ' ');
  std::string out;
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      absl::StrAppend(&out, pad, line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, pad, line, "\n");
  return out;
}

}  // namespace kvharbor
