#include "core/index/page_key.h"

#include <cstring>

#include "absl/strings/str_format.h"

namespace kvharbor {

static_assert(kMaxPageKeyBytes % sizeof(Token) == 0,
              "page keys pad to whole words");

absl::Status AppendPageKey(absl::string_view key, size_t index,
                           absl::string_view field, std::vector<Token>* out) {
  if (key.empty() || key.size() > kMaxPageKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s[%u]: a page key of %u bytes; keys are 1..%u bytes",
                        field, index, key.size(), kMaxPageKeyBytes));
  }
  Token words[kPageKeyWords] = {};
  std::memcpy(words, key.data(), key.size());
  words[kPageKeyWords - 1] = static_cast<Token>(key.size());
  out->insert(out->end(), words, words + kPageKeyWords);
  return absl::OkStatus();
}

std::string DecodePageKey(const Token* words) {
  const Token len = words[kPageKeyWords - 1];
  if (len <= 0 || static_cast<size_t>(len) > kMaxPageKeyBytes) return "";
  char bytes[kMaxPageKeyBytes];
  std::memcpy(bytes, words, kMaxPageKeyBytes);
  for (size_t i = static_cast<size_t>(len); i < kMaxPageKeyBytes; ++i) {
    if (bytes[i] != 0) return "";
  }
  return std::string(bytes, static_cast<size_t>(len));
}

}  // namespace kvharbor
