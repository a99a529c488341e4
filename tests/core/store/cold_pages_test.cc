#include "core/store/cold_pages.h"

#include <xxh3.h>

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/match.h"

namespace kvharbor {
namespace {

ColdPages::Page HostPage(const std::string& bytes, uint64_t position) {
  ColdPages::Page p;
  p.tier = Tier::kHostCompressed;
  p.buffer = std::make_shared<const std::string>(bytes);
  p.stored_bytes = bytes.size();
  p.first_position = position;
  p.checksum = XXH3_64bits(bytes.data(), bytes.size());
  return p;  // no codec: counted as "unknown"
}

// An index as Check sees it: each cold page's tier.
struct FakeIndex {
  std::map<PageHandle, Tier> tiers;
  absl::StatusOr<Tier> TierOf(PageHandle h) const {
    auto it = tiers.find(h);
    if (it == tiers.end()) return absl::NotFoundError("not indexed");
    return it->second;
  }
  uint64_t Pages(Tier t) const {
    uint64_t n = 0;
    for (const auto& [h, tier] : tiers) n += tier == t;
    return n;
  }
};

// The pool and calibrations a ColdPages reads fetched pages with; these
// tests use only its table.
struct Parts {
  Parts() : calibrations(config) {
    auto p = HostPagePool::Create(4096, 4);
    REQUIRE(p.ok());
    pool = *std::move(p);
  }
  NamespaceConfig config;
  NamespaceCalibrations calibrations;
  std::unique_ptr<PagePool> pool;
};

absl::Status CheckAgainst(const ColdPages& cold, const FakeIndex& index) {
  return cold.Check([&](PageHandle h) { return index.TierOf(h); },
                    [&](Tier t) { return index.Pages(t); });
}

TEST_CASE("ColdPages: add, find, count and drop host pages") {
  Parts parts;
  ColdPages cold(nullptr, parts.pool.get(), parts.calibrations);
  FakeIndex index;
  CHECK(cold.empty());
  CHECK_FALSE(cold.Find(1).has_value());
  cold.Add(1, HostPage("abcd", 0));
  cold.Add(2, HostPage("efghij", 4));
  index.tiers = {{1, Tier::kHostCompressed}, {2, Tier::kHostCompressed}};
  CHECK_FALSE(cold.empty());
  CHECK(cold.Contains(2));
  const std::optional<ColdPages::Page> p = cold.Find(2);
  REQUIRE(p.has_value());
  CHECK(*p->buffer == "efghij");
  CHECK(p->first_position == 4);
  CHECK(cold.bytes(Tier::kHostCompressed) == 10);
  CHECK(cold.bytes(Tier::kDisk) == 0);
  REQUIRE(cold.ByCodec().size() == 1);
  CHECK(cold.ByCodec()[0].codec == "unknown");
  CHECK(cold.ByCodec()[0].pages == 2);
  CHECK(cold.ByCodec()[0].bytes == 10);
  CHECK(cold.memory_bytes() >= 10);
  REQUIRE(CheckAgainst(cold, index).ok());

  cold.Drop(1);
  cold.Drop(1);  // not cold any more: nothing happens
  index.tiers.erase(1);
  CHECK_FALSE(cold.Contains(1));
  CHECK(cold.bytes(Tier::kHostCompressed) == 6);
  CHECK(cold.ByCodec()[0].pages == 1);
  CHECK(CheckAgainst(cold, index).ok());
  // A reader keeps the buffer of a dropped page.
  const std::shared_ptr<const std::string> kept = cold.Find(2)->buffer;
  cold.Drop(2);
  CHECK(*kept == "efghij");
  CHECK(cold.ByCodec().empty());
  CHECK(cold.empty());
}

TEST_CASE("ColdPages: Check finds disagreements") {
  Parts parts;
  ColdPages cold(nullptr, parts.pool.get(), parts.calibrations);
  FakeIndex index;
  cold.Add(1, HostPage("abcd", 0));
  // Not in the index.
  absl::Status s = CheckAgainst(cold, index);
  CHECK(absl::IsInternal(s));
  CHECK(absl::StrContains(s.message(), "not indexed"));
  // In the index in another tier.
  index.tiers[1] = Tier::kDisk;
  CHECK(absl::IsInternal(CheckAgainst(cold, index)));
  index.tiers[1] = Tier::kHostCompressed;
  CHECK(CheckAgainst(cold, index).ok());
  // The index has a cold page the table does not.
  index.tiers[9] = Tier::kHostCompressed;
  s = CheckAgainst(cold, index);
  CHECK(absl::IsInternal(s));
  CHECK(absl::StrContains(s.message(), "index says 2 pages"));
  index.tiers.erase(9);
  // A buffer whose checksum does not match.
  ColdPages::Page bad = HostPage("wxyz", 8);
  bad.checksum ^= 1;
  cold.Add(3, bad);
  index.tiers[3] = Tier::kHostCompressed;
  s = CheckAgainst(cold, index);
  CHECK(absl::IsInternal(s));
  CHECK(absl::StrContains(s.message(), "does not fit its tier"));
}

TEST_CASE("ColdPages: MoveTo moves bytes between tiers; file ids") {
  Parts parts;
  ColdPages cold(nullptr, parts.pool.get(), parts.calibrations);
  CHECK(cold.NextFileId() == 1);
  CHECK(cold.NextFileId() == 2);
  cold.SetNextFileId(40);
  const uint64_t id = cold.NextFileId();
  CHECK(id == 40);
  cold.Add(1, HostPage("abcdef", 0));
  cold.MoveTo(1, Tier::kDisk, id);
  CHECK(cold.bytes(Tier::kHostCompressed) == 0);
  CHECK(cold.bytes(Tier::kDisk) == 6);
  const std::optional<ColdPages::Page> p = cold.Find(1);
  REQUIRE(p.has_value());
  CHECK(p->tier == Tier::kDisk);
  CHECK(p->buffer == nullptr);
  CHECK(p->file_id == 40);
  // Without a disk tier a disk page is an invariant violation.
  FakeIndex index;
  index.tiers[1] = Tier::kDisk;
  const absl::Status s = CheckAgainst(cold, index);
  CHECK(absl::IsInternal(s));
  CHECK(absl::StrContains(s.message(), "without a disk tier"));
}

}  // namespace
}  // namespace kvharbor
