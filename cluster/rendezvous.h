// Rendezvous (highest-random-weight) hashing of KV-cache prefixes onto
// cluster members.
//
// A prefix's route key hashes the namespace and the tokens of its FIRST page
// only: every continuation of a prefix (same first page) gets the same key,
// so all of a conversation's pages live on one daemon and Match stays one
// round trip. Each member scores every key with a mix of the key and the
// hash of its address; the highest score owns the key. Adding or removing a
// member moves only the keys it wins or owned (about 1/n of them), and every
// client computes the same owner from the same member list without talking
// to the others.
//
// Pure functions; thread-safe. The hash of tokens is over their
// little-endian bytes, so it is the same on every host.
#ifndef KVHARBOR_CLUSTER_RENDEZVOUS_H_
#define KVHARBOR_CLUSTER_RENDEZVOUS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvharbor {
namespace cluster {

// XXH3-64 of the namespace name, a separator and the first page's tokens.
uint64_t RouteKey(absl::string_view ns,
                  absl::Span<const int32_t> first_page_tokens);
// XXH3-64 of the member's address.
uint64_t MemberHash(absl::string_view address);
// The weight of a member for a key (a 64-bit mix of both).
uint64_t RendezvousScore(uint64_t route_key, uint64_t member_hash);
// Indices into `member_hashes`, highest score first (ties: lower index
// first); the first `count` of them (all when count >= size).
std::vector<size_t> RankMembers(uint64_t route_key,
                                absl::Span<const uint64_t> member_hashes,
                                size_t count);

}  // namespace cluster
}  // namespace kvharbor

#endif  // KVHARBOR_CLUSTER_RENDEZVOUS_H_
