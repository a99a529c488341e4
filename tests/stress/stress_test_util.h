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
#include "kvharbor/types.h"
#include "tests/stress/stress_keys.h"

namespace kvharbor {
namespace testing {

inline constexpr uint32_t kLayers = 2;
inline constexpr uint32_t kHeads = 1;
inline constexpr uint32_t kHeadDim = 64;
inline constexpr uint64_t kPageBytes =
    uint64_t{2} * kLayers * kPageSize * kHeads * kHeadDim * 2;  // BF16: 2048
inline constexpr char kFlat[] = "flat";
inline constexpr char kTiered[] = "tiered";
inline constexpr int kChurnNamespaces = 2;
inline constexpr uint32_t kFlatPages = 20;
inline constexpr uint32_t kTieredPages = 12;
inline constexpr absl::Duration kLongTtl = absl::Seconds(300);
inline constexpr absl::Duration kShortTtl = absl::Milliseconds(150);

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
