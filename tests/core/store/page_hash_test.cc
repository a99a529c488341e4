// Tests of page-hash namespaces (KeyKind::kPageHashes, issue 32 item 3):
// each page is stored and found by its own key alone, so pages inserted in
// batches without their prefix, or matched from the middle of a chain, are
// found; a Match stops at the first missing key; evicting a middle page
// shortens the match and nothing else; leases, dedup, skip_pages, LRU
// eviction, tiers and a disk warm restart work per page.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/index/page_key.h"
#include "core/store/namespace.h"
#include "tests/core/store/tiers_test_util.h"
#include "types/layer_range.h"

namespace kvharbor {
namespace testing {
namespace {

// Elements of page keys "h<first>" .. "h<first + n - 1>".
std::vector<Token> Hashes(int first, int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back("h" + std::to_string(first + i));
  std::vector<Token> out;
  REQUIRE(EncodePageKeys(keys, "page_keys", &out).ok());
  return out;
}

std::vector<Token> Concat(std::vector<Token> a, const std::vector<Token>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

NamespaceConfig HashConfig(uint64_t host_budget = 0, std::string disk = "") {
  NamespaceConfig c = Config(host_budget, std::move(disk));
  c.key_kind = KeyKind::kPageHashes;
  return c;
}

size_t Matched(Namespace& ns, const std::vector<Token>& keys) {
  auto m = ns.Match(keys, false, absl::ZeroDuration());
  REQUIRE(m.ok());
  return m->pages.size();
}

// Bytes of pages [first, first + n) of `all` (pages numbered from 1).
std::string Slice(const std::string& all, int first, int n) {
  const size_t pb = Geo().PageBytes();
  return all.substr((first - 1) * pb, n * pb);
}

absl::StatusOr<Namespace::InsertOutcome> Upload(Namespace& ns,
                                                Namespace::InsertSpec spec,
                                                const std::string& sent) {
  auto up = ns.BeginInsert(spec);
  if (!up.ok()) return up.status();
  REQUIRE((*up)->total_bytes() == sent.size());
  absl::Status s = (*up)->Write(0, sent);
  if (!s.ok()) return s;
  return (*up)->Commit();
}

TEST_CASE("Page hashes: batches without their prefix are found") {
  auto ns = Make(HashConfig(), 256);
  const std::string bytes = Pages(200, 7);
  // Pages 1..128, then 129..200 in a second call that names no prefix.
  Insert(*ns, Hashes(1, 128), Slice(bytes, 1, 128));
  Insert(*ns, Hashes(129, 72), Slice(bytes, 129, 72));
  CHECK(ns->Counters().cached_pages == 200);
  CHECK(Matched(*ns, Hashes(1, 200)) == 200);
  CHECK(Fetch(*ns, Hashes(1, 200), FetchFormat::kRaw) == bytes);
  // Pages stored by another call match without their predecessors.
  CHECK(Matched(*ns, Hashes(129, 72)) == 72);
  CHECK(Fetch(*ns, Hashes(150, 51), FetchFormat::kRaw) ==
        Slice(bytes, 150, 51));
  // A match stops at the first missing key.
  CHECK(Matched(*ns, Concat(Concat(Hashes(1, 10), Hashes(999, 1)),
                            Hashes(11, 50))) == 10);
  CHECK(Matched(*ns, Concat(Hashes(999, 1), Hashes(1, 5))) == 0);
  auto past = ns->Match(Hashes(195, 10), false, absl::ZeroDuration());
  REQUIRE(past.ok());
  CHECK(past->matched_tokens == 6 * Geo().page_size);
  // Evicting a middle page shortens the match that needs it, and only that.
  auto m = ns->Match(Hashes(100, 1), false, absl::ZeroDuration());
  REQUIRE(m.ok());
  REQUIRE(ns->EvictPages(m->pages).ok());
  CHECK(ns->Counters().cached_pages == 199);
  CHECK(Matched(*ns, Hashes(1, 200)) == 99);
  CHECK(Matched(*ns, Hashes(101, 100)) == 100);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("Page hashes: present pages are deduplicated wherever they are") {
  auto ns = Make(HashConfig(), 64);
  const std::string bytes = Pages(10, 3);
  const std::string other = Pages(10, 4);
  Insert(*ns, Hashes(1, 5), Slice(bytes, 1, 5));
  // Present, new, present, new: both present pages keep their bytes.
  const std::vector<Token> mixed = Concat(Concat(Hashes(1, 1), Hashes(20, 1)),
                                          Concat(Hashes(3, 1), Hashes(21, 1)));
  Namespace::InsertSpec spec;
  spec.elements = mixed;
  auto r = Upload(*ns, spec, Slice(other, 1, 4));
  REQUIRE(r.ok());
  CHECK(r->already_present_tokens == 2 * Geo().page_size);
  CHECK(r->pages_stored == 2);
  CHECK(Fetch(*ns, Hashes(1, 5), FetchFormat::kRaw) == Slice(bytes, 1, 5));
  CHECK(Fetch(*ns, Hashes(20, 2), FetchFormat::kRaw) ==
        Slice(other, 2, 1) + Slice(other, 4, 1));
  // The same key twice in one call: stored once.
  const std::vector<Token> twice = Concat(Hashes(30, 1), Hashes(30, 1));
  spec.elements = twice;
  r = Upload(*ns, spec, Slice(other, 5, 2));
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 1);
  const NamespaceStats c = ns->Counters();
  CHECK(c.cached_pages == 8);
  CHECK(c.dedup_pages == 3);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("Page hashes: a full namespace takes back one missing page") {
  // Every page present but one: only that one needs a slot, so nothing is
  // evicted for the bytes of the others.
  auto ns = Make(HashConfig(), 8);
  const std::string bytes = Pages(8, 11);
  Insert(*ns, Hashes(1, 8), bytes);
  auto m = ns->Match(Hashes(4, 1), false, absl::ZeroDuration());
  REQUIRE(m.ok());
  REQUIRE(ns->EvictPages(m->pages).ok());
  Namespace::InsertSpec spec;
  const std::vector<Token> all = Hashes(1, 8);
  spec.elements = all;
  auto r = Upload(*ns, spec, bytes);
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 1);
  CHECK(r->pages_evicted == 0);
  CHECK(r->already_present_tokens == 7 * Geo().page_size);
  CHECK(Fetch(*ns, all, FetchFormat::kRaw) == bytes);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("Page hashes: layer by layer and by several threads, with holes") {
  // Present pages between absent ones: their bytes arrive (layer by layer,
  // or in whole pages copied by threads) and are dropped; the absent ones
  // land in their slots.
  const bool layer_major = GENERATE(false, true);
  auto ns = Make(HashConfig(), 32);
  const size_t pb = ns->page_bytes();
  const std::string stored = Pages(6, 12);
  const std::string sent = Pages(6, 13);
  Insert(*ns, Hashes(2, 1), Slice(stored, 2, 1));
  Insert(*ns, Hashes(5, 1), Slice(stored, 5, 1));
  const std::vector<Token> seq = Hashes(1, 6);
  Namespace::InsertSpec spec;
  spec.elements = seq;
  spec.layer_major = layer_major;
  auto up = ns->BeginInsert(spec);
  REQUIRE(up.ok());
  std::string stream = sent;
  if (layer_major) {
    const Geometry& g = Geo();
    const uint64_t kvb = KvLayerBytes(g);
    stream.clear();
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      for (size_t p = 0; p < 6; ++p) {
        for (int kv = 0; kv < 2; ++kv) {
          stream.append(sent, p * pb + KvLayerOffset(g, l, kv), kvb);
        }
      }
    }
  }
  REQUIRE(stream.size() == (*up)->total_bytes());
  REQUIRE((*up)->Write(0, stream, /*threads=*/3).ok());
  auto r = (*up)->Commit();
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 4);
  CHECK(Fetch(*ns, seq, FetchFormat::kRaw) ==
        Slice(sent, 1, 1) + Slice(stored, 2, 1) + Slice(sent, 3, 2) +
            Slice(stored, 5, 1) + Slice(sent, 6, 1));
  CHECK(ns->Counters().free_pages == 32 - 6);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("Page hashes: skip_pages needs each skipped page cached") {
  auto ns = Make(HashConfig(), 64);
  const std::string bytes = Pages(8, 5);
  Insert(*ns, Hashes(1, 2), Slice(bytes, 1, 2));
  Insert(*ns, Hashes(4, 1), Slice(bytes, 4, 1));
  Namespace::InsertSpec spec;
  const std::vector<Token> seq = Hashes(1, 6);
  spec.elements = seq;
  spec.skip_pages = 4;  // page 3 is not cached
  auto r = Upload(*ns, spec, Slice(bytes, 5, 2));
  REQUIRE(absl::IsFailedPrecondition(r.status()));
  CHECK(absl::StartsWith(r.status().message(), "skip_pages:"));
  CHECK(ns->Counters().cached_pages == 3);
  spec.skip_pages = 2;  // pages 3..6 sent; 4 deduplicated
  r = Upload(*ns, spec, Slice(bytes, 3, 4));
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 3);
  CHECK(r->already_present_tokens == 3 * Geo().page_size);
  CHECK(Fetch(*ns, seq, FetchFormat::kRaw) == Slice(bytes, 1, 6));
  // A prefix lease: its pages must lead the list.
  auto lease = ns->Match(Hashes(2, 2), true, absl::Seconds(5));
  REQUIRE(lease.ok());
  spec = Namespace::InsertSpec();
  spec.elements = seq;
  spec.prefix_lease_id = lease->lease_id;
  r = Upload(*ns, spec, "");
  REQUIRE(absl::IsFailedPrecondition(r.status()));
  CHECK(absl::StartsWith(r.status().message(), "prefix_lease_id:"));
  const std::vector<Token> from2 = Hashes(2, 5);
  spec.elements = from2;
  r = Upload(*ns, spec, Slice(bytes, 4, 3));
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 0);
  REQUIRE(ns->Release(lease->lease_id).ok());
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("Page hashes: leases keep their pages, LRU evicts single pages") {
  auto ns = Make(HashConfig(), 8);
  const std::string bytes = Pages(12, 6);
  Insert(*ns, Hashes(1, 8), Slice(bytes, 1, 8));
  // A lease on pages 3..5 (none of them a prefix of the others).
  auto lease = ns->Match(Hashes(3, 3), true, absl::Seconds(5));
  REQUIRE(lease.ok());
  REQUIRE(lease->lease_id != 0);
  CHECK(absl::IsFailedPrecondition(
      ns->EvictPages(absl::MakeConstSpan(lease->pages).subspan(1, 1))
          .status()));
  // Touch page 1: pages 2, 6, 7 are now the least recently used unleased.
  CHECK(Matched(*ns, Hashes(1, 1)) == 1);
  Insert(*ns, Hashes(9, 3), Slice(bytes, 9, 3));
  CHECK(Matched(*ns, Hashes(1, 1)) == 1);
  CHECK(Matched(*ns, Hashes(2, 1)) == 0);
  CHECK(Matched(*ns, Hashes(3, 3)) == 3);
  CHECK(Matched(*ns, Hashes(6, 2)) == 0);
  CHECK(Matched(*ns, Hashes(8, 4)) == 4);
  ns->EvictAll();
  CHECK(ns->Counters().cached_pages == 3);  // the leased ones
  auto pinned = ns->PinLease(lease->lease_id, 0, 0);
  REQUIRE(pinned.ok());
  CHECK(pinned->size() == 3);
  REQUIRE(ns->Release(lease->lease_id).ok());
  ns->EvictAll();
  CHECK(ns->Counters().cached_pages == 0);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("Page hashes: cold pages stay cold; a warm restart finds them") {
  TempDir dir;
  const std::string bytes = Pages(6, 8);
  {
    auto ns = Make(HashConfig(64 << 10, dir.path), 16);
    Insert(*ns, Hashes(1, 3), Slice(bytes, 1, 3));
    REQUIRE(ns->tiers().DemoteAll(Tier::kDisk).ok());
    // New pages after cold ones: the cold pages are deduplicated and stay
    // on disk (no page extends another).
    Insert(*ns, Hashes(1, 6), bytes);
    std::vector<Tier> tiers;
    CHECK(Fetch(*ns, Hashes(1, 6), FetchFormat::kRaw, &tiers) == bytes);
    CHECK(tiers == std::vector<Tier>{Tier::kDisk, Tier::kDisk, Tier::kDisk,
                                     Tier::kRaw, Tier::kRaw, Tier::kRaw});
    REQUIRE(ns->CheckInvariants().ok());
    REQUIRE(ns->tiers().DemoteAll(Tier::kDisk).ok());
  }
  auto again = Make(HashConfig(64 << 10, dir.path), 16);
  CHECK(again->Counters().cached_pages == 6);
  CHECK(Matched(*again, Hashes(4, 3)) == 3);
  CHECK(Fetch(*again, Hashes(1, 6), FetchFormat::kRaw) == bytes);
  REQUIRE(again->CheckInvariants().ok());
}

TEST_CASE("Page keys and hashes: binary keys go to disk and come back") {
  // Keys with high bytes encode to negative index words (SHA-256 digests,
  // vLLM's block hashes): the disk tier serves and restores them.
  const KeyKind kind = GENERATE(KeyKind::kPageKeys, KeyKind::kPageHashes);
  TempDir dir;
  std::vector<std::string> keys;
  for (int i = 0; i < 4; ++i) keys.push_back(std::string(32, '\xf0') + "");
  for (int i = 0; i < 4; ++i) keys[i][31] = static_cast<char>(0x80 + i);
  std::vector<Token> seq;
  REQUIRE(EncodePageKeys(keys, "page_keys", &seq).ok());
  REQUIRE(*std::min_element(seq.begin(), seq.end()) < 0);
  NamespaceConfig c = HashConfig(64 << 10, dir.path);
  c.key_kind = kind;
  const std::string bytes = Pages(4, 14);
  {
    auto ns = Make(c, 16);
    Insert(*ns, seq, bytes);
    REQUIRE(ns->tiers().DemoteAll(Tier::kDisk).ok());
    CHECK(Fetch(*ns, seq, FetchFormat::kRaw) == bytes);
  }
  auto again = Make(c, 16);
  CHECK(again->Counters().cached_pages == 4);
  CHECK(again->Counters().corrupt_dropped == 0);
  CHECK(Fetch(*again, seq, FetchFormat::kRaw) == bytes);
  REQUIRE(again->CheckInvariants().ok());
}

TEST_CASE("Page hashes: a stopped Match changes nothing") {
  auto ns = Make(HashConfig(), 8192);
  Insert(*ns, Hashes(0, 5000), Pages(5000, 9));
  int polls = 0;
  auto m = ns->Match(Hashes(0, 5000), true, absl::Seconds(5), [&polls] {
    ++polls;
    return absl::DeadlineExceededError("Match: the call's deadline passed");
  });
  CHECK(absl::IsDeadlineExceeded(m.status()));
  CHECK(polls == 1);
  CHECK(ns->Counters().active_leases == 0);
  CHECK(ns->Counters().hit_tokens == 0);
  REQUIRE(ns->CheckInvariants().ok());
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
