#include "core/store/lease_table.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <set>
#include <vector>

#include "absl/strings/match.h"

namespace kvharbor {
namespace {

// The table only stores the nodes; these stand for nodes of an index.
RadixNode* Node(uintptr_t n) { return reinterpret_cast<RadixNode*>(n * 16); }
LeaseTable::Nodes One(uintptr_t n) { return {Node(n)}; }

LeaseTable MakeTable() {
  return LeaseTable("ns", absl::Seconds(10), absl::Seconds(60));
}

TEST_CASE("LeaseTable: Add, Get and Remove a lease") {
  LeaseTable t = MakeTable();
  absl::Time expiry;
  const absl::Time before = absl::Now();
  const uint64_t id = t.Add(One(1), {11, 12, 13}, absl::Seconds(5), &expiry);
  REQUIRE(id != 0);
  CHECK(expiry >= before + absl::Seconds(5));
  CHECK(expiry <= absl::Now() + absl::Seconds(5));
  CHECK(t.Contains(id));
  CHECK(t.size() == 1);
  absl::StatusOr<LeaseTable::Lease> got = t.Get(id);
  REQUIRE(got.ok());
  CHECK(got->nodes == One(1));
  CHECK(got->pages == std::vector<PageHandle>{11, 12, 13});
  CHECK(got->expiry == expiry);
  absl::StatusOr<LeaseTable::Nodes> node = t.Remove(id);
  REQUIRE(node.ok());
  CHECK(*node == One(1));
  CHECK_FALSE(t.Contains(id));
  CHECK(t.size() == 0);
  // Gone: every lookup by id gives the same NotFound naming lease_id.
  for (const absl::Status& s :
       {t.Remove(id).status(), t.Get(id).status(),
        t.Extend(id, absl::Seconds(1)).status(), t.Slice(id, 0, 0).status()}) {
    CHECK(absl::IsNotFound(s));
    CHECK(absl::StrContains(s.message(), "lease_id"));
    CHECK(absl::StrContains(s.message(), "'ns'"));
  }
}

TEST_CASE(
    "LeaseTable: a lease of a page-hash namespace locks a node per page") {
  LeaseTable t = MakeTable();
  absl::Time expiry;
  const LeaseTable::Nodes nodes = {Node(1), Node(2), Node(3)};
  const uint64_t id = t.Add(nodes, {11, 12, 13}, absl::Seconds(5), &expiry);
  absl::StatusOr<LeaseTable::Nodes> got = t.Remove(id);
  REQUIRE(got.ok());
  CHECK(*got == nodes);
}

TEST_CASE("LeaseTable: ids are non-zero and unique") {
  LeaseTable t = MakeTable();
  std::set<uint64_t> ids;
  absl::Time expiry;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t id =
        t.Add(One(i + 1), {PageHandle(i)}, absl::ZeroDuration(), &expiry);
    CHECK(id != 0);
    ids.insert(id);
  }
  CHECK(ids.size() == 1000);
  CHECK(t.size() == 1000);
}

TEST_CASE("LeaseTable: ttls are clamped to the default and the maximum") {
  LeaseTable t = MakeTable();
  absl::Time expiry;
  absl::Time now = absl::Now();
  const uint64_t a = t.Add(One(1), {1}, absl::ZeroDuration(), &expiry);
  CHECK(expiry >= now + absl::Seconds(10));
  CHECK(expiry < now + absl::Seconds(11));
  now = absl::Now();
  t.Add(One(2), {2}, absl::Hours(5), &expiry);
  CHECK(expiry >= now + absl::Seconds(60));
  CHECK(expiry < now + absl::Seconds(61));
  now = absl::Now();
  absl::StatusOr<absl::Time> extended = t.Extend(a, absl::Seconds(-3));
  REQUIRE(extended.ok());
  CHECK(*extended >= now + absl::Seconds(10));
  CHECK(t.Get(a)->expiry == *extended);
}

TEST_CASE("LeaseTable: RemoveExpired ends only the expired leases") {
  LeaseTable t = MakeTable();
  absl::Time e1, e2;
  const uint64_t shorter = t.Add(One(1), {1}, absl::Seconds(1), &e1);
  const uint64_t longer = t.Add(One(2), {2}, absl::Seconds(30), &e2);
  CHECK(t.RemoveExpired(e1 - absl::Milliseconds(1)).empty());
  const std::vector<LeaseTable::Nodes> gone =
      t.RemoveExpired(e1 + absl::Seconds(1));
  CHECK(gone == std::vector<LeaseTable::Nodes>{One(1)});
  CHECK_FALSE(t.Contains(shorter));
  CHECK(t.Contains(longer));
  t.Add(One(3), {3}, absl::Seconds(30), &e1);
  std::vector<LeaseTable::Nodes> all = t.RemoveAll();
  std::sort(all.begin(), all.end());
  CHECK(all == std::vector<LeaseTable::Nodes>{One(2), One(3)});
  CHECK(t.size() == 0);
}

TEST_CASE("LeaseTable: Slice checks its range") {
  LeaseTable t = MakeTable();
  absl::Time expiry;
  const uint64_t id =
      t.Add(One(1), {10, 11, 12, 13}, absl::Seconds(5), &expiry);
  CHECK(*t.Slice(id, 0, 0) == std::vector<PageHandle>{10, 11, 12, 13});
  CHECK(*t.Slice(id, 1, 2) == std::vector<PageHandle>{11, 12});
  CHECK(*t.Slice(id, 3, 0) == std::vector<PageHandle>{13});
  absl::Status past = t.Slice(id, 4, 0).status();
  CHECK(absl::IsInvalidArgument(past));
  CHECK(absl::StrContains(past.message(), "start_page"));
  absl::Status over = t.Slice(id, 2, 3).status();
  CHECK(absl::IsInvalidArgument(over));
  CHECK(absl::StrContains(over.message(), "page_count"));
}

TEST_CASE("LeaseTable: ReplaceHandle follows a page into every lease") {
  LeaseTable t = MakeTable();
  absl::Time expiry;
  const uint64_t a = t.Add(One(1), {1, 2, 3}, absl::Seconds(5), &expiry);
  const uint64_t b = t.Add(One(2), {1, 2}, absl::Seconds(5), &expiry);
  const uint64_t c = t.Add(One(3), {7}, absl::Seconds(5), &expiry);
  t.ReplaceHandle(2, 99);
  CHECK(t.Get(a)->pages == std::vector<PageHandle>{1, 99, 3});
  CHECK(t.Get(b)->pages == std::vector<PageHandle>{1, 99});
  CHECK(t.Get(c)->pages == std::vector<PageHandle>{7});
}

}  // namespace
}  // namespace kvharbor
