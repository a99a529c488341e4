// The Prometheus endpoint: the registry's text format (escaping, histogram
// buckets), an in-process daemon's /metrics after real RPCs (hit and miss
// tokens, a histogram bucket, status-code series of bad requests, tier
// gauges, compression ratio), the exposition checked by promtool, and the
// metrics listener's port handling.
#include "server/metrics/metrics.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/metrics/server_metrics.h"
#include "tests/server/http_get.h"
#include "tests/server/server_test_util.h"
#include "tests/server/subprocess.h"
#include "tests/skip.h"

namespace kvharbor {
namespace testing {
namespace {

// Sample lines ("name{labels}" -> value) of an exposition.
std::map<std::string, double> ParseSamples(const std::string& text) {
  std::map<std::string, double> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    REQUIRE(space != std::string::npos);
    out[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return out;
}

double Value(const std::map<std::string, double>& s, const std::string& key) {
  auto it = s.find(key);
  INFO("series " << key);
  REQUIRE(it != s.end());
  return it->second;
}

bool HavePromtool() {
  return std::system("command -v promtool >/dev/null 2>&1") == 0;
}

// promtool's verdict on `text`; rc 0 is clean.
int Promtool(const std::string& text, std::string* output) {
  char name[] = "/tmp/kvharbor_metrics_XXXXXX";
  const int fd = mkstemp(name);
  REQUIRE(fd >= 0);
  close(fd);
  std::ofstream(name) << text;
  const std::string cmd =
      std::string("promtool check metrics < ") + name + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = pclose(p);
  std::remove(name);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void CheckWithPromtool(const std::string& text) {
  if (!HavePromtool()) {
    // The rest of the test case ran; its result is reported as skipped
    // because this part could not run (tests/skip.h).
    MarkSkipped(
        "promtool check: promtool is not on PATH (Debian package "
        "'prometheus'; scripts/install_deps.sh installs it)");
    return;
  }
  std::string output;
  const int rc = Promtool(text, &output);
  INFO("promtool said:\n" << output << "\non:\n" << text);
  CHECK(rc == 0);
}

TEST_CASE("Registry renders counters, gauges and histograms",
          "[server][metrics]") {
  metrics::Registry r;
  auto* c =
      r.AddCounter("t_requests_total", "Requests.\nSecond \\ line.", {"path"});
  c->WithLabels({"a\"b\\c\nd"})->Inc(3);
  c->WithLabels({"plain"})->Inc();
  r.AddGauge("t_temperature_celsius", "A gauge.")->WithLabels({})->Set(-2.5);
  auto* h = r.AddHistogram("t_size_bytes", "Sizes.", {"kind"}, {1, 10, 100});
  auto hist = h->WithLabels({"x"});
  for (double v : {0.5, 1.0, 5.0, 10.0, 1000.0}) hist->Observe(v);
  r.AddCollector([](std::vector<metrics::CollectedFamily>* out) {
    out->push_back({"t_collected_total",
                    "Collected.",
                    metrics::MetricType::kCounter,
                    {"ns"},
                    {{{"n1"}, 7}}});
  });
  const std::string text = r.Render();
  INFO(text);
  CHECK(text.find("# HELP t_requests_total Requests.\\nSecond \\\\ line.\n") !=
        std::string::npos);
  CHECK(text.find("# TYPE t_requests_total counter\n") != std::string::npos);
  CHECK(text.find("t_requests_total{path=\"a\\\"b\\\\c\\nd\"} 3\n") !=
        std::string::npos);
  const auto s = ParseSamples(text);
  CHECK(Value(s, "t_requests_total{path=\"plain\"}") == 1);
  CHECK(Value(s, "t_temperature_celsius") == -2.5);
  // "le" is inclusive: 1.0 falls in le="1", 10.0 in le="10".
  CHECK(Value(s, "t_size_bytes_bucket{kind=\"x\",le=\"1\"}") == 2);
  CHECK(Value(s, "t_size_bytes_bucket{kind=\"x\",le=\"10\"}") == 4);
  CHECK(Value(s, "t_size_bytes_bucket{kind=\"x\",le=\"100\"}") == 4);
  CHECK(Value(s, "t_size_bytes_bucket{kind=\"x\",le=\"+Inf\"}") == 5);
  CHECK(Value(s, "t_size_bytes_count{kind=\"x\"}") == 5);
  CHECK(Value(s, "t_size_bytes_sum{kind=\"x\"}") == 1016.5);
  CHECK(Value(s, "t_collected_total{ns=\"n1\"}") == 7);
  h->Remove({"x"});
  CHECK(r.Render().find("t_size_bytes_bucket") == std::string::npos);
  hist->Observe(1);  // a removed series stays usable for its holders
  CheckWithPromtool(text);
}

TEST_CASE("FormatValue and name checks", "[server][metrics]") {
  CHECK(metrics::FormatValue(0) == "0");
  CHECK(metrics::FormatValue(18446744073709551616.0) ==
        "1.8446744073709552e+19");
  CHECK(metrics::FormatValue(4096) == "4096");
  CHECK(metrics::FormatValue(0.00025) == "0.00025");
  CHECK(metrics::FormatValue(1.0 / 0.0) == "+Inf");
  CHECK(metrics::FormatValue(-1.0 / 0.0) == "-Inf");
  CHECK(metrics::FormatValue(0.0 / 0.0) == "NaN");
  CHECK(metrics::IsValidMetricName("kvharbor_x:y_total"));
  CHECK_FALSE(metrics::IsValidMetricName("1abc"));
  CHECK_FALSE(metrics::IsValidMetricName("a-b"));
  CHECK(metrics::IsValidLabelName("namespace"));
  CHECK_FALSE(metrics::IsValidLabelName("__reserved"));
  CHECK_FALSE(metrics::IsValidLabelName("a:b"));
}

DaemonOptions MetricsOptions() {
  DaemonOptions o = TestOptions();
  o.metrics_listen = "127.0.0.1:0";
  o.namespaces[0].host_compressed_bytes = 1 << 20;  // a cold tier to demote to
  return o;
}

TEST_CASE("GET /metrics reports what the RPCs did", "[server][metrics]") {
  TestServer s(MetricsOptions());
  const int port = s.daemon->metrics_port();
  REQUIRE(port > 0);
  REQUIRE(InsertPages(s.stub.get(), Tokens(2 * kPageSize, 1),
                      RandomBytes(2 * kPageBytes, 1), 3000)
              .ok());
  // 8 of 12 tokens hit, locked; then a full miss of 4.
  const v1::MatchResponse m = MatchOk(s.stub.get(), Tokens(12, 1), true);
  REQUIRE(m.matched_tokens() == 8);
  REQUIRE(MatchOk(s.stub.get(), Tokens(4, 1000)).matched_tokens() == 0);
  v1::FetchRequest fr;
  fr.set_namespace_(kNs);
  fr.set_lease_id(m.lease_id());
  REQUIRE(FetchAll(s.stub.get(), fr).status.ok());
  {
    grpc::ClientContext ctx;
    v1::MatchRequest bad;
    bad.set_namespace_("nope");
    bad.add_token_ids(1);
    v1::MatchResponse resp;
    CHECK(s.stub->Match(&ctx, bad, &resp).error_code() ==
          grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::MatchRequest empty;
    empty.set_namespace_(kNs);
    v1::MatchResponse resp;
    CHECK(s.stub->Match(&ctx, empty, &resp).error_code() ==
          grpc::StatusCode::INVALID_ARGUMENT);
  }

  // A call is recorded when its reactor is done, just after the client
  // has its status.
  HttpResponse r;
  std::map<std::string, double> v;
  CHECK(Eventually([&] {
    r = HttpGet(port, "/metrics");
    v = ParseSamples(r.body);
    auto it = v.find("kvharbor_rpc_duration_seconds_count{method=\"Match\"}");
    auto f =
        v.find("kvharbor_rpcs_handled_total{method=\"Fetch\",code=\"OK\"}");
    return it != v.end() && it->second == 4 && f != v.end();
  }));
  REQUIRE(r.status == 200);
  CHECK(r.headers.find("Content-Type: text/plain; version=0.0.4; "
                       "charset=utf-8") != std::string::npos);
  INFO(r.body);
  const std::string ns = "{namespace=\"test\"}";
  CHECK(Value(v, "kvharbor_match_hit_tokens_total" + ns) == 8);
  CHECK(Value(v, "kvharbor_match_miss_tokens_total" + ns) == 8);
  // Prefix lengths 8 and 0: le="0" has the miss, le="16" both.
  CHECK(Value(v,
              "kvharbor_match_prefix_tokens_bucket{namespace=\"test\","
              "le=\"0\"}") == 1);
  CHECK(Value(v,
              "kvharbor_match_prefix_tokens_bucket{namespace=\"test\","
              "le=\"16\"}") == 2);
  CHECK(Value(v, "kvharbor_match_prefix_tokens_sum" + ns) == 8);
  CHECK(Value(v, "kvharbor_rpcs_handled_total{method=\"Match\",code=\"OK\"}") ==
        2);
  CHECK(Value(v,
              "kvharbor_rpcs_handled_total{method=\"Match\","
              "code=\"NOT_FOUND\"}") == 1);
  CHECK(Value(v,
              "kvharbor_rpcs_handled_total{method=\"Match\","
              "code=\"INVALID_ARGUMENT\"}") == 1);
  CHECK(Value(v,
              "kvharbor_rpcs_handled_total{method=\"Insert\","
              "code=\"OK\"}") == 1);
  CHECK(v.count("kvharbor_rpcs_handled_total{method=\"Stats\",code=\"OK\"}") ==
        0);
  CHECK(Value(v,
              "kvharbor_rpc_duration_seconds_bucket{method=\"Match\","
              "le=\"+Inf\"}") == 4);
  CHECK(Value(v,
              "kvharbor_rpc_duration_seconds_bucket{method=\"Match\","
              "le=\"10\"}") == 4);
  CHECK(Value(v, "kvharbor_namespace_pages{namespace=\"test\",tier=\"raw\"}") ==
        2);
  CHECK(Value(v,
              "kvharbor_namespace_stored_bytes{namespace=\"test\","
              "tier=\"raw\"}") == 2 * kPageBytes);
  CHECK(Value(v, "kvharbor_received_bytes_total" + ns) == 2 * kPageBytes);
  CHECK(Value(v, "kvharbor_sent_bytes_total" + ns) == 2 * kPageBytes);
  CHECK(Value(v, "kvharbor_leases_active" + ns) == 1);
  CHECK(Value(v, "kvharbor_namespace_capacity_pages" + ns) == kCapacityPages);
  CHECK(Value(v, "kvharbor_pool_budget_bytes") == 64 << 20);
  CHECK(Value(v, "kvharbor_pool_reserved_bytes") == 0);  // caps, no reserve
  CHECK(Value(v, "kvharbor_memory_used_bytes") >= 2 * kPageBytes);
  CHECK(Value(v, "kvharbor_namespace_memory_bytes" + ns) ==
        Value(v, "kvharbor_memory_used_bytes"));
  CHECK(Value(v, "kvharbor_rpcs_in_flight") == 0);
  // No compressed pages yet, so no ratio.
  for (const auto& [name, value] : v) {
    CHECK(name.rfind("kvharbor_namespace_compression_ratio", 0) != 0);
    CHECK(name.rfind("kvharbor_namespace_codec_pages", 0) != 0);
  }
  CheckWithPromtool(r.body);
}

TEST_CASE("Demotions and the compression ratio appear in /metrics",
          "[server][metrics]") {
  TestServer s(MetricsOptions());
  REQUIRE(InsertPages(s.stub.get(), Tokens(3 * kPageSize, 1),
                      RandomBytes(3 * kPageBytes, 2), 5000)
              .ok());
  grpc::ClientContext ctx;
  v1::DemoteRequest dr;
  dr.set_namespace_(kNs);
  dr.set_tier(v1::TIER_HOST_COMPRESSED);
  v1::DemoteResponse resp;
  grpc::Status st = s.stub->Demote(&ctx, dr, &resp);
  INFO(st.error_message());
  REQUIRE(st.ok());
  REQUIRE(resp.pages_moved() == 3);
  const NamespaceStats c = s.ns()->Counters();
  const int hc = static_cast<int>(Tier::kHostCompressed);
  REQUIRE(c.tiers[hc].bytes > 0);
  const auto v =
      ParseSamples(HttpGet(s.daemon->metrics_port(), "/metrics").body);
  const std::string ns = "{namespace=\"test\"}";
  CHECK(Value(v, "kvharbor_demoted_pages_total" + ns) == 3);
  CHECK(Value(v,
              "kvharbor_namespace_pages{namespace=\"test\","
              "tier=\"host_compressed\"}") == 3);
  CHECK(Value(v,
              "kvharbor_namespace_stored_bytes{namespace=\"test\","
              "tier=\"host_compressed\"}") == c.tiers[hc].bytes);
  // One codec encoded all three: its ratio is the tier's.
  REQUIRE(c.codecs.size() == 1);
  CHECK(c.codecs[0].pages == 3);
  CHECK(c.codecs[0].bytes == c.tiers[hc].bytes);
  const std::string nc =
      absl::StrCat("{namespace=\"test\",codec=\"", c.codecs[0].codec, "\"}");
  CHECK(Value(v, "kvharbor_namespace_compression_ratio" + nc) ==
        Approx(3.0 * kPageBytes / static_cast<double>(c.tiers[hc].bytes)));
  CHECK(Value(v, "kvharbor_namespace_codec_pages" + nc) == 3);
  CHECK(Value(v, "kvharbor_namespace_pages{namespace=\"test\",tier=\"raw\"}") ==
        0);
}

TEST_CASE("A deleted namespace's series leave /metrics", "[server][metrics]") {
  TestServer s(MetricsOptions());
  {
    grpc::ClientContext ctx;
    v1::CreateNamespaceRequest req;
    req.mutable_spec()->set_name("other");
    *req.mutable_spec()->mutable_geometry() = TestGeometryProto();
    req.mutable_spec()->set_capacity_bytes(4 * kPageBytes);
    v1::CreateNamespaceResponse resp;
    REQUIRE(s.stub->CreateNamespace(&ctx, req, &resp).ok());
  }
  MatchOk(s.stub.get(), Tokens(4, 1), false, 0, "other");
  const int port = s.daemon->metrics_port();
  std::string body = HttpGet(port, "/metrics").body;
  CHECK(
      body.find("kvharbor_match_prefix_tokens_count{namespace=\"other\"} 1") !=
      std::string::npos);
  CHECK(body.find("kvharbor_match_miss_tokens_total{namespace=\"other\"} 4") !=
        std::string::npos);
  {
    grpc::ClientContext ctx;
    v1::DeleteNamespaceRequest req;
    req.set_namespace_("other");
    v1::DeleteNamespaceResponse resp;
    REQUIRE(s.stub->DeleteNamespace(&ctx, req, &resp).ok());
  }
  body = HttpGet(port, "/metrics").body;
  CHECK(body.find("namespace=\"other\"") == std::string::npos);
  CHECK(body.find("namespace=\"test\"") != std::string::npos);
}

TEST_CASE("The metrics listener: paths, busy ports, disabled, stopped",
          "[server][metrics]") {
  TestServer a(MetricsOptions());
  const int port = a.daemon->metrics_port();
  REQUIRE(port > 0);
  CHECK(HttpGet(port, "/").status == 404);
  CHECK(HttpGet(port, "/metricsx").status == 404);

  SECTION("a busy metrics port fails Start, naming metrics.listen") {
    DaemonOptions o = TestOptions();
    o.metrics_listen = "127.0.0.1:" + std::to_string(port);
    absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(std::string(d.status().message()),
               Catch::Matchers::StartsWith("metrics.listen:"));
    CHECK(HttpGet(port, "/metrics").status == 200);  // the first one serves
  }
  SECTION("a malformed metrics address is rejected") {
    DaemonOptions o = TestOptions();
    o.metrics_listen = "localhost";
    absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(d.status().message()),
               Catch::Matchers::StartsWith("options: metrics.listen:"));
  }
  SECTION("an embedded daemon serves no metrics by default") {
    TestServer b;
    CHECK(b.daemon->metrics_port() == 0);
    CHECK(b.daemon->options().metrics_listen.empty());
  }
  SECTION("Shutdown closes the metrics port") {
    a.daemon->Shutdown(absl::Seconds(1));
    CHECK(HttpGet(port, "/metrics").status == 0);
  }
}

TEST_CASE("kvharbord serves /metrics on --metrics_listen",
          "[server][metrics]") {
  const int mport = FreePort();
  REQUIRE(mport > 0);
  Kvharbord proc(KVHARBORD_PATH,
                 {"--metrics_listen=127.0.0.1:" + std::to_string(mport),
                  "--log_format=json"});
  REQUIRE(proc.started());
  REQUIRE(proc.Connect() != nullptr);
  const HttpResponse r = HttpGet(mport, "/metrics");
  REQUIRE(r.status == 200);
  CHECK(r.body.find("# TYPE kvharbor_rpc_duration_seconds histogram") !=
        std::string::npos);
  CHECK(r.body.find("kvharbor_pool_budget_bytes ") != std::string::npos);
  proc.Signal(SIGTERM);
  const int status = proc.WaitExit(std::chrono::seconds(20));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("An empty --metrics_listen overrides the config file's address",
          "[server][metrics]") {
  // The config names a busy port; the empty flag must win, or start fails.
  TestServer busy(MetricsOptions());
  char name[] = "/tmp/kvharbor_metrics_cfg_XXXXXX";
  const int fd = mkstemp(name);
  REQUIRE(fd >= 0);
  close(fd);
  std::ofstream(name) << "metrics:\n  listen: \"127.0.0.1:"
                      << busy.daemon->metrics_port() << "\"\n";
  {
    Kvharbord proc(KVHARBORD_PATH,
                   {std::string("--config=") + name, "--metrics_listen="});
    REQUIRE(proc.started());
    CHECK(proc.Connect() != nullptr);
  }
  {
    // Control: the busy port itself does fail start (exit 1). (Kvharbord
    // passes an empty --metrics_listen first; the last one given wins.)
    Kvharbord proc(KVHARBORD_PATH,
                   {std::string("--config=") + name,
                    "--metrics_listen=127.0.0.1:" +
                        std::to_string(busy.daemon->metrics_port())});
    REQUIRE(proc.started());
    const int status = proc.WaitExit(std::chrono::seconds(20));
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 1);
  }
  std::remove(name);
}

TEST_CASE("kvharbord rejects bad logging and metrics flags",
          "[server][metrics]") {
  for (const char* flag :
       {"--log_format=xml", "--log_level=loud", "--metrics_listen=nowhere"}) {
    INFO(flag);
    Kvharbord proc(KVHARBORD_PATH, {flag});
    REQUIRE(proc.started());
    const int status = proc.WaitExit(std::chrono::seconds(20));
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
  }
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
