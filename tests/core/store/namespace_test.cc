#include "core/store/namespace.h"

#include <xxh3.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/store/store.h"

namespace kvharbor {
namespace {

Geometry SmallGeometry(uint32_t page_size = 4) {
  Geometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 4;
  g.page_size = page_size;
  g.dtype = DType::kFP16;
  return g;
}

std::shared_ptr<Namespace> MakeStoreNamespace(Store& store, uint32_t pages,
                                              uint32_t page_size = 4) {
  NamespaceSpec spec;
  spec.name = "ns";
  spec.geometry = SmallGeometry(page_size);
  spec.capacity_bytes = uint64_t{pages} * spec.geometry.PageBytes();
  auto r = store.CreateNamespace(spec, false);
  REQUIRE(r.ok());
  return r->first;
}

std::vector<Token> Seq(int start, int n) {
  std::vector<Token> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

std::string PageBytes(size_t page_bytes, uint32_t seed) {
  std::string s(page_bytes, '\0');
  std::mt19937 rng(seed);
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// Uploads `pages` (concatenated) in chunks of `chunk` bytes.
absl::StatusOr<Namespace::InsertOutcome> Upload(Namespace& ns,
                                                const std::vector<Token>& t,
                                                const std::string& bytes,
                                                size_t chunk = 7) {
  auto up = ns.BeginInsert(t, {});
  if (!up.ok()) return up.status();
  for (size_t off = 0; off < bytes.size(); off += chunk) {
    absl::Status s =
        (*up)->Write(off, absl::string_view(bytes).substr(off, chunk));
    if (!s.ok()) return s;
  }
  return (*up)->Commit();
}

TEST_CASE("namespace: insert, match, fetch by lease round-trips bytes") {
  Store store(StoreOptions{});
  auto ns = MakeStoreNamespace(store, 16);
  const size_t pb = ns->page_bytes();
  std::string bytes = PageBytes(3 * pb, 1);
  auto out = Upload(*ns, Seq(0, 12), bytes);
  REQUIRE(out.ok());
  CHECK(out->pages_stored == 3);
  CHECK(out->already_present_tokens == 0);

  auto m = ns->Match(Seq(0, 14), /*lock=*/true, absl::ZeroDuration());
  REQUIRE(m.ok());
  CHECK(m->matched_tokens == 12);
  REQUIRE(m->pages.size() == 3);
  CHECK(m->lease_id != 0);

  auto pinned = ns->PinLease(m->lease_id, 0, 0);
  REQUIRE(pinned.ok());
  REQUIRE(pinned->size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(std::memcmp(pinned->data(i), bytes.data() + i * pb, pb) == 0);
    CHECK(pinned->checksum(i) == XXH3_64bits(bytes.data() + i * pb, pb));
  }
  CHECK(ns->Release(m->lease_id).ok());
  CHECK(absl::IsNotFound(ns->Release(m->lease_id)));
  CHECK(ns->CheckInvariants().ok());
}

TEST_CASE("namespace: dedup stores each page once") {
  Store store(StoreOptions{});
  auto ns = MakeStoreNamespace(store, 16);
  const size_t pb = ns->page_bytes();
  REQUIRE(Upload(*ns, Seq(0, 8), PageBytes(2 * pb, 1)).ok());
  auto again = Upload(*ns, Seq(0, 16), PageBytes(4 * pb, 2));
  REQUIRE(again.ok());
  CHECK(again->already_present_tokens == 8);
  CHECK(again->pages_stored == 2);
  NamespaceStats c = ns->Counters();
  CHECK(c.cached_pages == 4);
  CHECK(c.free_pages == 12);
  // The first two pages keep their original bytes.
  auto m = ns->Match(Seq(0, 16), true, absl::ZeroDuration());
  REQUIRE(m.ok());
  auto pinned = ns->PinLease(m->lease_id, 0, 1);
  REQUIRE(pinned.ok());
  CHECK(std::memcmp(pinned->data(0), PageBytes(2 * pb, 1).data(), pb) == 0);
  CHECK(ns->CheckInvariants().ok());
}

TEST_CASE("namespace: broken uploads leave nothing behind") {
  Store store(StoreOptions{});
  auto ns = MakeStoreNamespace(store, 4);
  const size_t pb = ns->page_bytes();
  {
    auto up = ns->BeginInsert(Seq(0, 8), {});
    REQUIRE(up.ok());
    REQUIRE((*up)->Write(0, PageBytes(pb, 3)).ok());
    CHECK(ns->Counters().free_pages == 2);
    // Not committed: destroyed.
  }
  CHECK(ns->Counters().free_pages == 4);
  CHECK(ns->Counters().cached_pages == 0);

  auto up = ns->BeginInsert(Seq(0, 8), {});
  REQUIRE(up.ok());
  absl::Status s = (*up)->Write(5, "x");
  CHECK(absl::IsInvalidArgument(s));
  CHECK(std::string(s.message()).find("chunk.offset") != std::string::npos);
  CHECK(!(*up)->Write(0, "x").ok());  // dead after an error
  up->reset();

  auto up2 = ns->BeginInsert(Seq(0, 8), {});
  REQUIRE(up2.ok());
  s = (*up2)->Write(0, PageBytes(2 * pb + 1, 4));
  CHECK(absl::IsInvalidArgument(s));
  CHECK(std::string(s.message()).find("declared size") != std::string::npos);
  up2->reset();

  auto up3 = ns->BeginInsert(Seq(0, 8), {});
  REQUIRE(up3.ok());
  REQUIRE((*up3)->Write(0, PageBytes(pb, 4)).ok());
  CHECK(absl::IsInvalidArgument((*up3)->Commit().status()));
  up3->reset();
  CHECK(ns->Counters().free_pages == 4);
  CHECK(ns->CheckInvariants().ok());
}

TEST_CASE("namespace: declared checksums are verified") {
  Store store(StoreOptions{});
  auto ns = MakeStoreNamespace(store, 4);
  const size_t pb = ns->page_bytes();
  std::string bytes = PageBytes(pb, 9);
  std::vector<uint64_t> good = {XXH3_64bits(bytes.data(), pb)};
  std::vector<uint64_t> bad = {good[0] ^ 1};
  auto up = ns->BeginInsert(Seq(0, 4), bad);
  REQUIRE(up.ok());
  CHECK(absl::IsDataLoss((*up)->Write(0, bytes)));
  up->reset();
  auto up2 = ns->BeginInsert(Seq(0, 4), good);
  REQUIRE(up2.ok());
  REQUIRE((*up2)->Write(0, bytes).ok());
  REQUIRE((*up2)->Commit().ok());
  CHECK(absl::IsInvalidArgument(ns->BeginInsert(Seq(0, 8), good).status()));
}

TEST_CASE("namespace: bad tokens are rejected with the field named") {
  Store store(StoreOptions{});
  auto ns = MakeStoreNamespace(store, 4);
  auto m = ns->Match({}, false, absl::ZeroDuration());
  CHECK(absl::IsInvalidArgument(m.status()));
  CHECK(std::string(m.status().message()).find("token_ids") == 0);
  std::vector<Token> neg = {1, -2, 3};
  CHECK(absl::IsInvalidArgument(ns->Match(neg, false, {}).status()));
  auto odd = ns->BeginInsert(Seq(0, 5), {});
  CHECK(absl::IsInvalidArgument(odd.status()));
  CHECK(std::string(odd.status().message()).find("page_size") !=
        std::string::npos);
}

TEST_CASE("namespace: a full pool evicts LRU pages, locked pages stay") {
  Store store(StoreOptions{});
  auto ns = MakeStoreNamespace(store, 4);
  const size_t pb = ns->page_bytes();
  REQUIRE(Upload(*ns, Seq(0, 8), PageBytes(2 * pb, 1)).ok());
  REQUIRE(Upload(*ns, Seq(100, 8), PageBytes(2 * pb, 2)).ok());
  auto lease = ns->Match(Seq(100, 8), true, absl::ZeroDuration());
  REQUIRE(lease.ok());
  auto out = Upload(*ns, Seq(200, 8), PageBytes(2 * pb, 3));
  REQUIRE(out.ok());
  CHECK(out->pages_evicted == 2);
  CHECK(ns->Match(Seq(0, 8), false, {})->matched_tokens == 0);
  CHECK(ns->Match(Seq(100, 8), false, {})->matched_tokens == 8);
  // Everything else locked or needed: the next insert cannot fit.
  auto lease2 = ns->Match(Seq(200, 8), true, absl::ZeroDuration());
  REQUIRE(lease2.ok());
  auto full = ns->BeginInsert(Seq(300, 4), {});
  CHECK(absl::IsResourceExhausted(full.status()));
  CHECK(ns->CheckInvariants().ok());
}

TEST_CASE("namespace: pinned pages survive eviction until unpinned") {
  Store store(StoreOptions{});
  auto ns = MakeStoreNamespace(store, 2);
  const size_t pb = ns->page_bytes();
  std::string bytes = PageBytes(pb, 5);
  REQUIRE(Upload(*ns, Seq(0, 4), bytes).ok());
  auto m = ns->Match(Seq(0, 4), false, {});
  REQUIRE(m.ok());
  auto pinned = ns->PinPages(m->pages);
  REQUIRE(pinned.ok());
  CHECK(ns->EvictAll().pages == 1);
  // Stale handle now; the bytes are still intact for the reader.
  CHECK(absl::IsNotFound(ns->PinPages(m->pages).status()));
  CHECK(ns->Counters().free_pages == 1);
  CHECK(std::memcmp(pinned->data(0), bytes.data(), pb) == 0);
  CHECK(ns->CheckInvariants().ok());
  *pinned = Namespace::PinnedPages();
  CHECK(ns->Counters().free_pages == 2);
  CHECK(ns->CheckInvariants().ok());
}

TEST_CASE("namespace: leases expire and evict by pages removes descendants") {
  Store store(StoreOptions{});
  auto ns = MakeStoreNamespace(store, 8);
  const size_t pb = ns->page_bytes();
  REQUIRE(Upload(*ns, Seq(0, 12), PageBytes(3 * pb, 1)).ok());
  auto m = ns->Match(Seq(0, 12), true, absl::Milliseconds(1));
  REQUIRE(m.ok());
  auto locked = ns->EvictPages({m->pages[1]});
  CHECK(absl::IsFailedPrecondition(locked.status()));
  CHECK(ns->ReapExpiredLeases(absl::Now() + absl::Seconds(1)) == 1);
  auto ev = ns->EvictPages({m->pages[1]});
  REQUIRE(ev.ok());
  CHECK(ev->pages == 2);
  CHECK(ns->Match(Seq(0, 12), false, {})->matched_tokens == 4);
  CHECK(absl::IsNotFound(ns->EvictPages({m->pages[2]}).status()));
  CHECK(ns->CheckInvariants().ok());
}

TEST_CASE("store: namespaces, budget and names") {
  StoreOptions opt;
  opt.pool_budget_bytes = 1 << 20;
  opt.default_namespace_bytes = 1 << 19;
  Store store(opt);
  NamespaceSpec spec;
  spec.name = "a";
  spec.geometry = SmallGeometry();
  auto a = store.CreateNamespace(spec, false);
  REQUIRE(a.ok());
  CHECK(a->second);
  CHECK(absl::IsAlreadyExists(store.CreateNamespace(spec, false).status()));
  auto again = store.CreateNamespace(spec, true);
  REQUIRE(again.ok());
  CHECK(!again->second);
  spec.name = "b";
  spec.capacity_bytes = 1 << 20;
  CHECK(absl::IsResourceExhausted(store.CreateNamespace(spec, false).status()));
  spec.name = "bad name!";
  auto bad = store.CreateNamespace(spec, false);
  CHECK(absl::IsInvalidArgument(bad.status()));
  CHECK(std::string(bad.status().message()).find("spec.name") == 0);
  spec.name = "c";
  spec.capacity_bytes = 0;
  spec.geometry.head_dim = 0;
  auto geo = store.CreateNamespace(spec, false);
  CHECK(std::string(geo.status().message()).find("spec.geometry.head_dim") ==
        0);
  CHECK(store.List().size() == 1);
  CHECK(store.Counters().pool_reserved_bytes == 1 << 19);
  CHECK(absl::IsNotFound(store.Get("zzz").status()));
  CHECK(absl::IsNotFound(store.Release(12345)));
  CHECK(store.DeleteNamespace("a", false).ok());
  CHECK(store.Counters().pool_reserved_bytes == 0);
}

}  // namespace
}  // namespace kvharbor
