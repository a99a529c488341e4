// The SDK on the bulk data plane (docs/data_plane.md): Fetch, FetchInto and
// FetchBulk over loopback TCP against a daemon with data_plane.listen,
// byte-exact for every connection count and a layer range; COMPRESSED
// fetches (FetchCompressed) carry the stream's codec buffers; DataPlaneMode
// kOff streams; a daemon without the plane streams and is not asked again
// for a while; bad options name the field.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvharbor/client.h"
#include "server/daemon/daemon.h"
#include "tests/client/client_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

constexpr uint32_t kPageSize = 16;

std::unique_ptr<Daemon> StartDaemon(bool plane) {
  DaemonOptions o;
  o.listen = "127.0.0.1:0";
  o.store.pool_budget_bytes = uint64_t{256} << 20;
  o.store.default_namespace_bytes = uint64_t{64} << 20;
  o.drain_timeout = absl::Seconds(2);
  if (plane) o.data_plane.listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  return *std::move(d);
}

struct Stored {
  std::vector<uint8_t> bytes;
  client::Lease lease;
  uint64_t page_bytes = 0;
};

Stored Store(Client& c, uint32_t pages) {
  Stored s;
  s.page_bytes = CreateNs(
      c, MakeSpec("ns", 4, 2, 64, kPageSize, client::DType::kBF16, 32 << 20));
  const auto tokens = TokenRange(pages * kPageSize, 7);
  s.bytes = RandomBytes(pages * s.page_bytes, 11);
  REQUIRE(c.Insert("ns", tokens, s.bytes, s.page_bytes).ok());
  absl::StatusOr<client::Lease> l = c.Match("ns", tokens, /*lock=*/true);
  REQUIRE(l.ok());
  REQUIRE(l->pages.size() == pages);
  s.lease = *l;
  return s;
}

TEST_CASE("SDK bulk plane: Fetch and FetchInto are byte-exact",
          "[client][bulk]") {
  std::unique_ptr<Daemon> d = StartDaemon(/*plane=*/true);
  for (uint32_t connections : {1u, 2u, 4u, 16u}) {
    INFO(connections << " connections");
    ClientOptions o;
    o.data_plane_connections = connections;
    std::unique_ptr<Client> c = Connect(*d, o);
    if (connections == 1) {
      Stored s = Store(*c, 37);
      std::vector<uint8_t> dst(s.bytes.size());
      absl::StatusOr<client::FetchResult> r =
          c->FetchInto("ns", client::FetchSource::FromLease(s.lease.id),
                       absl::MakeSpan(dst));
      REQUIRE(r.ok());
      CHECK(r->path == client::FetchPath::kBulk);
      CHECK(r->num_pages == 37);
      CHECK(r->handles == s.lease.pages);
      CHECK(dst == s.bytes);
      REQUIRE(c->Release(s.lease.id).ok());
    }
    absl::StatusOr<client::Lease> l =
        c->Match("ns", TokenRange(37 * kPageSize, 7), /*lock=*/true);
    REQUIRE(l.ok());
    absl::StatusOr<std::vector<std::vector<uint8_t>>> pages =
        c->Fetch("ns", client::FetchSource::FromLease(l->id));
    REQUIRE(pages.ok());
    REQUIRE(pages->size() == 37);
    const std::vector<uint8_t> want = RandomBytes(37 * pages->at(0).size(), 11);
    std::vector<uint8_t> got;
    for (const auto& p : *pages) got.insert(got.end(), p.begin(), p.end());
    CHECK(got == want);
    // A sub-range and a layer range through FetchBulk's own sink.
    client::BulkSink sink;
    sink.stripe_pages = 3;
    absl::Mutex mu;
    std::vector<std::vector<uint8_t>> by_page(10);
    uint64_t size = 0;
    sink.begin = [&](uint32_t n, uint64_t pb) {
      CHECK(n == 10);
      size = pb;
      for (auto& p : by_page) p.resize(pb);
      return absl::OkStatus();
    };
    sink.destination = [&](uint32_t i, uint64_t) -> absl::StatusOr<uint8_t*> {
      return by_page[i].data();
    };
    uint32_t done = 0;
    sink.done = [&](uint32_t) {
      absl::MutexLock lock(&mu);
      ++done;
      return absl::OkStatus();
    };
    absl::StatusOr<std::optional<client::FetchResult>> b = c->FetchBulk(
        "ns", client::FetchSource::FromLease(l->id, 5, 10).Layers(1, 3), sink);
    INFO(b.status().ToString());
    REQUIRE(b.ok());
    REQUIRE(b->has_value());
    CHECK(done == 10);
    // Geometry [K layers][V layers] per page: layers 1-2 of K, then of V.
    const uint64_t pb = pages->at(0).size(), half = pb / 2, layer = half / 4;
    CHECK(size == 4 * layer);
    for (uint32_t i = 0; i < 10; ++i) {
      const std::vector<uint8_t>& page = pages->at(5 + i);
      std::vector<uint8_t> expect(page.begin() + layer,
                                  page.begin() + 3 * layer);
      expect.insert(expect.end(), page.begin() + half + layer,
                    page.begin() + half + 3 * layer);
      CHECK(by_page[i] == expect);
    }
    REQUIRE(c->Release(l->id).ok());
  }
}

TEST_CASE("SDK bulk plane: Insert sends the pages on the plane",
          "[client][bulk]") {
  std::unique_ptr<Daemon> d = StartDaemon(/*plane=*/true);
  for (uint32_t connections : {1u, 4u}) {
    ClientOptions o;
    o.data_plane_connections = connections;
    std::unique_ptr<Client> c = Connect(*d, o);
    const std::string ns = absl::StrCat("ins", connections);
    const uint64_t pb = CreateNs(
        *c, MakeSpec(ns, 4, 2, 64, kPageSize, client::DType::kBF16, 32 << 20));
    const auto tokens = TokenRange(29 * kPageSize, 3);
    const std::vector<uint8_t> bytes = RandomBytes(29 * pb, connections);
    absl::StatusOr<client::InsertResult> r = c->Insert(ns, tokens, bytes, pb);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(r->data_plane);
    CHECK(r->pages_stored == 29);
    absl::StatusOr<client::Lease> l = c->Match(ns, tokens, /*lock=*/true);
    REQUIRE(l.ok());
    std::vector<uint8_t> back(bytes.size());
    ClientOptions off;
    off.data_plane = DataPlaneMode::kOff;
    std::unique_ptr<Client> streamed = Connect(*d, off);
    REQUIRE(streamed
                ->FetchInto(ns, client::FetchSource::FromLease(l->id),
                            absl::MakeSpan(back))
                .ok());
    CHECK(back == bytes);
    // The same again through a client with the plane off: streamed.
    REQUIRE(c->Release(l->id).ok());
    REQUIRE(c->EvictAll(ns).ok());
    absl::StatusOr<client::InsertResult> again =
        streamed->Insert(ns, tokens, bytes, pb);
    REQUIRE(again.ok());
    CHECK(!again->data_plane);
    CHECK(again->pages_stored == 29);
  }
}

TEST_CASE("SDK bulk plane: compressed fetches are the stream's pages",
          "[client][bulk]") {
  std::unique_ptr<Daemon> d = StartDaemon(/*plane=*/true);
  ClientOptions off;
  off.data_plane = DataPlaneMode::kOff;
  std::unique_ptr<Client> streamed = Connect(*d, off);
  client::NamespaceSpec spec =
      MakeSpec("cold", 4, 2, 64, kPageSize, client::DType::kBF16, 32 << 20);
  spec.host_compressed_bytes = 64 << 20;
  const uint64_t pb = CreateNs(*streamed, spec);
  // More pages than one stripe (64) on each of the 4 connections.
  const uint32_t n = 300;
  const auto tokens = TokenRange(n * kPageSize, 5);
  const std::vector<uint8_t> bytes = RandomBytes(n * pb, 9);
  REQUIRE(streamed->Insert("cold", tokens, bytes, pb).ok());
  REQUIRE(streamed->Demote("cold", client::Tier::kHostCompressed).ok());
  absl::StatusOr<client::Lease> l =
      streamed->Match("cold", tokens, /*lock=*/true);
  REQUIRE(l.ok());
  REQUIRE(l->pages.size() == n);
  const uint64_t plane_before = d->data_plane_bytes();
  absl::StatusOr<std::vector<client::CompressedPage>> want =
      streamed->FetchCompressed("cold", client::FetchSource::FromLease(l->id));
  REQUIRE(want.ok());
  CHECK(d->data_plane_bytes() == plane_before);  // the stream
  for (uint32_t connections : {1u, 4u, 16u}) {
    INFO(connections << " connections");
    ClientOptions o;
    o.data_plane_connections = connections;
    std::unique_ptr<Client> c = Connect(*d, o);
    const uint64_t before = d->data_plane_bytes();
    absl::StatusOr<std::vector<client::CompressedPage>> got =
        c->FetchCompressed("cold",
                           client::FetchSource::FromLease(l->id, 3, n - 3));
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    REQUIRE(got->size() == n - 3);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n - 3; ++i) {
      const client::CompressedPage& a = (*got)[i];
      const client::CompressedPage& b = (*want)[i + 3];
      CHECK(a.handle == b.handle);
      CHECK(a.tier == client::Tier::kHostCompressed);
      CHECK(a.codec == b.codec);
      CHECK(a.calibration_fingerprint == b.calibration_fingerprint);
      CHECK(a.buffer == b.buffer);
      sum += a.buffer.size();
    }
    CHECK(d->data_plane_bytes() - before == sum);  // every byte on the plane
    // Decoded, the pages are those inserted.
    absl::StatusOr<std::vector<uint8_t>> page0 =
        c->DecodePage("cold", (*got)[0]);
    REQUIRE(page0.ok());
    CHECK(std::equal(page0->begin(), page0->end(), bytes.begin() + 3 * pb));
  }
  // A sink that fails mid-way ends the fetch with its error; the pages
  // before it were handed over in order, and the daemon serves on.
  std::unique_ptr<Client> c = Connect(*d);
  uint32_t seen = 0;
  absl::StatusOr<uint32_t> stopped = c->FetchCompressedStreaming(
      "cold", client::FetchSource::FromLease(l->id),
      [&](uint32_t index, client::CompressedPage page) -> absl::Status {
        CHECK(index == seen);
        CHECK(page.buffer == (*want)[index].buffer);
        if (++seen == 150) return absl::AbortedError("sink: enough");
        return absl::OkStatus();
      });
  REQUIRE(!stopped.ok());
  CHECK(stopped.status().code() == absl::StatusCode::kAborted);
  CHECK(seen == 150);
  absl::StatusOr<std::vector<client::CompressedPage>> again =
      c->FetchCompressed("cold", client::FetchSource::FromLease(l->id));
  REQUIRE(again.ok());
  CHECK(again->size() == n);
  REQUIRE(streamed->Release(l->id).ok());
}

TEST_CASE("SDK bulk plane: off, not served, bad options", "[client][bulk]") {
  std::unique_ptr<Daemon> d = StartDaemon(/*plane=*/true);
  ClientOptions off;
  off.data_plane = DataPlaneMode::kOff;
  std::unique_ptr<Client> c = Connect(*d, off);
  Stored s = Store(*c, 5);
  std::vector<uint8_t> dst(s.bytes.size());
  absl::StatusOr<client::FetchResult> r = c->FetchInto(
      "ns", client::FetchSource::FromLease(s.lease.id), absl::MakeSpan(dst));
  REQUIRE(r.ok());
  CHECK(r->path == client::FetchPath::kGrpc);
  CHECK(dst == s.bytes);

  std::unique_ptr<Daemon> plain = StartDaemon(/*plane=*/false);
  std::unique_ptr<Client> pc = Connect(*plain);
  Stored ps = Store(*pc, 5);
  client::BulkSink sink;
  sink.destination = [&](uint32_t i, uint64_t pb) -> absl::StatusOr<uint8_t*> {
    return dst.data() + i * pb;
  };
  absl::StatusOr<std::optional<client::FetchResult>> b =
      pc->FetchBulk("ns", client::FetchSource::FromLease(ps.lease.id), sink);
  REQUIRE(b.ok());
  CHECK(!b->has_value());
  // FetchInto streams (and does not ask the plane again for a while).
  std::fill(dst.begin(), dst.end(), 0);
  r = pc->FetchInto("ns", client::FetchSource::FromLease(ps.lease.id),
                    absl::MakeSpan(dst));
  REQUIRE(r.ok());
  CHECK(r->path == client::FetchPath::kGrpc);
  CHECK(dst == ps.bytes);

  for (uint32_t bad : {0u, 17u}) {
    ClientOptions o;
    o.address = d->address();
    o.data_plane_connections = bad;
    absl::StatusOr<std::unique_ptr<Client>> made = Client::Create(o);
    REQUIRE(!made.ok());
    CHECK(made.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StartsWith(made.status().message(), "data_plane_connections"));
  }
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
