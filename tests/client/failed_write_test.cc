// client::FinishAfterFailedWrite (client/failed_write.h) against a real
// daemon: a call the daemon already ended gives the daemon's status at once;
// a call still open at the daemon (what gRPC sometimes leaves behind a
// refused write) is cancelled after the grace, reported UNAVAILABLE, and its
// staged upload is aborted, storing nothing.
#include "client/failed_write.h"

#include <catch2/catch.hpp>
#include <chrono>

#include "tests/server/server_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

using Clock = std::chrono::steady_clock;

TEST_CASE("FinishAfterFailedWrite returns the daemon's status when it has one",
          "[client][failed_write]") {
  TestServer t;
  grpc::ClientContext ctx;
  v1::InsertResponse resp;
  auto writer = t.stub->Insert(&ctx, &resp);
  // A header of another namespace: the daemon ends the call at once.
  REQUIRE(writer->Write(Header("no-such-namespace", Tokens(kPageSize, 1))));
  const auto start = Clock::now();
  const grpc::Status s = client::FinishAfterFailedWrite(
      &ctx, [&] { return writer->Finish(); }, "Insert", absl::Seconds(30));
  INFO(s.error_message());
  CHECK(s.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(s.error_message().find("header.namespace") != std::string::npos);
  CHECK(Clock::now() - start < std::chrono::seconds(10));  // not the grace
}

TEST_CASE(
    "FinishAfterFailedWrite cancels a call the daemon still holds open, "
    "which stores nothing",
    "[client][failed_write]") {
  TestServer t;
  auto ns = t.ns();
  const NamespaceStats idle = ns->Counters();
  grpc::ClientContext ctx;
  v1::InsertResponse resp;
  auto writer = t.stub->Insert(&ctx, &resp);
  // An accepted header and half the data: the daemon waits for the rest.
  const std::vector<int32_t> tokens = Tokens(4 * kPageSize, 1);
  const std::string bytes = RandomBytes(4 * kPageBytes, 7);
  REQUIRE(writer->Write(Header(kNs, tokens)));
  REQUIRE(writer->Write(Chunk(0, bytes.substr(0, 2 * kPageBytes))));
  REQUIRE(Eventually([&] { return ns->Counters().uploads_in_flight == 1; }));
  const auto start = Clock::now();
  const grpc::Status s = client::FinishAfterFailedWrite(
      &ctx, [&] { return writer->Finish(); }, "Insert",
      absl::Milliseconds(200));
  const auto took = Clock::now() - start;
  INFO(s.error_message());
  CHECK(s.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(s.error_message().find("Insert: gRPC refused a write") !=
        std::string::npos);
  CHECK(took >= std::chrono::milliseconds(200));
  CHECK(took < std::chrono::seconds(10));
  // The daemon aborted the upload: nothing stored, its slots free again.
  CheckSettled(*ns);
  CHECK(ns->Counters().cached_pages == idle.cached_pages);
  CHECK(ns->Counters().free_pages == idle.free_pages);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
