// KeyKind: what the sequence elements of a namespace are (docs/engines_api.md).
//
// A token namespace (kTokens, the default) is keyed by the prompt's token ids,
// page_size of them per page. A page-key namespace (kPageKeys) is keyed by one
// opaque page key of 1..kMaxPageKeyBytes bytes per page, as engines name their
// pages: SGLang's page-hash strings, vLLM's block hashes, LMCache's chunk
// keys. Both have the same semantics (longest consecutive prefix, leases,
// dedup, LRU eviction of leaves, tiers, codecs, append); only the element
// differs: a page is found through the pages before it.
//
// A page-hash namespace (kPageHashes) takes the same keys, but each key must
// already name its page AND everything before it (a chained hash), so a page
// is stored and found by its own key alone: an Insert stores each page under
// its key whether or not the pages before it are cached, and a Match returns
// the longest run of leading keys that are each present. No batch boundary or
// omitted prefix can orphan a page (issue 32 item 3). Values match
// kvharbor.v1.KeyKind; never renumber.
//
// Header only; no state.
#ifndef KVHARBOR_TYPES_KEY_KIND_H_
#define KVHARBOR_TYPES_KEY_KIND_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "types/enum_names.h"

namespace kvharbor {

enum class KeyKind : int {
  kTokens = 0,
  kPageKeys = 1,
  kPageHashes = 2,
};

// Whether a namespace of kind `k` is keyed by page keys (kPageKeys or
// kPageHashes): its sequences are Sequence::OfKeys / page_keys.
inline bool UsesPageKeys(KeyKind k) { return k != KeyKind::kTokens; }
// Whether each page of a namespace of kind `k` stands alone (kPageHashes).
inline bool IndependentPages(KeyKind k) { return k == KeyKind::kPageHashes; }

// Longest page key; keys are 1..kMaxPageKeyBytes bytes.
inline constexpr size_t kMaxPageKeyBytes = 32;

inline constexpr const char* kKeyKindNames[] = {"tokens", "page_keys",
                                                "page_hashes"};

inline absl::string_view KeyKindName(KeyKind k) {
  return EnumName(k, kKeyKindNames);
}
// Inverse of KeyKindName; InvalidArgument "<field>: unknown value '<name>'
// (want tokens, page_keys or page_hashes)" otherwise.
inline absl::StatusOr<KeyKind> ParseKeyKind(absl::string_view field,
                                            absl::string_view name) {
  return ParseEnum<KeyKind>(field, name, kKeyKindNames);
}

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_KEY_KIND_H_
