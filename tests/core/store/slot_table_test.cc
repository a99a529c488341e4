#include "core/store/slot_table.h"

#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "absl/strings/match.h"

namespace kvharbor {
namespace {

constexpr size_t kSlotBytes = 4096;

std::unique_ptr<PagePool> MakePool(uint32_t slots) {
  auto pool = HostPagePool::Create(kSlotBytes, slots);
  REQUIRE(pool.ok());
  return *std::move(pool);
}

// Every slot counts as a raw index page; none is locked.
bool AllRaw(PageHandle) { return true; }
bool NoneLocked(PageHandle) { return false; }

TEST_CASE("SlotTable: allocate, index, resolve, retire") {
  std::unique_ptr<PagePool> pool = MakePool(4);
  SlotTable t("ns", pool.get(), nullptr);
  CHECK(t.capacity() == 4);
  CHECK(t.free_count() == 4);
  absl::StatusOr<std::vector<uint32_t>> slots = t.Allocate(2, 0, nullptr);
  REQUIRE(slots.ok());
  REQUIRE(slots->size() == 2);
  CHECK(t.free_count() == 2);
  const uint32_t s = (*slots)[0];
  const PageHandle h = t.HandleOf(s);
  CHECK(h == SlotTable::MakeHandle(s, 1));
  // Reserved, not yet indexed: not a cached page.
  CHECK(absl::IsNotFound(t.Resolve(h).status()));
  t.Index(s, 0xabc, 64);
  REQUIRE(t.Resolve(h).ok());
  CHECK(*t.Resolve(h) == s);
  CHECK(t.checksum(s) == 0xabc);
  t.Free(absl::MakeConstSpan(&(*slots)[1], 1));
  CHECK(t.free_count() == 3);
  t.Retire(absl::MakeConstSpan(&h, 1));
  CHECK(t.free_count() == 4);
  // The old handle went stale with the new generation.
  absl::Status stale = t.Resolve(h).status();
  CHECK(absl::IsNotFound(stale));
  CHECK(absl::StrContains(stale.message(), "namespace 'ns'"));
  CHECK(t.HandleOf(s) == SlotTable::MakeHandle(s, 2));
  uint64_t indexed = 1;
  REQUIRE(t.Check(AllRaw, &indexed).ok());
  CHECK(indexed == 0);
}

TEST_CASE("SlotTable: a pinned retired slot is freed by its last unpin") {
  std::unique_ptr<PagePool> pool = MakePool(2);
  SlotTable t("ns", pool.get(), nullptr);
  const std::vector<uint32_t> slots = *t.Allocate(1, 0, nullptr);
  const uint32_t s = slots[0];
  t.Index(s, 7, 0);
  const PageHandle h = t.HandleOf(s);
  CHECK(t.Unpinned(s));
  CHECK(t.Pin(s).checksum == 7);
  CHECK(t.Pin(s).checksum == 7);
  CHECK_FALSE(t.Unpinned(s));
  const SlotTable::Census held = t.Count(NoneLocked);
  CHECK(held.pinned == 1);
  CHECK(held.other == 0);
  t.Retire(absl::MakeConstSpan(&h, 1));
  CHECK(t.free_count() == 1);  // a zombie until unpinned
  CHECK(t.Count(NoneLocked).pinned == 1);
  uint64_t indexed = 0;
  CHECK(t.Check(AllRaw, &indexed).ok());
  t.Unpin(slots);
  CHECK(t.free_count() == 1);
  const uint32_t both[] = {s, SlotTable::kNoSlot};  // kNoSlot is skipped
  t.Unpin(both);
  CHECK(t.free_count() == 2);
  CHECK(t.Check(AllRaw, &indexed).ok());
}

TEST_CASE("SlotTable: Count and Check see what holds the slots") {
  std::unique_ptr<PagePool> pool = MakePool(4);
  SlotTable t("ns", pool.get(), nullptr);
  const std::vector<uint32_t> slots = *t.Allocate(3, 0, nullptr);
  t.Index(slots[0], 1, 0);
  t.Index(slots[1], 2, 0);
  const PageHandle locked = t.HandleOf(slots[0]);
  const SlotTable::Census c =
      t.Count([&](PageHandle h) { return h == locked; });
  CHECK(c.reserved == 1);
  CHECK(c.locked == 1);
  CHECK(c.other == 1);
  CHECK(c.pinned == 0);
  uint64_t indexed = 0;
  REQUIRE(t.Check(AllRaw, &indexed).ok());
  CHECK(indexed == 2);
  // An indexed slot that the index does not hold as a raw page is caught.
  const absl::Status bad =
      t.Check([&](PageHandle h) { return h != locked; }, &indexed);
  CHECK(absl::IsInternal(bad));
  CHECK(absl::StrContains(bad.message(), "not a raw index page"));
}

TEST_CASE("SlotTable: fresh slots are charged to the budget") {
  std::unique_ptr<PagePool> pool = MakePool(4);
  auto budget = std::make_shared<MemoryBudget>(3 * kSlotBytes + 300);
  SlotTable t("ns", pool.get(), budget);
  std::vector<uint32_t> slots = *t.Allocate(2, 100, nullptr);
  CHECK(t.committed_bytes() == 2 * kSlotBytes);
  CHECK(budget->used() == 2 * kSlotBytes);  // metadata only checked
  bool full = false;
  absl::StatusOr<std::vector<uint32_t>> more = t.Allocate(2, 100, &full);
  CHECK(absl::IsResourceExhausted(more.status()));
  CHECK(full);
  CHECK(absl::StrContains(more.status().message(), "store.pool_budget_bytes"));
  CHECK(budget->used() == 2 * kSlotBytes);
  // Freed slots stay committed (and charged) until discarded.
  t.Free(slots);
  CHECK(t.committed_bytes() == 2 * kSlotBytes);
  t.DiscardFree();
  CHECK(t.committed_bytes() < 2 * kSlotBytes);
  CHECK(budget->used() == t.committed_bytes());
  uint64_t indexed = 0;
  CHECK(t.Check(AllRaw, &indexed).ok());
}

}  // namespace
}  // namespace kvharbor
