// Placed uploads (Namespace::Upload::SlotData / AcceptPlaced): a same-host
// client writes the pages into the reserved slots itself and the namespace
// checks them where they lie. On host pools and on a stand-in device tier
// (tests/host_arena_tier.h), with and without the tier's own checksums;
// mismatches, wrong counts, mixing with Write, skipped prefixes and aborts
// leave nothing behind.
#include <xxh3.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/store/namespace.h"
#include "tests/core/store/tiers_test_util.h"
#include "tests/host_arena_tier.h"

namespace kvharbor {
namespace testing {
namespace {

constexpr uint32_t kPool = 8;

// A namespace over the stand-in device tier (cold tiers in host memory).
std::shared_ptr<Namespace> MakeDevice(std::shared_ptr<HostArenaTier> tier,
                                      uint64_t host_budget = 1 << 20) {
  NamespaceConfig c = Config(host_budget);
  c.device_tier = tier;
  auto pool = tier->CreatePool(c.geometry.PageBytes(), kPool);
  REQUIRE(pool.ok());
  auto ns = Namespace::Create(std::move(c), *std::move(pool));
  INFO(ns.status().ToString());
  REQUIRE(ns.ok());
  return *ns;
}

std::vector<uint64_t> Sums(const std::string& bytes, size_t first_page = 0) {
  const size_t pb = Geo().PageBytes();
  std::vector<uint64_t> out;
  for (size_t o = first_page * pb; o < bytes.size(); o += pb) {
    out.push_back(XXH3_64bits(bytes.data() + o, pb));
  }
  return out;
}

// A placed upload: every slot reserved at begin, for the client to write.
absl::StatusOr<std::unique_ptr<Namespace::Upload>> BeginPlaced(
    Namespace& ns, const std::vector<Token>& t) {
  Namespace::InsertSpec spec;
  spec.elements = t;
  spec.placed = true;
  return ns.BeginInsert(spec);
}

// Writes pages [up.skip_pages(), n) of `bytes` into their slots.
void Place(Namespace::Upload& up, const std::string& bytes) {
  const size_t pb = Geo().PageBytes();
  for (uint32_t i = up.skip_pages(); i < up.num_pages(); ++i) {
    uint8_t* slot = up.SlotData(i);
    REQUIRE(slot != nullptr);
    std::memcpy(slot, bytes.data() + i * pb, pb);
  }
}

void ExpectPlacedInsertWorks(Namespace& ns) {
  const std::vector<Token> t = Seq(1, 3 * 4);
  const std::string bytes = Pages(3, 11);
  auto up = BeginPlaced(ns, t);
  REQUIRE(up.ok());
  CHECK((*up)->skip_pages() == 0);
  CHECK((*up)->SlotData(3) == nullptr);  // past the end
  Place(**up, bytes);
  REQUIRE((*up)->AcceptPlaced(Sums(bytes)).ok());
  CHECK((*up)->bytes_received() == (*up)->total_bytes());
  auto out = (*up)->Commit();
  REQUIRE(out.ok());
  CHECK(out->pages_stored == 3);
  CHECK(Fetch(ns, t, FetchFormat::kRaw) == bytes);
  CHECK(ns.Counters().inserted_pages == 3);
  CHECK(ns.CheckInvariants().ok());
}

TEST_CASE("Placed upload: pages written into their slots are stored",
          "[namespace][placed]") {
  SECTION("host pool") { ExpectPlacedInsertWorks(*Make(Config(0), kPool)); }
  SECTION("device pool, checksums on the device") {
    auto tier = std::make_shared<HostArenaTier>(1 << 20);
    auto ns = MakeDevice(tier);
    ExpectPlacedInsertWorks(*ns);
    CHECK(tier->checksummed_pages() == 3);
  }
  SECTION("device pool whose tier cannot checksum: read back") {
    auto tier = std::make_shared<HostArenaTier>(1 << 20, false);
    auto ns = MakeDevice(tier);
    ExpectPlacedInsertWorks(*ns);
    CHECK(tier->checksummed_pages() == 0);
  }
}

TEST_CASE("Placed upload: a mismatch names the page and stores nothing",
          "[namespace][placed]") {
  auto tier = std::make_shared<HostArenaTier>(1 << 20);
  auto ns = MakeDevice(tier);
  const std::vector<Token> t = Seq(1, 3 * 4);
  const std::string bytes = Pages(3, 12);
  const uint32_t free_before = ns->Counters().free_pages;
  {
    auto up = BeginPlaced(*ns, t);
    REQUIRE(up.ok());
    Place(**up, bytes);
    (*up)->SlotData(1)[17] ^= 0x40;  // the client's copy went wrong
    absl::Status s = (*up)->AcceptPlaced(Sums(bytes));
    INFO(s.ToString());
    CHECK(absl::IsDataLoss(s));
    CHECK(absl::StartsWith(s.message(), "page_checksums[1]: page 1 "));
    // The upload is dead: accepting again or committing fails.
    CHECK(absl::IsDataLoss((*up)->AcceptPlaced(Sums(bytes))));
    CHECK_FALSE((*up)->Commit().ok());
  }
  CHECK(ns->Counters().free_pages == free_before);  // no slot leaked
  CHECK(ns->Match(t, false, absl::ZeroDuration())->matched_tokens == 0);
  CHECK(ns->CheckInvariants().ok());
}

TEST_CASE("Placed upload: bad use is refused", "[namespace][placed]") {
  auto ns = Make(Config(0), kPool);
  const std::vector<Token> t = Seq(1, 2 * 4);
  const std::string bytes = Pages(2, 13);
  SECTION("one checksum per written page") {
    auto up = BeginPlaced(*ns, t);
    REQUIRE(up.ok());
    Place(**up, bytes);
    absl::Status s = (*up)->AcceptPlaced({Sums(bytes)[0]});
    CHECK(absl::IsInvalidArgument(s));
    CHECK(absl::StartsWith(s.message(), "page_checksums: 1 given for 2"));
  }
  SECTION("not after Write") {
    auto up = BeginPlaced(*ns, t);
    REQUIRE(up.ok());
    REQUIRE((*up)->Write(0, bytes.substr(0, 100)).ok());
    CHECK(absl::IsFailedPrecondition((*up)->AcceptPlaced(Sums(bytes))));
  }
  SECTION("not twice") {
    auto up = BeginPlaced(*ns, t);
    REQUIRE(up.ok());
    Place(**up, bytes);
    REQUIRE((*up)->AcceptPlaced(Sums(bytes)).ok());
    CHECK(absl::IsFailedPrecondition((*up)->AcceptPlaced(Sums(bytes))));
    REQUIRE((*up)->Commit().ok());
    CHECK((*up)->SlotData(0) == nullptr);  // committed: no slot to write
  }
  CHECK(ns->CheckInvariants().ok());
}

TEST_CASE("Placed upload: a cached prefix is skipped, only the rest placed",
          "[namespace][placed]") {
  auto ns = Make(Config(0), kPool);
  const std::vector<Token> t = Seq(1, 4 * 4);
  const std::string bytes = Pages(4, 14);
  Insert(*ns, Seq(1, 2 * 4), bytes.substr(0, 2 * Geo().PageBytes()));
  auto up = BeginPlaced(*ns, t);
  REQUIRE(up.ok());
  REQUIRE((*up)->skip_pages() == 2);
  CHECK((*up)->SlotData(1) == nullptr);
  Place(**up, bytes);
  REQUIRE((*up)->AcceptPlaced(Sums(bytes, 2)).ok());
  auto out = (*up)->Commit();
  REQUIRE(out.ok());
  CHECK(out->pages_stored == 2);
  CHECK(out->already_present_tokens == 8);
  CHECK(Fetch(*ns, t, FetchFormat::kRaw) == bytes);
}

TEST_CASE("Placed upload: destroyed before accepting, it gives the slots back",
          "[namespace][placed]") {
  auto tier = std::make_shared<HostArenaTier>(1 << 20);
  auto ns = MakeDevice(tier);
  const uint32_t free_before = ns->Counters().free_pages;
  {
    auto up = BeginPlaced(*ns, Seq(1, 3 * 4));
    REQUIRE(up.ok());
    CHECK(ns->Counters().free_pages == free_before - 3);
    CHECK(ns->Counters().uploads_in_flight == 1);
  }
  CHECK(ns->Counters().free_pages == free_before);
  CHECK(ns->Counters().uploads_in_flight == 0);
  CHECK(ns->CheckInvariants().ok());
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
