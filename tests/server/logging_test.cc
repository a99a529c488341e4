// Structured logs: the JSON line formatter (fields, escaping of anything a
// message may hold), log option validation, and the store watcher's
// one-line-per-event logging (eviction bursts, nothing while idle).
#include "server/daemon/logging.h"

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "server/metrics/store_watcher.h"
#include "spdlog/sinks/ostream_sink.h"
#include "tests/server/server_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

// "YYYY-MM-DDTHH:MM:SS.ffffffZ". (No std::regex: GCC 12's -Wmaybe-uninitialized
// misfires inside <regex> in the sanitizer build.)
bool IsUtcMicrosTimestamp(const std::string& ts) {
  const std::string shape = "dddd-dd-ddTdd:dd:dd.ddddddZ";
  if (ts.size() != shape.size()) return false;
  for (size_t i = 0; i < ts.size(); ++i) {
    const bool ok =
        shape[i] == 'd' ? (ts[i] >= '0' && ts[i] <= '9') : ts[i] == shape[i];
    if (!ok) return false;
  }
  return true;
}

// Routes the default logger into a string for the test's lifetime.
class CapturedLog {
 public:
  explicit CapturedLog(bool json) : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    auto logger = std::make_shared<spdlog::logger>("captured", sink);
    if (json) logger->set_formatter(std::make_unique<JsonLogFormatter>());
    logger->set_level(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  std::vector<std::string> Lines() const {
    std::vector<std::string> lines;
    std::istringstream in(out_.str());
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST_CASE("JSON log lines carry ts, level and an escaped msg",
          "[server][logging]") {
  CapturedLog log(/*json=*/true);
  const std::string tricky =
      "quote \" backslash \\ newline \n tab \t ctrl \x01 del \x7f "
      "utf8 \xc3\xa9 bad \xff\xc3 end";
  spdlog::warn("{}", tricky);
  spdlog::info("plain");
  spdlog::debug("below the level: not written");
  const std::vector<std::string> lines = log.Lines();
  REQUIRE(lines.size() == 2);  // one object per line: the \n was escaped
  const nlohmann::json j = nlohmann::json::parse(lines[0]);
  CHECK(j.size() == 3);
  CHECK(j["level"] == "warning");
  CHECK(j["msg"] ==
        "quote \" backslash \\ newline \n tab \t ctrl \x01 del \x7f "
        "utf8 \xc3\xa9 bad \xef\xbf\xbd\xef\xbf\xbd end");
  const std::string ts = j["ts"];
  CHECK(IsUtcMicrosTimestamp(ts));
  const nlohmann::json k = nlohmann::json::parse(lines[1]);
  CHECK(k["level"] == "info");
  CHECK(k["msg"] == "plain");
}

TEST_CASE("AppendJsonEscaped rejects overlong and surrogate UTF-8",
          "[server][logging]") {
  std::string out;
  AppendJsonEscaped("\xc0\xaf|\xed\xa0\x80|\xf0\x9f\x98\x80", &out);
  CHECK(out == "\\ufffd\\ufffd|\\ufffd\\ufffd\\ufffd|\xf0\x9f\x98\x80");
}

TEST_CASE("Log options are validated naming the key", "[server][logging]") {
  CHECK(ValidateLogOptions("text", "info", "config").ok());
  CHECK(ValidateLogOptions("json", "warn", "config").ok());
  CHECK(ValidateLogOptions("json", "off", "config").ok());
  absl::Status s = ValidateLogOptions("xml", "info", "config");
  CHECK(s.message() == "config: log.format: 'xml' is not text or json");
  s = ValidateLogOptions("text", "loud", "flags");
  CHECK_THAT(std::string(s.message()),
             Catch::Matchers::StartsWith("flags: log.level: 'loud'"));
  DaemonOptions o = TestOptions();
  o.log_format = "yaml";
  CHECK_THAT(std::string(ValidateDaemonOptions(o, "options").message()),
             Catch::Matchers::StartsWith("options: log.format:"));
}

// Stores `pages` pages under token ids starting at `first`.
void StorePages(Namespace& ns, uint32_t pages, int32_t first) {
  std::vector<Token> tokens(pages * kPageSize);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = first + static_cast<Token>(i);
  }
  auto up = ns.BeginInsert(tokens, {});
  REQUIRE(up.ok());
  REQUIRE((*up)->Write(0, RandomBytes(pages * kPageBytes, first)).ok());
  REQUIRE((*up)->Commit().ok());
}

TEST_CASE("StoreWatcher logs an eviction burst once, and nothing when idle",
          "[server][logging]") {
  const DaemonOptions o = TestOptions();
  Store store(o.store);
  auto created = store.CreateNamespace(o.namespaces[0], false);
  REQUIRE(created.ok());
  Namespace& ns = *created->first;
  CapturedLog log(/*json=*/false);
  StoreWatcher watcher(&store, absl::Seconds(10));
  const absl::Time t0 = absl::Now();
  CHECK(watcher.Poll(t0) == 0);

  StorePages(ns, 20, 1);
  ns.EvictAll();  // 20 pages >= max(16, 32 / 10)
  CHECK(watcher.Poll(t0 + absl::Seconds(5)) == 0);  // window still open
  CHECK(watcher.Poll(t0 + absl::Seconds(11)) == 1);
  CHECK(watcher.Poll(t0 + absl::Seconds(22)) == 0);  // nothing new

  StorePages(ns, 5, 1000);
  ns.EvictAll();  // 5 pages: below the burst threshold
  CHECK(watcher.Poll(t0 + absl::Seconds(33)) == 0);

  const std::vector<std::string> lines = log.Lines();
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Catch::Matchers::Contains(
                           "namespace 'test': eviction burst: 20 page(s) "
                           "evicted and 0 demoted"));
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
