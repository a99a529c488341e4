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
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/base/text_wrap.h"
#include "server/daemon/config.h"
#include "server/daemon/daemon.h"
#include "server/daemon/logging.h"
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
// the command line holds a value. Each help text ends with its default
// (--help prints them by topic, kFlagGroups below).
ABSL_FLAG(std::optional<std::string>, listen, std::nullopt,
          "HOST:PORT to serve gRPC on; PORT 0 picks a free port (logged). "
          "Config listen. Default 127.0.0.1:50051");
ABSL_FLAG(std::string, config, "",
          "YAML config file (see deploy/kvharbord.example.yaml); flags given "
          "explicitly override it. Default: none (built-in defaults)");
ABSL_FLAG(std::optional<absl::Duration>, drain_timeout, std::nullopt,
          "how long SIGTERM waits for in-flight calls before cancelling "
          "them, e.g. 10s. Config drain_timeout_ms. Default 10s");
ABSL_FLAG(std::optional<std::string>, pool_bytes, std::nullopt,
          "host memory all namespaces may hold together (raw pages, their "
          "metadata, host-compressed tiers), e.g. 8GiB; more than the "
          "machine's RAM is refused. Config store.pool_budget_bytes. Default "
          "min(4 GiB, 25% of physical RAM)");
ABSL_FLAG(std::optional<std::string>, default_namespace_bytes, std::nullopt,
          "capacity (a cap, not a reservation) of a namespace created "
          "without one, e.g. 1GiB. Config store.default_namespace_bytes. "
          "Default 0: the whole budget (with --host_ipc_socket or a device "
          "pool, where capacities are reserved: 1GiB or what is left)");
ABSL_FLAG(std::optional<std::string>, device_pool_bytes, std::nullopt,
          "GPU tier 0: bytes of the device arena namespace pools are cut "
          "from, e.g. 16GiB; 0: host pools; auto: on a machine with a GPU, "
          "1/16 of its free memory, at most 8 GiB (none when "
          "store.host_ipc_socket is set), else host pools. A size given that "
          "cannot be had (no GPU, a build without the GPU tier) is a warning "
          "and the daemon keeps host pools. Config store.device_pool_bytes. "
          "Default auto");
ABSL_FLAG(std::optional<int>, device, std::nullopt,
          "CUDA device index of the device arena. Config store.device. "
          "Default 0");
ABSL_FLAG(std::optional<std::string>, host_ipc_socket, std::nullopt,
          "same-host Fetch through shared memory: Unix socket path that "
          "hands local clients a read-only descriptor of the host page "
          "arena. Config store.host_ipc_socket. Default: off");
ABSL_FLAG(kvharbor::GivenString, metrics_listen, kvharbor::GivenString(),
          "HOST:PORT of the Prometheus endpoint (GET /metrics); PORT 0 picks "
          "a free port; --metrics_listen= (empty) serves none. Config "
          "metrics.listen. Default 127.0.0.1:9464");
ABSL_FLAG(bool, metrics_require_token, false,
          "GET /metrics needs 'Authorization: Bearer <token>' of a "
          "daemon_admin token of --tokens_file; only turns it on. Config "
          "metrics.require_token. Default: off (keep metrics on loopback)");
ABSL_FLAG(std::optional<std::string>, log_level, std::nullopt,
          "trace, debug, info, warn, error, critical or off. Config "
          "log.level. Default info");
ABSL_FLAG(std::optional<std::string>, log_format, std::nullopt,
          "text, or json: one JSON object per line with ts, level and msg. "
          "Config log.format. Default text");
ABSL_FLAG(kvharbor::GivenString, tls_cert, kvharbor::GivenString(),
          "PEM certificate (chain) of the gRPC port; turns TLS on (--tls_cert= "
          "turns it off). Config security.tls.cert_file. Default: none "
          "(plaintext)");
ABSL_FLAG(kvharbor::GivenString, tls_key, kvharbor::GivenString(),
          "PEM private key of --tls_cert. Config security.tls.key_file. "
          "Default: none");
ABSL_FLAG(kvharbor::GivenString, tls_client_ca, kvharbor::GivenString(),
          "PEM CA bundle that verifies client certificates. Config "
          "security.tls.client_ca_file. Default: none (client certificates "
          "are not requested)");
ABSL_FLAG(bool, tls_require_client_cert, false,
          "refuse clients without a certificate signed by --tls_client_ca "
          "(mutual TLS; the flag can only turn it on). Config "
          "security.tls.require_client_cert. Default false");
ABSL_FLAG(kvharbor::GivenString, tokens_file, kvharbor::GivenString(),
          "YAML file of bearer tokens (token -> tenant, role); turns "
          "authentication on; reloaded on SIGHUP and when it changes. Config "
          "security.tokens_file. Default: none (no authentication)");
ABSL_FLAG(std::optional<std::string>, max_receive_message_bytes, std::nullopt,
          "largest message a client may send, e.g. 16MiB. Config "
          "limits.max_receive_message_bytes. Default 16MiB");
ABSL_FLAG(std::optional<uint32_t>, max_concurrent_streams, std::nullopt,
          "calls open at once on one connection. Config "
          "limits.max_concurrent_streams. Default 256");
ABSL_FLAG(std::optional<uint32_t>, max_in_flight_calls, std::nullopt,
          "calls in flight over all connections before new ones get "
          "RESOURCE_EXHAUSTED. Config limits.max_in_flight_calls. Default "
          "1024");
ABSL_FLAG(std::optional<std::string>, resource_quota_bytes, std::nullopt,
          "memory gRPC's buffers may use, e.g. 256MiB. Config "
          "limits.resource_quota_bytes. Default 0 (no quota)");

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
  options->device_pool_auto = true;  // server/daemon/device_setup.h
  const std::string config = absl::GetFlag(FLAGS_config);
  if (!config.empty()) {
    absl::Status s = LoadConfigFile(config, options);
    if (!s.ok()) return s;
  }
  if (auto listen = absl::GetFlag(FLAGS_listen)) options->listen = *listen;
  if (const GivenString m = absl::GetFlag(FLAGS_metrics_listen); m.given) {
    options->metrics_listen = m.value;
  }
  if (absl::GetFlag(FLAGS_metrics_require_token)) {
    options->metrics_require_token = true;
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
    options->device_pool_auto = *text == "auto";
    if (!options->device_pool_auto) {
      absl::StatusOr<uint64_t> v = ParseByteSize(*text, "--device_pool_bytes");
      if (!v.ok()) return v.status();
      options->store.device_pool_bytes = *v;
    }
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

// --help: the flags by topic. A flag of this file missing here is still
// printed, under "other" (PrintFlagHelp), so a new flag is never hidden.
struct FlagGroup {
  const char* title;
  std::vector<const char*> flags;  // "name=VALUE" or "name" (a bool)
  const char* note;  // keys of the topic that only the config file sets
};

const std::vector<FlagGroup>& FlagGroups() {
  static const std::vector<FlagGroup>* const kGroups = new std::vector<
      FlagGroup>{
      {"listen and config",
       {"listen=HOST:PORT", "config=FILE", "drain_timeout=DURATION"},
       "config only: lease_reap_interval_ms, fetch.*, namespaces[] (created "
       "at startup)"},
      {"memory and tiers",
       {"pool_bytes=SIZE", "default_namespace_bytes=SIZE",
        "device_pool_bytes=SIZE", "device=N"},
       "config only: store.default_lease_ttl_ms (30000), "
       "store.max_lease_ttl_ms, store.promote_on_fetch, "
       "store.max_tokens_per_request; per namespace: codec, "
       "calibration_path, host_compressed_bytes (within the budget), "
       "disk_dir, kvcm_path"},
      {"same-host paths",
       {"host_ipc_socket=PATH"},
       "config only: store.host_ipc_socket_mode, store.allow_ipc (CUDA IPC "
       "handles of the device arena)"},
      {"bulk data plane (docs/data_plane.md)",
       {},
       "config only: data_plane.listen (HOST:PORT; off by default), "
       "data_plane.max_connections (64), data_plane.allow_plaintext (needed "
       "beside security.tls)"},
      {"observability",
       {"metrics_listen=HOST:PORT", "metrics_require_token", "log_level=LEVEL",
        "log_format=text|json"},
       ""},
      {"security",
       {"tls_cert=FILE", "tls_key=FILE", "tls_client_ca=FILE",
        "tls_require_client_cert", "tokens_file=FILE"},
       ""},
      {"limits",
       {"max_receive_message_bytes=SIZE", "max_concurrent_streams=N",
        "max_in_flight_calls=N", "resource_quota_bytes=SIZE"},
       "config only: limits.max_threads, "
       "limits.max_in_flight_calls_per_tenant (256), "
       "limits.max_in_flight_calls_per_connection (256), "
       "limits.upload_idle_timeout_ms (30000), limits.fetch_idle_timeout_ms "
       "(30000), limits.keepalive.*"},
      {"cluster",
       {},
       "config only: the cluster: section (etcd_endpoints, key_prefix, "
       "lease_ttl_s, advertise; docs/cluster.md). Default: not a member"},
  };
  return *kGroups;
}

// `usage` is "name=VALUE", or the name alone.
void PrintFlag(const absl::CommandLineFlag& flag, absl::string_view usage,
               std::FILE* out) {
  std::fprintf(out, "  --%s\n%s", std::string(usage).c_str(),
               WrapText(flag.Help(), 6).c_str());
}

void PrintFlagHelp(std::FILE* out) {
  std::fprintf(out, "kvharbord: %s\n",
               std::string(absl::ProgramUsageMessage()).c_str());
  std::set<std::string> printed;
  for (const FlagGroup& group : FlagGroups()) {
    std::fprintf(out, "\n%s:\n", group.title);
    for (absl::string_view usage : group.flags) {
      const std::string name(usage.substr(0, usage.find('=')));
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      if (flag == nullptr) continue;
      PrintFlag(*flag, usage, out);
      printed.insert(name);
    }
    std::fprintf(out, "%s", WrapText(group.note, 2).c_str());
  }
  std::vector<const absl::CommandLineFlag*> other;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), "server/daemon/main.cc") &&
        printed.count(std::string(name)) == 0) {
      other.push_back(flag);
    }
  }
  if (!other.empty()) {
    std::sort(other.begin(), other.end(), [](const auto* a, const auto* b) {
      return a->Name() < b->Name();
    });
    std::fprintf(out, "\nother:\n");
    for (const absl::CommandLineFlag* flag : other) {
      PrintFlag(*flag, flag->Name(), out);
    }
  }
  std::fprintf(out,
               "\nEvery key of the config file, with its default: "
               "deploy/kvharbord.example.yaml.\nabsl's own flags: "
               "--helpfull.\n");
}

// --help, -help, -h or --helpshort: the grouped help on stdout, exit 0.
// absl would print only the flags of a file named after the program, and
// exit 1.
bool WantsHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") return false;
    if (a == "--help" || a == "-help" || a == "-h" || a == "--helpshort" ||
        a == "-helpshort") {
      return true;
    }
  }
  return false;
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
      "the kvharbor KV-cache daemon for LLM inference.\n\n"
      "usage: kvharbord [--config=FILE] [--listen=HOST:PORT] [FLAGS...]\n\n"
      "Settings come from built-in defaults, then --config, then the flags "
      "given on\nthe command line. Sizes take a binary unit (512MiB, 8GiB).");
  if (kvharbor::WantsHelp(argc, argv)) {
    kvharbor::PrintFlagHelp(stdout);
    return 0;
  }
  absl::ParseCommandLine(argc, argv);
  return kvharbor::Run();
}
