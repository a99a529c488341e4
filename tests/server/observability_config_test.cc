// The metrics.listen and log.* config keys: loaded from a file, left alone
// when absent, and every bad value rejected with a message naming the key.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <string>

#include "server/daemon/config.h"
#include "server/daemon/daemon.h"

namespace kvharbor {
namespace {

class TempYaml {
 public:
  explicit TempYaml(const std::string& text) {
    char name[] = "/tmp/kvharbor_obs_config_XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    close(fd);
    path_ = name;
    std::ofstream(path_) << text;
  }
  ~TempYaml() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST_CASE("metrics and log keys load from the config file",
          "[server][config]") {
  TempYaml f(
      "metrics:\n  listen: \"0.0.0.0:9100\"\n"
      "log:\n  format: json\n  level: debug\n");
  DaemonOptions o;
  absl::Status s = LoadConfigFile(f.path(), &o);
  INFO(s.ToString());
  REQUIRE(s.ok());
  CHECK(o.metrics_listen == "0.0.0.0:9100");
  CHECK(o.log_format == "json");
  CHECK(o.log_level == "debug");

  TempYaml off("metrics:\n  listen: \"\"\n");
  REQUIRE(LoadConfigFile(off.path(), &o).ok());
  CHECK(o.metrics_listen.empty());
  CHECK(o.log_format == "json");  // absent keys keep their value

  TempYaml example_keys("metrics:\nlog:\n");  // empty sections are fine
  REQUIRE(LoadConfigFile(example_keys.path(), &o).ok());
}

TEST_CASE("The example config sets the metrics and log defaults",
          "[server][config]") {
  DaemonOptions o;
  const absl::Status s = LoadConfigFile(
      std::string(KVHARBOR_SOURCE_DIR) + "/deploy/kvharbord.example.yaml", &o);
  INFO(s.ToString());
  REQUIRE(s.ok());
  CHECK(o.metrics_listen == kDefaultMetricsListen);
  CHECK(o.log_format == "text");
  CHECK(o.log_level == "info");
}

TEST_CASE("Bad metrics and log values are rejected naming the key",
          "[server][config]") {
  struct Case {
    const char* yaml;
    const char* prefix;
  };
  const Case cases[] = {
      {"metrics: 5\n", "config: metrics: must be a mapping"},
      {"metrics: {port: 9}\n", "config: metrics.port: unknown key"},
      {"metrics: {listen: nowhere}\n", "config: metrics.listen: 'nowhere'"},
      {"metrics: {listen: \"127.0.0.1:70000\"}\n", "config: metrics.listen:"},
      {"metrics: {listen: [a]}\n",
       "config: metrics.listen: must be a single value"},
      {"log: {format: xml}\n", "config: log.format: 'xml' is not text or json"},
      {"log: {level: loud}\n", "config: log.level: 'loud'"},
      {"log: {colour: red}\n", "config: log.colour: unknown key"},
      {"log: [json]\n", "config: log: must be a mapping"},
  };
  for (const Case& c : cases) {
    INFO(c.yaml);
    TempYaml f(c.yaml);
    DaemonOptions o;
    const absl::Status s = LoadConfigFile(f.path(), &o);
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Matchers::StartsWith(c.prefix));
    CHECK(o.metrics_listen.empty());  // untouched on error
  }
}

}  // namespace
}  // namespace kvharbor
