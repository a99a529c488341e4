// The limits: config section: the example's values load, every field is
// validated with a message naming it, and a daemon starts with them.
#include <catch2/catch.hpp>
#include <string>

#include "server/daemon/config.h"
#include "server/daemon/daemon.h"
#include "server/daemon/limits.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

using testing::TempDir;

absl::Status Load(const std::string& yaml, DaemonOptions* o) {
  TempDir dir;
  return LoadConfigFile(dir.Write("kvharbord.yaml", yaml), o);
}

TEST_CASE("The example config's limits load", "[server][config][limits]") {
  DaemonOptions o;
  absl::Status s = LoadConfigFile(
      std::string(KVHARBOR_SOURCE_DIR) + "/deploy/kvharbord.example.yaml", &o);
  INFO(s.ToString());
  REQUIRE(s.ok());
  const LimitsOptions defaults;
  CHECK(o.limits.max_receive_message_bytes == (16u << 20));
  CHECK(o.limits.max_concurrent_streams == defaults.max_concurrent_streams);
  CHECK(o.limits.max_in_flight_calls == defaults.max_in_flight_calls);
  CHECK(o.limits.resource_quota_bytes == 0);
  CHECK(o.limits.keepalive.time == absl::Seconds(60));
  CHECK(o.limits.keepalive.permit_without_calls);
}

TEST_CASE("A limits section sets only its keys", "[server][config][limits]") {
  DaemonOptions o;
  absl::Status s = Load(
      "limits:\n"
      "  max_receive_message_bytes: 32MiB\n"
      "  max_concurrent_streams: 8\n"
      "  resource_quota_bytes: 64MiB\n"
      "  max_threads: 16\n"
      "  max_in_flight_calls: 12\n"
      "  keepalive:\n"
      "    time_ms: 5000\n"
      "    timeout_ms: 1000\n"
      "    min_client_ping_interval_ms: 250\n"
      "    max_ping_strikes: 0\n"
      "    permit_without_calls: false\n"
      "    max_connection_idle_ms: 60000\n"
      "    max_connection_age_ms: 120000\n"
      "    max_connection_age_grace_ms: 3000\n",
      &o);
  INFO(s.ToString());
  REQUIRE(s.ok());
  const LimitsOptions& l = o.limits;
  CHECK(l.max_receive_message_bytes == (32u << 20));
  CHECK(l.max_concurrent_streams == 8);
  CHECK(l.resource_quota_bytes == (64u << 20));
  CHECK(l.max_threads == 16);
  CHECK(l.max_in_flight_calls == 12);
  CHECK(l.keepalive.time == absl::Seconds(5));
  CHECK(l.keepalive.timeout == absl::Seconds(1));
  CHECK(l.keepalive.min_client_ping_interval == absl::Milliseconds(250));
  CHECK(l.keepalive.max_ping_strikes == 0);
  CHECK(!l.keepalive.permit_without_calls);
  CHECK(l.keepalive.max_connection_idle == absl::Minutes(1));
  CHECK(l.keepalive.max_connection_age == absl::Minutes(2));
  CHECK(l.keepalive.max_connection_age_grace == absl::Seconds(3));

  DaemonOptions partial;
  REQUIRE(Load("limits: {max_in_flight_calls: 3}\n", &partial).ok());
  CHECK(partial.limits.max_in_flight_calls == 3);
  CHECK(partial.limits.max_concurrent_streams ==
        LimitsOptions().max_concurrent_streams);
}

TEST_CASE("Bad limits are rejected naming the key",
          "[server][config][limits]") {
  struct Case {
    const char* yaml;
    const char* prefix;
  };
  const Case cases[] = {
      {"limits: 5\n", "config: limits: must be a mapping"},
      {"limits: {max_streams: 1}\n", "config: limits.max_streams: unknown key"},
      {"limits: {max_receive_message_bytes: 1KiB}\n",
       "config: limits.max_receive_message_bytes: 1024 is out of range"},
      {"limits: {max_receive_message_bytes: 2GiB}\n",
       "config: limits.max_receive_message_bytes:"},
      {"limits: {max_receive_message_bytes: big}\n",
       "config: limits.max_receive_message_bytes:"},
      // 1048576 tokens need about 5 MiB.
      {"limits: {max_receive_message_bytes: 1MiB}\n",
       "config: limits.max_receive_message_bytes: 1048576 is too small for a "
       "request with store.max_tokens_per_request=1048576"},
      {"limits: {max_concurrent_streams: 0}\n",
       "config: limits.max_concurrent_streams: 0 is out of range"},
      {"limits: {max_concurrent_streams: -1}\n",
       "config: limits.max_concurrent_streams:"},
      {"limits: {resource_quota_bytes: 1000}\n",
       "config: limits.resource_quota_bytes: 1000 is below the minimum"},
      {"limits: {max_threads: 1}\n", "config: limits.max_threads:"},
      {"limits: {max_in_flight_calls: 0}\n",
       "config: limits.max_in_flight_calls:"},
      {"limits: {max_in_flight_calls: 99999999999}\n",
       "config: limits.max_in_flight_calls:"},
      {"limits: {keepalive: 3}\n",
       "config: limits.keepalive: must be a mapping"},
      {"limits: {keepalive: {ping_ms: 1}}\n",
       "config: limits.keepalive.ping_ms: unknown key"},
      {"limits: {keepalive: {time_ms: 10}}\n",
       "config: limits.keepalive.time_ms: 10 is out of range"},
      {"limits: {keepalive: {timeout_ms: 0}}\n",
       "config: limits.keepalive.timeout_ms:"},
      {"limits: {keepalive: {max_connection_age_ms: 3000000000}}\n",
       "config: limits.keepalive.max_connection_age_ms:"},
      {"limits: {keepalive: {max_connection_age_grace_ms: 10}}\n",
       "config: limits.keepalive.max_connection_age_grace_ms: set without"},
      {"limits: {keepalive: {max_ping_strikes: 5000}}\n",
       "config: limits.keepalive.max_ping_strikes:"},
      {"limits: {keepalive: {permit_without_calls: yes}}\n",
       "config: limits.keepalive.permit_without_calls: 'yes' is not true or "
       "false"},
  };
  for (const Case& c : cases) {
    DaemonOptions o;
    const uint32_t before = o.limits.max_in_flight_calls;
    absl::Status s = Load(c.yaml, &o);
    INFO(c.yaml << " -> " << s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Matchers::StartsWith(c.prefix));
    CHECK(o.limits.max_in_flight_calls == before);  // unchanged on error
  }
}

TEST_CASE("A small receive limit fits a small max_tokens_per_request",
          "[server][config][limits]") {
  DaemonOptions o;
  absl::Status s = Load(
      "store: {max_tokens_per_request: 4096}\n"
      "limits: {max_receive_message_bytes: 64KiB}\n",
      &o);
  INFO(s.ToString());
  CHECK(s.ok());
  // The same check guards embedders that skip the config file.
  DaemonOptions direct;
  direct.limits.max_receive_message_bytes = 64 << 10;
  s = ValidateDaemonOptions(direct, "options");
  CHECK_THAT(std::string(s.message()),
             Catch::Matchers::StartsWith(
                 "options: limits.max_receive_message_bytes:"));
}

TEST_CASE("A daemon starts with every limit set", "[server][config][limits]") {
  DaemonOptions o;
  o.listen = "127.0.0.1:0";
  o.store.pool_budget_bytes = 16 << 20;
  o.store.default_namespace_bytes = 1 << 20;
  o.limits.resource_quota_bytes = 32 << 20;
  o.limits.max_threads = 8;
  o.limits.max_concurrent_streams = 4;
  o.limits.keepalive.max_connection_idle = absl::Seconds(30);
  o.limits.keepalive.max_connection_age = absl::Seconds(60);
  o.limits.keepalive.max_connection_age_grace = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  (*d)->Shutdown(absl::ZeroDuration());
}

}  // namespace
}  // namespace kvharbor
