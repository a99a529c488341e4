// The bulk data plane (docs/data_plane.md), server side, over loopback: a
// Fetch with FetchRequest.bulk gets a BulkOffer and its bytes on TCP
// connections; checked with the raw stub and raw sockets: byte-exact
// stripes over 1 and 4 connections and a layer range, the capability's
// rules (an unknown token, an index opened twice, a token replayed after
// every index was claimed, a token after its call was cancelled), a client
// that never connects (the idle timeout ends the call), one that leaves
// mid-transfer (the call fails, the pins go), a bad hello, a flood beyond
// data_plane.max_connections, bad bulk fields, a COMPRESSED fetch's codec
// buffers of their own sizes, a transformed fetch (refused), a daemon without
// the plane (the field is ignored) and the TLS rule of the config.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxh3.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "server/daemon/config.h"
#include "tests/server/bulk_test_util.h"
#include "tests/server/server_test_util.h"
#include "tests/tls_test_util.h"
#include "types/bulk_wire.h"
#include "types/layer_range.h"

namespace kvharbor {
namespace testing {
namespace {

// Inserts `pages` pages and returns their bytes and a lease on them.
std::string InsertLeased(TestServer& s, uint32_t pages, uint64_t* lease,
                         int32_t first_token = 100) {
  const std::vector<int32_t> tokens = Tokens(pages * kPageSize, first_token);
  const std::string bytes = RandomBytes(pages * kPageBytes, first_token);
  REQUIRE(InsertPages(s.stub.get(), tokens, bytes, 1 << 20).ok());
  *lease = MatchOk(s.stub.get(), tokens, /*lock=*/true).lease_id();
  REQUIRE(*lease != 0);
  return bytes;
}

v1::FetchRequest BulkRequest(uint64_t lease, uint32_t connections,
                             uint32_t stripe_pages) {
  v1::FetchRequest req;
  req.set_namespace_(kNs);
  req.set_lease_id(lease);
  req.mutable_bulk()->set_connections(connections);
  req.mutable_bulk()->set_stripe_pages(stripe_pages);
  return req;
}

// One open Fetch call whose first message was read.
struct OpenFetch {
  explicit OpenFetch(TestServer& s, const v1::FetchRequest& req) {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    reader = s.stub->Fetch(&ctx, req);
    got_first = reader->Read(&first);
  }
  grpc::Status Finish() {
    v1::FetchResponse r;
    while (reader->Read(&r)) {
    }
    return reader->Finish();
  }
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::FetchResponse>> reader;
  v1::FetchResponse first;
  bool got_first = false;
};

// Receives every connection of `offer` (each on this thread, one after the
// other: the daemon writes all of them at once) into pages in order.
std::string ReceiveAll(const v1::BulkOffer& offer) {
  const uint64_t pb = offer.page_bytes();
  const uint32_t n = offer.page_handles_size();
  const uint32_t c = offer.connections(), sp = offer.stripe_pages();
  std::string out(uint64_t{n} * pb, '\0');
  std::vector<int> fds(c);
  for (uint32_t i = 0; i < c; ++i) REQUIRE(Hello(offer, i, &fds[i]).code == 0);
  for (uint32_t i = 0; i < c; ++i) {
    for (uint64_t st = i; st * sp < n; st += c) {
      for (uint64_t p = st * sp; p < std::min<uint64_t>(n, (st + 1) * sp);
           ++p) {
        REQUIRE(ReadN(fds[i], out.data() + p * pb, pb));
      }
    }
    char extra;
    CHECK(recv(fds[i], &extra, 1, 0) == 0);  // closed after its stripes
    close(fds[i]);
  }
  return out;
}

TEST_CASE("bulk Fetch: stripes over 1 and 4 connections are the pages",
          "[server][bulk]") {
  TestServer s(BulkOptions());
  REQUIRE(s.daemon->data_plane_port() != 0);
  uint64_t lease = 0;
  const std::string bytes = InsertLeased(s, 10, &lease);
  for (auto [connections, stripe] :
       {std::pair<uint32_t, uint32_t>{1, 16}, {4, 1}, {4, 3}, {3, 2}}) {
    INFO(connections << " connections, " << stripe << " pages a stripe");
    OpenFetch f(s, BulkRequest(lease, connections, stripe));
    REQUIRE(f.got_first);
    REQUIRE(f.first.has_bulk_offer());
    const v1::BulkOffer& o = f.first.bulk_offer();
    CHECK(o.port() == s.daemon->data_plane_port());
    CHECK(o.page_bytes() == kPageBytes);
    REQUIRE(o.page_handles_size() == 10);
    for (int p = 0; p < 10; ++p) {
      CHECK(o.page_checksums(p) == PageChecksum(bytes, p));
    }
    CHECK(ReceiveAll(o) == bytes);
    CHECK(f.Finish().ok());
  }
  // A layer range: only layer 1's runs, with their checksums.
  v1::FetchRequest req = BulkRequest(lease, 2, 2);
  req.set_layer_begin(1);
  req.set_layer_end(2);
  OpenFetch f(s, req);
  REQUIRE(f.first.has_bulk_offer());
  const PageRuns runs = LayerRuns(TestGeometry(), LayerRange{1, 2});
  CHECK(f.first.bulk_offer().page_bytes() == runs.total());
  const std::string got = ReceiveAll(f.first.bulk_offer());
  std::string want;
  for (int p = 0; p < 10; ++p) {
    for (int r = 0; r < runs.count; ++r) {
      want += bytes.substr(p * kPageBytes + runs.offset[r], runs.bytes[r]);
    }
  }
  CHECK(got == want);
  CHECK(f.Finish().ok());
  CheckSettled(*s.ns());
}

TEST_CASE("bulk Fetch: the token is a single-use capability of its call",
          "[server][bulk]") {
  TestServer s(BulkOptions());
  uint64_t lease = 0;
  InsertLeased(s, 4, &lease);
  OpenFetch f(s, BulkRequest(lease, 2, 1));
  REQUIRE(f.first.has_bulk_offer());
  v1::BulkOffer offer = f.first.bulk_offer();
  int fd0 = -1, fd1 = -1, again = -1;
  REQUIRE(Hello(offer, 0, &fd0).code == 0);
  // The same index again while index 1 is still open.
  BulkAccept a = Hello(offer, 0, &again);
  CHECK(a.code == static_cast<int>(absl::StatusCode::kAlreadyExists));
  CHECK(a.error.find("bulk hello.index") == 0);
  close(again);
  // A count that is not the offer's.
  a = Hello(offer, 1, &again, /*connections=*/3);
  CHECK(a.code == static_cast<int>(absl::StatusCode::kInvalidArgument));
  CHECK(a.error.find("bulk hello.connections") == 0);
  close(again);
  REQUIRE(Hello(offer, 1, &fd1).code == 0);
  // Every index claimed: the token opens nothing more.
  a = Hello(offer, 1, &again);
  CHECK(a.code == static_cast<int>(absl::StatusCode::kPermissionDenied));
  CHECK(a.error.find("bulk hello.token") == 0);
  close(again);
  std::string sink(2 * kPageBytes, '\0');
  CHECK(ReadN(fd0, sink.data(), sink.size()));
  CHECK(ReadN(fd1, sink.data(), sink.size()));
  close(fd0);
  close(fd1);
  CHECK(f.Finish().ok());

  // An unknown token.
  offer.set_token(std::string(kBulkTokenBytes, 'x'));
  a = Hello(offer, 0, &again);
  CHECK(a.code == static_cast<int>(absl::StatusCode::kPermissionDenied));
  close(again);

  // A token whose call was cancelled before any connection came.
  {
    OpenFetch g(s, BulkRequest(lease, 1, 1));
    REQUIRE(g.first.has_bulk_offer());
    offer = g.first.bulk_offer();
    g.ctx.TryCancel();
    g.Finish();
  }
  CHECK(Eventually([&] {
    int fd = -1;
    const BulkAccept late = Hello(offer, 0, &fd);
    close(fd);
    return late.code == static_cast<int>(absl::StatusCode::kPermissionDenied);
  }));
  CheckSettled(*s.ns());
}

TEST_CASE("bulk Fetch: a client that never connects or leaves mid-transfer",
          "[server][bulk]") {
  DaemonOptions o = BulkOptions();
  o.limits.fetch_idle_timeout = absl::Milliseconds(300);
  NamespaceSpec big = BigPageOptions().namespaces[1];
  o.namespaces.push_back(big);
  TestServer s(o);
  uint64_t lease = 0;
  InsertLeased(s, 4, &lease);
  {
    // No connection: the idle timeout ends the call.
    OpenFetch f(s, BulkRequest(lease, 2, 1));
    REQUIRE(f.first.has_bulk_offer());
    const grpc::Status st = f.Finish();
    CHECK(st.error_code() == grpc::StatusCode::CANCELLED);
  }
  // Pages of 1 MiB, many more than the socket buffers hold: a client that
  // reads a little and closes breaks the transfer.
  const uint64_t big_page = Geometry(big.geometry).PageBytes();
  const uint32_t pages = 12;
  const std::vector<int32_t> tokens =
      Tokens(pages * big.geometry.page_size, 5000);
  const std::string bytes = RandomBytes(pages * big_page, 7);
  REQUIRE(
      SendInsert(s.stub.get(), InsertMessages("big", tokens, bytes, 1 << 20))
          .ok());
  const uint64_t big_lease =
      MatchOk(s.stub.get(), tokens, true, 0, "big").lease_id();
  v1::FetchRequest req = BulkRequest(big_lease, 1, 4);
  req.set_namespace_("big");
  OpenFetch f(s, req);
  REQUIRE(f.first.has_bulk_offer());
  int fd = -1;
  REQUIRE(Hello(f.first.bulk_offer(), 0, &fd).code == 0);
  std::string part(big_page, '\0');
  REQUIRE(ReadN(fd, part.data(), part.size()));
  CHECK(part == bytes.substr(0, big_page));
  close(fd);
  const grpc::Status st = f.Finish();
  INFO(st.error_message());
  CHECK(!st.ok());
  // The pins went with the transfer: released, every page can be evicted.
  v1::ReleaseRequest rel;
  rel.set_lease_id(big_lease);
  v1::ReleaseResponse rr;
  grpc::ClientContext rctx;
  REQUIRE(s.stub->Release(&rctx, rel, &rr).ok());
  std::shared_ptr<Namespace> ns = s.ns("big");
  CHECK(Eventually([&] {
    const NamespaceStats c = ns->Counters();
    return c.evictable_pages == c.cached_pages;
  }));
  CheckSettled(*ns);
}

TEST_CASE("bulk Fetch: bad hellos, a flood, bad fields, no plane",
          "[server][bulk]") {
  DaemonOptions o = BulkOptions();
  o.data_plane.max_connections = 3;
  TestServer s(o);
  const uint32_t port = s.daemon->data_plane_port();
  // Not a hello.
  int fd = Connect(port);
  const std::string junk(kBulkHelloBytes, 'j');
  REQUIRE(send(fd, junk.data(), junk.size(), MSG_NOSIGNAL) > 0);
  std::array<uint8_t, kBulkAcceptBytes> in{};
  REQUIRE(ReadN(fd, in.data(), in.size()));
  absl::StatusOr<BulkAccept> a = DecodeBulkAccept(in);
  REQUIRE(a.ok());
  CHECK(a->code == static_cast<int>(absl::StatusCode::kInvalidArgument));
  CHECK(a->error.find("bulk hello.magic") == 0);
  close(fd);
  // A flood: 3 silent connections hold every place; the 4th is refused.
  std::vector<int> silent;
  for (int i = 0; i < 3; ++i) silent.push_back(Connect(port));
  bool refused = Eventually([&] {
    const int extra = Connect(port);
    std::array<uint8_t, kBulkAcceptBytes> r{};
    const bool got = ReadN(extra, r.data(), r.size());
    close(extra);
    if (!got) return false;
    absl::StatusOr<BulkAccept> ra = DecodeBulkAccept(r);
    return ra.ok() &&
           ra->code == static_cast<int>(absl::StatusCode::kResourceExhausted) &&
           ra->error.find("data_plane.max_connections") == 0;
  });
  CHECK(refused);
  for (int f : silent) close(f);
  // The places come back: a transfer works again.
  uint64_t lease = 0;
  const std::string bytes = InsertLeased(s, 3, &lease);
  CHECK(Eventually([&] {
    OpenFetch f(s, BulkRequest(lease, 1, 1));
    if (!f.first.has_bulk_offer()) return false;
    int c = -1;
    const BulkAccept ok = Hello(f.first.bulk_offer(), 0, &c);
    if (ok.code != 0) {
      close(c);
      f.ctx.TryCancel();
      f.Finish();
      return false;
    }
    std::string got(3 * kPageBytes, '\0');
    const bool read = ReadN(c, got.data(), got.size());
    close(c);
    return f.Finish().ok() && read && got == bytes;
  }));
  // Bad fields.
  CheckError(FetchAll(s.stub.get(), BulkRequest(lease, 0, 1)).status,
             grpc::StatusCode::INVALID_ARGUMENT, "bulk.connections");
  CheckError(FetchAll(s.stub.get(), BulkRequest(lease, 17, 1)).status,
             grpc::StatusCode::INVALID_ARGUMENT, "bulk.connections");
  CheckError(FetchAll(s.stub.get(), BulkRequest(lease, 2, 0)).status,
             grpc::StatusCode::INVALID_ARGUMENT, "bulk.stripe_pages");

  // A compressed fetch goes on the plane: codec buffers of their own sizes,
  // each connection's back to back; a transformed one does not.
  v1::FetchRequest compressed = BulkRequest(lease, 2, 1);
  compressed.set_format(v1::FETCH_FORMAT_COMPRESSED);
  {
    OpenFetch f(s, compressed);
    REQUIRE(f.first.has_bulk_offer());
    const v1::BulkOffer& o = f.first.bulk_offer();
    CHECK(o.page_bytes() == 0);
    REQUIRE(o.page_sizes_size() == o.page_handles_size());
    REQUIRE(o.page_codecs_size() == o.page_handles_size());
    REQUIRE(o.page_calibration_fingerprints_size() == o.page_handles_size());
    for (uint32_t i = 0; i < 2; ++i) {
      int fd = -1;
      REQUIRE(Hello(o, i, &fd).code == 0);
      for (int p = i; p < o.page_handles_size(); p += 2) {
        CHECK(o.page_codecs(p) == "identity");
        CHECK(o.page_sizes(p) > kPageBytes);  // the envelope around the page
        std::string buffer(o.page_sizes(p), '\0');
        REQUIRE(ReadN(fd, buffer.data(), buffer.size()));
        CHECK(XXH3_64bits(buffer.data(), buffer.size()) == o.page_checksums(p));
        // The identity envelope ends with the raw page.
        CHECK(buffer.substr(buffer.size() - kPageBytes) ==
              bytes.substr(p * kPageBytes, kPageBytes));
      }
      char extra;
      CHECK(recv(fd, &extra, 1, 0) == 0);
      close(fd);
    }
    CHECK(f.Finish().ok());
  }
  v1::FetchRequest transformed = BulkRequest(lease, 2, 1);
  transformed.set_transform(v1::FETCH_TRANSFORM_KVCM);
  CheckError(FetchAll(s.stub.get(), transformed).status,
             grpc::StatusCode::FAILED_PRECONDITION, "bulk");

  // A daemon without the plane refuses the field before pinning anything;
  // without it, the same fetch streams.
  TestServer plain;
  CHECK(plain.daemon->data_plane_port() == 0);
  uint64_t plain_lease = 0;
  const std::string plain_bytes = InsertLeased(plain, 2, &plain_lease);
  CheckError(FetchAll(plain.stub.get(), BulkRequest(plain_lease, 2, 1)).status,
             grpc::StatusCode::FAILED_PRECONDITION, "bulk");
  v1::FetchRequest streamed = BulkRequest(plain_lease, 2, 1);
  streamed.clear_bulk();
  const FetchResult r = FetchAll(plain.stub.get(), streamed);
  REQUIRE(r.status.ok());
  CHECK(Reassemble(r, 1 << 20) == plain_bytes);
}

TEST_CASE("bulk Fetch: data_plane config and the TLS rule", "[server][bulk]") {
  DaemonOptions o;
  REQUIRE(LoadConfigText("data_plane:\n  listen: 127.0.0.1:0\n"
                         "  max_connections: 8\n  allow_plaintext: true\n",
                         "test", &o)
              .ok());
  CHECK(o.data_plane.listen == "127.0.0.1:0");
  CHECK(o.data_plane.max_connections == 8);
  CHECK(o.data_plane.allow_plaintext);
  for (const char* bad : {"data_plane:\n  listen: nonsense\n",
                          "data_plane:\n  max_connections: 0\n",
                          "data_plane:\n  allow_plaintext: maybe\n",
                          "data_plane:\n  port: 1\n"}) {
    DaemonOptions b;
    const absl::Status st = LoadConfigText(bad, "test", &b);
    INFO(bad << " -> " << st.ToString());
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(st.message().find("data_plane.") != std::string::npos);
  }
  // With TLS, a plain plane needs the operator's explicit word.
  TestPki pki;
  DaemonOptions tls = TestOptions();
  tls.security.tls_cert_file = pki.server_cert();
  tls.security.tls_key_file = pki.server_key();
  tls.data_plane.listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<Daemon>> refused = Daemon::Start(tls);
  REQUIRE(!refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StartsWith(refused.status().message(), "data_plane.listen"));
  tls.data_plane.allow_plaintext = true;
  absl::StatusOr<std::unique_ptr<Daemon>> allowed = Daemon::Start(tls);
  INFO(allowed.status().ToString());
  REQUIRE(allowed.ok());
  CHECK((*allowed)->data_plane_port() != 0);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
