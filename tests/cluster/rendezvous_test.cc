// Rendezvous routing: every continuation of a prefix routes like its first
// page, keys spread over the members, and removing a member moves only the
// keys it owned.
#include "cluster/rendezvous.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

namespace kvharbor {
namespace cluster {
namespace {

std::vector<int32_t> Tokens(int32_t first, size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = first + static_cast<int32_t>(i * 7);
  return t;
}

std::vector<uint64_t> Hashes(const std::vector<std::string>& addresses) {
  std::vector<uint64_t> h;
  for (const std::string& a : addresses) h.push_back(MemberHash(a));
  return h;
}

TEST_CASE("route key depends on the namespace and the first page only") {
  const std::vector<int32_t> prompt = Tokens(100, 64);
  const auto first = absl::MakeConstSpan(prompt).subspan(0, 16);
  CHECK(RouteKey("ns", first) == RouteKey("ns", first));
  CHECK(RouteKey("ns", first) != RouteKey("other", first));
  std::vector<int32_t> changed = prompt;
  changed[3] += 1;
  CHECK(RouteKey("ns", first) !=
        RouteKey("ns", absl::MakeConstSpan(changed).subspan(0, 16)));
  // The separator keeps ("ab", [x]) and ("a", ...) apart.
  CHECK(RouteKey("ab", first) != RouteKey("a", first));
}

TEST_CASE("keys spread over members and removal moves only the owner's") {
  const std::vector<std::string> three = {"10.0.0.1:50051", "10.0.0.2:50051",
                                          "10.0.0.3:50051"};
  const std::vector<uint64_t> h3 = Hashes(three);
  const std::vector<uint64_t> h2 = Hashes({three[0], three[2]});
  constexpr int kKeys = 3000;
  std::map<size_t, int> owned;
  int moved_wrongly = 0;
  for (int k = 0; k < kKeys; ++k) {
    const std::vector<int32_t> t = Tokens(k * 1000, 16);
    const uint64_t key = RouteKey("ns", t);
    const size_t owner = RankMembers(key, h3, 1)[0];
    ++owned[owner];
    // Without member 1, member 0 and 2 keep what they owned.
    const size_t owner2 = RankMembers(key, h2, 1)[0] == 0 ? 0 : 2;
    if (owner != 1 && owner2 != owner) ++moved_wrongly;
    // The full ranking starts with the owner and holds every member once.
    std::vector<size_t> all = RankMembers(key, h3, 10);
    REQUIRE(all.size() == 3);
    CHECK(all[0] == owner);
    CHECK(all[0] != all[1]);
    CHECK(all[1] != all[2]);
    CHECK(all[0] != all[2]);
  }
  CHECK(moved_wrongly == 0);
  REQUIRE(owned.size() == 3);
  for (const auto& [member, n] : owned) {
    INFO("member " << member << " owns " << n << " of " << kKeys);
    // 1/3 each; 3000 keys put a fair share within +-15% with overwhelming
    // probability.
    CHECK(n > kKeys / 3 * 85 / 100);
    CHECK(n < kKeys / 3 * 115 / 100);
  }
}

TEST_CASE("no members ranks nothing") { CHECK(RankMembers(42, {}, 1).empty()); }

}  // namespace
}  // namespace cluster
}  // namespace kvharbor
