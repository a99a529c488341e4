// Page keys as RadixIndex elements: how a page-key namespace (types/key_kind.h)
// shares the radix tree of the token namespaces.
//
// Design: the index works on fixed-size elements (int32 words), page_size of
// them per page. A page-key namespace builds its RadixIndex with
// kPageKeyWords words per page and stores each page key as those words: the
// key's bytes zero-padded to kMaxPageKeyBytes (8 words), then its length (1
// word). The encoding is injective ("ab" and "ab\0" differ in the length
// word), so matching, dedup, locks, LRU eviction, tiers and the disk tier's
// persisted prefixes (RadixIndex::PrefixTokens) work unchanged and exactly,
// with no hash that could collide. Interning keys to 32-bit ids was the
// alternative: 4 bytes per page in the tree instead of 36, but an intern table
// (key bytes, reference count, reverse map) per namespace, ids that change
// across a restart (the disk tier persists prefixes), and a second lookup per
// page on every Match. The 36 bytes per page are counted in the index's
// MemoryBytes (node keys) like token ids are (a 16-token page costs 64).
//
// Stateless functions; thread-safe.
#ifndef KVHARBOR_CORE_INDEX_PAGE_KEY_H_
#define KVHARBOR_CORE_INDEX_PAGE_KEY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/index/radix_index.h"
#include "types/key_kind.h"

namespace kvharbor {

// Index words per page key: kMaxPageKeyBytes key bytes, then the length.
inline constexpr uint32_t kPageKeyWords =
    static_cast<uint32_t>(kMaxPageKeyBytes / sizeof(Token) + 1);

// Appends the kPageKeyWords words of `key`, the `index`-th key of a list
// named `field`, to `*out`. InvalidArgument "<field>[<index>]: ..." for a key
// of 0 or more than kMaxPageKeyBytes bytes (nothing appended).
absl::Status AppendPageKey(absl::string_view key, size_t index,
                           absl::string_view field, std::vector<Token>* out);

// Every key of `keys` (any container of string-like values), in order. On an
// error `*out` holds what it held before.
template <typename Keys>
absl::Status EncodePageKeys(const Keys& keys, absl::string_view field,
                            std::vector<Token>* out) {
  const size_t before = out->size();
  out->reserve(before + static_cast<size_t>(keys.size()) * kPageKeyWords);
  size_t i = 0;
  for (const auto& key : keys) {
    absl::Status s = AppendPageKey(absl::string_view(key), i++, field, out);
    if (!s.ok()) {
      out->resize(before);
      return s;
    }
  }
  return absl::OkStatus();
}

// The key held in `words` (kPageKeyWords words made by AppendPageKey);
// words that no key encodes to (a length of 0 or over kMaxPageKeyBytes, or
// padding that is not zero) give "".
std::string DecodePageKey(const Token* words);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_INDEX_PAGE_KEY_H_
