// Tests of the namespace's engine paths (docs/engines_api.md): page-key
// namespaces (the namespace-level semantics: dedup, leases, LRU eviction,
// tiers with a disk warm restart), appends that skip a cached prefix
// (checked at BeginInsert, locked until commit, cold skipped pages restored
// from their stored copy, prefix leases) and layer-major uploads (both page
// layouts; checksums per page; aborts leave nothing).
#include <xxh3.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/codec/fp8/fp8_codec.h"
#include "core/index/page_key.h"
#include "core/store/namespace.h"
#include "tests/core/store/tiers_test_util.h"
#include "types/layer_range.h"

namespace kvharbor {
namespace testing {
namespace {

// Elements of `n` page keys "k<first>", "k<first+1>", ...
std::vector<Token> Keys(int first, int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back("k" + std::to_string(first + i));
  std::vector<Token> out;
  REQUIRE(EncodePageKeys(keys, "page_keys", &out).ok());
  return out;
}

std::vector<Token> Concat(std::vector<Token> a, const std::vector<Token>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

NamespaceConfig KeyConfig(uint64_t host_budget = 0, std::string disk = "") {
  NamespaceConfig c = Config(host_budget, std::move(disk));
  c.key_kind = KeyKind::kPageKeys;
  return c;
}

std::string Page(const std::string& all, size_t i) {
  const size_t pb = Geo().PageBytes();
  return all.substr(i * pb, pb);
}

// Uploads pages [skip, n) of `bytes` (all n pages) with InsertSpec `spec`.
absl::StatusOr<Namespace::InsertOutcome> Append(Namespace& ns,
                                                Namespace::InsertSpec spec,
                                                const std::string& bytes) {
  auto up = ns.BeginInsert(spec);
  if (!up.ok()) return up.status();
  const size_t pb = ns.page_bytes();
  const std::string sent =
      bytes.substr((*up)->num_pages() * pb - (*up)->total_bytes());
  for (size_t off = 0; off < sent.size(); off += 1000) {
    absl::Status s =
        (*up)->Write(off, absl::string_view(sent).substr(off, 1000));
    if (!s.ok()) return s;
  }
  return (*up)->Commit();
}

TEST_CASE("Namespace: a page-key namespace matches, dedups and evicts") {
  auto ns = Make(KeyConfig(), 8);
  CHECK(ns->elements_per_page() == kPageKeyWords);
  const std::string bytes = Pages(6, 1);
  Insert(*ns, Keys(0, 4), bytes.substr(0, 4 * Geo().PageBytes()));
  // A branch after two keys: two pages deduplicated.
  const std::vector<Token> branch = Concat(Keys(0, 2), Keys(100, 2));
  Namespace::InsertSpec spec;
  spec.elements = branch;
  auto r = Append(*ns, spec,
                  bytes.substr(0, 2 * Geo().PageBytes()) +
                      bytes.substr(4 * Geo().PageBytes()));
  REQUIRE(r.ok());
  CHECK(r->already_present_tokens == 2 * Geo().page_size);
  CHECK(r->pages_stored == 2);
  auto m = ns->Match(Concat(Keys(0, 3), Keys(7, 1)), true, absl::Seconds(5));
  REQUIRE(m.ok());
  CHECK(m->pages.size() == 3);
  CHECK(m->matched_tokens == 3 * Geo().page_size);  // tokens, not elements
  CHECK(Fetch(*ns, Keys(0, 3), FetchFormat::kRaw) ==
        bytes.substr(0, 3 * Geo().PageBytes()));
  // The leased prefix survives evicting everything else.
  ns->EvictAll();
  CHECK(ns->Counters().cached_pages == 3);
  REQUIRE(ns->Release(m->lease_id).ok());
  const NamespaceStats c = ns->Counters();
  // Counted in tokens: the leased match and Fetch's match, 3 pages each.
  CHECK(c.hit_tokens == 6 * Geo().page_size);
  CHECK(c.miss_tokens == Geo().page_size);
  CHECK(ns->DumpTree(10).find(std::string("6b30")) != std::string::npos);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("Namespace: page-key inputs are checked") {
  auto ns = Make(KeyConfig(), 4);
  std::vector<Token> ragged = Keys(0, 2);
  ragged.pop_back();
  auto m = ns->Match(ragged, false, absl::ZeroDuration());
  CHECK(absl::IsInvalidArgument(m.status()));
  CHECK(m.status().message().substr(0, 10) == "page_keys:");
  auto up = ns->BeginInsert(std::vector<Token>(), {});
  CHECK(up.status().message().substr(0, 10) == "page_keys:");
  // Over the request limit, counted as page_size tokens per key.
  NamespaceConfig small = KeyConfig();
  small.max_tokens_per_request = 3 * Geo().page_size;
  auto limited = Make(small, 8);
  CHECK(absl::IsInvalidArgument(
      limited->Match(Keys(0, 4), false, absl::ZeroDuration()).status()));
  CHECK(limited->Match(Keys(0, 3), false, absl::ZeroDuration()).ok());
}

TEST_CASE("Namespace: page-key pages go cold, to disk and come back") {
  TempDir dir;
  const std::string bytes = Pages(4, 2);
  {
    auto ns = Make(KeyConfig(64 << 10, dir.path), 8);
    Insert(*ns, Keys(0, 4), bytes);
    REQUIRE(ns->tiers().DemoteAll(Tier::kDisk).ok());
    std::vector<Tier> tiers;
    CHECK(Fetch(*ns, Keys(0, 4), FetchFormat::kRaw, &tiers) == bytes);
    CHECK(tiers == std::vector<Tier>(4, Tier::kDisk));
  }
  // Warm restart: the persisted prefixes are page keys.
  auto again = Make(KeyConfig(64 << 10, dir.path), 8);
  CHECK(again->Counters().cached_pages == 4);
  CHECK(Fetch(*again, Keys(0, 4), FetchFormat::kRaw) == bytes);
  REQUIRE(again->CheckInvariants().ok());
}

TEST_CASE("Namespace: an append sends only the new pages") {
  const bool keys = GENERATE(false, true);
  INFO((keys ? "page keys" : "tokens"));
  auto ns = Make(keys ? KeyConfig() : Config(0), 8);
  const std::vector<Token> seq = keys ? Keys(0, 6) : Seq(0, 24);
  const size_t epp = ns->elements_per_page();
  const std::string bytes = Pages(6, 3);
  Insert(*ns, std::vector<Token>(seq.begin(), seq.begin() + 4 * epp),
         bytes.substr(0, 4 * Geo().PageBytes()));
  const uint64_t in_before = ns->Counters().bytes_in;
  Namespace::InsertSpec spec;
  spec.elements = seq;
  spec.skip_pages = 4;
  std::vector<uint64_t> sums;
  for (int i = 4; i < 6; ++i) {
    const std::string p = Page(bytes, i);
    sums.push_back(XXH3_64bits(p.data(), p.size()));
  }
  spec.checksums = sums;  // one per sent page
  auto r = Append(*ns, spec, bytes);
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 2);
  CHECK(r->already_present_tokens == 4 * Geo().page_size);
  CHECK(ns->Counters().bytes_in - in_before == 2 * Geo().PageBytes());
  CHECK(Fetch(*ns, seq, FetchFormat::kRaw) == bytes);
  // Everything skipped: nothing sent, nothing stored.
  spec.skip_pages = 6;
  spec.checksums = {};
  auto none = Append(*ns, spec, bytes);
  REQUIRE(none.ok());
  CHECK(none->pages_stored == 0);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("Namespace: a skipped prefix that is not cached stores nothing") {
  auto ns = Make(Config(0), 8);
  const std::vector<Token> seq = Seq(0, 16);
  const std::string bytes = Pages(4, 4);
  Insert(*ns, Seq(0, 8), bytes.substr(0, 2 * Geo().PageBytes()));
  Namespace::InsertSpec spec;
  spec.elements = seq;
  spec.skip_pages = 3;  // only 2 are cached
  auto up = ns->BeginInsert(spec);
  REQUIRE(absl::IsFailedPrecondition(up.status()));
  CHECK(up.status().message().substr(0, 11) == "skip_pages:");
  spec.skip_pages = 5;  // more than the sequence
  CHECK(ns->BeginInsert(spec).status().message().substr(0, 11) ==
        "skip_pages:");
  // The wrong number of checksums: one per SENT page.
  spec.skip_pages = 2;
  const std::vector<uint64_t> four(4, 1);
  spec.checksums = four;
  auto sums = ns->BeginInsert(spec);
  CHECK(absl::IsInvalidArgument(sums.status()));
  CHECK(sums.status().message().substr(0, 15) == "page_checksums:");
  const NamespaceStats c = ns->Counters();
  CHECK(c.cached_pages == 2);
  CHECK(c.free_pages == 6);
  CHECK(c.uploads_in_flight == 0);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("Namespace: the skipped prefix stays locked until commit") {
  auto ns = Make(Config(0), 6);
  const std::string bytes = Pages(6, 5);
  Insert(*ns, Seq(0, 8), bytes.substr(0, 2 * Geo().PageBytes()));
  Namespace::InsertSpec spec;
  const std::vector<Token> seq = Seq(0, 12);
  spec.elements = seq;
  spec.skip_pages = 2;
  auto up = ns->BeginInsert(spec);
  REQUIRE(up.ok());
  // Neither eviction nor other inserts' need for room takes the prefix.
  ns->EvictAll();
  CHECK(ns->Counters().cached_pages == 2);
  const std::string page = Page(bytes, 2);
  REQUIRE((*up)->Write(0, page).ok());
  REQUIRE((*up)->Commit().ok());
  CHECK(Fetch(*ns, seq, FetchFormat::kRaw) == bytes.substr(0, 3 * page.size()));
  // Aborted: nothing stored, the lock and slots given back.
  const std::vector<Token> longer = Seq(0, 20);
  spec.elements = longer;
  spec.skip_pages = 3;
  auto dead = ns->BeginInsert(spec);
  REQUIRE(dead.ok());
  REQUIRE((*dead)->Write(0, page.substr(0, 10)).ok());
  dead->reset();
  const NamespaceStats c = ns->Counters();
  CHECK(c.cached_pages == 3);
  CHECK(c.free_pages == 3);
  CHECK(c.protected_pages == 0);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("Namespace: an append after cold pages restores them raw") {
  TempDir dir;
  auto ns = Make(Config(64 << 10, dir.path), 8);
  const std::string bytes = Pages(5, 6);
  Insert(*ns, Seq(0, 12), bytes.substr(0, 3 * Geo().PageBytes()));
  const Tier cold = GENERATE(Tier::kHostCompressed, Tier::kDisk);
  REQUIRE(ns->tiers().DemoteAll(cold).ok());
  Namespace::InsertSpec spec;
  const std::vector<Token> seq = Seq(0, 20);
  spec.elements = seq;
  spec.skip_pages = 3;
  auto r = Append(*ns, spec, bytes);
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 2);
  std::vector<Tier> tiers;
  CHECK(Fetch(*ns, seq, FetchFormat::kRaw, &tiers) == bytes);
  // Raw pages under cold ones would break the path invariant.
  CHECK(tiers == std::vector<Tier>(5, Tier::kRaw));
  CHECK(ns->Counters().promoted_pages == 3);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("Namespace: an append after lossy cold pages is refused") {
  // A raw page is exact: a lossy copy cannot be made raw again.
  NamespaceConfig c = Config(64 << 10);
  CodecParams params;
  params.geometry = c.geometry;
  auto fp8 = CreateFp8Codec(params);
  REQUIRE(fp8.ok());
  c.codec = kFp8CodecName;
  c.tier_codec = *std::move(fp8);
  auto ns = Make(c, 8);
  const std::string bytes = Pages(3, 8);
  Insert(*ns, Seq(0, 8), bytes.substr(0, 2 * Geo().PageBytes()));
  REQUIRE(ns->tiers().DemoteAll(Tier::kHostCompressed).ok());
  Namespace::InsertSpec spec;
  const std::vector<Token> seq = Seq(0, 12);
  spec.elements = seq;
  spec.skip_pages = 2;
  auto up = ns->BeginInsert(spec);
  REQUIRE(absl::IsFailedPrecondition(up.status()));
  CHECK(up.status().message().substr(0, 11) == "skip_pages:");
  CHECK(ns->Counters().uploads_in_flight == 0);
  // Sent whole, the pages are stored exact.
  spec.skip_pages = 0;
  REQUIRE(Append(*ns, spec, bytes).ok());
  std::vector<Tier> tiers;
  CHECK(Fetch(*ns, seq, FetchFormat::kRaw, &tiers) == bytes);
  CHECK(tiers == std::vector<Tier>(3, Tier::kRaw));
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("Namespace: an append after a prefix lease") {
  auto ns = Make(Config(0), 8);
  const std::string bytes = Pages(4, 7);
  Insert(*ns, Seq(0, 8), bytes.substr(0, 2 * Geo().PageBytes()));
  auto lease = ns->Match(Seq(0, 8), true, absl::Seconds(10));
  REQUIRE(lease.ok());
  const std::vector<Token> seq = Seq(0, 16);
  Namespace::InsertSpec spec;
  spec.elements = seq;
  spec.prefix_lease_id = lease->lease_id;
  auto r = Append(*ns, spec, bytes);
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 2);
  CHECK(Fetch(*ns, seq, FetchFormat::kRaw) == bytes);
  CHECK(ns->HasLease(lease->lease_id));  // left as it is
  // skip_pages must agree with the lease.
  spec.skip_pages = 1;
  auto disagree = ns->BeginInsert(spec);
  CHECK(absl::IsFailedPrecondition(disagree.status()));
  CHECK(disagree.status().message().substr(0, 11) == "skip_pages:");
  // A lease on another prefix.
  Insert(*ns, Seq(100, 4), Page(bytes, 0));
  auto other = ns->Match(Seq(100, 4), true, absl::Seconds(10));
  REQUIRE(other.ok());
  spec.skip_pages = 0;
  spec.prefix_lease_id = other->lease_id;
  auto wrong = ns->BeginInsert(spec);
  CHECK(absl::IsFailedPrecondition(wrong.status()));
  CHECK(wrong.status().message().substr(0, 16) == "prefix_lease_id:");
  REQUIRE(ns->Release(other->lease_id).ok());
  auto gone = ns->BeginInsert(spec);
  CHECK(absl::IsNotFound(gone.status()));
  CHECK(gone.status().message().substr(0, 16) == "prefix_lease_id:");
  REQUIRE(ns->CheckInvariants().ok());
}

// The layer-major stream of pages [skip, n) of `bytes`: for each layer, for
// each page, K then V of that layer.
std::string LayerMajor(const Geometry& g, const std::string& bytes,
                       size_t skip) {
  const size_t pb = g.PageBytes();
  const size_t n = bytes.size() / pb;
  const uint64_t kvb = KvLayerBytes(g);
  std::string out;
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    for (size_t p = skip; p < n; ++p) {
      for (int kv = 0; kv < 2; ++kv) {
        out.append(bytes, p * pb + KvLayerOffset(g, l, kv), kvb);
      }
    }
  }
  return out;
}

TEST_CASE("Namespace: a layer-major upload stores the pages it describes") {
  const PageLayout layout = GENERATE(PageLayout::kKvLayerTokenHeadDim,
                                     PageLayout::kLayerKvTokenHeadDim);
  NamespaceConfig c = Config(0);
  c.geometry.layout = layout;
  c.geometry.num_layers = 3;
  auto pool = HostPagePool::Create(c.geometry.PageBytes(), 8);
  REQUIRE(pool.ok());
  auto made = Namespace::Create(c, *std::move(pool));
  REQUIRE(made.ok());
  Namespace& ns = **made;
  const size_t pb = ns.page_bytes();
  std::string bytes(4 * pb, '\0');
  // Every 4-byte word distinct, so no two pages or layers are alike.
  for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
    const uint32_t v = static_cast<uint32_t>(i);
    std::memcpy(&bytes[i], &v, 4);
  }
  Insert(ns, Seq(0, 4), bytes.substr(0, pb));
  const std::vector<Token> seq = Seq(0, 16);
  std::vector<uint64_t> sums;
  for (int p = 1; p < 4; ++p) {
    sums.push_back(XXH3_64bits(bytes.data() + p * pb, pb));
  }
  Namespace::InsertSpec spec;
  spec.elements = seq;
  spec.skip_pages = 1;
  spec.layer_major = true;
  spec.checksums = sums;
  auto up = ns.BeginInsert(spec);
  REQUIRE(up.ok());
  const std::string stream = LayerMajor(c.geometry, bytes, 1);
  REQUIRE(stream.size() == (*up)->total_bytes());
  for (size_t off = 0; off < stream.size(); off += 100) {
    REQUIRE((*up)->Write(off, absl::string_view(stream).substr(off, 100)).ok());
  }
  REQUIRE((*up)->Commit().ok());
  CHECK(Fetch(ns, seq, FetchFormat::kRaw) == bytes);
  REQUIRE(ns.CheckInvariants().ok());
  // A page whose layers do not hash to its declared checksum: DataLoss
  // once the last byte arrives, nothing stored.
  const std::vector<Token> other = Seq(500, 8);
  std::string two = bytes.substr(0, 2 * pb);
  const std::vector<uint64_t> bad = {XXH3_64bits(two.data(), pb),
                                     XXH3_64bits(two.data(), pb)};
  spec.elements = other;
  spec.skip_pages = 0;
  spec.checksums = bad;
  auto broken = ns.BeginInsert(spec);
  REQUIRE(broken.ok());
  const absl::Status s = (*broken)->Write(0, LayerMajor(c.geometry, two, 0));
  CHECK(absl::IsDataLoss(s));
  CHECK(s.message().substr(0, 17) == "page_checksums[1]");
  broken->reset();
  CHECK(ns.Counters().free_pages == 4);
  REQUIRE(ns.CheckInvariants().ok());
}

TEST_CASE("Upload: several threads store what one thread stores") {
  auto ns = Make(Config(0), 32);
  const size_t pb = Geo().PageBytes();
  const std::string bytes = Pages(9, 77);
  std::vector<uint64_t> sums;
  for (size_t i = 0; i < 9; ++i) {
    sums.push_back(XXH3_64bits(bytes.data() + i * pb, pb));
  }
  // A head of 100 bytes alone, the rest (not on a page boundary) with 4
  // threads, then the same sequence's pages whole with 4 threads.
  Namespace::InsertSpec spec;
  const std::vector<Token> t1 = Seq(0, 9 * 4);
  spec.elements = t1;
  spec.checksums = sums;
  auto up = ns->BeginInsert(spec);
  REQUIRE(up.ok());
  REQUIRE((*up)->Write(0, absl::string_view(bytes).substr(0, 100), 4).ok());
  REQUIRE((*up)->Write(100, absl::string_view(bytes).substr(100), 4).ok());
  REQUIRE((*up)->Commit().ok());
  CHECK(Fetch(*ns, t1, FetchFormat::kRaw) == bytes);
  const std::vector<Token> t2 = Seq(1000, 9 * 4);
  spec.elements = t2;
  up = ns->BeginInsert(spec);
  REQUIRE(up.ok());
  REQUIRE((*up)->Write(0, bytes, 4).ok());
  REQUIRE((*up)->Commit().ok());
  CHECK(Fetch(*ns, t2, FetchFormat::kRaw) == bytes);
  // An append after the 9 cached pages: the 2 new pages, with 4 threads
  // (the first written page is page 9 of the sequence).
  std::vector<Token> t3 = t2;
  for (int i = 0; i < 8; ++i) t3.push_back(5000 + i);
  const std::string more = bytes + Pages(2, 78);
  Namespace::InsertSpec append;
  append.elements = t3;
  append.skip_pages = 9;
  up = ns->BeginInsert(append);
  REQUIRE(up.ok());
  const size_t sent = (*up)->total_bytes();
  REQUIRE((*up)
              ->Write(0, absl::string_view(more).substr(more.size() - sent), 4)
              .ok());
  REQUIRE((*up)->Commit().ok());
  CHECK(Fetch(*ns, t3, FetchFormat::kRaw) == more);
  // A page that is not what its checksum says fails the upload, and
  // nothing of it is stored.
  const std::vector<Token> t4 = Seq(9000, 9 * 4);
  sums[5] ^= 1;
  spec.elements = t4;
  spec.checksums = sums;
  up = ns->BeginInsert(spec);
  REQUIRE(up.ok());
  const absl::Status bad = (*up)->Write(0, bytes, 4);
  CHECK(bad.code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StartsWith(bad.message(), "page_checksums[5]"));
  up->reset();
  auto m = ns->Match(t4, false, absl::ZeroDuration());
  REQUIRE(m.ok());
  CHECK(m->pages.empty());
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
