// Fetching into and inserting from an engine's paged KV cache in host
// memory (include/kvharbor/layout_fetch.h, the "cpu" path) against a daemon:
// pages land exactly where the element mapping says in vLLM, SGLang (both) and
// HF layouts, layer ranges included (a RAW fetch of some layers moves only
// those), through the RAW and the COMPRESSED stream; an insert from a layout
// stores what the gather makes; bad input is refused naming the field, with
// nothing written.
#include "kvharbor/layout_fetch.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/memory/paged_kv_copy.h"
#include "kvharbor/client.h"
#include "tests/client/client_test_util.h"
#include "tests/kv_layout_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

constexpr uint32_t kPageSize = 4;

client::NamespaceSpec LayoutSpec(const std::string& name) {
  return MakeSpec(name, 4, 2, 8, kPageSize, client::DType::kBF16, 1 << 20);
}

void CheckMapped(const Geometry& g, const PagedKvLayout& l,
                 const std::vector<uint8_t>& pages, uint64_t pb,
                 const std::vector<int64_t>& blocks, size_t first_page) {
  size_t wrong = 0;
  ForEachMappedByte(g, l, blocks.size(), blocks,
                    [&](size_t page, uint64_t byte, uint64_t address) {
                      if (*reinterpret_cast<const uint8_t*>(address) !=
                          pages[(first_page + page) * pb + byte]) {
                        ++wrong;
                      }
                    });
  CHECK(wrong == 0);
}

TEST_CASE("fetch into host layouts puts every byte where it belongs",
          "[client][layout]") {
  auto d = StartTestDaemon();
  auto c = Connect(*d);
  const client::NamespaceSpec spec = LayoutSpec("l");
  const uint64_t pb = CreateNs(*c, spec);
  const Geometry g = spec.geometry.Resolved();
  const auto tokens = TokenRange(6 * kPageSize, 10);
  const auto pages = RandomBytes(6 * pb, 5);
  REQUIRE(c->Insert("l", tokens, pages, pb).ok());
  absl::StatusOr<client::Lease> lease = c->Match("l", tokens, true);
  REQUIRE(lease.ok());
  for (EngineLayout e : AllEngineLayouts()) {
    for (auto [begin, n] : {std::pair<uint32_t, uint32_t>{0, 4}, {2, 2}}) {
      for (bool compressed : {false, true}) {
        INFO(EngineLayoutName(e) << " layers [" << begin << ", " << begin + n
                                 << ") compressed " << compressed);
        HostAllocs allocs;
        const PagedKvLayout l =
            MakeEngineLayout(e, g, begin, n, 8, allocs.alloc());
        const std::vector<int64_t> blocks = {7, 2, 5, 0};
        client::LayoutFetchOptions o;
        o.start_page = 1;
        if (compressed) o.format = client::FetchFormat::kCompressed;
        absl::StatusOr<client::TransferResult> r =
            client::FetchToHostLayout(*c, "l", lease->id, l, blocks, o);
        INFO(r.status().ToString());
        REQUIRE(r.ok());
        CHECK(r->path == "cpu");
        CHECK(r->pages == 4);
        CHECK(r->stages.size() == 3);
        // A RAW fetch of some layers moves only those (a layer-range
        // fetch); COMPRESSED codec buffers hold every layer.
        CHECK(r->bytes_moved == 4 * (compressed ? pb : pb / 4 * n));
        CheckMapped(g, l, pages, pb, blocks, 1);
      }
    }
  }
}

TEST_CASE("insert from a host layout stores the gathered pages",
          "[client][layout]") {
  auto d = StartTestDaemon();
  auto c = Connect(*d);
  const client::NamespaceSpec spec = LayoutSpec("i");
  const uint64_t pb = CreateNs(*c, spec);
  const Geometry g = spec.geometry.Resolved();
  HostAllocs allocs;
  const PagedKvLayout l = MakeEngineLayout(EngineLayout::kSglangPageFirst, g, 0,
                                           4, 6, allocs.alloc());
  for (auto& b : allocs.buffers) {  // in place: the layout holds addresses
    const auto r = RandomBytes(b.size(), b.size());
    std::copy(r.begin(), r.end(), b.begin());
  }
  const std::vector<int64_t> blocks = {4, 1, 3};
  const auto tokens = TokenRange(3 * kPageSize, 50);
  auto r = client::InsertFromHostLayout(*c, "i", tokens, l, blocks);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->first.pages_stored == 3);
  CHECK(r->second.path == "cpu");
  std::vector<std::vector<uint8_t>> want(3, std::vector<uint8_t>(pb));
  std::vector<uint8_t*> dst = {want[0].data(), want[1].data(), want[2].data()};
  REQUIRE(GatherLayoutToPages(g, l, blocks, dst).ok());
  absl::StatusOr<client::Lease> lease = c->Match("i", tokens, true);
  REQUIRE(lease.ok());
  auto got = c->Fetch("i", client::FetchSource::FromLease(lease->id));
  REQUIRE(got.ok());
  CHECK(*got == want);
}

TEST_CASE("fetch into and insert from host layouts: bad input",
          "[client][layout]") {
  auto d = StartTestDaemon();
  auto c = Connect(*d);
  const client::NamespaceSpec spec = LayoutSpec("b");
  const uint64_t pb = CreateNs(*c, spec);
  const Geometry g = spec.geometry.Resolved();
  const auto tokens = TokenRange(2 * kPageSize, 10);
  REQUIRE(c->Insert("b", tokens, RandomBytes(2 * pb, 1), pb).ok());
  absl::StatusOr<client::Lease> lease = c->Match("b", tokens, true);
  REQUIRE(lease.ok());
  HostAllocs allocs;
  const PagedKvLayout good =
      MakeEngineLayout(EngineLayout::kVllm, g, 0, 4, 4, allocs.alloc());
  auto untouched = [&] {
    for (const auto& buf : allocs.buffers) {
      for (uint8_t b : buf) {
        if (b != 0xA5) return false;
      }
    }
    return true;
  };
  auto expect = [&](const absl::Status& s, absl::StatusCode code,
                    const std::string& field) {
    INFO(s.ToString());
    CHECK(s.code() == code);
    CHECK(absl::StartsWith(s.message(), field));
    CHECK(untouched());
  };
  const auto inv = absl::StatusCode::kInvalidArgument;
  expect(client::FetchToHostLayout(*c, "b", 0, good, {0, 1}).status(), inv,
         "lease_id");
  expect(client::FetchToHostLayout(*c, "b", lease->id, good, {0, 4}).status(),
         inv, "block_ids[1]");
  expect(client::FetchToHostLayout(*c, "b", lease->id, good, {1, 1}).status(),
         inv, "block_ids[1]");
  PagedKvLayout l = good;
  l.head_dim = 16;
  expect(client::FetchToHostLayout(*c, "b", lease->id, l, {0, 1}).status(), inv,
         "layout.head_dim");
  l = good;
  l.device = 0;
  expect(client::FetchToHostLayout(*c, "b", lease->id, l, {0, 1}).status(), inv,
         "layout.device");
  expect(
      client::FetchToHostLayout(*c, "nope", lease->id, good, {0, 1}).status(),
      absl::StatusCode::kNotFound, "");
  l = good;
  l.k.pop_back();
  l.v.pop_back();
  l.k_bytes.pop_back();
  l.v_bytes.pop_back();
  expect(client::InsertFromHostLayout(*c, "b", tokens, l, {0, 1}).status(), inv,
         "layout.num_layers");
  expect(client::InsertFromHostLayout(*c, "b", TokenRange(5, 1), good, {0})
             .status(),
         inv, "tokens");
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
