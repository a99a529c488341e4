// Insert's eviction fallback in a tiered namespace (docs/reliability.md,
// issue 10): when demotion cannot make room for a reservation, the fallback
// may only remove raw pages, since dropping a host-compressed or disk page
// frees no raw slot. Cold pages leave only by their own tier's budget.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/index/radix_index.h"
#include "core/store/namespace.h"
#include "tests/core/store/tiers_test_util.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

using namespace testing;  // NOLINT: the tier test helpers

TEST_CASE("radix index: EvictIf takes only what the predicate allows") {
  RadixIndex idx(1);
  REQUIRE(idx.Insert({1, 2, 3}, {1, 2, 3}).ok());
  REQUIRE(idx.Insert({1, 2, 3, 4}, {0, 0, 0, 4}).ok());  // oldest leaf: [4]
  REQUIRE(idx.SetTier(4, Tier::kHostCompressed).ok());
  REQUIRE(idx.Insert({30, 31, 32}, {30, 31, 32}).ok());
  REQUIRE(idx.Insert({10, 11}, {10, 11}).ok());
  REQUIRE(idx.Insert({20}, {20}).ok());  // newest leaf
  const auto raw_not_31 = [](PageHandle h, Tier t) {
    return t == Tier::kRaw && h != 31;
  };
  std::vector<PageHandle> out;
  // [4] is cold: kept. [30 31 32] gives its tail up to 31. Then [10 11] and
  // [20], LRU first and tail first; [1 2 3] is no leaf (it has [4]).
  CHECK(idx.EvictIf(100, raw_not_31, &out) == 4);
  CHECK(out == std::vector<PageHandle>{32, 11, 10, 20});
  REQUIRE(idx.CheckInvariants().ok());
  CHECK(idx.total_pages() == 6);
  CHECK(idx.tier_pages(Tier::kHostCompressed) == 1);
  // Nothing more passes; the leaves set aside are back in the LRU order.
  out.clear();
  CHECK(idx.EvictIf(100, raw_not_31, &out) == 0);
  CHECK(idx.Evict(1, &out) == 1);
  CHECK(out == std::vector<PageHandle>{4});
  // Only as many as asked, from the tail.
  out.clear();
  CHECK(idx.EvictIf(2, raw_not_31, &out) == 2);
  CHECK(out == std::vector<PageHandle>{3, 2});
  REQUIRE(idx.CheckInvariants().ok());
}

// Cold prompts placed before the pressure starts, with their bytes.
struct ColdChain {
  std::vector<Token> tokens;
  std::string bytes;
  Tier tier;
};

// Every chain is still cached whole, in its tier, byte-exact.
void CheckColdChains(Namespace& ns, const std::vector<ColdChain>& chains) {
  for (const ColdChain& c : chains) {
    auto m = ns.Match(c.tokens, false, absl::ZeroDuration());
    REQUIRE(m.ok());
    CHECK(m->matched_tokens == c.tokens.size());
    CHECK(m->tiers == std::vector<Tier>(m->pages.size(), c.tier));
    if (m->matched_tokens == 0) continue;
    CHECK(Fetch(ns, c.tokens, FetchFormat::kRaw) ==
          c.bytes.substr(0, m->pages.size() * ns.page_bytes()));
  }
}

// No slot leaked: every slot is free or holds a raw page, none reserved.
void CheckNoSlotLeaked(Namespace& ns) {
  REQUIRE(ns.CheckInvariants().ok());
  const NamespaceStats k = ns.Counters();
  CHECK(k.uploads_in_flight == 0);
  CHECK(k.free_pages + k.tiers[0].pages == k.capacity_pages);
}

// Two chains on disk and two in the host-compressed tier (budgets large
// enough that neither tier ever drops a page by itself).
std::vector<ColdChain> PlaceColdChains(Namespace& ns) {
  std::vector<ColdChain> chains;
  for (int i = 0; i < 4; ++i) {
    const Tier tier = i < 2 ? Tier::kDisk : Tier::kHostCompressed;
    chains.push_back(
        ColdChain{Seq(100000 * (i + 1), 8), Pages(2, 40 + i), tier});
    Insert(ns, chains.back().tokens, chains.back().bytes);
    if (i == 1 || i == 3) REQUIRE(ns.tiers().DemoteAll(tier).ok());
  }
  REQUIRE(ns.Counters().tiers[0].pages == 0);
  return chains;
}

TEST_CASE(
    "tier eviction: an insert finding every raw slot taken drops no cold "
    "page") {
  TempDir dir;
  auto ns = Make(Config(64 << 20, dir.path), 4);
  const std::vector<ColdChain> chains = PlaceColdChains(*ns);
  // Every raw slot taken: a leased page, a page pinned by a read, and two
  // uploads in flight.
  Insert(*ns, Seq(1, 4), Pages(1, 50));
  auto lease = ns->Match(Seq(1, 4), true, absl::ZeroDuration());
  REQUIRE(lease.ok());
  Insert(*ns, Seq(11, 4), Pages(1, 51));
  auto read_match = ns->Match(Seq(11, 4), false, absl::ZeroDuration());
  REQUIRE(read_match.ok());
  auto read = ns->PinPages(read_match->pages);
  REQUIRE(read.ok());
  auto up1 = ns->BeginInsert(Seq(21, 4), {});
  REQUIRE(up1.ok());
  auto up2 = ns->BeginInsert(Seq(31, 4), {});
  REQUIRE(up2.ok());

  for (int attempt = 0; attempt < 3; ++attempt) {  // repeated pressure
    auto refused = ns->BeginInsert(Seq(41, 8), {});
    REQUIRE(!refused.ok());
    CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
    const std::string msg(refused.status().message());
    INFO(msg);
    CHECK(msg.find("namespace 't'") != std::string::npos);
    CHECK(msg.find("2 are reserved by uploads in progress") !=
          std::string::npos);
    CHECK(msg.find("1 locked by leases") != std::string::npos);
    CHECK(msg.find("1 pinned by reads") != std::string::npos);
  }
  REQUIRE(ns->CheckInvariants().ok());
  CheckColdChains(*ns, chains);
  CHECK(ns->Counters().evicted_pages == 0);

  // Once the room is given back, the insert goes through by demotion.
  const std::string up_bytes = Pages(1, 52);
  REQUIRE((*up1)->Write(0, up_bytes).ok());
  REQUIRE((*up1)->Commit().ok());
  up2->reset();  // aborted: its slot is free again
  *read = Namespace::PinnedPages();
  REQUIRE(ns->Release(lease->lease_id).ok());
  const std::string more = Pages(2, 53);
  Insert(*ns, Seq(41, 8), more);
  CHECK(Fetch(*ns, Seq(41, 8), FetchFormat::kRaw) == more);
  CHECK(Fetch(*ns, Seq(21, 4), FetchFormat::kRaw) == up_bytes);
  CheckColdChains(*ns, chains);
  CHECK(ns->Counters().evicted_pages == 0);
  CheckNoSlotLeaked(*ns);
}

// Pages of writer `w`'s prompt `i`: new token ids each time, so every
// upload needs fresh slots and the writers outrun demotion together.
std::vector<Token> WriterPrompt(int w, int i, int pages) {
  return Seq(10000000 * (w + 1) + 1000 * i, pages * Geo().page_size);
}

TEST_CASE(
    "tier eviction: concurrent uploads outrunning demotion keep every cold "
    "page") {
  TempDir dir;
  NamespaceConfig config = Config(64 << 20, dir.path);
  config.tier_batch_pages = 1;  // slow demotion: one page per move
  auto ns = Make(std::move(config), 6);
  const std::vector<ColdChain> chains = PlaceColdChains(*ns);
  constexpr int kWriters = 4, kUploads = 150;
  std::atomic<int> committed{0}, exhausted{0}, other_errors{0};
  std::vector<std::string> first_error(kWriters);
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; i < kUploads; ++i) {
        const int pages = 1 + (i + w) % 3;
        auto up = ns->BeginInsert(WriterPrompt(w, i, pages), {});
        absl::Status s = up.status();
        // The bytes arrive a little later, as over a network: reservations
        // of several writers overlap.
        if (s.ok()) std::this_thread::sleep_for(std::chrono::microseconds(200));
        if (s.ok()) s = (*up)->Write(0, Pages(pages, 1000 * w + i));
        if (s.ok()) s = (*up)->Commit().status();
        if (s.ok()) {
          ++committed;
        } else if (s.code() == absl::StatusCode::kResourceExhausted) {
          ++exhausted;
        } else if (other_errors++ == 0) {
          first_error[w] = s.ToString();
        }
      }
    });
  }
  for (std::thread& t : writers) t.join();
  for (const std::string& e : first_error) INFO(e);
  CHECK(other_errors == 0);
  INFO("committed " << committed << ", refused " << exhausted << ", evicted "
                    << ns->Counters().evicted_pages);
  CHECK(committed > 0);
  CheckColdChains(*ns, chains);
  // The writers' own pages: whatever is still cached is byte-exact.
  for (int w = 0; w < kWriters; ++w) {
    for (int i = kUploads - 3; i < kUploads; ++i) {
      const int pages = 1 + (i + w) % 3;
      const std::vector<Token> t = WriterPrompt(w, i, pages);
      auto m = ns->Match(t, false, absl::ZeroDuration());
      REQUIRE(m.ok());
      if (m->pages.empty()) continue;  // refused, or evicted since
      CHECK(Fetch(*ns, t, FetchFormat::kRaw) ==
            Pages(pages, 1000 * w + i)
                .substr(0, m->pages.size() * ns->page_bytes()));
    }
  }
  CheckNoSlotLeaked(*ns);
}

}  // namespace
}  // namespace kvharbor
