// Storage tiers of a cached page, from hottest to coldest.
//
// Every page the RadixIndex holds is in exactly one tier; "gone" is not a
// tier but absence from the index. Tier 0 (kRaw) is the namespace's first
// PagePool, whatever its MemoryKind: the host pool today, a device pool when
// one is configured (the same tier logic then compresses device pages into
// the host tier). Values are stored in the index and on the wire order by
// coldness, so comparisons (<, >) mean hotter/colder. Never renumber.
//
// Path invariant (checked by RadixIndex::CheckInvariants): along every path
// from the root, tiers never get hotter, i.e. a page is never in a colder
// tier than any page extending it. Demotion therefore works from the tail of
// a path (leaves first), and an Insert that extends a cold prefix promotes
// that prefix back to raw from the bytes the client sends anyway.
//
// Header only; no state.
#ifndef KVHARBOR_TYPES_TIER_H_
#define KVHARBOR_TYPES_TIER_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "types/enum_names.h"

namespace kvharbor {

enum class Tier : uint8_t {
  kRaw = 0,             // raw bytes in the namespace's PagePool
  kHostCompressed = 1,  // one codec buffer per page in host memory
  kDisk = 2,            // one codec buffer per page in a file
};
inline constexpr int kNumTiers = 3;

inline absl::string_view TierName(Tier t) {
  return EnumName(t, {"raw", "host_compressed", "disk"});
}

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_TIER_H_
