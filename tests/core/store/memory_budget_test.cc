// The store's memory budget (core/memory/memory_budget.h, Store): every
// byte a namespace holds in host memory is charged -- written raw pages,
// slot and index metadata, host-compressed buffers -- capacities are caps
// that namespaces share dynamically, a full budget takes pages from the
// namespace holding the most, Evict gives memory back to the system, and a
// namespace costs nothing until it holds pages.
#include "core/memory/memory_budget.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/memory/host_arena.h"
#include "core/store/store.h"

namespace kvharbor {
namespace {

// 16 KiB pages: 2 layers, 2 heads, head_dim 256, 8 tokens, fp16.
Geometry Geo16K() {
  Geometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 256;
  g.page_size = 8;
  g.dtype = DType::kFP16;
  return g;
}

std::vector<Token> Seq(int start, int n) {
  std::vector<Token> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

std::shared_ptr<Namespace> Create(Store& store, const std::string& name,
                                  const Geometry& g, uint64_t capacity = 0,
                                  uint64_t host_tier = 0) {
  NamespaceSpec spec;
  spec.name = name;
  spec.geometry = g;
  spec.capacity_bytes = capacity;
  spec.host_compressed_bytes = host_tier;
  auto r = store.CreateNamespace(spec, false);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return r->first;
}

absl::Status Put(Namespace& ns, const std::vector<Token>& t, char fill) {
  auto up = ns.BeginInsert(t, {});
  if (!up.ok()) return up.status();
  const std::string bytes(
      t.size() / ns.config().geometry.page_size * ns.page_bytes(), fill);
  // 64 KiB chunks, as a client would send them.
  for (size_t off = 0; off < bytes.size(); off += 64 << 10) {
    absl::Status s =
        (*up)->Write(off, absl::string_view(bytes).substr(off, 64 << 10));
    if (!s.ok()) return s;
  }
  return (*up)->Commit().status();
}

// Resident memory of this process (/proc/self/statm).
uint64_t RssBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long size = 0, resident = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return uint64_t{resident} * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

TEST_CASE("memory: the ledger admits within capacity, forces past it") {
  MemoryBudget b(100);
  CHECK(b.TryCharge(60));
  CHECK(!b.TryCharge(41));
  CHECK(b.used() == 60);
  CHECK(b.TryCharge(40));
  b.ForceCharge(5);
  CHECK(b.used() == 105);
  CHECK(b.free_bytes() == 0);
  b.Release(105);
  CHECK(b.used() == 0);
  CHECK(!b.TryCharge(101));
}

TEST_CASE("memory: capacities are caps; many namespaces on the defaults") {
  // Found: on the defaults each namespace reserved 1 GiB of the 4 GiB
  // budget up front, so the 5th was refused while the daemon used 35 MiB.
  Store store(StoreOptions{});
  for (int i = 0; i < 12; ++i) {
    auto ns = Create(store, absl::StrCat("model-", i), Geo16K());
    CHECK(ns->config().capacity_bytes == store.options().pool_budget_bytes);
    CHECK(ns->memory_bytes() == 0);  // nothing held until pages arrive
  }
  CHECK(store.List().size() == 12);
  CHECK(store.Counters().pool_reserved_bytes == 0);
  CHECK(store.Counters().memory_used_bytes == 0);
}

TEST_CASE("memory: budgets larger than the daemon's are refused") {
  StoreOptions o;
  o.pool_budget_bytes = 64 << 20;
  Store store(o);
  NamespaceSpec spec;
  spec.name = "h";
  spec.geometry = Geo16K();
  for (uint64_t host : {UINT64_MAX, uint64_t{65} << 20}) {
    spec.host_compressed_bytes = host;
    auto r = store.CreateNamespace(spec, false);
    CHECK(absl::IsInvalidArgument(r.status()));
    CHECK(absl::StartsWith(r.status().message(), "spec.host_compressed_bytes"));
  }
  spec.host_compressed_bytes = 0;
  spec.capacity_bytes = uint64_t{65} << 20;
  auto r = store.CreateNamespace(spec, false);
  CHECK(absl::StartsWith(r.status().message(), "spec.capacity_bytes"));
}

TEST_CASE("memory: a full budget takes the largest namespace's LRU pages") {
  StoreOptions o;
  const uint64_t pb = Geo16K().PageBytes();
  o.pool_budget_bytes = 64 * pb;  // 64 pages and their metadata, about
  Store store(o);
  auto a = Create(store, "a", Geo16K());
  auto b = Create(store, "b", Geo16K());
  // "a" fills most of the budget with 6 chains of 8 pages, chain 0 the
  // least recently used.
  for (int c = 0; c < 6; ++c) REQUIRE(Put(*a, Seq(c * 1000, 64), 'a').ok());
  for (int c = 1; c < 6; ++c) {
    REQUIRE(a->Match(Seq(c * 1000, 64), false, {})->matched_tokens == 64);
  }
  const uint64_t a_before = a->memory_bytes();
  CHECK(a_before >= 48 * pb);
  // "b" needs 24 pages: the budget has room for about 16; "a" holds the
  // most, so its least recently used pages go, not "b"'s.
  for (int c = 0; c < 3; ++c) {
    INFO(c);
    REQUIRE(Put(*b, Seq(c * 1000 + 7, 64), 'b').ok());
  }
  CHECK(b->Counters().cached_pages == 24);
  CHECK(a->memory_bytes() < a_before);
  CHECK(store.budget().used() <= store.budget().capacity());
  CHECK(a->Match(Seq(0, 64), false, {})->matched_tokens < 64);  // LRU chain
  CHECK(a->Match(Seq(5000, 64), false, {})->matched_tokens == 64);
  REQUIRE(a->CheckInvariants().ok());
  REQUIRE(b->CheckInvariants().ok());
  // Now "b" is the largest... once it is, its own pages go first.
  for (int c = 3; c < 8; ++c) REQUIRE(Put(*b, Seq(c * 1000 + 7, 64), 'b').ok());
  CHECK(b->memory_bytes() >= a->memory_bytes());
  CHECK(a->Counters().cached_pages > 0);  // not emptied for "b"
  CHECK(store.budget().used() <= store.budget().capacity());
  REQUIRE(a->CheckInvariants().ok());
  REQUIRE(b->CheckInvariants().ok());
}

TEST_CASE("memory: a tiered victim's coldest pages leave memory") {
  StoreOptions o;
  const uint64_t pb = Geo16K().PageBytes();
  o.pool_budget_bytes = 64 * pb;
  Store store(o);
  auto a = Create(store, "a", Geo16K(), 0, 16 * pb);
  auto b = Create(store, "b", Geo16K());
  for (int c = 0; c < 6; ++c) REQUIRE(Put(*a, Seq(c * 1000, 64), 'a').ok());
  const uint64_t a_before = a->memory_bytes();
  for (int c = 0; c < 4; ++c) REQUIRE(Put(*b, Seq(c * 1000 + 7, 64), 'b').ok());
  CHECK(b->Counters().cached_pages == 32);
  CHECK(a->memory_bytes() < a_before);
  CHECK(a->Counters().demoted_pages > 0);
  REQUIRE(a->CheckInvariants().ok());
  REQUIRE(b->CheckInvariants().ok());
}

TEST_CASE("memory: nothing to reclaim is RESOURCE_EXHAUSTED naming the key") {
  StoreOptions o;
  const uint64_t pb = Geo16K().PageBytes();
  o.pool_budget_bytes = 16 * pb;
  Store store(o);
  auto a = Create(store, "a", Geo16K());
  auto b = Create(store, "b", Geo16K());
  REQUIRE(Put(*a, Seq(0, 96), 'a').ok());  // 12 pages
  auto lease = a->Match(Seq(0, 96), true, {});
  REQUIRE(lease->lease_id != 0);
  const absl::Status s = Put(*b, Seq(0, 64), 'b');
  CHECK(absl::IsResourceExhausted(s));
  CHECK(absl::StrContains(s.message(), "store.pool_budget_bytes"));
  CHECK(b->Counters().uploads_in_flight == 0);
  REQUIRE(a->Release(lease->lease_id).ok());
  REQUIRE(Put(*b, Seq(0, 64), 'b').ok());
  REQUIRE(b->CheckInvariants().ok());
}

TEST_CASE("memory: a reservation larger than the budget takes nothing") {
  // Issue 34, row 1: a layer-major upload's first layer reaches every page,
  // so its reservation covers them all at once; when that exceeds the whole
  // budget it must fail without first evicting other namespaces' pages.
  StoreOptions o;
  const uint64_t pb = Geo16K().PageBytes();
  o.pool_budget_bytes = 64 * pb;
  Store store(o);
  auto victim = Create(store, "victim", Geo16K());
  // Capacity may equal the budget; its pages' metadata then cannot fit too.
  auto hostile = Create(store, "hostile", Geo16K(), 64 * pb);
  for (int c = 0; c < 4; ++c) {
    REQUIRE(Put(*victim, Seq(c * 1000, 64), 'v').ok());  // 32 pages
  }
  const uint64_t cached = victim->Counters().cached_pages;
  REQUIRE(cached == 32);
  const std::vector<Token> t = Seq(50000, 64 * 8);  // 64 pages
  InsertSpec spec;
  spec.elements = t;
  spec.layer_major = true;
  auto up = hostile->BeginInsert(spec);
  REQUIRE(up.ok());
  // Layer 0 of every page: its bytes reach the last page.
  const std::string layer0(64 * pb / Geo16K().num_layers, 'h');
  const absl::Status s = (*up)->Write(0, layer0);
  CHECK(absl::IsResourceExhausted(s));
  CHECK(absl::StrContains(s.message(), "store.pool_budget_bytes"));
  INFO(s.ToString());
  CHECK(absl::StrContains(s.message(), "nothing was taken"));
  up->reset();
  CHECK(victim->Counters().cached_pages == cached);
  CHECK(victim->Match(Seq(0, 64), false, {})->matched_tokens == 64);
  REQUIRE(victim->CheckInvariants().ok());
  REQUIRE(hostile->CheckInvariants().ok());
  // A reservation that fits still makes room as before.
  REQUIRE(Put(*hostile, Seq(90000, 8 * 8), 'h').ok());
}

TEST_CASE("memory: lease records are charged and bounded") {
  // Issue 34, row 3: locked Matches of many small pages made the daemon hold
  // 8 bytes per page per lease, uncounted and without a cap.
  StoreOptions o;
  Geometry g;
  g.num_layers = 1;
  g.num_kv_heads = 1;
  g.head_dim = 1;
  g.page_size = 1;
  g.dtype = DType::kFP16;  // 4-byte pages: records outweigh them
  o.pool_budget_bytes = uint64_t{64} << 20;
  Store store(o);
  auto ns = Create(store, "tiny", g, uint64_t{8} << 20);
  const std::vector<Token> t = Seq(0, 20000);
  REQUIRE(Put(*ns, t, 'x').ok());
  const uint64_t before = ns->memory_bytes();
  const uint64_t used_before = store.budget().used();
  std::vector<uint64_t> leases;
  absl::Status refused;
  for (int i = 0; i < 10000 && refused.ok(); ++i) {
    auto m = ns->Match(t, true, {});
    if (!m.ok()) {
      refused = m.status();
      break;
    }
    leases.push_back(m->lease_id);
  }
  INFO(refused.ToString());
  CHECK(absl::IsResourceExhausted(refused));
  CHECK(absl::StartsWith(refused.message(), "lock:"));
  REQUIRE(!leases.empty());
  // Charged: the namespace and the budget count the records ...
  CHECK(ns->memory_bytes() > before + leases.size() * 20000 * 8);
  CHECK(store.budget().used() > used_before);
  // ... at most about the namespace's own memory (or 1 MiB).
  CHECK(ns->memory_bytes() - before <=
        std::max<uint64_t>(before, uint64_t{1} << 20) + 20000 * 8 + 128);
  // A Match without lock still works.
  CHECK(ns->Match(t, false, {})->matched_tokens == 20000);
  for (uint64_t id : leases) REQUIRE(ns->Release(id).ok());
  CHECK(ns->memory_bytes() == before);
  CHECK(store.budget().used() == used_before);
  REQUIRE(ns->Match(t, true, {}).ok());  // room again
  ns->ReleaseAllLeases();
  CHECK(ns->memory_bytes() == before);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("memory: a full budget never takes raw pages from the shared arena") {
  // A sealed shared arena (store.host_ipc_socket) keeps a written page's
  // memory committed: evicting or demoting its raw pages would lose them
  // (demoting would even charge more) and free nothing. The budget is full
  // here of what the namespaces reserved, so "b" is refused and "a" keeps
  // every page, raw, in both its untiered and its tiered form.
  const uint64_t pb = Geo16K().PageBytes();
  for (const uint64_t host_tier : {uint64_t{0}, 8 * pb}) {
    INFO("host tier " << host_tier);
    absl::StatusOr<std::shared_ptr<HostArena>> arena =
        HostArena::Create(128 * pb);
    REQUIRE(arena.ok());
    StoreOptions o;
    o.pool_budget_bytes = 64 * pb;
    o.host_arena = *arena;
    Store store(o);
    auto a = Create(store, "a", Geo16K(), 48 * pb, host_tier);
    auto b = Create(store, "b", Geo16K(), 8 * pb);
    for (int c = 0; c < 6; ++c) REQUIRE(Put(*a, Seq(c * 1000, 64), 'a').ok());
    REQUIRE(a->Counters().cached_pages == 48);
    // "a" holds 48 pages and their metadata, the budget 64 pages: "b"'s 8
    // fit, and 8 more in a second namespace's place would not.
    REQUIRE(Put(*b, Seq(7, 64), 'b').ok());
    auto c = Create(store, "c", Geo16K(), 8 * pb);
    const absl::Status s = Put(*c, Seq(9, 64), 'c');
    CHECK(absl::IsResourceExhausted(s));
    CHECK(absl::StrContains(s.message(), "store.pool_budget_bytes"));
    CHECK(a->Counters().cached_pages == 48);
    CHECK(a->Counters().demoted_pages == 0);
    CHECK(a->Counters().evicted_pages == 0);
    CHECK(b->Counters().cached_pages == 8);
    for (int k = 0; k < 6; ++k) {
      CHECK(a->Match(Seq(k * 1000, 64), false, {})->matched_tokens == 64);
    }
    REQUIRE(a->CheckInvariants().ok());
    REQUIRE(b->CheckInvariants().ok());
    REQUIRE(c->CheckInvariants().ok());
  }
}

TEST_CASE("memory: tiny pages cost nothing up front, metadata is charged") {
  // Found: a 16 MiB namespace of 2-byte pages added 289 MiB of RSS at
  // creation (per-slot tables sized to the capacity), none of it counted.
  Geometry tiny;
  tiny.num_layers = 1;
  tiny.num_kv_heads = 1;
  tiny.head_dim = 1;
  tiny.page_size = 1;
  tiny.dtype = DType::kFP8E4M3;
  REQUIRE(tiny.PageBytes() == 2);
  Store store(StoreOptions{});
  const uint64_t rss = RssBytes();
  auto ns = Create(store, "tiny", tiny, 16 << 20);
  CHECK(ns->Counters().capacity_pages == (16 << 20) / 2);
  CHECK(RssBytes() < rss + (4 << 20));
  CHECK(ns->memory_bytes() == 0);
  // 10,000 pages: each is charged its 2 bytes and its metadata.
  REQUIRE(Put(*ns, Seq(0, 10000), 'x').ok());
  CHECK(ns->memory_bytes() >= 10000 * (2 + ns->page_meta_bytes()));
  CHECK(ns->memory_bytes() == store.budget().used());
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("memory: Evict gives the pages' memory back to the system") {
  Store store(StoreOptions{});
  auto ns = Create(store, "e", Geo16K());
  const uint64_t pb = ns->page_bytes();
  const uint64_t rss0 = RssBytes();
  for (int c = 0; c < 32; ++c) REQUIRE(Put(*ns, Seq(c * 1000, 64), 'e').ok());
  const uint64_t held = 256 * pb;  // 4 MiB
  const uint64_t rss1 = RssBytes();
  CHECK(rss1 >= rss0 + held * 3 / 4);
  CHECK(ns->memory_bytes() >= held);
  REQUIRE(ns->EvictAll().pages == 256);
  const uint64_t rss2 = RssBytes();
  INFO("rss " << rss0 << " -> " << rss1 << " -> " << rss2);
  CHECK(rss2 + held * 3 / 4 <= rss1);
  CHECK(ns->memory_bytes() < held / 16);  // the slot table remains
  REQUIRE(ns->CheckInvariants().ok());
  // The slots are reused (fresh memory) and charged again.
  REQUIRE(Put(*ns, Seq(0, 64), 'f').ok());
  CHECK(ns->memory_bytes() >= 8 * pb);
  REQUIRE(ns->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvharbor
