// Helpers of the stress test: the page geometry, a token space with many
// shared prefixes, and page bytes derived from the token prefix each page
// ends, so that identical prefixes carry identical bytes and any fetched
// page can be verified without remembering what was inserted.
//
// Test-only; pure functions, callable from any thread.
#ifndef KVHARBOR_TESTS_STRESS_STRESS_TEST_UTIL_H_
#define KVHARBOR_TESTS_STRESS_STRESS_TEST_UTIL_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/types.h"

namespace kvharbor {
namespace testing {

inline constexpr uint32_t kLayers = 2;
inline constexpr uint32_t kHeads = 1;
inline constexpr uint32_t kHeadDim = 64;
inline constexpr uint32_t kPageSize = 4;
inline constexpr uint64_t kPageBytes =
    uint64_t{2} * kLayers * kPageSize * kHeads * kHeadDim * 2;  // BF16: 2048
// Token space: few trunks, branches and lengths so prefixes overlap a lot.
inline constexpr uint32_t kTrunks = 4;
inline constexpr uint32_t kMaxPages = 4;
inline constexpr uint32_t kBranches = 3;
inline constexpr char kFlat[] = "flat";
inline constexpr char kTiered[] = "tiered";
inline constexpr int kChurnNamespaces = 2;
inline constexpr uint32_t kFlatPages = 20;
inline constexpr uint32_t kTieredPages = 12;
inline constexpr absl::Duration kLongTtl = absl::Seconds(300);
inline constexpr absl::Duration kShortTtl = absl::Milliseconds(150);

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

// The bytes of page `page` of `tokens`: a function of tokens[0, end of page).
inline void FillPage(const std::vector<int32_t>& tokens, size_t page,
                     uint8_t* dst) {
  uint64_t s = 0x6b76686172626f72ull;
  for (size_t i = 0; i < (page + 1) * kPageSize; ++i) {
    s = Mix(s ^ static_cast<uint32_t>(tokens[i]));
  }
  for (size_t i = 0; i < kPageBytes; i += 8) {
    s = Mix(s);
    std::memcpy(dst + i, &s, 8);
  }
}

inline std::vector<uint8_t> Pages(const std::vector<int32_t>& tokens) {
  const size_t n = tokens.size() / kPageSize;
  std::vector<uint8_t> out(n * kPageBytes);
  for (size_t p = 0; p < n; ++p) FillPage(tokens, p, &out[p * kPageBytes]);
  return out;
}

inline bool PageMatches(const std::vector<int32_t>& tokens, size_t page,
                        const uint8_t* got) {
  uint8_t want[kPageBytes];
  FillPage(tokens, page, want);
  return std::memcmp(want, got, kPageBytes) == 0;
}

inline client::NamespaceSpec Spec(const std::string& name, uint32_t pages,
                                  uint64_t host_compressed_bytes,
                                  const std::string& disk_dir) {
  client::NamespaceSpec s;
  s.name = name;
  s.geometry.num_layers = kLayers;
  s.geometry.num_kv_heads = kHeads;
  s.geometry.head_dim = kHeadDim;
  s.geometry.page_size = kPageSize;
  s.geometry.dtype = client::DType::kBF16;
  s.capacity_bytes = pages * kPageBytes;
  s.host_compressed_bytes = host_compressed_bytes;
  s.disk_dir = disk_dir;
  if (!disk_dir.empty()) s.disk_bytes = 10 * (kPageBytes + 256);
  return s;
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_STRESS_STRESS_TEST_UTIL_H_
