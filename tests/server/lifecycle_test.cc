// Daemon lifecycle in-process: Start errors, the standard health service,
// Shutdown draining in-flight calls (and cancelling them past the drain
// time), idempotent Shutdown and Wait.
#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "server/daemon/config.h"
#include "tests/server/server_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

HealthCheckResponse::ServingStatus Check(
    const std::shared_ptr<grpc::Channel>& ch, const std::string& service,
    grpc::Status* status = nullptr) {
  auto stub = Health::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (status != nullptr) *status = s;
  return resp.status();
}

TEST_CASE("Health reports SERVING for the server and the service",
          "[server][health]") {
  TestServer s;
  CHECK(Check(s.channel, "") == HealthCheckResponse::SERVING);
  CHECK(Check(s.channel, "kvharbor.v1.KvHarbor") ==
        HealthCheckResponse::SERVING);
  grpc::Status st;
  Check(s.channel, "no.such.Service", &st);
  CHECK(st.error_code() == grpc::StatusCode::NOT_FOUND);
}

TEST_CASE("Shutdown turns health NOT_SERVING for watchers",
          "[server][health]") {
  TestServer s;
  auto stub = Health::NewStub(s.channel);
  grpc::ClientContext ctx;
  HealthCheckRequest req;
  req.set_service("kvharbor.v1.KvHarbor");
  auto reader = stub->Watch(&ctx, req);
  HealthCheckResponse resp;
  REQUIRE(reader->Read(&resp));
  CHECK(resp.status() == HealthCheckResponse::SERVING);
  // A future, not a thread: a failed REQUIRE below unwinds through its
  // destructor, which waits for Shutdown instead of aborting the process.
  auto stopper = std::async(std::launch::async,
                            [&] { s.daemon->Shutdown(absl::Seconds(2)); });
  // The update arrives before the stream is cancelled (Shutdown leaves
  // watchers a grace for it).
  const bool got = reader->Read(&resp);
  CHECK(got);
  CHECK(resp.status() == HealthCheckResponse::NOT_SERVING);
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  reader->Finish();
  stopper.get();
  CHECK(s.daemon->shut_down());
}

TEST_CASE("An open health Watch does not hold up Shutdown",
          "[server][health]") {
  TestServer s;
  auto stub = Health::NewStub(s.channel);
  grpc::ClientContext ctx;
  HealthCheckRequest req;
  auto reader = stub->Watch(&ctx, req);
  HealthCheckResponse resp;
  REQUIRE(reader->Read(&resp));
  const absl::Time start = absl::Now();
  s.daemon->Shutdown(absl::Seconds(3));
  CHECK(absl::Now() - start < absl::Seconds(2));
  while (reader->Read(&resp)) {
  }
  reader->Finish();
}

TEST_CASE("Start reports bad options and busy ports", "[server][lifecycle]") {
  spdlog::set_level(spdlog::level::warn);
  DaemonOptions o = TestOptions();
  SECTION("malformed listen address") {
    o.listen = "localhost";
    auto d = Daemon::Start(o);
    REQUIRE_FALSE(d.ok());
    CHECK_THAT(std::string(d.status().message()),
               Catch::Matchers::StartsWith("options: listen:"));
  }
  SECTION("port out of range") {
    o.listen = "127.0.0.1:70000";
    auto d = Daemon::Start(o);
    REQUIRE_FALSE(d.ok());
    CHECK_THAT(std::string(d.status().message()),
               Catch::Matchers::StartsWith("options: listen:"));
  }
  SECTION("a port already in use") {
    TestServer first;
    o.listen = first.daemon->address();
    auto d = Daemon::Start(o);
    REQUIRE_FALSE(d.ok());
    CHECK_THAT(std::string(d.status().message()),
               Catch::Matchers::StartsWith("listen:"));
    // The first daemon is unaffected.
    CHECK(MatchOk(first.stub.get(), Tokens(4, 1)).matched_tokens() == 0);
  }
  SECTION("default chunk over the maximum") {
    o.default_chunk_bytes = o.max_chunk_bytes + 1;
    auto d = Daemon::Start(o);
    REQUIRE_FALSE(d.ok());
    CHECK_THAT(
        std::string(d.status().message()),
        Catch::Matchers::StartsWith("options: fetch.default_chunk_bytes:"));
  }
  SECTION("a bad namespace spec") {
    o.namespaces[0].geometry.head_dim = 0;
    auto d = Daemon::Start(o);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(d.status().message()),
               Catch::Matchers::StartsWith("namespaces[0] ('test'): ") &&
                   Catch::Matchers::Contains("head_dim"));
  }
  SECTION("a namespace larger than the budget") {
    o.store.pool_budget_bytes = kPageBytes * kCapacityPages - 1;
    auto d = Daemon::Start(o);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(d.status().message()),
               Catch::Matchers::Contains("spec.capacity_bytes"));
  }
  SECTION("a budget larger than the machine's memory") {
    o.store.pool_budget_bytes = PhysicalRamBytes() + (uint64_t{1} << 30);
    auto d = Daemon::Start(o);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(d.status().message()),
               Catch::Matchers::StartsWith(
                   "store.pool_budget_bytes (--pool_bytes): ") &&
                   Catch::Matchers::Contains("more than this machine's"));
  }
}

TEST_CASE("address and port name the bound port", "[server][lifecycle]") {
  TestServer s;
  CHECK(s.daemon->port() > 0);
  CHECK(s.daemon->address() == "127.0.0.1:" + std::to_string(s.daemon->port()));
  DaemonOptions o = TestOptions();
  o.listen = "0.0.0.0:0";
  TestServer any(o);
  CHECK(any.daemon->address() ==
        "127.0.0.1:" + std::to_string(any.daemon->port()));
  CHECK(Check(any.channel, "") == HealthCheckResponse::SERVING);
}

TEST_CASE("Shutdown drains an in-flight upload", "[server][lifecycle]") {
  TestServer s;
  std::shared_ptr<Namespace> ns = s.ns();
  const std::vector<int32_t> tokens = Tokens(2 * kPageSize, 1);
  const std::string bytes = RandomBytes(2 * kPageBytes, 3);
  grpc::ClientContext ctx;
  v1::InsertResponse resp;
  auto writer = s.stub->Insert(&ctx, &resp);
  REQUIRE(writer->Write(Header(kNs, tokens)));
  REQUIRE(writer->Write(Chunk(0, bytes.substr(0, 5000))));
  REQUIRE(Eventually([&] { return ns->Counters().uploads_in_flight == 1; }));

  std::atomic<bool> returned{false};
  std::thread stopper([&] {
    s.daemon->Shutdown(absl::Seconds(10));
    returned = true;
  });
  // The daemon stops taking new calls but waits for this one.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK_FALSE(returned.load());
  // During the drain health says NOT_SERVING and new calls are turned away.
  CHECK(Check(s.channel, "") == HealthCheckResponse::NOT_SERVING);
  CHECK(Check(s.channel, "kvharbor.v1.KvHarbor") ==
        HealthCheckResponse::NOT_SERVING);
  {
    grpc::ClientContext c2;
    v1::StatsResponse sr;
    CheckError(s.stub->Stats(&c2, v1::StatsRequest(), &sr),
               grpc::StatusCode::UNAVAILABLE, "server");
    grpc::ClientContext c3;
    v1::InsertResponse ir;
    auto w2 = s.stub->Insert(&c3, &ir);
    w2->Write(Header(kNs, tokens));
    w2->WritesDone();
    CheckError(w2->Finish(), grpc::StatusCode::UNAVAILABLE, "server");
    v1::FetchRequest fr;
    fr.set_namespace_(kNs);
    fr.set_lease_id(1);
    CheckError(FetchAll(s.stub.get(), fr).status, grpc::StatusCode::UNAVAILABLE,
               "server");
  }
  CHECK_FALSE(returned.load());
  REQUIRE(writer->Write(Chunk(5000, bytes.substr(5000))));
  writer->WritesDone();
  grpc::Status st = writer->Finish();
  INFO(st.error_message());
  CHECK(st.ok());
  CHECK(resp.pages_stored() == 2);
  stopper.join();
  CHECK(returned.load());
  CHECK(ns->Counters().cached_pages == 2);
  CHECK(ns->CheckInvariants().ok());
}

TEST_CASE("Shutdown cancels calls still running after the drain time",
          "[server][lifecycle]") {
  TestServer s;
  std::shared_ptr<Namespace> ns = s.ns();
  grpc::ClientContext ctx;
  v1::InsertResponse resp;
  auto writer = s.stub->Insert(&ctx, &resp);
  REQUIRE(writer->Write(Header(kNs, Tokens(2 * kPageSize, 1))));
  REQUIRE(Eventually([&] { return ns->Counters().uploads_in_flight == 1; }));

  const absl::Time start = absl::Now();
  s.daemon->Shutdown(absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  CHECK(took >= absl::Milliseconds(250));
  CHECK(took < absl::Seconds(5));
  grpc::Status st = writer->Finish();
  CHECK_FALSE(st.ok());
  // The aborted upload gave its slots back.
  CHECK(ns->Counters().uploads_in_flight == 0);
  CHECK(ns->Counters().free_pages == kCapacityPages);
  CHECK(ns->CheckInvariants().ok());
}

TEST_CASE("Shutdown is idempotent and Wait returns after it",
          "[server][lifecycle]") {
  TestServer s;
  auto waited = std::async(std::launch::async, [&] { s.daemon->Wait(); });
  CHECK(waited.wait_for(std::chrono::milliseconds(100)) ==
        std::future_status::timeout);
  std::thread a([&] { s.daemon->Shutdown(absl::Seconds(1)); });
  std::thread b([&] { s.daemon->Shutdown(absl::Seconds(1)); });
  a.join();
  b.join();
  s.daemon->Shutdown(absl::Seconds(1));
  CHECK(waited.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  CHECK(s.daemon->shut_down());
  s.daemon.reset();  // the destructor after Shutdown is fine too
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
