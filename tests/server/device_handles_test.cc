// GetDeviceHandles (same-host zero copy) on the CPU: every error the RPC
// states, and -- with a device tier whose "arena" is host memory, so the
// test can read what the offsets point at -- that the offsets it returns
// address exactly the leased pages' bytes, and that the lease keeps them
// there. The CUDA IPC part (another process mapping a real arena) is
// tests/cuda/device_ipc_e2e.cc on the GPU machine.
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvharbor/client.h"
#include "server/daemon/daemon.h"
#include "spdlog/spdlog.h"
#include "tests/client/client_test_util.h"
#include "tests/server/ipc_daemon.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace testing {
namespace {

TEST_CASE("GetDeviceHandles: offsets address the leased pages in the arena",
          "[server][ipc]") {
  IpcDaemon d(/*allow_ipc=*/true);
  REQUIRE(d.c->CreateNamespace(Spec("first", 4)).ok());
  REQUIRE(d.c->CreateNamespace(Spec("second", 4)).ok());
  const auto tokens = TokenRange(3 * kPageSize, 10);
  const auto pages = RandomBytes(3 * kPageBytes, 7);
  // The same prefix in two namespaces: their pages lie in different pools.
  REQUIRE(d.c->Insert("first", tokens, pages, kPageBytes).ok());
  REQUIRE(d.c->Insert("second", tokens, pages, kPageBytes).ok());
  const client::Lease l1 = Lock(*d.c, "first", tokens);
  const client::Lease l2 = Lock(*d.c, "second", tokens);

  absl::StatusOr<client::DeviceHandles> h1 =
      d.c->GetDeviceHandles("first", l1.id);
  absl::StatusOr<client::DeviceHandles> h2 =
      d.c->GetDeviceHandles("second", l2.id);
  INFO(h1.status().ToString() + " / " + h2.status().ToString());
  REQUIRE(h1.ok());
  REQUIRE(h2.ok());
  CHECK(h1->ipc_handle == std::string(64, 'h'));
  CHECK(h2->ipc_handle == h1->ipc_handle);  // one arena, one handle
  CHECK(h1->device == 3);
  CHECK(h1->device_uuid == std::string(16, 'u'));
  CHECK(h1->arena_bytes == 1 << 20);
  CHECK(absl::ToUnixMillis(h1->lease_expiry) == absl::ToUnixMillis(l1.expiry));
  for (const client::DeviceHandles* h : {&*h1, &*h2}) {
    const client::Lease& l = h == &*h1 ? l1 : l2;
    REQUIRE(h->pages.size() == 3);
    for (size_t i = 0; i < 3; ++i) {
      INFO("page " << i);
      CHECK(h->pages[i].handle == l.pages[i]);
      CHECK(h->pages[i].bytes == kPageBytes);
      REQUIRE(h->pages[i].offset + kPageBytes <= h->arena_bytes);
      CHECK(std::memcmp(d.tier->base() + h->pages[i].offset,
                        pages.data() + i * kPageBytes, kPageBytes) == 0);
    }
  }
  CHECK(h1->pages[0].offset != h2->pages[0].offset);

  // The lease keeps its pages in place: inserts that fill the pool (the
  // second finds no unleased page to make room with), Evict and Demote
  // neither move nor overwrite them.
  REQUIRE(d.c->Insert("first", TokenRange(kPageSize, 900),
                      RandomBytes(kPageBytes, 8), kPageBytes)
              .ok());
  (void)d.c->Insert("first", TokenRange(2 * kPageSize, 950),
                    RandomBytes(2 * kPageBytes, 9), kPageBytes);
  CHECK(d.c->EvictAll("first").ok());
  CHECK(d.c->Demote("first", client::Tier::kHostCompressed).ok());
  absl::StatusOr<client::DeviceHandles> again =
      d.c->GetDeviceHandles("first", l1.id);
  REQUIRE(again.ok());
  for (size_t i = 0; i < 3; ++i) {
    CHECK(again->pages[i].offset == h1->pages[i].offset);
    CHECK(std::memcmp(d.tier->base() + again->pages[i].offset,
                      pages.data() + i * kPageBytes, kPageBytes) == 0);
  }

  // After Release the request fails; the pages may now move.
  REQUIRE(d.c->Release(l1.id).ok());
  ExpectError(d.c->GetDeviceHandles("first", l1.id).status(),
              absl::StatusCode::kNotFound, "lease_id: ");
  REQUIRE(d.c->Release(l2.id).ok());
}

TEST_CASE("GetDeviceHandles: pages outside the device tier are named",
          "[server][ipc]") {
  IpcDaemon d(/*allow_ipc=*/true);
  REQUIRE(d.c->CreateNamespace(Spec("ns", 4)).ok());
  const auto tokens = TokenRange(2 * kPageSize, 10);
  REQUIRE(d.c->Insert("ns", tokens, RandomBytes(2 * kPageBytes, 1), kPageBytes)
              .ok());
  // Unlocked pages go to the host-compressed tier; a lease taken afterwards
  // holds cold pages, which have no device address.
  REQUIRE(d.c->Demote("ns", client::Tier::kHostCompressed).ok());
  const client::Lease l = Lock(*d.c, "ns", tokens);
  REQUIRE(l.page_tiers[0] == client::Tier::kHostCompressed);
  absl::Status s = d.c->GetDeviceHandles("ns", l.id).status();
  ExpectError(s, absl::StatusCode::kFailedPrecondition, "pages[0]: ");
  CHECK(absl::StrContains(s.message(), "host_compressed"));
  // Fetch still serves them.
  CHECK(d.c->Fetch("ns", client::FetchSource::FromLease(l.id)).ok());
}

TEST_CASE("GetDeviceHandles: stage_cold brings cold pages onto the device",
          "[server][ipc]") {
  IpcDaemon d(/*allow_ipc=*/true);
  REQUIRE(d.c->CreateNamespace(Spec("ns", 6)).ok());
  const auto tokens = TokenRange(3 * kPageSize, 10);
  const auto pages = RandomBytes(3 * kPageBytes, 4);
  REQUIRE(d.c->Insert("ns", tokens, pages, kPageBytes).ok());
  REQUIRE(d.c->Demote("ns", client::Tier::kHostCompressed).ok());
  const client::Lease l = Lock(*d.c, "ns", tokens);
  REQUIRE(l.page_tiers[2] == client::Tier::kHostCompressed);
  client::DeviceHandlesOptions stage;
  stage.stage_cold = true;
  absl::StatusOr<client::DeviceHandles> h =
      d.c->GetDeviceHandles("ns", l.id, stage);
  INFO(h.status().ToString());
  REQUIRE(h.ok());
  REQUIRE(h->pages.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    INFO("page " << i);
    // A new handle (the page moved into a slot), the lease's bytes there.
    CHECK(h->pages[i].handle != l.pages[i]);
    CHECK(std::memcmp(d.tier->base() + h->pages[i].offset,
                      pages.data() + i * kPageBytes, kPageBytes) == 0);
  }
  // The lease follows the new handles: a plain call now answers too, and
  // the pages are raw and counted as promoted.
  absl::StatusOr<client::DeviceHandles> again =
      d.c->GetDeviceHandles("ns", l.id);
  REQUIRE(again.ok());
  CHECK(again->pages[0].offset == h->pages[0].offset);
  absl::StatusOr<client::Stats> st = d.c->Stats("ns");
  REQUIRE(st.ok());
  CHECK(st->namespaces[0].promoted_pages == 3);
  REQUIRE(d.c->Release(l.id).ok());

  // Too few slots: every other page leased and the namespace full.
  const auto more = TokenRange(6 * kPageSize, 500);
  REQUIRE(d.c->Demote("ns", client::Tier::kHostCompressed).ok());
  const client::Lease cold = Lock(*d.c, "ns", tokens);
  REQUIRE(
      d.c->Insert("ns", more, RandomBytes(6 * kPageBytes, 5), kPageBytes).ok());
  const client::Lease hot = Lock(*d.c, "ns", more);
  ExpectError(d.c->GetDeviceHandles("ns", cold.id, stage).status(),
              absl::StatusCode::kFailedPrecondition, "stage_cold: 3 pages");
  REQUIRE(d.c->Release(hot.id).ok());
  CHECK(d.c->GetDeviceHandles("ns", cold.id, stage).ok());
}

TEST_CASE("GetDeviceHandles: request and configuration errors",
          "[server][ipc]") {
  SECTION("a daemon without a device tier") {
    auto daemon = StartTestDaemon();
    auto c = Connect(*daemon);
    REQUIRE(c->CreateNamespace(Spec("ns", 4)).ok());
    const auto tokens = TokenRange(kPageSize, 1);
    REQUIRE(
        c->Insert("ns", tokens, RandomBytes(kPageBytes, 1), kPageBytes).ok());
    const client::Lease l = Lock(*c, "ns", tokens);
    ExpectError(c->GetDeviceHandles("ns", l.id).status(),
                absl::StatusCode::kFailedPrecondition,
                "store.device_pool_bytes: this daemon has no device tier");
  }
  SECTION("IPC not allowed (the default)") {
    IpcDaemon d(/*allow_ipc=*/false);
    REQUIRE(d.c->CreateNamespace(Spec("ns", 4)).ok());
    const auto tokens = TokenRange(kPageSize, 1);
    REQUIRE(
        d.c->Insert("ns", tokens, RandomBytes(kPageBytes, 1), kPageBytes).ok());
    const client::Lease l = Lock(*d.c, "ns", tokens);
    ExpectError(d.c->GetDeviceHandles("ns", l.id).status(),
                absl::StatusCode::kFailedPrecondition, "store.allow_ipc: ");
  }
  SECTION("bad lease or namespace") {
    IpcDaemon d(/*allow_ipc=*/true);
    REQUIRE(d.c->CreateNamespace(Spec("ns", 4)).ok());
    REQUIRE(d.c->CreateNamespace(Spec("other", 4)).ok());
    const auto tokens = TokenRange(kPageSize, 1);
    REQUIRE(
        d.c->Insert("ns", tokens, RandomBytes(kPageBytes, 1), kPageBytes).ok());
    const client::Lease l = Lock(*d.c, "ns", tokens);
    ExpectError(d.c->GetDeviceHandles("ns", 0).status(),
                absl::StatusCode::kInvalidArgument, "lease_id: 0");
    ExpectError(d.c->GetDeviceHandles("ns", l.id + 12345).status(),
                absl::StatusCode::kNotFound, "lease_id: ");
    // A lease of another namespace is not found through this one.
    ExpectError(d.c->GetDeviceHandles("other", l.id).status(),
                absl::StatusCode::kNotFound, "lease_id: ");
    ExpectError(d.c->GetDeviceHandles("missing", l.id).status(),
                absl::StatusCode::kNotFound, "namespace: ");
    ExpectError(d.c->GetDeviceHandles("bad name!", l.id).status(),
                absl::StatusCode::kInvalidArgument, "namespace: ");
  }
}

TEST_CASE("GetDeviceHandles: an expired lease's pages are not described",
          "[server][ipc]") {
  IpcDaemon d(/*allow_ipc=*/true);
  REQUIRE(d.c->CreateNamespace(Spec("ns", 4)).ok());
  const auto tokens = TokenRange(kPageSize, 1);
  REQUIRE(
      d.c->Insert("ns", tokens, RandomBytes(kPageBytes, 1), kPageBytes).ok());
  absl::StatusOr<client::Lease> l =
      d.c->Match("ns", tokens, /*lock=*/true, absl::Milliseconds(50));
  REQUIRE(l.ok());
  REQUIRE(d.c->GetDeviceHandles("ns", l->id).ok());
  absl::Status s;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  do {
    absl::SleepFor(absl::Milliseconds(20));
    s = d.c->GetDeviceHandles("ns", l->id).status();
  } while (s.ok() && absl::Now() < give_up);
  ExpectError(s, absl::StatusCode::kNotFound, "lease_id: ");
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
