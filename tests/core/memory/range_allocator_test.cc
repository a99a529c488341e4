// RangeAllocator (the bookkeeping of the shared host arena and the GPU
// arena): first fit, alignment, merge on give-back in any order, and the
// exhaustion message; plus a random sequence against a byte map.
#include "core/memory/range_allocator.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/match.h"

namespace kvharbor {
namespace {

TEST_CASE("RangeAllocator: first fit, alignment and merging",
          "[core][range_allocator]") {
  RangeAllocator r(1000, 100, "the test arena");
  CHECK(r.free_bytes() == 1000);
  auto a = r.Take(150);  // rounded to 200
  auto b = r.Take(100);
  auto c = r.Take(300);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  CHECK(*a == 0);
  CHECK(*b == 200);
  CHECK(*c == 300);
  CHECK(r.free_bytes() == 400);
  auto big = r.Take(500);
  REQUIRE(!big.ok());
  CHECK(big.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(big.status().message(),
                          "the test arena has 400 bytes free (largest range "
                          "400), 500 needed"));
  // Give back a and c, then b: the three merge with the tail into one range.
  r.Give(*a, 150);
  r.Give(*c, 300);
  CHECK(!r.Take(900).ok());
  r.Give(*b, 100);
  CHECK(r.free_bytes() == 1000);
  auto all = r.Take(1000);
  REQUIRE(all.ok());
  CHECK(*all == 0);
}

TEST_CASE("RangeAllocator: random takes and gives never overlap",
          "[core][range_allocator]") {
  constexpr uint64_t kBytes = 64 * 16;
  RangeAllocator r(kBytes, 16, "arena");
  std::vector<int> owner(kBytes / 16, -1);
  std::vector<std::pair<uint64_t, uint64_t>> live;  // offset, bytes asked
  std::mt19937 rng(7);
  for (int step = 0; step < 5000; ++step) {
    if (live.empty() || rng() % 2 == 0) {
      const uint64_t n = 1 + rng() % 100;
      auto off = r.Take(n);
      if (!off.ok()) continue;
      REQUIRE(*off % 16 == 0);
      for (uint64_t u = *off / 16; u < (*off + r.Round(n)) / 16; ++u) {
        REQUIRE(u < owner.size());
        REQUIRE(owner[u] == -1);
        owner[u] = step;
      }
      live.emplace_back(*off, n);
    } else {
      const size_t i = rng() % live.size();
      const auto [off, n] = live[i];
      for (uint64_t u = off / 16; u < (off + r.Round(n)) / 16; ++u) {
        owner[u] = -1;
      }
      r.Give(off, n);
      live.erase(live.begin() + static_cast<long>(i));
    }
    uint64_t free_units = 0;
    for (int o : owner) free_units += o == -1;
    REQUIRE(r.free_bytes() == free_units * 16);
  }
  for (const auto& [off, n] : live) r.Give(off, n);
  CHECK(r.free_bytes() == kBytes);
  CHECK(r.Take(kBytes).ok());  // everything merged back into one range
}

}  // namespace
}  // namespace kvharbor
