// KeyKind: what the sequence elements of a namespace are (docs/engines_api.md).
//
// A token namespace (kTokens, the default) is keyed by the prompt's token ids,
// page_size of them per page. A page-key namespace (kPageKeys) is keyed by one
// opaque page key of 1..kMaxPageKeyBytes bytes per page, as engines name their
// pages: SGLang's page-hash strings, vLLM's block hashes, LMCache's chunk
// keys. Both have the same semantics (longest consecutive prefix, leases,
// dedup, LRU eviction of leaves, tiers, codecs, append); only the element
// differs. Values match kvharbor.v1.KeyKind; never renumber.
//
// Header only; no state.
#ifndef KVHARBOR_TYPES_KEY_KIND_H_
#define KVHARBOR_TYPES_KEY_KIND_H_

#include <cstddef>

#include "absl/strings/string_view.h"
#include "types/enum_names.h"

namespace kvharbor {

enum class KeyKind : int {
  kTokens = 0,
  kPageKeys = 1,
};

// Longest page key; keys are 1..kMaxPageKeyBytes bytes.
inline constexpr size_t kMaxPageKeyBytes = 32;

inline absl::string_view KeyKindName(KeyKind k) {
  return EnumName(k, {"tokens", "page_keys"});
}

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_KEY_KIND_H_
