// The token space both stress tests draw from (tests/stress/stress_test.cc
// over gRPC, tests/stress/core_stress.cc on the core alone): few trunks,
// branches and lengths, so that prefixes overlap a lot and inserts, dedup,
// node splits and evictions all happen. Also their env knobs and mixer.
//
// Test-only, header-only, standard library only (the core-only TSan build
// has no client or server code); pure functions, callable from any thread.
#ifndef KVHARBOR_TESTS_STRESS_STRESS_KEYS_H_
#define KVHARBOR_TESTS_STRESS_STRESS_KEYS_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace kvharbor {
namespace testing {

inline constexpr uint32_t kPageSize = 4;  // tokens per page
inline constexpr uint32_t kTrunks = 4;
inline constexpr uint32_t kMaxPages = 4;
inline constexpr uint32_t kBranches = 3;

inline int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

inline uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct SeqKey {
  uint32_t trunk, pages, branch_at, branch;
};

// Pages before `branch_at` follow the trunk, later ones the branch.
inline std::vector<int32_t> MakeTokens(const SeqKey& k) {
  std::vector<int32_t> t(k.pages * kPageSize);
  for (size_t j = 0; j < t.size(); ++j) {
    const bool on_trunk = j / kPageSize < k.branch_at;
    t[j] = static_cast<int32_t>(k.trunk * 1000000 +
                                (on_trunk ? 0 : (k.branch + 1) * 10000) + j);
  }
  return t;
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_STRESS_STRESS_KEYS_H_
