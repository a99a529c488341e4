#include "cluster/rendezvous.h"

#include <xxhash.h>

#include <algorithm>
#include <numeric>
#include <string>

namespace kvharbor {
namespace cluster {

uint64_t RouteKey(absl::string_view ns,
                  absl::Span<const int32_t> first_page_tokens) {
  std::string bytes(ns);
  bytes.push_back('\0');  // "ab"+[..] and "a"+"b.." differ
  bytes.reserve(bytes.size() + 4 * first_page_tokens.size());
  for (int32_t t : first_page_tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i)
      bytes.push_back(static_cast<char>(u >> (8 * i)));
  }
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t MemberHash(absl::string_view address) {
  return XXH3_64bits(address.data(), address.size());
}

uint64_t RendezvousScore(uint64_t route_key, uint64_t member_hash) {
  // splitmix64's finalizer: a bijective mix, so distinct members never tie
  // for one key unless their hashes collide.
  uint64_t z = route_key ^ member_hash;
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::vector<size_t> RankMembers(uint64_t route_key,
                                absl::Span<const uint64_t> member_hashes,
                                size_t count) {
  std::vector<size_t> order(member_hashes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::vector<uint64_t> score(member_hashes.size());
  for (size_t i = 0; i < member_hashes.size(); ++i) {
    score[i] = RendezvousScore(route_key, member_hashes[i]);
  }
  count = std::min(count, order.size());
  std::partial_sort(order.begin(), order.begin() + count, order.end(),
                    [&](size_t a, size_t b) {
                      return score[a] != score[b] ? score[a] > score[b] : a < b;
                    });
  order.resize(count);
  return order;
}

}  // namespace cluster
}  // namespace kvharbor
