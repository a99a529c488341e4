// Limits and deadlines through the wire: a Fetch or Insert whose deadline
// passes stops and frees what it held (pins, staged slots); calls beyond
// limits.max_in_flight_calls get RESOURCE_EXHAUSTED at once; calls beyond
// limits.max_concurrent_streams wait on their connection (never hang past
// their deadline) while other connections go on; oversize messages and
// token lists are refused before any work; a tiny ResourceQuota yields
// errors, never a crash; max_connection_age closes connections.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/server_test_util.h"
#include "tests/server/subprocess.h"

#ifndef KVHARBORD_PATH
#error "KVHARBORD_PATH (the built kvharbord) must be defined by the build"
#endif

namespace kvharbor {
namespace testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::system_clock;

DaemonOptions OptionsWithPages(uint32_t pages) {
  DaemonOptions o = TestOptions();
  o.namespaces[0].capacity_bytes = uint64_t{pages} * kPageBytes;
  return o;
}

// The counters that say what a namespace holds (not the traffic totals).
auto Holdings(const NamespaceStats& c) {
  return std::make_tuple(c.free_pages, c.cached_pages, c.evictable_pages,
                         c.protected_pages, c.active_leases,
                         c.uploads_in_flight);
}

// A channel with a connection of its own (not shared with other channels of
// the same target), with `args` added.
std::shared_ptr<grpc::Channel> OwnChannel(const Daemon& d,
                                          grpc::ChannelArguments args = {}) {
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(64 << 20);
  return grpc::CreateCustomChannel(d.address(),
                                   grpc::InsecureChannelCredentials(), args);
}

// Match of `tokens` (default: one page) with a deadline `timeout` away.
grpc::Status MatchWithin(v1::KvHarbor::Stub* stub, milliseconds timeout,
                         const std::vector<int32_t>& tokens = Tokens(kPageSize,
                                                                     1)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Clock::now() + timeout);
  v1::MatchRequest req;
  req.set_namespace_(kNs);
  for (int32_t t : tokens) req.add_token_ids(t);
  v1::MatchResponse resp;
  return stub->Match(&ctx, req, &resp);
}

// An Insert stream opened with its header and held open (no data yet).
struct HeldInsert {
  HeldInsert(v1::KvHarbor::Stub* stub, int32_t first) {
    // A deadline, so that a test that goes wrong fails instead of hanging.
    ctx.set_deadline(Clock::now() + std::chrono::seconds(20));
    writer = stub->Insert(&ctx, &resp);
    ok = writer->Write(Header(kNs, Tokens(kPageSize, first)));
  }
  grpc::Status Cancel() {
    ctx.TryCancel();
    return writer->Finish();
  }
  grpc::ClientContext ctx;
  v1::InsertResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::InsertRequest>> writer;
  bool ok = false;
};

TEST_CASE("A Fetch past its deadline stops sending and unpins its pages",
          "[server][limits][deadline]") {
  constexpr uint32_t kPages = 8192;  // 32 MiB in 1 KiB chunks
  TestServer t(OptionsWithPages(kPages));
  const std::vector<int32_t> tokens = Tokens(kPages * kPageSize, 1);
  const std::string bytes = RandomBytes(kPages * kPageBytes, 3);
  REQUIRE(InsertPages(t.stub.get(), tokens, bytes, 1 << 20).ok());
  auto ns = t.ns();
  const NamespaceStats idle = ns->Counters();
  const v1::MatchResponse m = MatchOk(t.stub.get(), tokens);
  REQUIRE(m.page_handles_size() == static_cast<int>(kPages));

  grpc::ClientContext ctx;
  ctx.set_deadline(Clock::now() + milliseconds(300));
  v1::FetchRequest req;
  req.set_namespace_(kNs);
  *req.mutable_pages()->mutable_page_handles() = m.page_handles();
  req.set_max_chunk_bytes(1024);
  auto reader = t.stub->Fetch(&ctx, req);
  v1::FetchResponse r;
  REQUIRE(reader->Read(&r));
  // While the stream runs its pages are pinned: evicted, their slots stay
  // taken until the stream lets go of them.
  CHECK(ns->EvictAll().pages == kPages);
  CHECK(ns->Counters().free_pages < kPages);
  // The client stops reading and lets the deadline pass.
  std::this_thread::sleep_for(milliseconds(600));
  while (reader->Read(&r)) {
  }
  const grpc::Status s = reader->Finish();
  CHECK(s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);

  REQUIRE(Eventually([&] {
    const NamespaceStats c = ns->Counters();
    return c.free_pages == kPages && c.cached_pages == 0 &&
           c.protected_pages == 0 && c.active_leases == 0;
  }));
  // The daemon stopped producing chunks: bytes_out no longer grows and falls
  // far short of the 32 MiB asked for.
  const uint64_t out = ns->Counters().bytes_out - idle.bytes_out;
  std::this_thread::sleep_for(milliseconds(200));
  CHECK(ns->Counters().bytes_out - idle.bytes_out == out);
  CHECK(out < uint64_t{kPages} * kPageBytes / 2);
  CheckSettled(*ns);
}

TEST_CASE("An Insert past its deadline stores nothing and frees its slots",
          "[server][limits][deadline]") {
  constexpr uint32_t kPages = 2048;
  TestServer t(OptionsWithPages(kPages));
  auto ns = t.ns();
  const NamespaceStats idle = ns->Counters();
  const std::vector<int32_t> tokens = Tokens(kPages * kPageSize, 1);
  const std::string bytes = RandomBytes(kPages * kPageBytes, 4);

  grpc::ClientContext ctx;
  ctx.set_deadline(Clock::now() + milliseconds(300));
  v1::InsertResponse resp;
  auto writer = t.stub->Insert(&ctx, &resp);
  REQUIRE(writer->Write(Header(kNs, tokens)));
  REQUIRE(writer->Write(Chunk(0, bytes.substr(0, 1 << 20))));
  // The upload holds staged slots while it runs.
  REQUIRE(Eventually([&] {
    const NamespaceStats c = ns->Counters();
    return c.uploads_in_flight == 1 && c.free_pages < idle.free_pages;
  }));
  std::this_thread::sleep_for(milliseconds(500));
  // A client that goes on sending after its deadline gets nowhere.
  for (uint64_t off = 1 << 20; off < bytes.size(); off += 1 << 20) {
    if (!writer->Write(Chunk(off, bytes.substr(off, 1 << 20)))) break;
  }
  writer->WritesDone();
  const grpc::Status s = writer->Finish();
  CHECK(s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);

  REQUIRE(
      Eventually([&] { return Holdings(ns->Counters()) == Holdings(idle); }));
  CHECK(ns->Counters().inserted_pages == idle.inserted_pages);
  CHECK(MatchOk(t.stub.get(), tokens).matched_tokens() == 0);
  CheckSettled(*ns);
}

TEST_CASE("Calls beyond max_in_flight_calls get RESOURCE_EXHAUSTED",
          "[server][limits][overload]") {
  DaemonOptions o = TestOptions();
  o.limits.max_in_flight_calls = 2;
  TestServer t(o);
  auto ns = t.ns();
  HeldInsert a(t.stub.get(), 1);
  HeldInsert b(t.stub.get(), 100);
  REQUIRE(a.ok);
  REQUIRE(b.ok);
  REQUIRE(Eventually([&] { return ns->Counters().uploads_in_flight == 2; }));

  // Unary calls and streams alike, answered at once (no hang).
  const auto start = Clock::now();
  CheckError(MatchWithin(t.stub.get(), milliseconds(5000)),
             grpc::StatusCode::RESOURCE_EXHAUSTED,
             "limits.max_in_flight_calls");
  CHECK(Clock::now() - start < milliseconds(2000));
  HeldInsert c(t.stub.get(), 200);
  c.writer->WritesDone();
  CheckError(c.writer->Finish(), grpc::StatusCode::RESOURCE_EXHAUSTED,
             "limits.max_in_flight_calls");
  v1::FetchRequest fetch;
  fetch.set_namespace_(kNs);
  fetch.set_lease_id(1);
  CheckError(FetchAll(t.stub.get(), fetch).status,
             grpc::StatusCode::RESOURCE_EXHAUSTED,
             "limits.max_in_flight_calls");
  // The turned-away calls took no slot of the limit: one held call ending
  // makes room for exactly one more.
  CHECK(a.Cancel().error_code() == grpc::StatusCode::CANCELLED);
  CHECK(Eventually(
      [&] { return MatchWithin(t.stub.get(), milliseconds(5000)).ok(); }));
  CHECK(b.Cancel().error_code() == grpc::StatusCode::CANCELLED);
  CHECK(Eventually([&] { return ns->Counters().uploads_in_flight == 0; }));
  CheckSettled(*ns);
}

TEST_CASE("A call's in-flight slot is free once its client has the status",
          "[server][limits][overload]") {
  // One admitted call at a time, and a client that sends each call as soon
  // as it has the previous one's status: none may be refused for a call it
  // already saw end (a call's OnDone can come after its client's reply).
  DaemonOptions o = TestOptions();
  o.limits.max_in_flight_calls = 1;
  TestServer t(o);
  for (int i = 0; i < 200; ++i) {
    const std::vector<int32_t> tokens = Tokens(kPageSize, 1000 * i);
    grpc::Status s =
        InsertPages(t.stub.get(), tokens, RandomBytes(kPageBytes, i), 4096);
    INFO("round " << i << ": " << s.error_message());
    REQUIRE(s.ok());
    const v1::MatchResponse m = MatchOk(t.stub.get(), tokens);
    REQUIRE(m.page_handles_size() == 1);
    v1::FetchRequest fetch;
    fetch.set_namespace_(kNs);
    fetch.mutable_pages()->add_page_handles(m.page_handles(0));
    FetchResult f = FetchAll(t.stub.get(), fetch);
    INFO(f.status.error_message());
    REQUIRE(f.status.ok());
  }
}

TEST_CASE("Calls beyond max_concurrent_streams wait on their connection only",
          "[server][limits][overload]") {
  DaemonOptions o = TestOptions();
  o.limits.max_concurrent_streams = 2;
  TestServer t(o);
  auto ns = t.ns();
  auto channel = OwnChannel(*t.daemon);
  auto stub = v1::KvHarbor::NewStub(channel);
  // The first call learns the connection's SETTINGS.
  REQUIRE(MatchWithin(stub.get(), milliseconds(5000)).ok());
  HeldInsert a(stub.get(), 1);
  HeldInsert b(stub.get(), 100);
  REQUIRE(Eventually([&] { return ns->Counters().uploads_in_flight == 2; }));

  // A third call on the same connection waits for a free stream and ends at
  // its deadline (gRPC clients queue it; nothing hangs).
  const auto queued_at = Clock::now();
  const grpc::Status queued = MatchWithin(stub.get(), milliseconds(300));
  INFO(queued.error_code() << ": " << queued.error_message());
  CHECK(queued.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK(Clock::now() - queued_at >= milliseconds(250));  // it did wait
  // Another connection is not limited by this one's streams.
  auto other = v1::KvHarbor::NewStub(OwnChannel(*t.daemon));
  CHECK(MatchWithin(other.get(), milliseconds(5000)).ok());
  // A stream ending lets the next call through.
  CHECK(a.Cancel().error_code() == grpc::StatusCode::CANCELLED);
  CHECK(MatchWithin(stub.get(), milliseconds(5000)).ok());
  CHECK(b.Cancel().error_code() == grpc::StatusCode::CANCELLED);
  CHECK(Eventually([&] { return ns->Counters().uploads_in_flight == 0; }));
}

TEST_CASE("Oversize messages and token lists are refused before any work",
          "[server][limits]") {
  DaemonOptions o = TestOptions();
  o.store.max_tokens_per_request = 64;
  o.limits.max_receive_message_bytes = 64 << 10;
  TestServer t(o);
  auto ns = t.ns();
  const NamespaceStats idle = ns->Counters();

  // 128 tokens: over store.max_tokens_per_request.
  const std::vector<int32_t> many = Tokens(128, 1);
  const std::string many_bytes = RandomBytes(32 * kPageBytes, 5);
  CheckError(InsertPages(t.stub.get(), many, many_bytes, 16 << 10),
             grpc::StatusCode::INVALID_ARGUMENT, "header.token_ids");
  CheckError(MatchWithin(t.stub.get(), milliseconds(5000), many),
             grpc::StatusCode::INVALID_ARGUMENT, "token_ids");
  CHECK(ns->Counters().miss_tokens == idle.miss_tokens);  // no walk was made

  // 64 KiB of pages in one chunk message is over the 64 KiB receive limit
  // (framing adds to it); gRPC refuses it and the upload is aborted. 16 KiB
  // chunks of the same pages go through.
  const std::vector<int32_t> tokens = Tokens(16 * kPageSize, 1);
  const std::string bytes = many_bytes.substr(0, 16 * kPageBytes);
  const grpc::Status big = InsertPages(t.stub.get(), tokens, bytes, 64 << 10);
  CHECK(big.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  REQUIRE(
      Eventually([&] { return Holdings(ns->Counters()) == Holdings(idle); }));
  CHECK(InsertPages(t.stub.get(), tokens, bytes, 16 << 10).ok());
  CheckSettled(*ns);
}

TEST_CASE("A tiny ResourceQuota yields errors or success, never a crash",
          "[server][limits][overload]") {
  DaemonOptions o = OptionsWithPages(256);
  o.limits.resource_quota_bytes = kMinResourceQuotaBytes;
  o.limits.max_threads = 4;
  TestServer t(o);
  auto ns = t.ns();
  std::atomic<int> ok{0};
  std::atomic<int> refused{0};
  std::atomic<int> unexpected{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto stub = v1::KvHarbor::NewStub(OwnChannel(*t.daemon));
      const std::vector<int32_t> tokens = Tokens(64 * kPageSize, 1000 * i);
      const std::string bytes = RandomBytes(64 * kPageBytes, i);
      for (int round = 0; round < 5; ++round) {
        grpc::Status s = InsertPages(stub.get(), tokens, bytes, 256 << 10);
        v1::FetchRequest req;
        req.set_namespace_(kNs);
        if (s.ok()) {
          grpc::ClientContext ctx;
          v1::MatchRequest mreq;
          mreq.set_namespace_(kNs);
          for (int32_t tok : tokens) mreq.add_token_ids(tok);
          v1::MatchResponse m;
          s = stub->Match(&ctx, mreq, &m);
          if (s.ok() && m.page_handles_size() > 0) {
            *req.mutable_pages()->mutable_page_handles() = m.page_handles();
            s = FetchAll(stub.get(), req).status;
          }
        }
        using C = grpc::StatusCode;
        switch (s.error_code()) {
          case C::OK:
            ++ok;
            break;
          // Quota pressure, or pages evicted by the other threads between
          // Match and Fetch.
          case C::RESOURCE_EXHAUSTED:
          case C::UNAVAILABLE:
          case C::NOT_FOUND:
            ++refused;
            break;
          default:
            UNSCOPED_INFO(s.error_code() << ": " << s.error_message());
            ++unexpected;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(unexpected == 0);
  CHECK(ok + refused == 40);
  // The daemon still answers and its namespace is consistent.
  CHECK(MatchWithin(t.stub.get(), milliseconds(5000)).ok());
  CheckSettled(*ns);
}

TEST_CASE("max_connection_age closes a connection after the grace time",
          "[server][limits][keepalive]") {
  auto hold_for = [](DaemonOptions o) {
    TestServer t(o);
    auto stub = v1::KvHarbor::NewStub(OwnChannel(*t.daemon));
    HeldInsert held(stub.get(), 1);
    REQUIRE(held.ok);
    std::this_thread::sleep_for(milliseconds(1500));
    // A write on a closed stream fails; on an open one it is taken.
    const bool open =
        held.writer->Write(Chunk(0, std::string(kPageBytes, 'x')));
    if (open) held.ctx.TryCancel();
    held.writer->Finish().IgnoreError();
    CHECK(
        Eventually([&] { return t.ns()->Counters().uploads_in_flight == 0; }));
    // The client reconnects for the next call.
    CHECK(MatchWithin(stub.get(), milliseconds(5000)).ok());
    return open;
  };
  DaemonOptions aging = TestOptions();
  aging.limits.keepalive.max_connection_age = absl::Milliseconds(200);
  aging.limits.keepalive.max_connection_age_grace = absl::Milliseconds(200);
  CHECK(!hold_for(aging));
  // Without an age limit the same stream stays open.
  CHECK(hold_for(TestOptions()));
}

TEST_CASE("kvharbord's limit flags apply and are validated",
          "[server][limits][process]") {
  {
    Kvharbord bad(KVHARBORD_PATH, {"--max_in_flight_calls=0"});
    REQUIRE(bad.started());
    const int status = bad.WaitExit(milliseconds(10000));
    REQUIRE(status != -1);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
  }
  Kvharbord proc(
      KVHARBORD_PATH,
      {"--max_in_flight_calls=1", "--max_concurrent_streams=8",
       "--max_receive_message_bytes=32MiB", "--resource_quota_bytes=64MiB"});
  REQUIRE(proc.started());
  auto channel = proc.Connect();
  REQUIRE(channel != nullptr);
  auto stub = v1::KvHarbor::NewStub(channel);
  CreateTestNamespace(stub.get());
  HeldInsert held(stub.get(), 1);
  REQUIRE(held.ok);
  // The one admitted call is the held upload; give it time to arrive.
  CHECK(Eventually([&] {
    return MatchWithin(stub.get(), milliseconds(5000)).error_code() ==
           grpc::StatusCode::RESOURCE_EXHAUSTED;
  }));
  CHECK(held.Cancel().error_code() == grpc::StatusCode::CANCELLED);
  CHECK(Eventually(
      [&] { return MatchWithin(stub.get(), milliseconds(5000)).ok(); }));
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
