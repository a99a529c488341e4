// kvharbord: the kvharbor KV-cache daemon.
//
// Configuration comes from built-in defaults, then an optional YAML file
// (--config), then the flags that were given explicitly on the command line.
// SIGTERM or SIGINT: report NOT_SERVING, drain in-flight calls (up to the
// drain timeout), exit 0. SIGHUP: reload the bearer tokens file (a bad file
// keeps the tokens in force and logs an error).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/config.h"
#include "server/daemon.h"
#include "server/logging.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

// A string flag that knows whether it was given, an empty value included
// (a std::optional flag reads "--flag=" as not given).
struct GivenString {
  bool given = false;
  std::string value;
};
bool AbslParseFlag(absl::string_view text, GivenString* flag, std::string*) {
  flag->given = true;
  flag->value = std::string(text);
  return true;
}
std::string AbslUnparseFlag(const GivenString& flag) { return flag.value; }

}  // namespace kvharbor

// Flags that may override the config file are optional: only a flag given on
// the command line holds a value.
ABSL_FLAG(std::optional<std::string>, listen, std::nullopt,
          "HOST:PORT to serve on (PORT 0 picks a free port; default "
          "127.0.0.1:50051)");
ABSL_FLAG(std::string, config, "",
          "YAML config file (see deploy/kvharbord.example.yaml); flags given "
          "explicitly override it");
ABSL_FLAG(std::optional<std::string>, pool_bytes, std::nullopt,
          "memory all namespaces may reserve, e.g. 8GiB (default: min(4 GiB, "
          "25% of physical RAM))");
ABSL_FLAG(std::optional<std::string>, default_namespace_bytes, std::nullopt,
          "capacity of a namespace created without one, e.g. 1GiB");
ABSL_FLAG(std::optional<std::string>, device_pool_bytes, std::nullopt,
          "GPU tier 0: bytes of the device arena namespace pools are cut "
          "from, e.g. 16GiB (default 0: host pools); needs a CUDA build and "
          "a GPU, else the daemon keeps host pools with a warning");
ABSL_FLAG(std::optional<std::string>, host_ipc_socket, std::nullopt,
          "same-host Fetch through shared memory: Unix socket path that "
          "hands local clients a read-only descriptor of the host page "
          "arena (config store.host_ipc_socket; default off)");
ABSL_FLAG(std::optional<int>, device, std::nullopt,
          "CUDA device index of the device arena (default 0)");
ABSL_FLAG(std::optional<std::string>, log_level, std::nullopt,
          "trace, debug, info, warn, error, critical or off (default info)");
ABSL_FLAG(std::optional<std::string>, log_format, std::nullopt,
          "text (the default) or json: one JSON object per line with ts, "
          "level and msg");
ABSL_FLAG(kvharbor::GivenString, metrics_listen, kvharbor::GivenString(),
          "HOST:PORT of the Prometheus endpoint (GET /metrics); PORT 0 picks "
          "a free port; --metrics_listen= (empty) serves none (default "
          "127.0.0.1:9464)");
ABSL_FLAG(kvharbor::GivenString, tls_cert, kvharbor::GivenString(),
          "PEM certificate (chain) of the gRPC port; turns TLS on (config "
          "security.tls.cert_file; --tls_cert= turns it off)");
ABSL_FLAG(kvharbor::GivenString, tls_key, kvharbor::GivenString(),
          "PEM private key of --tls_cert (security.tls.key_file)");
ABSL_FLAG(kvharbor::GivenString, tls_client_ca, kvharbor::GivenString(),
          "PEM CA bundle that verifies client certificates "
          "(security.tls.client_ca_file)");
ABSL_FLAG(bool, tls_require_client_cert, false,
          "refuse clients without a certificate signed by --tls_client_ca "
          "(mutual TLS; security.tls.require_client_cert; only turns it on)");
ABSL_FLAG(kvharbor::GivenString, tokens_file, kvharbor::GivenString(),
          "YAML file of bearer tokens (token -> tenant, role); turns "
          "authentication on; reloaded on SIGHUP and when it changes "
          "(security.tokens_file)");
ABSL_FLAG(std::optional<absl::Duration>, drain_timeout, std::nullopt,
          "how long SIGTERM waits for in-flight calls before cancelling them, "
          "e.g. 10s (the default)");
ABSL_FLAG(std::optional<std::string>, max_receive_message_bytes, std::nullopt,
          "largest message a client may send, e.g. 16MiB (the default); "
          "config limits.max_receive_message_bytes");
ABSL_FLAG(std::optional<uint32_t>, max_concurrent_streams, std::nullopt,
          "calls open at once on one connection (default 256); config "
          "limits.max_concurrent_streams");
ABSL_FLAG(std::optional<uint32_t>, max_in_flight_calls, std::nullopt,
          "calls in flight over all connections before new ones get "
          "RESOURCE_EXHAUSTED (default 1024); config "
          "limits.max_in_flight_calls");
ABSL_FLAG(std::optional<std::string>, resource_quota_bytes, std::nullopt,
          "memory gRPC's buffers may use, e.g. 256MiB (default 0: no quota); "
          "config limits.resource_quota_bytes");

namespace kvharbor {
namespace {

// The limits: flags given explicitly on the command line.
absl::Status ApplyLimitFlags(LimitsOptions* limits) {
  for (auto [flag, name, out] :
       {std::tuple<std::optional<std::string>, const char*, uint64_t*>{
            absl::GetFlag(FLAGS_max_receive_message_bytes),
            "--max_receive_message_bytes", &limits->max_receive_message_bytes},
        {absl::GetFlag(FLAGS_resource_quota_bytes), "--resource_quota_bytes",
         &limits->resource_quota_bytes}}) {
    if (!flag) continue;
    absl::StatusOr<uint64_t> v = ParseByteSize(*flag, name);
    if (!v.ok()) return v.status();
    *out = *v;
  }
  if (auto v = absl::GetFlag(FLAGS_max_concurrent_streams)) {
    limits->max_concurrent_streams = *v;
  }
  if (auto v = absl::GetFlag(FLAGS_max_in_flight_calls)) {
    limits->max_in_flight_calls = *v;
  }
  return absl::OkStatus();
}

// The security flags given on the command line override the config file.
void ApplySecurityFlags(SecurityOptions* s) {
  for (auto [flag, out] :
       {std::pair<const absl::Flag<GivenString>*, std::string*>{
            &FLAGS_tls_cert, &s->tls_cert_file},
        {&FLAGS_tls_key, &s->tls_key_file},
        {&FLAGS_tls_client_ca, &s->tls_client_ca_file},
        {&FLAGS_tokens_file, &s->tokens_file}}) {
    if (const GivenString v = absl::GetFlag(*flag); v.given) *out = v.value;
  }
  // A plain bool flag, so that "--tls_require_client_cert" alone works; it
  // can only turn the requirement on (absl does not say whether a bool flag
  // was given).
  if (absl::GetFlag(FLAGS_tls_require_client_cert)) {
    s->tls_require_client_cert = true;
  }
}

// Fills `options` from defaults, the config file and explicit flags.
absl::Status BuildOptions(DaemonOptions* options) {
  options->store.pool_budget_bytes = DefaultPoolBudgetBytes();
  options->metrics_listen = kDefaultMetricsListen;
  options->store.default_namespace_bytes = std::min(
      options->store.default_namespace_bytes, options->store.pool_budget_bytes);
  const std::string config = absl::GetFlag(FLAGS_config);
  if (!config.empty()) {
    absl::Status s = LoadConfigFile(config, options);
    if (!s.ok()) return s;
  }
  if (auto listen = absl::GetFlag(FLAGS_listen)) options->listen = *listen;
  if (const GivenString m = absl::GetFlag(FLAGS_metrics_listen); m.given) {
    options->metrics_listen = m.value;
  }
  if (auto f = absl::GetFlag(FLAGS_log_format)) options->log_format = *f;
  if (auto l = absl::GetFlag(FLAGS_log_level)) options->log_level = *l;
  if (auto text = absl::GetFlag(FLAGS_pool_bytes)) {
    absl::StatusOr<uint64_t> v = ParseByteSize(*text, "--pool_bytes");
    if (!v.ok()) return v.status();
    options->store.pool_budget_bytes = *v;
  }
  if (auto text = absl::GetFlag(FLAGS_default_namespace_bytes)) {
    absl::StatusOr<uint64_t> v =
        ParseByteSize(*text, "--default_namespace_bytes");
    if (!v.ok()) return v.status();
    options->store.default_namespace_bytes = *v;
  }
  if (auto text = absl::GetFlag(FLAGS_device_pool_bytes)) {
    absl::StatusOr<uint64_t> v = ParseByteSize(*text, "--device_pool_bytes");
    if (!v.ok()) return v.status();
    options->store.device_pool_bytes = *v;
  }
  if (auto d = absl::GetFlag(FLAGS_device)) options->store.device = *d;
  if (auto path = absl::GetFlag(FLAGS_host_ipc_socket)) {
    options->host_ipc.socket = *path;
  }
  if (auto drain = absl::GetFlag(FLAGS_drain_timeout)) {
    options->drain_timeout = *drain;
  }
  if (absl::Status s = ApplyLimitFlags(&options->limits); !s.ok()) return s;
  ApplySecurityFlags(&options->security);
  return ValidateDaemonOptions(*options, "flags");
}

int Run() {
  // The logging flags apply at once, so that config errors are reported in
  // the format asked for; the config file's log keys apply once it is read.
  const DaemonOptions defaults;
  absl::Status s = ConfigureLogging(
      absl::GetFlag(FLAGS_log_format).value_or(defaults.log_format),
      absl::GetFlag(FLAGS_log_level).value_or(defaults.log_level), "flags");
  if (!s.ok()) {
    std::fprintf(stderr, "kvharbord: %s\n", std::string(s.message()).c_str());
    return 2;
  }

  DaemonOptions options;
  s = BuildOptions(&options);
  if (s.ok()) {
    s = ConfigureLogging(options.log_format, options.log_level, "config");
  }
  if (!s.ok()) {
    spdlog::error("kvharbord: {}", std::string(s.message()));
    return 2;
  }

  // Block the shutdown signals in every thread (gRPC's threads inherit this
  // mask from here) and take them synchronously below: no handler runs in
  // signal context, so Shutdown can do anything it likes.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options);
  if (!daemon.ok()) {
    spdlog::error("kvharbord: {}", std::string(daemon.status().message()));
    return 1;
  }
  int sig = 0;
  while (sigwait(&signals, &sig) != 0 || sig == SIGHUP) {
    if (sig == SIGHUP) {
      spdlog::info("received SIGHUP: reloading the tokens file");
      (*daemon)->ReloadTokens().IgnoreError();  // logged by ReloadTokens
      sig = 0;
    }
  }
  spdlog::info("received {}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (*daemon)->Shutdown(options.drain_timeout);
  daemon->reset();
  return 0;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvharbord: KV-cache service for LLM inference.\n"
      "  kvharbord [--config=FILE] [--listen=HOST:PORT] [--pool_bytes=SIZE] "
      "[--metrics_listen=HOST:PORT] [--log_format=text|json] ...");
  absl::ParseCommandLine(argc, argv);
  return kvharbor::Run();
}
