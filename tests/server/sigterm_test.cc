// The kvharbord binary as a process: SIGTERM (and SIGINT) drain in-flight
// calls and exit 0; calls still running after the drain time are cancelled.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/server/server_test_util.h"
#include "tests/server/subprocess.h"

#ifndef KVHARBORD_PATH
#error "KVHARBORD_PATH (the built kvharbord) must be defined by the build"
#endif

namespace kvharbor {
namespace testing {
namespace {

using std::chrono::milliseconds;

TEST_CASE("kvharbord drains an in-flight upload on SIGTERM and exits 0",
          "[server][process]") {
  Kvharbord proc(KVHARBORD_PATH, {"--pool_bytes=16MiB"});
  REQUIRE(proc.started());
  auto ch = proc.Connect();
  REQUIRE(ch != nullptr);
  auto stub = v1::KvHarbor::NewStub(ch);
  CreateTestNamespace(stub.get());
  {
    auto health = grpc::health::v1::Health::NewStub(ch);
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    REQUIRE(health->Check(&ctx, req, &resp).ok());
    CHECK(resp.status() == grpc::health::v1::HealthCheckResponse::SERVING);
  }

  const std::vector<int32_t> tokens = Tokens(2 * kPageSize, 1);
  const std::string bytes = RandomBytes(2 * kPageBytes, 1);
  grpc::ClientContext ctx;
  v1::InsertResponse resp;
  auto writer = stub->Insert(&ctx, &resp);
  REQUIRE(writer->Write(Header(kNs, tokens)));
  REQUIRE(writer->Write(Chunk(0, bytes.substr(0, 3000))));
  // Let the header reach the daemon before the signal.
  std::this_thread::sleep_for(milliseconds(200));

  proc.Signal(SIGTERM);
  // Still draining: the upload's call is alive, so the process is too.
  CHECK(proc.WaitExit(milliseconds(300)) == -1);
  REQUIRE(writer->Write(Chunk(3000, bytes.substr(3000))));
  writer->WritesDone();
  grpc::Status st = writer->Finish();
  INFO(st.error_message());
  CHECK(st.ok());
  CHECK(resp.pages_stored() == 2);

  const int status = proc.WaitExit(milliseconds(10000));
  REQUIRE(status != -1);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("kvharbord cancels calls left after the drain time, exits 0",
          "[server][process]") {
  Kvharbord proc(KVHARBORD_PATH, {"--drain_timeout=300ms"});
  REQUIRE(proc.started());
  auto ch = proc.Connect();
  REQUIRE(ch != nullptr);
  auto stub = v1::KvHarbor::NewStub(ch);
  CreateTestNamespace(stub.get());
  grpc::ClientContext ctx;
  v1::InsertResponse resp;
  auto writer = stub->Insert(&ctx, &resp);
  REQUIRE(writer->Write(Header(kNs, Tokens(kPageSize, 1))));
  std::this_thread::sleep_for(milliseconds(200));

  const auto start = std::chrono::steady_clock::now();
  proc.Signal(SIGINT);
  const int status = proc.WaitExit(milliseconds(10000));
  const auto took = std::chrono::steady_clock::now() - start;
  REQUIRE(status != -1);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(took >= milliseconds(250));
  CHECK_FALSE(writer->Finish().ok());
}

TEST_CASE("kvharbord refuses a bad config and exits non-zero",
          "[server][process]") {
  Kvharbord proc(KVHARBORD_PATH, {"--config=/nonexistent/kvharbord.yaml"});
  REQUIRE(proc.started());
  const int status = proc.WaitExit(milliseconds(10000));
  REQUIRE(status != -1);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 2);
  Kvharbord bad_flag(KVHARBORD_PATH, {"--pool_bytes=lots"});
  const int s2 = bad_flag.WaitExit(milliseconds(10000));
  REQUIRE(s2 != -1);
  CHECK(WEXITSTATUS(s2) == 2);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
