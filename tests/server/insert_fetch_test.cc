// Insert and Fetch through the raw generated stub: byte-exact round trips at
// several chunk sizes, dedup, and every malformed stream or request, each
// leaving the namespace exactly as it was.
#include <string>
#include <vector>

#include "tests/server/server_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

v1::FetchRequest FetchByLease(uint64_t lease, uint32_t max_chunk,
                              const std::string& ns = kNs) {
  v1::FetchRequest req;
  req.set_namespace_(ns);
  req.set_lease_id(lease);
  req.set_max_chunk_bytes(max_chunk);
  return req;
}

v1::FetchRequest FetchByHandles(const std::vector<uint64_t>& handles,
                                uint32_t max_chunk) {
  v1::FetchRequest req;
  req.set_namespace_(kNs);
  for (uint64_t h : handles) req.mutable_pages()->add_page_handles(h);
  req.set_max_chunk_bytes(max_chunk);
  return req;
}

TEST_CASE("Insert then Fetch round-trips bytes exactly", "[server][insert]") {
  TestServer s;
  const size_t pages = 5;
  const std::vector<int32_t> tokens = Tokens(pages * kPageSize, 100);
  const std::string bytes = RandomBytes(pages * kPageBytes, 7);

  // Upload chunks smaller than a page, not aligned to pages, and larger.
  const size_t upload_chunk =
      GENERATE(size_t{1000}, size_t{4096}, size_t{6000}, size_t{5 * 4096});
  v1::InsertResponse ins;
  grpc::Status st =
      InsertPages(s.stub.get(), tokens, bytes, upload_chunk, &ins);
  INFO(st.error_message());
  REQUIRE(st.ok());
  CHECK(ins.already_present_tokens() == 0);
  CHECK(ins.pages_stored() == pages);
  CHECK(ins.pages_evicted() == 0);

  v1::MatchResponse m = MatchOk(s.stub.get(), tokens, /*lock=*/true);
  REQUIRE(m.matched_tokens() == tokens.size());
  REQUIRE(m.page_handles_size() == static_cast<int>(pages));
  CHECK(m.page_bytes() == kPageBytes);
  REQUIRE(m.lease_id() != 0);
  CHECK(m.lease_expires_unix_ms() > absl::ToUnixMillis(absl::Now()));

  // Fetch chunks smaller than a page (aligned or not), a whole page, larger
  // than a page, and the daemon's default.
  const uint32_t fetch_chunk =
      GENERATE(uint32_t{1024}, uint32_t{1500}, uint32_t{4096}, uint32_t{20000},
               uint32_t{0});
  const uint64_t out_before = s.ns()->Counters().bytes_out;
  FetchResult f =
      FetchAll(s.stub.get(), FetchByLease(m.lease_id(), fetch_chunk));
  INFO(f.status.error_message());
  REQUIRE(f.status.ok());
  std::vector<uint64_t> handles;
  const size_t limit = fetch_chunk == 0 ? (1u << 20) : fetch_chunk;
  CHECK(Reassemble(f, limit, &handles) == bytes);
  CHECK(handles == std::vector<uint64_t>(m.page_handles().begin(),
                                         m.page_handles().end()));
  // Checksums streamed back are those of what was uploaded.
  for (const v1::FetchResponse& c : f.chunks) {
    if (c.offset() == 0) {
      CHECK(c.page_checksum() == PageChecksum(bytes, c.page_index()));
    }
  }
  CHECK(s.ns()->Counters().bytes_out - out_before == bytes.size());

  // The same pages by handle, and a sub-range of the lease.
  FetchResult byh =
      FetchAll(s.stub.get(),
               FetchByHandles({m.page_handles(3), m.page_handles(1)}, 3000));
  REQUIRE(byh.status.ok());
  CHECK(Reassemble(byh, 3000) == bytes.substr(3 * kPageBytes, kPageBytes) +
                                     bytes.substr(1 * kPageBytes, kPageBytes));
  v1::FetchRequest sub = FetchByLease(m.lease_id(), 2048);
  sub.set_start_page(2);
  sub.set_page_count(2);
  FetchResult subf = FetchAll(s.stub.get(), sub);
  REQUIRE(subf.status.ok());
  CHECK(Reassemble(subf, 2048) == bytes.substr(2 * kPageBytes, 2 * kPageBytes));

  grpc::ClientContext rctx;
  v1::ReleaseRequest rel;
  rel.set_lease_id(m.lease_id());
  v1::ReleaseResponse rr;
  CHECK(s.stub->Release(&rctx, rel, &rr).ok());
  CheckSettled(*s.ns());
}

TEST_CASE("Insert with correct checksums is accepted", "[server][insert]") {
  TestServer s;
  const std::vector<int32_t> tokens = Tokens(3 * kPageSize, 5);
  const std::string bytes = RandomBytes(3 * kPageBytes, 3);
  std::vector<uint64_t> sums;
  for (size_t p = 0; p < 3; ++p) sums.push_back(PageChecksum(bytes, p));
  v1::InsertResponse ins;
  REQUIRE(SendInsert(s.stub.get(),
                     InsertMessages(kNs, tokens, bytes, 2500, sums), &ins)
              .ok());
  CHECK(ins.pages_stored() == 3);
  CHECK(s.ns()->Counters().bytes_in == bytes.size());
}

TEST_CASE("Inserting a present prefix again deduplicates", "[server][insert]") {
  TestServer s;
  const std::vector<int32_t> first = Tokens(2 * kPageSize, 1);
  const std::string b1 = RandomBytes(2 * kPageBytes, 1);
  REQUIRE(InsertPages(s.stub.get(), first, b1, 4096).ok());

  // The same two pages plus two new ones; the client sends all bytes, the
  // daemon keeps the stored copy of the shared prefix.
  std::vector<int32_t> longer = first;
  for (int32_t t : Tokens(2 * kPageSize, 1000)) longer.push_back(t);
  const std::string b2 = RandomBytes(4 * kPageBytes, 2);
  v1::InsertResponse ins;
  REQUIRE(InsertPages(s.stub.get(), longer, b2, 3000, &ins).ok());
  CHECK(ins.already_present_tokens() == first.size());
  CHECK(ins.pages_stored() == 2);

  v1::InsertResponse again;
  REQUIRE(InsertPages(s.stub.get(), longer, b2, 3000, &again).ok());
  CHECK(again.already_present_tokens() == longer.size());
  CHECK(again.pages_stored() == 0);

  const NamespaceStats c = s.ns()->Counters();
  CHECK(c.cached_pages == 4);
  CHECK(c.inserted_pages == 4);
  CHECK(c.dedup_pages == 2 + 4);

  v1::MatchResponse m = MatchOk(s.stub.get(), longer, true);
  REQUIRE(m.matched_tokens() == longer.size());
  FetchResult f = FetchAll(s.stub.get(), FetchByLease(m.lease_id(), 0));
  REQUIRE(f.status.ok());
  CHECK(Reassemble(f, 1 << 20) ==
        b1 + b2.substr(2 * kPageBytes, 2 * kPageBytes));
  CheckSettled(*s.ns());
}

// Runs `msgs` as one Insert and checks the rejection leaves no trace.
void ExpectInsertRejected(TestServer& s,
                          const std::vector<v1::InsertRequest>& msgs,
                          grpc::StatusCode code, const std::string& field) {
  std::shared_ptr<Namespace> ns = s.ns();
  const Snapshot before = Snap(*ns);
  CheckError(SendInsert(s.stub.get(), msgs), code, field);
  CheckSettled(*ns);
  CHECK(Snap(*ns) == before);
  CHECK(ns->Counters().free_pages == before.c.free_pages);
  // Still serving: a good insert works afterwards.
  const std::vector<int32_t> t = Tokens(kPageSize, 900000);
  REQUIRE(InsertPages(s.stub.get(), t, RandomBytes(kPageBytes, 9), 4096).ok());
  v1::EvictRequest ev;
  ev.set_namespace_(kNs);
  ev.set_all(true);
  grpc::ClientContext ctx;
  v1::EvictResponse er;
  REQUIRE(s.stub->Evict(&ctx, ev, &er).ok());
}

TEST_CASE("Insert rejects malformed headers", "[server][insert]") {
  TestServer s;
  // Something cached, so that "nothing changed" is not trivially true.
  REQUIRE(InsertPages(s.stub.get(), Tokens(2 * kPageSize, 50),
                      RandomBytes(2 * kPageBytes, 4), 4096)
              .ok());
  const std::vector<int32_t> tokens = Tokens(2 * kPageSize, 1);
  const std::string bytes = RandomBytes(2 * kPageBytes, 5);
  using C = grpc::StatusCode;

  SECTION("unknown namespace") {
    ExpectInsertRejected(s, InsertMessages("nope", tokens, bytes, 4096),
                         C::NOT_FOUND, "header.namespace");
  }
  SECTION("malformed namespace name") {
    ExpectInsertRejected(s, InsertMessages("a b", tokens, bytes, 4096),
                         C::INVALID_ARGUMENT, "header.namespace");
  }
  SECTION("empty token list") {
    ExpectInsertRejected(s, {Header(kNs, {})}, C::INVALID_ARGUMENT,
                         "header.token_ids");
  }
  SECTION("negative token id") {
    std::vector<int32_t> bad = tokens;
    bad[3] = -1;
    ExpectInsertRejected(s, InsertMessages(kNs, bad, bytes, 4096),
                         C::INVALID_ARGUMENT, "header.token_ids");
  }
  SECTION("not a whole number of pages") {
    ExpectInsertRejected(s, {Header(kNs, Tokens(kPageSize + 1, 1))},
                         C::INVALID_ARGUMENT, "header.token_ids");
  }
  SECTION("checksum count does not match the pages") {
    ExpectInsertRejected(s, InsertMessages(kNs, tokens, bytes, 4096, {1, 2, 3}),
                         C::INVALID_ARGUMENT, "header.page_checksums");
  }
  SECTION("more pages than the namespace holds") {
    const std::vector<int32_t> many =
        Tokens((kCapacityPages + 1) * kPageSize, 1);
    ExpectInsertRejected(s, {Header(kNs, many)}, C::RESOURCE_EXHAUSTED,
                         "header.token_ids");
  }
  SECTION("an empty InsertRequest") {
    ExpectInsertRejected(s, {v1::InsertRequest()}, C::INVALID_ARGUMENT, "kind");
  }
}

TEST_CASE("Insert rejects a token list over the daemon's limit",
          "[server][insert]") {
  DaemonOptions o = TestOptions();
  o.store.max_tokens_per_request = 16;
  TestServer s(o);
  ExpectInsertRejected(s, {Header(kNs, Tokens(5 * kPageSize, 1))},
                       grpc::StatusCode::INVALID_ARGUMENT, "header.token_ids");
}

TEST_CASE("Insert rejects malformed streams and aborts the upload",
          "[server][insert]") {
  TestServer s;
  REQUIRE(InsertPages(s.stub.get(), Tokens(2 * kPageSize, 50),
                      RandomBytes(2 * kPageBytes, 4), 4096)
              .ok());
  const std::vector<int32_t> tokens = Tokens(3 * kPageSize, 1);
  const std::string bytes = RandomBytes(3 * kPageBytes, 5);
  std::vector<v1::InsertRequest> good =
      InsertMessages(kNs, tokens, bytes, 3000);
  using C = grpc::StatusCode;

  SECTION("a second header") {
    std::vector<v1::InsertRequest> m = good;
    m.insert(m.begin() + 2, Header(kNs, tokens));
    ExpectInsertRejected(s, m, C::INVALID_ARGUMENT, "header");
  }
  SECTION("a chunk before the header") {
    std::vector<v1::InsertRequest> m = good;
    std::swap(m[0], m[1]);
    ExpectInsertRejected(s, m, C::INVALID_ARGUMENT, "chunk");
  }
  SECTION("a stream with no header at all") {
    ExpectInsertRejected(s, {}, C::INVALID_ARGUMENT, "header");
  }
  SECTION("a chunk offset that skips bytes") {
    std::vector<v1::InsertRequest> m = good;
    m[2].mutable_chunk()->set_offset(m[2].chunk().offset() + 1);
    ExpectInsertRejected(s, m, C::INVALID_ARGUMENT, "chunk.offset");
  }
  SECTION("a chunk sent twice") {
    std::vector<v1::InsertRequest> m = good;
    m.insert(m.begin() + 2, m[1]);
    ExpectInsertRejected(s, m, C::INVALID_ARGUMENT, "chunk.offset");
  }
  SECTION("a chunk after the declared size") {
    std::vector<v1::InsertRequest> m = good;
    m.push_back(Chunk(bytes.size(), "x"));
    ExpectInsertRejected(s, m, C::INVALID_ARGUMENT, "chunk.data");
  }
  SECTION("a last chunk that runs past the declared size") {
    std::vector<v1::InsertRequest> m = good;
    m.back().mutable_chunk()->mutable_data()->append("extra");
    ExpectInsertRejected(s, m, C::INVALID_ARGUMENT, "chunk.data");
  }
  SECTION("the stream closes before all bytes") {
    std::vector<v1::InsertRequest> m = good;
    m.pop_back();
    ExpectInsertRejected(s, m, C::INVALID_ARGUMENT, "chunk.data");
  }
  SECTION("only the header") {
    ExpectInsertRejected(s, {good[0]}, C::INVALID_ARGUMENT, "chunk.data");
  }
  SECTION("page bytes that do not match the declared checksum") {
    std::vector<uint64_t> sums;
    for (size_t p = 0; p < 3; ++p) sums.push_back(PageChecksum(bytes, p));
    sums[1] ^= 1;
    ExpectInsertRejected(s, InsertMessages(kNs, tokens, bytes, 3000, sums),
                         C::DATA_LOSS, "header.page_checksums[1]");
  }
}

TEST_CASE("A cancelled upload leaves nothing and leaks no slot",
          "[server][insert]") {
  TestServer s;
  std::shared_ptr<Namespace> ns = s.ns();
  const Snapshot before = Snap(*ns);
  const std::vector<int32_t> tokens = Tokens(4 * kPageSize, 1);
  const std::string bytes = RandomBytes(4 * kPageBytes, 5);

  grpc::ClientContext ctx;
  v1::InsertResponse resp;
  auto writer = s.stub->Insert(&ctx, &resp);
  REQUIRE(writer->Write(Header(kNs, tokens)));
  REQUIRE(writer->Write(Chunk(0, bytes.substr(0, 5000))));
  // The upload holds its slots until the call breaks.
  REQUIRE(Eventually([&] { return ns->Counters().uploads_in_flight == 1; }));
  CHECK(ns->Counters().free_pages == kCapacityPages - 4);
  ctx.TryCancel();
  CHECK(writer->Finish().error_code() == grpc::StatusCode::CANCELLED);

  CheckSettled(*ns);
  CHECK(ns->Counters().free_pages == kCapacityPages);
  CHECK(Snap(*ns) == before);
  CHECK(MatchOk(s.stub.get(), tokens).matched_tokens() == 0);
}

TEST_CASE("An upload whose client vanishes is aborted", "[server][insert]") {
  TestServer s;
  std::shared_ptr<Namespace> ns = s.ns();
  {
    // A second channel that is torn down with the call still open.
    auto ch = grpc::CreateChannel(s.daemon->address(),
                                  grpc::InsecureChannelCredentials());
    auto stub = v1::KvHarbor::NewStub(ch);
    auto ctx = std::make_unique<grpc::ClientContext>();
    v1::InsertResponse resp;
    auto writer = stub->Insert(ctx.get(), &resp);
    REQUIRE(writer->Write(Header(kNs, Tokens(2 * kPageSize, 1))));
    REQUIRE(Eventually([&] { return ns->Counters().uploads_in_flight == 1; }));
    ctx->TryCancel();
    writer->Finish();
  }
  CheckSettled(*ns);
  CHECK(ns->Counters().free_pages == kCapacityPages);
  CHECK(ns->Counters().cached_pages == 0);
}

void ExpectFetchRejected(TestServer& s, const v1::FetchRequest& req,
                         grpc::StatusCode code, const std::string& field) {
  std::shared_ptr<Namespace> ns = s.ns();
  const Snapshot before = Snap(*ns);
  FetchResult f = FetchAll(s.stub.get(), req);
  CHECK(f.chunks.empty());
  CheckError(f.status, code, field);
  CheckSettled(*ns);
  CHECK(Snap(*ns) == before);
}

TEST_CASE("Fetch rejects bad requests", "[server][fetch]") {
  TestServer s;
  const std::vector<int32_t> tokens = Tokens(3 * kPageSize, 1);
  REQUIRE(
      InsertPages(s.stub.get(), tokens, RandomBytes(3 * kPageBytes, 1), 4096)
          .ok());
  v1::MatchResponse m = MatchOk(s.stub.get(), tokens, true);
  REQUIRE(m.lease_id() != 0);
  using C = grpc::StatusCode;

  SECTION("unknown namespace") {
    ExpectFetchRejected(s, FetchByLease(m.lease_id(), 0, "nope"), C::NOT_FOUND,
                        "namespace");
  }
  SECTION("empty namespace") {
    ExpectFetchRejected(s, FetchByLease(m.lease_id(), 0, ""),
                        C::INVALID_ARGUMENT, "namespace");
  }
  SECTION("no source") {
    v1::FetchRequest req;
    req.set_namespace_(kNs);
    ExpectFetchRejected(s, req, C::INVALID_ARGUMENT, "source");
  }
  SECTION("lease 0") {
    ExpectFetchRejected(s, FetchByLease(0, 0), C::INVALID_ARGUMENT, "lease_id");
  }
  SECTION("unknown lease") {
    ExpectFetchRejected(s, FetchByLease(m.lease_id() + 12345, 0), C::NOT_FOUND,
                        "lease_id");
  }
  SECTION("start_page past the lease") {
    v1::FetchRequest req = FetchByLease(m.lease_id(), 0);
    req.set_start_page(3);
    ExpectFetchRejected(s, req, C::INVALID_ARGUMENT, "start_page");
  }
  SECTION("page_count past the lease") {
    v1::FetchRequest req = FetchByLease(m.lease_id(), 0);
    req.set_start_page(1);
    req.set_page_count(3);
    ExpectFetchRejected(s, req, C::INVALID_ARGUMENT, "page_count");
  }
  SECTION("start_page with a page list") {
    v1::FetchRequest req = FetchByHandles({m.page_handles(0)}, 0);
    req.set_start_page(1);
    ExpectFetchRejected(s, req, C::INVALID_ARGUMENT, "start_page");
  }
  SECTION("page_count with a page list") {
    v1::FetchRequest req = FetchByHandles({m.page_handles(0)}, 0);
    req.set_page_count(1);
    ExpectFetchRejected(s, req, C::INVALID_ARGUMENT, "page_count");
  }
  SECTION("an empty page list") {
    v1::FetchRequest req = FetchByHandles({}, 0);
    req.mutable_pages();
    ExpectFetchRejected(s, req, C::INVALID_ARGUMENT, "pages.page_handles");
  }
  SECTION("an unknown page handle") {
    ExpectFetchRejected(s, FetchByHandles({m.page_handles(0), 12345}, 0),
                        C::NOT_FOUND, "pages.page_handles[1]");
  }
  SECTION("max_chunk_bytes below the minimum") {
    ExpectFetchRejected(s, FetchByLease(m.lease_id(), 100), C::INVALID_ARGUMENT,
                        "max_chunk_bytes");
  }
  // Still serving, and the lease still fetches.
  FetchResult f = FetchAll(s.stub.get(), FetchByLease(m.lease_id(), 0));
  CHECK(f.status.ok());
  CHECK(f.chunks.size() == 3);
}

TEST_CASE("max_chunk_bytes over the daemon's maximum is capped",
          "[server][fetch]") {
  DaemonOptions o = TestOptions();
  o.max_chunk_bytes = 2048;
  o.default_chunk_bytes = 1024;
  TestServer s(o);
  const std::vector<int32_t> tokens = Tokens(2 * kPageSize, 1);
  const std::string bytes = RandomBytes(2 * kPageBytes, 8);
  REQUIRE(InsertPages(s.stub.get(), tokens, bytes, 4096).ok());
  v1::MatchResponse m = MatchOk(s.stub.get(), tokens, true);
  FetchResult big = FetchAll(s.stub.get(), FetchByLease(m.lease_id(), 1 << 30));
  REQUIRE(big.status.ok());
  CHECK(big.chunks.size() == 4);
  CHECK(Reassemble(big, 2048) == bytes);
  FetchResult def = FetchAll(s.stub.get(), FetchByLease(m.lease_id(), 0));
  REQUIRE(def.status.ok());
  CHECK(def.chunks.size() == 8);
  CHECK(Reassemble(def, 1024) == bytes);
}

TEST_CASE("A stale handle of an evicted page is not fetched",
          "[server][fetch]") {
  TestServer s;
  const std::vector<int32_t> tokens = Tokens(2 * kPageSize, 1);
  REQUIRE(
      InsertPages(s.stub.get(), tokens, RandomBytes(2 * kPageBytes, 1), 4096)
          .ok());
  v1::MatchResponse m = MatchOk(s.stub.get(), tokens);
  v1::EvictRequest ev;
  ev.set_namespace_(kNs);
  ev.set_all(true);
  grpc::ClientContext ctx;
  v1::EvictResponse er;
  REQUIRE(s.stub->Evict(&ctx, ev, &er).ok());
  REQUIRE(er.pages_evicted() == 2);
  // Re-store other bytes in the same slots: the old handles must not see them.
  REQUIRE(InsertPages(s.stub.get(), Tokens(2 * kPageSize, 500),
                      RandomBytes(2 * kPageBytes, 2), 4096)
              .ok());
  ExpectFetchRejected(s, FetchByHandles({m.page_handles(0)}, 0),
                      grpc::StatusCode::NOT_FOUND, "pages.page_handles[0]");
}

TEST_CASE("A cancelled Fetch releases its pins", "[server][fetch]") {
  // Pages of 1 MiB, so that the stream cannot complete within the HTTP/2
  // flow-control window before the client cancels.
  TestServer s(BigPageOptions());
  std::shared_ptr<Namespace> ns = s.ns("big");
  REQUIRE(ns->page_bytes() == (1u << 20));
  const uint64_t capacity = ns->Counters().capacity_pages;
  const size_t pages = 8;
  const std::vector<int32_t> tokens = Tokens(pages * 32, 1);
  REQUIRE(InsertPages(s.stub.get(), tokens, RandomBytes(pages << 20, 1),
                      1 << 20, nullptr, "big")
              .ok());
  v1::MatchResponse m = MatchOk(s.stub.get(), tokens, false, 0, "big");
  REQUIRE(m.page_handles_size() == static_cast<int>(pages));
  v1::FetchRequest req;
  req.set_namespace_("big");
  for (uint64_t h : m.page_handles()) req.mutable_pages()->add_page_handles(h);
  req.set_max_chunk_bytes(1024);
  {
    grpc::ClientContext ctx;
    auto reader = s.stub->Fetch(&ctx, req);
    v1::FetchResponse r;
    REQUIRE(reader->Read(&r));
    // Evicting while pinned retires the pages but cannot free their slots.
    v1::EvictRequest ev;
    ev.set_namespace_("big");
    ev.set_all(true);
    grpc::ClientContext ectx;
    v1::EvictResponse er;
    REQUIRE(s.stub->Evict(&ectx, ev, &er).ok());
    CHECK(er.pages_evicted() == pages);
    CHECK(ns->Counters().free_pages == capacity - pages);
    ctx.TryCancel();
    while (reader->Read(&r)) {
    }
    CHECK(reader->Finish().error_code() == grpc::StatusCode::CANCELLED);
  }
  CHECK(Eventually([&] { return ns->Counters().free_pages == capacity; }));
  // Only what was actually sent is counted, and far from all of it was.
  CHECK(ns->Counters().bytes_out < (pages << 20));
  CheckSettled(*ns);
}

TEST_CASE("Match accepts a 1M-token prompt of large ids", "[server][match]") {
  TestServer s;
  // 2^20 tokens of 5-byte varints: a ~5 MiB request, over gRPC's default
  // 4 MiB receive limit, within the daemon's.
  std::vector<int32_t> tokens(1 << 20, (1 << 30) + 7);
  v1::MatchResponse m = MatchOk(s.stub.get(), tokens);
  CHECK(m.matched_tokens() == 0);
  CHECK(s.ns()->Counters().miss_tokens == tokens.size());
  tokens.push_back(1);
  grpc::ClientContext ctx;
  v1::MatchRequest req;
  req.set_namespace_(kNs);
  for (int32_t t : tokens) req.add_token_ids(t);
  v1::MatchResponse resp;
  CheckError(s.stub->Match(&ctx, req, &resp),
             grpc::StatusCode::INVALID_ARGUMENT, "token_ids");
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
