// The lane formulation of XXH3-64 that the GPU checksum kernel runs
// (core/base/xxh3_lanes.h) equals libxxhash's XXH3_64bits over every length
// up to three blocks, the boundaries of every code path, page sizes, and
// unaligned starts.
#include "core/base/xxh3_lanes.h"

#include <xxh3.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <vector>

namespace kvharbor {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST_CASE("XXH3 by lanes equals XXH3_64bits at every length to 3 KiB",
          "[xxh3]") {
  const std::vector<uint8_t> data = RandomBytes(3 * 1024 + 64, 1);
  for (size_t len = 0; len <= 3 * 1024 + 64; ++len) {
    INFO("len " << len);
    REQUIRE(xxh3::Xxh3ByLanes(data.data(), len) ==
            XXH3_64bits(data.data(), len));
  }
}

TEST_CASE("XXH3 by lanes equals XXH3_64bits at path and block boundaries",
          "[xxh3]") {
  std::vector<size_t> sizes = {240,    241,     255,     256,          257,
                               1023,   1024,    1025,    1088,         2047,
                               2048,   2049,    4096,    65536,        65537,
                               100000, 1 << 20, 2 << 20, (2 << 20) + 7};
  // Around every multiple of the block (1024 bytes) up to 16 blocks.
  for (size_t b = 1; b <= 16; ++b) {
    for (int d = -65; d <= 65; d += 13) sizes.push_back(b * 1024 + d);
  }
  const std::vector<uint8_t> data = RandomBytes((2 << 20) + 64, 2);
  for (size_t len : sizes) {
    INFO("len " << len);
    CHECK(xxh3::Xxh3ByLanes(data.data(), len) == XXH3_64bits(data.data(), len));
  }
}

TEST_CASE("XXH3 by lanes does not care where the input starts", "[xxh3]") {
  const std::vector<uint8_t> data = RandomBytes(5000, 3);
  for (size_t start = 0; start < 9; ++start) {
    for (size_t len : {0, 3, 7, 16, 100, 200, 240, 241, 1500, 4096}) {
      INFO("start " << start << " len " << len);
      CHECK(xxh3::Xxh3ByLanes(data.data() + start, len) ==
            XXH3_64bits(data.data() + start, len));
    }
  }
}

TEST_CASE("XXH3 of constant pages (zeros, ones) matches", "[xxh3]") {
  for (uint8_t fill : {0x00, 0xff, 0x3c}) {
    const std::vector<uint8_t> page(512 * 1024, fill);
    CHECK(xxh3::Xxh3ByLanes(page.data(), page.size()) ==
          XXH3_64bits(page.data(), page.size()));
  }
}

}  // namespace
}  // namespace kvharbor
