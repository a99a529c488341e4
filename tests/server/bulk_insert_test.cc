// The bulk data plane for Insert (docs/data_plane.md "Insert"), server side,
// over loopback with the raw stub and raw sockets: an Insert whose header
// asks for the plane gets a BulkOffer in its initial metadata and takes the
// sent pages on TCP connections straight into its slots; checked here:
// byte-exact round trips over 1 and 4 connections (with and without page
// checksums, an append after a cached prefix), a wrong checksum (DATA_LOSS
// naming header.page_checksums, nothing stored), a client that sends too
// few bytes or too many, a chunk in a bulk insert, a client that never
// connects (the idle timeout aborts it), layer_major (no offer: chunks),
// a daemon without the plane (no offer), and a page-hash namespace (present
// pages among the placed ones deduplicated at commit).
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/server/bulk_test_util.h"
#include "tests/server/server_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

// What a test does on connection `index` of `offer` after its handshake,
// instead of sending its stripes and half-closing.
using Misbehave =
    std::function<void(int fd, uint32_t index, const v1::BulkOffer& offer)>;

struct BulkInsertOptions {
  uint32_t connections = 2;
  uint32_t stripe = 1;
  bool checksums = true;
  Misbehave misbehave;  // null: send the stripes
  bool connect = true;  // false: open no data connection at all
  uint32_t skip_pages = 0;
  bool layer_major = false;
  // A page-key namespace: its name and the keys (instead of the tokens).
  std::string ns = kNs;
  std::vector<std::string> keys;
};

struct BulkInsertCall {
  grpc::Status status;
  std::optional<v1::BulkOffer> offer;
  v1::InsertResponse response;
};

// Sends connection `index`'s stripes of `bytes` (pages of kPageBytes).
void SendStripes(int fd, const v1::BulkOffer& o, uint32_t index,
                 const std::string& bytes) {
  const uint64_t pages = bytes.size() / kPageBytes;
  const uint64_t sp = o.stripe_pages(), c = o.connections();
  for (uint64_t s = index; s * sp < pages; s += c) {
    for (uint64_t p = s * sp; p < std::min(pages, (s + 1) * sp); ++p) {
      REQUIRE(send(fd, bytes.data() + p * kPageBytes, kPageBytes,
                   MSG_NOSIGNAL) == static_cast<ssize_t>(kPageBytes));
    }
  }
}

// An Insert of `bytes` under `tokens` with header.bulk, its pages sent on
// the plane when offered (each connection by `misbehave` when given).
BulkInsertCall BulkInsert(TestServer& s, const std::vector<int32_t>& tokens,
                          const std::string& bytes,
                          const BulkInsertOptions& opt) {
  v1::InsertRequest header = Header(opt.ns, tokens);
  for (const std::string& k : opt.keys)
    header.mutable_header()->add_page_keys(k);
  header.mutable_header()->set_skip_pages(opt.skip_pages);
  header.mutable_header()->set_layer_major(opt.layer_major);
  if (opt.checksums) {
    for (size_t p = 0; p < bytes.size() / kPageBytes; ++p) {
      header.mutable_header()->add_page_checksums(PageChecksum(bytes, p));
    }
  }
  header.mutable_header()->mutable_bulk()->set_connections(opt.connections);
  header.mutable_header()->mutable_bulk()->set_stripe_pages(opt.stripe);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  BulkInsertCall out;
  auto writer = s.stub->Insert(&ctx, &out.response);
  REQUIRE(writer->Write(header));
  writer->WaitForInitialMetadata();
  const auto& md = ctx.GetServerInitialMetadata();
  auto it = md.find("kvh-bulk-offer-bin");
  if (it == md.end()) {
    for (size_t off = 0; off < bytes.size(); off += 1 << 20) {
      if (!writer->Write(Chunk(off, bytes.substr(off, 1 << 20)))) break;
    }
  } else {
    v1::BulkOffer o;
    REQUIRE(o.ParseFromArray(it->second.data(), it->second.size()));
    out.offer = o;
    std::vector<std::thread> threads;
    for (uint32_t i = 0; opt.connect && i < o.connections(); ++i) {
      threads.emplace_back([&, i] {
        int fd = -1;
        const BulkAccept a = Hello(o, i, &fd);
        if (a.code == 0) {
          if (opt.misbehave) {
            opt.misbehave(fd, i, o);
          } else {
            SendStripes(fd, o, i, bytes);
            shutdown(fd, SHUT_WR);
            char c;
            CHECK(recv(fd, &c, 1, 0) == 0);  // the daemon closes when done
          }
        }
        close(fd);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  writer->WritesDone();
  out.status = writer->Finish();
  return out;
}

std::string FetchLease(TestServer& s, const std::vector<int32_t>& tokens) {
  const v1::MatchResponse m = MatchOk(s.stub.get(), tokens, /*lock=*/true);
  v1::FetchRequest req;
  req.set_namespace_(kNs);
  req.set_lease_id(m.lease_id());
  const FetchResult f = FetchAll(s.stub.get(), req);
  REQUIRE(f.status.ok());
  grpc::ClientContext ctx;
  v1::ReleaseRequest rel;
  rel.set_lease_id(m.lease_id());
  v1::ReleaseResponse rr;
  REQUIRE(s.stub->Release(&ctx, rel, &rr).ok());
  return Reassemble(f, 1 << 20);
}

TEST_CASE("bulk Insert: pages over 1 and 4 connections land byte-exact",
          "[server][bulk]") {
  TestServer s(BulkOptions());
  int32_t first = 1000;
  for (auto [connections, stripe, checksums] :
       {std::tuple<uint32_t, uint32_t, bool>{1, 16, true},
        {4, 1, true},
        {4, 3, false},
        {3, 2, true}}) {
    INFO(connections << " connections, stripe " << stripe);
    const std::vector<int32_t> tokens = Tokens(11 * kPageSize, first);
    const std::string bytes = RandomBytes(11 * kPageBytes, first);
    first += 1000;
    BulkInsertOptions opt;
    opt.connections = connections;
    opt.stripe = stripe;
    opt.checksums = checksums;
    const BulkInsertCall r = BulkInsert(s, tokens, bytes, opt);
    INFO(r.status.error_message());
    REQUIRE(r.status.ok());
    REQUIRE(r.offer.has_value());
    CHECK(r.offer->page_bytes() == kPageBytes);
    CHECK(r.response.pages_stored() == 11);
    CHECK(FetchLease(s, tokens) == bytes);
    CheckSettled(*s.ns());
  }
  // Pages already cached are sent and dropped: the same 11 pages again, and
  // 14 pages whose first 11 are cached.
  {
    TestServer s2(BulkOptions());
    const std::vector<int32_t> again = Tokens(14 * kPageSize, 1000);
    std::string bytes = RandomBytes(11 * kPageBytes, 1000);
    const std::string tail = RandomBytes(3 * kPageBytes, 55);
    BulkInsertOptions opt;
    opt.connections = 3;
    REQUIRE(
        BulkInsert(s2, Tokens(11 * kPageSize, 1000), bytes, opt).status.ok());
    const BulkInsertCall same =
        BulkInsert(s2, Tokens(11 * kPageSize, 1000), bytes, opt);
    INFO(same.status.error_message());
    REQUIRE(same.status.ok());
    CHECK(same.response.pages_stored() == 0);
    bytes += tail;
    const BulkInsertCall longer = BulkInsert(s2, again, bytes, opt);
    INFO(longer.status.error_message());
    REQUIRE(longer.status.ok());
    CHECK(longer.response.pages_stored() == 3);
    CHECK(FetchLease(s2, again) == bytes);
    CheckSettled(*s2.ns());
  }
  // An append: the first 3 pages are cached and skipped.
  TestServer s3(BulkOptions());
  const std::vector<int32_t> tokens = Tokens(6 * kPageSize, 5000);
  const std::string head = RandomBytes(3 * kPageBytes, 76);
  const std::string more = RandomBytes(3 * kPageBytes, 77);
  REQUIRE(BulkInsert(s3, Tokens(3 * kPageSize, 5000), head, BulkInsertOptions())
              .status.ok());
  BulkInsertOptions append;
  append.skip_pages = 3;
  const BulkInsertCall r = BulkInsert(s3, tokens, more, append);
  INFO(r.status.error_message());
  REQUIRE(r.status.ok());
  CHECK(r.response.pages_stored() == 3);
  CHECK(FetchLease(s3, tokens) == head + more);
  CheckSettled(*s3.ns());
}

TEST_CASE("bulk Insert: bad bytes, early and late ends store nothing",
          "[server][bulk]") {
  DaemonOptions o = BulkOptions();
  o.limits.upload_idle_timeout = absl::Milliseconds(400);
  TestServer s(o);
  const std::vector<int32_t> tokens = Tokens(8 * kPageSize, 9000);
  const std::string bytes = RandomBytes(8 * kPageBytes, 5);
  const Snapshot before = Snap(*s.ns());
  auto none_stored = [&] {
    CheckSettled(*s.ns());
    CHECK(Eventually(
        [&] { return Snap(*s.ns()).c.free_pages == before.c.free_pages; }));
    CHECK(MatchOk(s.stub.get(), tokens).matched_tokens() == 0);
  };
  SECTION("a page that is not its declared checksum") {
    std::string wrong = bytes;
    wrong[5 * kPageBytes + 7] ^= 1;
    BulkInsertOptions opt;  // declares the checksums of `bytes`
    opt.misbehave = [&](int fd, uint32_t i, const v1::BulkOffer& o) {
      SendStripes(fd, o, i, wrong);
      shutdown(fd, SHUT_WR);
      char c;
      recv(fd, &c, 1, 0);
    };
    const BulkInsertCall r = BulkInsert(s, tokens, bytes, opt);
    CheckError(r.status, grpc::StatusCode::DATA_LOSS,
               "header.page_checksums[5]");
    none_stored();
  }
  SECTION("too few bytes") {
    BulkInsertOptions opt;
    opt.stripe = 2;
    opt.misbehave = [&](int fd, uint32_t i, const v1::BulkOffer&) {
      if (i == 0) {
        REQUIRE(send(fd, bytes.data(), kPageBytes + 10, MSG_NOSIGNAL) > 0);
      }
      shutdown(fd, SHUT_WR);
    };
    const BulkInsertCall r = BulkInsert(s, tokens, bytes, opt);
    INFO(r.status.error_message());
    CHECK(r.status.error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK(r.status.error_message().find("bulk: connection") == 0);
    none_stored();
  }
  SECTION("too many bytes") {
    BulkInsertOptions opt;
    opt.connections = 1;
    opt.stripe = 4;
    opt.misbehave = [&](int fd, uint32_t, const v1::BulkOffer&) {
      REQUIRE(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) > 0);
      REQUIRE(send(fd, "more", 4, MSG_NOSIGNAL) > 0);
      shutdown(fd, SHUT_WR);
    };
    const BulkInsertCall r = BulkInsert(s, tokens, bytes, opt);
    INFO(r.status.error_message());
    CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(r.status.error_message().find("more than") != std::string::npos);
    none_stored();
  }
  SECTION("no connection at all: the idle timeout aborts it") {
    BulkInsertOptions opt;
    opt.connect = false;
    const BulkInsertCall r = BulkInsert(s, tokens, bytes, opt);
    INFO(r.status.error_message());
    CHECK(r.status.error_code() == grpc::StatusCode::CANCELLED);
    none_stored();
  }
}

TEST_CASE("bulk Insert: chunks refused, no offer without the plane",
          "[server][bulk]") {
  TestServer s(BulkOptions());
  const std::vector<int32_t> tokens = Tokens(4 * kPageSize, 300);
  const std::string bytes = RandomBytes(4 * kPageBytes, 3);
  // A chunk after an accepted bulk header.
  v1::InsertRequest header = Header(kNs, tokens);
  header.mutable_header()->mutable_bulk()->set_connections(1);
  header.mutable_header()->mutable_bulk()->set_stripe_pages(1);
  CheckError(SendInsert(s.stub.get(), {header, Chunk(0, bytes)}),
             grpc::StatusCode::INVALID_ARGUMENT, "chunk");
  // Bad fields.
  header.mutable_header()->mutable_bulk()->set_connections(0);
  CheckError(SendInsert(s.stub.get(), {header}),
             grpc::StatusCode::INVALID_ARGUMENT, "header.bulk.connections");
  CheckSettled(*s.ns());
  // layer_major: no offer; the chunks carry the bytes.
  BulkInsertOptions lm;
  lm.layer_major = true;
  lm.checksums = false;  // the stream is layer by layer
  const std::string by_layer = RandomBytes(4 * kPageBytes, 9);
  BulkInsertCall r = BulkInsert(s, tokens, by_layer, lm);
  INFO(r.status.error_message());
  CHECK(r.status.ok());
  CHECK(!r.offer.has_value());
  // A daemon without the plane: no offer either.
  TestServer plain;
  const std::vector<int32_t> other = Tokens(4 * kPageSize, 700);
  r = [&] {
    TestServer& p = plain;
    return BulkInsert(p, other, bytes, BulkInsertOptions());
  }();
  CHECK(r.status.ok());
  CHECK(!r.offer.has_value());
  CHECK(FetchLease(plain, other) == bytes);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor

namespace kvharbor {
namespace testing {
namespace {

TEST_CASE("bulk Insert: a page-hash namespace stores the absent pages",
          "[server][bulk][page_hashes]") {
  // The plane writes every page after the first missing one into a slot
  // (a placed upload): present pages among them are deduplicated at commit
  // and keep their stored bytes.
  TestServer s(BulkOptions());
  {
    grpc::ClientContext ctx;
    v1::CreateNamespaceRequest req;
    req.mutable_spec()->set_name("hashes");
    *req.mutable_spec()->mutable_geometry() = TestGeometryProto();
    req.mutable_spec()->set_capacity_bytes(32 * kPageBytes);
    req.mutable_spec()->set_key_kind(v1::KEY_KIND_PAGE_HASHES);
    v1::CreateNamespaceResponse resp;
    REQUIRE(s.stub->CreateNamespace(&ctx, req, &resp).ok());
  }
  const auto keys = [](int first, int n) {
    std::vector<std::string> k;
    for (int i = first; i < first + n; ++i)
      k.push_back("h" + std::to_string(i));
    return k;
  };
  const std::string stored = RandomBytes(8 * kPageBytes, 90);
  const std::string resent = RandomBytes(8 * kPageBytes, 91);
  BulkInsertOptions opt;
  opt.ns = "hashes";
  opt.connections = 3;
  opt.keys = keys(1, 4);
  REQUIRE(BulkInsert(s, {}, stored.substr(0, 4 * kPageBytes), opt).status.ok());
  opt.keys = keys(6, 1);
  REQUIRE(BulkInsert(s, {}, stored.substr(5 * kPageBytes, kPageBytes), opt)
              .status.ok());
  opt.keys = keys(1, 8);
  const BulkInsertCall r = BulkInsert(s, {}, resent, opt);
  INFO(r.status.error_message());
  REQUIRE(r.status.ok());
  REQUIRE(r.offer.has_value());
  CHECK(r.response.pages_stored() == 3);
  CHECK(r.response.already_present_tokens() == 5 * kPageSize);
  // Match them all and fetch: present pages kept their bytes.
  grpc::ClientContext mctx;
  v1::MatchRequest m;
  m.set_namespace_("hashes");
  for (const std::string& k : keys(1, 8)) m.add_page_keys(k);
  m.set_lock(true);
  v1::MatchResponse mr;
  REQUIRE(s.stub->Match(&mctx, m, &mr).ok());
  REQUIRE(mr.page_handles_size() == 8);
  v1::FetchRequest f;
  f.set_namespace_("hashes");
  f.set_lease_id(mr.lease_id());
  const FetchResult got = FetchAll(s.stub.get(), f);
  REQUIRE(got.status.ok());
  const std::string want = stored.substr(0, 4 * kPageBytes) +
                           resent.substr(4 * kPageBytes, kPageBytes) +
                           stored.substr(5 * kPageBytes, kPageBytes) +
                           resent.substr(6 * kPageBytes);
  CHECK(Reassemble(got, 1 << 20) == want);
  CheckSettled(*s.ns("hashes"));
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
