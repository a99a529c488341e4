// DeviceInsert (same-host insert into device slots) on the CPU, through the
// SDK's Client::BeginDeviceInsert and the raw stub, against a daemon whose
// device tier is host memory (tests/host_arena_tier.h), so the test writes
// the pages where the slots say, as a client's IPC copy would. Round trip,
// append after a cached prefix, a checksum mismatch, abort by the client,
// the TTL, and every request error (and whether the layout insert falls
// back on it: client::DeviceInsertUnavailable); slots always go back. The
// CUDA IPC part is tests/cuda/gpu_daemon_e2e.cc on the GPU machine.
#include <grpcpp/grpcpp.h>
#include <xxh3.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "kvharbor/v1/kvharbor.grpc.pb.h"
#include "tests/server/ipc_daemon.h"

namespace kvharbor {
namespace testing {
namespace {

std::vector<uint64_t> Sums(const std::vector<uint8_t>& pages, uint32_t first) {
  std::vector<uint64_t> out;
  for (size_t o = first * kPageBytes; o < pages.size(); o += kPageBytes) {
    out.push_back(XXH3_64bits(pages.data() + o, kPageBytes));
  }
  return out;
}

// Writes pages [slots.first_page, n) of `pages` where the slots say.
void Place(IpcDaemon& d, const client::DeviceInsertSlots& slots,
           const std::vector<uint8_t>& pages) {
  for (size_t i = 0; i < slots.slots.size(); ++i) {
    REQUIRE(slots.slots[i].bytes == kPageBytes);
    REQUIRE(slots.slots[i].offset + kPageBytes <= slots.arena_bytes);
    std::memcpy(d.tier->mutable_base() + slots.slots[i].offset,
                pages.data() + (slots.first_page + i) * kPageBytes, kPageBytes);
  }
}

uint64_t FreePages(Client& c, const std::string& ns) {
  absl::StatusOr<client::Stats> s = c.Stats(ns);
  REQUIRE(s.ok());
  return s->namespaces[0].free_pages;
}

// Polls until `ns` has `pages` free pages again (an abort the daemon sees
// when the stream's cancel reaches it).
bool WaitFree(Client& c, const std::string& ns, uint64_t pages) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (FreePages(c, ns) != pages) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

TEST_CASE("DeviceInsert: pages written into the slots are stored",
          "[server][ipc][device_insert]") {
  IpcDaemon d(/*allow_ipc=*/true);
  REQUIRE(d.c->CreateNamespace(Spec("ns", 8)).ok());
  const auto tokens = TokenRange(3 * kPageSize, 10);
  const auto pages = RandomBytes(3 * kPageBytes, 1);
  absl::StatusOr<std::unique_ptr<client::DeviceUpload>> up =
      d.c->BeginDeviceInsert("ns", tokens);
  INFO(up.status().ToString());
  REQUIRE(up.ok());
  const client::DeviceInsertSlots& s = (*up)->slots();
  CHECK(s.ipc_handle == std::string(64, 'h'));
  CHECK(s.device_uuid == std::string(16, 'u'));
  CHECK(s.first_page == 0);
  REQUIRE(s.slots.size() == 3);
  CHECK(s.expiry > absl::Now());
  CHECK(FreePages(*d.c, "ns") == 5);  // reserved while the insert is open
  Place(d, s, pages);
  absl::StatusOr<client::InsertResult> r = (*up)->Commit(Sums(pages, 0));
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 3);
  CHECK(d.tier->checksummed_pages() == 3);  // hashed by the tier ("GPU")
  const client::Lease l = Lock(*d.c, "ns", tokens);
  CHECK(l.matched_tokens == tokens.size());
  absl::StatusOr<std::vector<std::vector<uint8_t>>> f =
      d.c->Fetch("ns", client::FetchSource::FromLease(l.id));
  REQUIRE(f.ok());
  std::vector<uint8_t> joined;
  for (const auto& p : *f) joined.insert(joined.end(), p.begin(), p.end());
  CHECK(joined == pages);
  // Committed: a second commit is refused by the SDK.
  CHECK(absl::IsFailedPrecondition((*up)->Commit(Sums(pages, 0)).status()));
}

TEST_CASE("DeviceInsert: a cached prefix is skipped",
          "[server][ipc][device_insert]") {
  IpcDaemon d(/*allow_ipc=*/true);
  REQUIRE(d.c->CreateNamespace(Spec("ns", 8)).ok());
  const auto tokens = TokenRange(4 * kPageSize, 10);
  const auto pages = RandomBytes(4 * kPageBytes, 2);
  REQUIRE(d.c->Insert("ns", absl::MakeConstSpan(tokens).first(2 * kPageSize),
                      absl::MakeConstSpan(pages).first(2 * kPageBytes),
                      kPageBytes)
              .ok());
  auto up = d.c->BeginDeviceInsert("ns", tokens);
  REQUIRE(up.ok());
  REQUIRE((*up)->slots().first_page == 2);
  REQUIRE((*up)->slots().slots.size() == 2);
  Place(d, (*up)->slots(), pages);
  auto r = (*up)->Commit(Sums(pages, 2));
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 2);
  CHECK(r->already_present_tokens == 2 * kPageSize);
}

TEST_CASE("DeviceInsert: a wrong page is DATA_LOSS and stores nothing",
          "[server][ipc][device_insert]") {
  IpcDaemon d(/*allow_ipc=*/true);
  REQUIRE(d.c->CreateNamespace(Spec("ns", 8)).ok());
  const auto tokens = TokenRange(3 * kPageSize, 10);
  auto pages = RandomBytes(3 * kPageBytes, 3);
  auto up = d.c->BeginDeviceInsert("ns", tokens);
  REQUIRE(up.ok());
  const std::vector<uint64_t> sums = Sums(pages, 0);
  pages[kPageBytes + 5] ^= 1;  // what lands in slot 1 is not what was hashed
  Place(d, (*up)->slots(), pages);
  ExpectError((*up)->Commit(sums).status(), absl::StatusCode::kDataLoss,
              "commit.page_checksums[1]: page 1 ");
  CHECK(FreePages(*d.c, "ns") == 8);
  CHECK(d.c->Match("ns", tokens)->matched_tokens == 0);
}

TEST_CASE("DeviceInsert: an abort or a TTL gives the slots back",
          "[server][ipc][device_insert]") {
  IpcDaemon d(/*allow_ipc=*/true, /*reap_interval=*/absl::Milliseconds(20));
  REQUIRE(d.c->CreateNamespace(Spec("ns", 8)).ok());
  const auto tokens = TokenRange(2 * kPageSize, 10);
  SECTION("the client destroys the upload") {
    {
      auto up = d.c->BeginDeviceInsert("ns", tokens);
      REQUIRE(up.ok());
      CHECK(FreePages(*d.c, "ns") == 6);
    }
    CHECK(WaitFree(*d.c, "ns", 8));
  }
  SECTION("Abort, then Commit") {
    auto up = d.c->BeginDeviceInsert("ns", tokens);
    REQUIRE(up.ok());
    (*up)->Abort();
    CHECK(WaitFree(*d.c, "ns", 8));
    CHECK(absl::IsFailedPrecondition((*up)->Commit({1, 2}).status()));
  }
  SECTION("the TTL runs out") {
    const auto pages = RandomBytes(2 * kPageBytes, 4);
    auto up = d.c->BeginDeviceInsert("ns", tokens, absl::Milliseconds(50));
    REQUIRE(up.ok());
    CHECK((*up)->slots().expiry < absl::Now() + absl::Seconds(1));
    CHECK(WaitFree(*d.c, "ns", 8));
    ExpectError((*up)->Commit(Sums(pages, 0)).status(),
                absl::StatusCode::kDeadlineExceeded, "begin.ttl_ms: ");
    CHECK(d.c->Match("ns", tokens)->matched_tokens == 0);
  }
}

TEST_CASE("DeviceInsert: request and configuration errors",
          "[server][ipc][device_insert]") {
  SECTION("a daemon without a device tier") {
    auto daemon = StartTestDaemon();
    auto c = Connect(*daemon);
    REQUIRE(c->CreateNamespace(Spec("ns", 4)).ok());
    const absl::Status s =
        c->BeginDeviceInsert("ns", TokenRange(kPageSize, 1)).status();
    ExpectError(s, absl::StatusCode::kFailedPrecondition,
                "store.device_pool_bytes: ");
    // The layout insert then takes the Insert stream ("pinned").
    CHECK(client::DeviceInsertUnavailable(s));
  }
  SECTION("IPC not allowed") {
    IpcDaemon d(/*allow_ipc=*/false);
    REQUIRE(d.c->CreateNamespace(Spec("ns", 4)).ok());
    const absl::Status s =
        d.c->BeginDeviceInsert("ns", TokenRange(kPageSize, 1)).status();
    ExpectError(s, absl::StatusCode::kFailedPrecondition, "store.allow_ipc: ");
    CHECK(client::DeviceInsertUnavailable(s));
  }
  SECTION("bad requests name their field") {
    IpcDaemon d(/*allow_ipc=*/true);
    REQUIRE(d.c->CreateNamespace(Spec("ns", 4)).ok());
    ExpectError(
        d.c->BeginDeviceInsert("missing", TokenRange(kPageSize, 1)).status(),
        absl::StatusCode::kNotFound, "begin.namespace: ");
    ExpectError(
        d.c->BeginDeviceInsert("ns", TokenRange(kPageSize + 1, 1)).status(),
        absl::StatusCode::kInvalidArgument, "begin.token_ids: ");
    ExpectError(d.c->BeginDeviceInsert("ns", {}).status(),
                absl::StatusCode::kInvalidArgument, "begin.token_ids: ");
    ExpectError(
        d.c->BeginDeviceInsert("ns", TokenRange(8 * kPageSize, 1)).status(),
        absl::StatusCode::kResourceExhausted, "");
    // Errors the Insert stream would fail on too: no fallback.
    for (const auto& tokens :
         {TokenRange(kPageSize + 1, 1), TokenRange(8 * kPageSize, 1)}) {
      CHECK_FALSE(client::DeviceInsertUnavailable(
          d.c->BeginDeviceInsert("ns", tokens).status()));
    }
    CHECK_FALSE(client::DeviceInsertUnavailable(
        d.c->BeginDeviceInsert("missing", TokenRange(kPageSize, 1)).status()));
    auto up = d.c->BeginDeviceInsert("ns", TokenRange(2 * kPageSize, 1));
    REQUIRE(up.ok());
    ExpectError((*up)->Commit({1}).status(), absl::StatusCode::kInvalidArgument,
                "commit.page_checksums: ");
    CHECK(WaitFree(*d.c, "ns", 4));
  }
  SECTION("the stream out of order (raw stub)") {
    IpcDaemon d(/*allow_ipc=*/true);
    REQUIRE(d.c->CreateNamespace(Spec("ns", 4)).ok());
    auto stub = v1::KvHarbor::NewStub(grpc::CreateChannel(
        d.daemon->address(), grpc::InsecureChannelCredentials()));
    {
      grpc::ClientContext ctx;
      auto stream = stub->DeviceInsert(&ctx);
      v1::DeviceInsertRequest req;
      req.mutable_commit()->add_page_checksums(1);
      stream->Write(req);
      stream->WritesDone();
      const grpc::Status st = stream->Finish();
      CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
      CHECK(absl::StartsWith(st.error_message(), "commit: arrived before"));
    }
    {
      // Half-closed after the slots: the insert is aborted.
      grpc::ClientContext ctx;
      auto stream = stub->DeviceInsert(&ctx);
      v1::DeviceInsertRequest req;
      req.mutable_begin()->set_namespace_("ns");
      for (int32_t t : TokenRange(kPageSize, 3)) {
        req.mutable_begin()->add_token_ids(t);
      }
      REQUIRE(stream->Write(req));
      v1::DeviceInsertResponse resp;
      REQUIRE(stream->Read(&resp));
      CHECK(resp.slots().slots_size() == 1);
      stream->WritesDone();
      const grpc::Status st = stream->Finish();
      CHECK(st.error_code() == grpc::StatusCode::ABORTED);
      CHECK(absl::StartsWith(st.error_message(), "commit: the stream ended"));
      CHECK(WaitFree(*d.c, "ns", 4));
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
