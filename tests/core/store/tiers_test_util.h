// Helpers of the tier tests (tiers_test.cc, faults_test.cc): a small FP32
// geometry, token sequences, random page bytes, a namespace with tiers, and
// Insert/Fetch drivers over the core API (no server). Test-only, header-only;
// the functions use Catch2 assertions and are meant for the test thread.
#ifndef KVHARBOR_TESTS_CORE_STORE_TIERS_TEST_UTIL_H_
#define KVHARBOR_TESTS_CORE_STORE_TIERS_TEST_UTIL_H_

#include <xxh3.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/codec/codec.h"
#include "core/store/namespace.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace testing {

namespace fs = std::filesystem;

inline Geometry Geo() {
  Geometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  g.page_size = 4;
  g.dtype = DType::kFP32;
  return g;
}

inline std::vector<Token> Seq(int start, int n) {
  std::vector<Token> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

// Random FP32 values (finite, moderate), as page bytes.
inline std::string Pages(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::string s(n * Geo().PageBytes(), '\0');
  for (size_t i = 0; i + 4 <= s.size(); i += 4) {
    const float v = dist(rng);
    std::memcpy(&s[i], &v, 4);
  }
  return s;
}

inline NamespaceConfig Config(uint64_t host_budget, std::string disk_dir = "") {
  NamespaceConfig c;
  c.name = "t";
  c.geometry = Geo();
  c.host_compressed_bytes = host_budget;
  c.disk_dir = std::move(disk_dir);
  c.tier_batch_pages = 2;
  c.log = [](const std::string&) {};
  return c;
}

inline std::shared_ptr<Namespace> Make(
    NamespaceConfig c, uint32_t pool_pages,
    std::vector<std::string>* log = nullptr) {
  if (log != nullptr)
    c.log = [log](const std::string& l) { log->push_back(l); };
  auto pool = HostPagePool::Create(c.geometry.PageBytes(), pool_pages);
  REQUIRE(pool.ok());
  auto ns = Namespace::Create(std::move(c), *std::move(pool));
  REQUIRE(ns.ok());
  return *ns;
}

inline void Insert(Namespace& ns, const std::vector<Token>& t,
                   const std::string& bytes) {
  auto up = ns.BeginInsert(t, {});
  REQUIRE(up.ok());
  REQUIRE((*up)->Write(0, bytes).ok());
  REQUIRE((*up)->Commit().ok());
}

// Fetches the whole match of `t` in `format` (no lease) and concatenates.
inline std::string Fetch(Namespace& ns, const std::vector<Token>& t,
                         FetchFormat format,
                         std::vector<Tier>* tiers = nullptr) {
  auto m = ns.Match(t, false, absl::ZeroDuration());
  REQUIRE(m.ok());
  if (tiers != nullptr) *tiers = m->tiers;
  auto pinned = ns.PinPages(m->pages, format);
  REQUIRE(pinned.ok());
  std::string out;
  for (size_t i = 0; i < pinned->size(); ++i) {
    const absl::string_view b = pinned->bytes(i);
    CHECK(XXH3_64bits(b.data(), b.size()) == pinned->checksum(i));
    out.append(b.data(), b.size());
  }
  return out;
}

// Decodes per-page buffers fetched COMPRESSED, as a client would.
inline std::string DecodeAll(Namespace& ns, const std::vector<Token>& t,
                             const Codec& codec) {
  auto m = ns.Match(t, false, absl::ZeroDuration());
  REQUIRE(m.ok());
  auto pinned = ns.PinPages(m->pages, FetchFormat::kCompressed);
  REQUIRE(pinned.ok());
  std::string out(pinned->size() * ns.page_bytes(), '\0');
  for (size_t i = 0; i < pinned->size(); ++i) {
    const absl::string_view b = pinned->bytes(i);
    MutablePageRef ref{reinterpret_cast<uint8_t*>(&out[i * ns.page_bytes()]),
                       i * Geo().page_size};
    REQUIRE(
        codec
            .Decode(absl::MakeConstSpan(
                        reinterpret_cast<const uint8_t*>(b.data()), b.size()),
                    absl::MakeConstSpan(&ref, 1), nullptr)
            .ok());
  }
  return out;
}

inline std::vector<fs::path> PageFiles(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

inline void FlipByte(const fs::path& p, size_t from_end) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const auto size = static_cast<size_t>(f.tellg());
  f.seekg(size - from_end);
  char c;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(size - from_end);
  f.write(&c, 1);
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_CORE_STORE_TIERS_TEST_UTIL_H_
