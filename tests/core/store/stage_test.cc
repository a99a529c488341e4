// Namespace::StageLeaseOnDevice on the CPU, over a stand-in device tier
// whose "arena" is host memory (tests/host_arena_tier.h): a lease's cold
// pages (host-compressed, disk) come back into device slots byte-exact,
// become raw there with the lease following their new handles, and
// DevicePagesOfLease then points at them. Not enough free slots, a host
// pool, an unknown lease and a corrupt disk file are errors that leave no
// slot reserved. The GPU decode into slots is tests/cuda/gpu_daemon_e2e.cc.
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

struct DeviceNs {
  DeviceNs(uint32_t pool_pages, uint64_t host_budget, std::string disk = "",
           bool gpu_checksums = true) {
    tier = std::make_shared<HostArenaTier>(1 << 20, gpu_checksums);
    NamespaceConfig c = Config(host_budget, std::move(disk));
    c.device_tier = tier;
    auto pool = tier->CreatePool(c.geometry.PageBytes(), pool_pages);
    REQUIRE(pool.ok());
    auto created = Namespace::Create(std::move(c), *std::move(pool));
    INFO(created.status().ToString());
    REQUIRE(created.ok());
    ns = *created;
  }
  // The bytes the lease's pages hold in the arena, in order.
  std::string LeaseBytes(uint64_t lease) {
    DeviceIpcExport e = *tier->ExportIpc();
    auto where = ns->DevicePagesOfLease(lease, e.arena_base, e.arena_bytes);
    INFO(where.status().ToString());
    REQUIRE(where.ok());
    std::string out;
    for (const Namespace::DevicePage& p : where->pages) {
      out.append(reinterpret_cast<const char*>(tier->base() + p.offset),
                 p.bytes);
    }
    return out;
  }
  std::shared_ptr<HostArenaTier> tier;
  std::shared_ptr<Namespace> ns;
};

Namespace::MatchOutcome Lock(Namespace& ns, const std::vector<Token>& t) {
  auto m = ns.Match(t, /*lock=*/true, absl::ZeroDuration());
  REQUIRE(m.ok());
  REQUIRE(m->lease_id != 0);
  return *m;
}

TEST_CASE("stage_cold: host-compressed pages come back into device slots",
          "[namespace][stage]") {
  for (bool gpu_checksums : {true, false}) {
    INFO("tier checksums: " << gpu_checksums);
    DeviceNs d(8, 1 << 20, "", gpu_checksums);
    const std::string a = Pages(3, 21);
    Insert(*d.ns, Seq(0, 12), a);
    REQUIRE(*d.ns->tiers().DemoteAll(Tier::kHostCompressed) == 3);
    const Namespace::MatchOutcome m = Lock(*d.ns, Seq(0, 12));
    REQUIRE(m.tiers == std::vector<Tier>(3, Tier::kHostCompressed));
    // Before staging the lease has no device pages.
    DeviceIpcExport e = *d.tier->ExportIpc();
    CHECK(absl::IsFailedPrecondition(
        d.ns->DevicePagesOfLease(m.lease_id, e.arena_base, e.arena_bytes)
            .status()));
    absl::StatusOr<uint32_t> staged = d.ns->StageLeaseOnDevice(m.lease_id);
    INFO(staged.status().ToString());
    REQUIRE(staged.ok());
    CHECK(*staged == 3);
    CHECK(d.LeaseBytes(m.lease_id) == a);
    // Raw again with new handles, which the lease follows; a Fetch serves
    // them from the pool with their checksums (checked by Fetch).
    const NamespaceStats k = d.ns->Counters();
    CHECK(k.tiers[0].pages == 3);
    CHECK(k.tiers[1].pages == 0);
    CHECK(k.promoted_pages == 3);
    auto pinned = d.ns->PinLease(m.lease_id, 0, 0);
    REQUIRE(pinned.ok());
    for (size_t i = 0; i < 3; ++i) {
      CHECK(pinned->tier(i) == Tier::kRaw);
      CHECK(pinned->handle(i) != m.pages[i]);
    }
    CHECK(Fetch(*d.ns, Seq(0, 12), FetchFormat::kRaw) == a);
    // Nothing left to stage.
    CHECK(*d.ns->StageLeaseOnDevice(m.lease_id) == 0);
    CHECK(d.tier->checksummed_pages() == 0);  // CPU-decoded: hashed on host
    REQUIRE(d.ns->Release(m.lease_id).ok());
    CHECK(d.ns->CheckInvariants().ok());
  }
}

TEST_CASE("stage_cold: disk pages and a partly cold lease",
          "[namespace][stage]") {
  TempDir dir;
  const uint64_t pb = Geo().PageBytes();
  DeviceNs d(8, 2 * pb, dir.path);
  const std::string a = Pages(4, 22);
  Insert(*d.ns, Seq(0, 16), a);
  REQUIRE(*d.ns->tiers().DemoteAll(Tier::kDisk) > 0);
  // The first page raw again (an insert that extends it on another branch
  // stores it raw from the bytes sent), the rest on disk.
  std::vector<Token> branch = Seq(0, 4);
  for (Token t : Seq(200, 4)) branch.push_back(t);
  Insert(*d.ns, branch, a.substr(0, pb) + Pages(1, 27));
  const Namespace::MatchOutcome m = Lock(*d.ns, Seq(0, 16));
  REQUIRE(m.tiers[0] == Tier::kRaw);
  REQUIRE(m.tiers[3] == Tier::kDisk);
  absl::StatusOr<uint32_t> staged = d.ns->StageLeaseOnDevice(m.lease_id);
  INFO(staged.status().ToString());
  REQUIRE(staged.ok());
  CHECK(*staged == 3);
  CHECK(d.LeaseBytes(m.lease_id) == a);
  CHECK(d.ns->Counters().tiers[2].pages == 0);
  REQUIRE(d.ns->Release(m.lease_id).ok());
  CHECK(d.ns->CheckInvariants().ok());
}

TEST_CASE("stage_cold: too few free slots is an error naming stage_cold",
          "[namespace][stage]") {
  const uint64_t pb = Geo().PageBytes();
  DeviceNs d(4, 8 * pb);
  const std::string a = Pages(2, 23), b = Pages(4, 24);
  Insert(*d.ns, Seq(0, 8), a);
  REQUIRE(*d.ns->tiers().DemoteAll(Tier::kHostCompressed) == 2);
  Insert(*d.ns, Seq(100, 16), b);  // fills the pool
  const Namespace::MatchOutcome hot = Lock(*d.ns, Seq(100, 16));
  const Namespace::MatchOutcome cold = Lock(*d.ns, Seq(0, 8));
  const uint64_t free_before = d.ns->Counters().free_pages;
  // The pool's pages are all leased: no room can be made.
  absl::StatusOr<uint32_t> staged = d.ns->StageLeaseOnDevice(cold.lease_id);
  INFO(staged.status().ToString());
  CHECK(absl::IsFailedPrecondition(staged.status()));
  CHECK(absl::StartsWith(staged.status().message(), "stage_cold: 2 pages"));
  CHECK(d.ns->Counters().free_pages == free_before);
  CHECK(d.ns->Counters().tiers[1].pages == 2);
  // Once the other lease is gone, room is made by demoting its pages.
  REQUIRE(d.ns->Release(hot.lease_id).ok());
  staged = d.ns->StageLeaseOnDevice(cold.lease_id);
  REQUIRE(staged.ok());
  CHECK(*staged == 2);
  CHECK(d.LeaseBytes(cold.lease_id) == a);
  CHECK(d.ns->CheckInvariants().ok());
}

TEST_CASE("stage_cold: errors leave nothing reserved", "[namespace][stage]") {
  SECTION("a host pool") {
    auto ns = Make(Config(1 << 20), 8);
    Insert(*ns, Seq(0, 4), Pages(1, 25));
    const Namespace::MatchOutcome m = Lock(*ns, Seq(0, 4));
    absl::Status s = ns->StageLeaseOnDevice(m.lease_id).status();
    CHECK(absl::IsFailedPrecondition(s));
    CHECK(absl::StartsWith(s.message(), "namespace: 't' keeps its pages"));
  }
  SECTION("an unknown lease") {
    DeviceNs d(8, 1 << 20);
    absl::Status s = d.ns->StageLeaseOnDevice(77).status();
    CHECK(absl::IsNotFound(s));
    CHECK(absl::StartsWith(s.message(), "lease_id: "));
  }
  SECTION("a corrupt disk file: DataLoss naming the page, which is dropped") {
    TempDir dir;
    const uint64_t pb = Geo().PageBytes();
    DeviceNs d(8, pb, dir.path);
    Insert(*d.ns, Seq(0, 8), Pages(2, 26));
    REQUIRE(*d.ns->tiers().DemoteAll(Tier::kDisk) > 0);
    for (const auto& f : PageFiles(dir.path)) FlipByte(f, 20);
    const Namespace::MatchOutcome m = Lock(*d.ns, Seq(0, 8));
    const uint64_t free_before = d.ns->Counters().free_pages;
    absl::Status s = d.ns->StageLeaseOnDevice(m.lease_id).status();
    INFO(s.ToString());
    CHECK(absl::IsDataLoss(s));
    CHECK(absl::StartsWith(s.message(), "page 0x"));
    CHECK(d.ns->Counters().free_pages == free_before);
    REQUIRE(d.ns->Release(m.lease_id).ok());
    CHECK(d.ns->CheckInvariants().ok());
  }
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
