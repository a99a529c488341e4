// Health while the daemon starts: once the gRPC listener is bound but Start
// has not finished, both "" and kvharbor.v1.KvHarbor report NOT_SERVING;
// after Start returns, SERVING. (Draining is covered in lifecycle_test.cc.)
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/server/server_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

HealthCheckResponse::ServingStatus CheckHealth(const std::string& address,
                                               const std::string& service) {
  auto stub = Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  const grpc::Status s = stub->Check(&ctx, req, &resp);
  INFO(s.error_message());
  REQUIRE(s.ok());
  return resp.status();
}

TEST_CASE("Health is NOT_SERVING while the daemon starts",
          "[server][lifecycle]") {
  DaemonOptions o = TestOptions();
  o.metrics_listen = "127.0.0.1:0";
  int hook_port = 0;
  HealthCheckResponse::ServingStatus during_all = HealthCheckResponse::UNKNOWN;
  HealthCheckResponse::ServingStatus during_service =
      HealthCheckResponse::UNKNOWN;
  o.before_serving = [&](int port) {
    hook_port = port;
    const std::string address = "127.0.0.1:" + std::to_string(port);
    during_all = CheckHealth(address, "");
    during_service = CheckHealth(address, "kvharbor.v1.KvHarbor");
  };
  TestServer s(o);
  CHECK(hook_port == s.daemon->port());
  CHECK(during_all == HealthCheckResponse::NOT_SERVING);
  CHECK(during_service == HealthCheckResponse::NOT_SERVING);
  CHECK(CheckHealth(s.daemon->address(), "") == HealthCheckResponse::SERVING);
  CHECK(CheckHealth(s.daemon->address(), "kvharbor.v1.KvHarbor") ==
        HealthCheckResponse::SERVING);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
