#include "server/daemon/daemon.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/blas_kernel_check.h"
#include "core/base/status_macros.h"
#include "core/memory/host_arena.h"
#include "grpc/health/v1/health.pb.h"
#include "server/daemon/config.h"
#include "server/daemon/device_setup.h"
#include "server/daemon/logging.h"
#include "server/metrics/metrics_http.h"
#include "server/metrics/server_metrics.h"
#include "server/metrics/store_watcher.h"
#include "server/rpc/service.h"
#include "spdlog/spdlog.h"
#include "types/staging_wire.h"

namespace kvharbor {

namespace {

// Staging regions registered at once (server/local/staging_registry.h); a
// region is one client's, and a client needs one per GPU it inserts from.
constexpr size_t kMaxStagingRegions = 64;

constexpr char kServiceName[] = "kvharbor.v1.KvHarbor";
// How often the store's counters are checked for events worth a log line.
constexpr absl::Duration kEventWindow = absl::Seconds(10);
// How long Shutdown leaves health Watch streams open after NOT_SERVING, so
// that the update reaches their readers (bounded by the drain time).
constexpr absl::Duration kHealthWatchGrace = absl::Milliseconds(250);

// Whether the metrics address is a loopback one (nobody else can scrape).
bool MetricsOnLoopback(absl::string_view listen) {
  absl::string_view host;
  int port = 0;
  return SplitHostPort(listen, &host, &port) && IsLoopbackHost(host);
}

// Never 0 (a client treats 0 as "no daemon seen yet").
uint64_t NewDaemonId() {
  absl::BitGen gen;
  uint64_t id = 0;
  while (id == 0) id = absl::Uniform<uint64_t>(gen);
  return id;
}

// The shared host arena for store.host_ipc_socket: the pool budget plus
// 1/16 (at least 1 MiB) of room, since each pool's range is rounded up to
// whole system pages and freed ranges fragment. Unused room costs nothing:
// the memfd commits pages only when written.
absl::Status AttachHostArena(StoreOptions* store) {
  const uint64_t budget = store->pool_budget_bytes;
  const uint64_t slack = std::max<uint64_t>(uint64_t{1} << 20, budget / 16);
  KVH_ASSIGN_OR_RETURN(
      store->host_arena,
      HostArena::Create(budget + slack, "store.host_ipc_socket"));
  return absl::OkStatus();
}

}  // namespace

Daemon::Daemon(DaemonOptions options)
    : options_(std::move(options)), daemon_id_(NewDaemonId()) {}

std::string Daemon::host_ipc_socket() const {
  return host_ipc_ == nullptr ? std::string() : host_ipc_->path();
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  KVH_RETURN_IF_ERROR(ValidateDaemonOptions(options, "options"));
  std::unique_ptr<Daemon> daemon(new Daemon(std::move(options)));
  absl::Status status = daemon->Init();
  if (!status.ok()) {
    // Nothing is serving yet; tear down what Init made without draining.
    daemon->Shutdown(absl::ZeroDuration());
    return status;
  }
  return daemon;
}

absl::StatusOr<StoreOptions> Daemon::MakeStoreOptions() const {
  StoreOptions store_options = options_.store;
  // The budget is host memory unless a device tier replaces it below.
  const uint64_t ram = PhysicalRamBytes();
  if (store_options.device_pool_bytes == 0 && ram > 0 &&
      store_options.pool_budget_bytes > ram) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store.pool_budget_bytes (--pool_bytes): ",
        HumanBytes(store_options.pool_budget_bytes),
        " is more than this machine's memory (", HumanBytes(ram),
        "); the daemon would be killed before the budget filled. Set it "
        "below the memory the daemon may use (in a container: below its "
        "memory limit)"));
  }
  // Namespace lines (calibration switches, tier warnings) in the daemon's
  // log, in the store watcher's "namespace '<name>': ..." style.
  store_options.log = [](const std::string& ns, const std::string& line) {
    spdlog::info("namespace '{}': {}", ns, line);
  };
  store_options.warn = [](const std::string& ns, const std::string& line) {
    spdlog::warn("namespace '{}': {}", ns, line);
  };
  const bool host_ipc = !options_.host_ipc.socket.empty();
  DeviceTierSetup device = SetUpDeviceTier(std::move(store_options),
                                           options_.device_pool_auto, host_ipc);
  if (device.warning) {
    spdlog::warn("{}", device.log_line);
  } else {
    spdlog::info("{}", device.log_line);
  }
  store_options = std::move(device.options);
  // The CPU codec and online calibration run on OpenBLAS.
  if (const std::string w = BlasKernelWarning(DetectBlasKernels());
      !w.empty()) {
    spdlog::warn("{}", w);
  }
  if (host_ipc && store_options.device_tier != nullptr) {
    spdlog::warn(
        "store.host_ipc_socket: not served: namespace pools live in the "
        "device arena (GetHostHandles answers FAILED_PRECONDITION)");
  } else if (host_ipc) {
    KVH_RETURN_IF_ERROR(AttachHostArena(&store_options));
  }
  return store_options;
}

absl::Status Daemon::StartHostIpc() {
  const StoreOptions& s = store_->options();
  if (s.host_arena == nullptr || s.device_tier != nullptr) {
    return absl::OkStatus();
  }
  KVH_ASSIGN_OR_RETURN(
      host_ipc_, HostIpcServer::Start(options_.host_ipc, s.host_arena->fd(),
                                      s.host_arena->bytes(), daemon_id_));
  spdlog::info(
      "host ipc: serving the shared host arena ({}) read-only on {} (mode "
      "{:04o}, daemon id {:016x})",
      HumanBytes(s.host_arena->bytes()), host_ipc_->path(),
      options_.host_ipc.socket_mode, daemon_id_);
  // Same-host Insert through shared memory, beside it (same mode).
  StagingServerOptions staging;
  staging.socket = options_.host_ipc.socket + kStagingSocketSuffix;
  staging.socket_mode = options_.host_ipc.socket_mode;
  staging_registry_ = std::make_unique<StagingRegistry>(kMaxStagingRegions);
  KVH_ASSIGN_OR_RETURN(
      staging_,
      StagingServer::Start(staging, staging_registry_.get(), daemon_id_));
  spdlog::info(
      "staging: same-host Insert through shared memory on {} (mode {:04o}; "
      "at most {} regions of at most {} each)",
      staging_->path(), options_.host_ipc.socket_mode, kMaxStagingRegions,
      HumanBytes(staging.max_region_bytes));
  return absl::OkStatus();
}

absl::Status Daemon::StartDataPlane() {
  const DataPlaneOptions& d = options_.data_plane;
  if (d.listen.empty()) return absl::OkStatus();
  if (options_.security.tls() && !d.allow_plaintext) {
    return absl::FailedPreconditionError(
        "data_plane.listen: the bulk data plane is plain TCP and "
        "security.tls is on; set data_plane.allow_plaintext: true if the "
        "network between this daemon and its clients is trusted, or remove "
        "data_plane.listen (every byte then goes through gRPC over TLS)");
  }
  bulk_tickets_ = std::make_unique<BulkTicketTable>(d.max_connections);
  BulkServerOptions bulk;
  bulk.listen = d.listen;
  bulk.max_connections = d.max_connections;
  // The longer of the two idle limits: a data connection of a Fetch or of
  // an Insert (30 s when neither is set).
  const absl::Duration idle = std::max(options_.limits.fetch_idle_timeout,
                                       options_.limits.upload_idle_timeout);
  if (idle > absl::ZeroDuration()) bulk.idle_timeout = idle;
  KVH_ASSIGN_OR_RETURN(bulk_, BulkServer::Start(bulk, bulk_tickets_.get()));
  spdlog::info(
      "data plane: bulk Fetch and Insert on TCP {} (port {}; at most {} "
      "connections); "
      "PLAINTEXT: page bytes are not encrypted{}",
      d.listen, bulk_->port(), d.max_connections,
      options_.security.tls()
          ? " although gRPC uses TLS (data_plane.allow_plaintext: true)"
          : "");
  return absl::OkStatus();
}

uint16_t Daemon::data_plane_port() const {
  return bulk_ == nullptr ? 0 : bulk_->port();
}

uint64_t Daemon::data_plane_bytes() const {
  return bulk_ == nullptr ? 0 : bulk_->bytes_moved();
}

absl::StatusOr<std::vector<std::string>> Daemon::CreateNamespaces() {
  std::vector<std::string> summary;
  for (size_t i = 0; i < options_.namespaces.size(); ++i) {
    const NamespaceSpec& spec = options_.namespaces[i];
    auto created = store_->CreateNamespace(spec, /*if_not_exists=*/false);
    if (!created.ok()) {
      return absl::Status(created.status().code(),
                          absl::StrCat("namespaces[", i, "] ('", spec.name,
                                       "'): ", created.status().message()));
    }
    const NamespaceConfig& c = created->first->config();
    summary.push_back(absl::StrCat(c.name, " (", c.geometry.DebugString(), ", ",
                                   HumanBytes(c.capacity_bytes), ", ", c.codec,
                                   ")"));
  }
  return summary;
}

void Daemon::StartService() {
  ServiceOptions service_options;
  service_options.default_chunk_bytes = options_.default_chunk_bytes;
  service_options.max_chunk_bytes = options_.max_chunk_bytes;
  const LimitsOptions& limits = options_.limits;
  service_options.admission.global = limits.max_in_flight_calls;
  service_options.admission.per_tenant = limits.max_in_flight_calls_per_tenant;
  service_options.admission.per_connection =
      limits.max_in_flight_calls_per_connection;
  service_options.upload_idle_timeout = limits.upload_idle_timeout;
  service_options.fetch_idle_timeout = limits.fetch_idle_timeout;
  service_options.daemon_id = daemon_id_;
  if (staging_ != nullptr) {
    service_options.staging_socket = staging_->path();
    service_options.staging = staging_registry_.get();
  }
  if (host_ipc_ != nullptr) {
    service_options.host_ipc_socket = host_ipc_->path();
  }
  if (bulk_ != nullptr) {
    service_options.bulk_tickets = bulk_tickets_.get();
    service_options.bulk_port = bulk_->port();
  }
  service_ = std::make_unique<KvHarborService>(store_.get(), service_options,
                                               metrics_.get(), tokens_);
  const CallTracker* calls = &service_->calls();
  const BulkServer* plane = bulk_.get();
  metrics_->AttachStore(store_.get(), [calls, plane] {
    CallCounters c{calls->in_flight(), calls->rejected(),
                   calls->idle_cancelled()};
    if (plane != nullptr) {
      c.data_plane = true;
      c.data_plane_bytes = plane->bytes_moved();
      c.data_plane_refused = plane->refused();
    }
    return c;
  });
}

absl::Status Daemon::StartMetricsHttp() {
  MetricsHttpServer::Authorizer authorize;
  if (options_.metrics_require_token) {
    authorize = [tokens = tokens_](absl::string_view header) -> absl::Status {
      if (header.empty()) {
        return absl::UnauthenticatedError(
            "metrics.require_token: send 'Authorization: Bearer <token>' "
            "of a daemon_admin token");
      }
      KVH_ASSIGN_OR_RETURN(Caller caller, tokens->Authenticate(header));
      if (!caller.daemon_admin) {
        return absl::PermissionDeniedError(
            "metrics.require_token: this token is not a daemon_admin "
            "token; /metrics shows every tenant");
      }
      return absl::OkStatus();
    };
  } else if (!MetricsOnLoopback(options_.metrics_listen)) {
    spdlog::warn(
        "metrics.listen {} is not a loopback address and "
        "metrics.require_token is off: anyone who reaches it reads every "
        "tenant's namespace names and counters",
        options_.metrics_listen);
  }
  KVH_ASSIGN_OR_RETURN(
      metrics_http_,
      MetricsHttpServer::Start(options_.metrics_listen, &metrics_->registry(),
                               "metrics.listen", std::move(authorize)));
  return absl::OkStatus();
}

absl::Status Daemon::StartGrpc(
    const std::shared_ptr<grpc::ServerCredentials>& credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  // gRPC implements the health service without protobuf (upb), so reflection
  // (which reads protobuf's generated pool) could list grpc.health.v1.Health
  // but not describe it, and grpcurl failed on Health/Check. The generated
  // health.pb.cc registers grpc/health/v1/health.proto in that pool; naming
  // one of its descriptors keeps the linker from dropping it.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, credentials, &port_);
  builder.RegisterService(service_.get());
  ApplyLimits(options_.limits, &builder);
  // gRPC sets SO_REUSEPORT by default, which would let a second daemon bind
  // a busy port and silently split the traffic; fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("listen: cannot serve on '", options_.listen,
                     "' (address in use, not local, or malformed)"));
  }
  return absl::OkStatus();
}

absl::Status Daemon::Init() {
  KVH_ASSIGN_OR_RETURN(StoreOptions store_options, MakeStoreOptions());
  store_ = std::make_unique<Store>(std::move(store_options));
  KVH_ASSIGN_OR_RETURN(std::vector<std::string> summary, CreateNamespaces());
  KVH_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                       SetUpSecurity());
  KVH_RETURN_IF_ERROR(StartHostIpc());
  KVH_RETURN_IF_ERROR(StartDataPlane());
  metrics_ = std::make_unique<ServerMetrics>();
  StartService();
  // Metrics first: a busy metrics port then fails Start before any gRPC
  // client could have connected.
  if (!options_.metrics_listen.empty()) {
    KVH_RETURN_IF_ERROR(StartMetricsHttp());
  }
  KVH_RETURN_IF_ERROR(StartGrpc(credentials));
  // gRPC's health service says SERVING for "" from the start; not yet.
  SetServing(false);
  watcher_ = std::make_unique<StoreWatcher>(store_.get(), kEventWindow);
  reaper_ = std::thread([this] { ReapLoop(); });
  if (options_.before_serving) options_.before_serving(port_);
  SetServing(true);
  if (options_.cluster.has_value()) {
    // Registered only once serving: a client that sees the key can use it.
    cluster::RegistrarOptions c = *options_.cluster;
    if (c.advertise.empty()) c.advertise = address();
    KVH_ASSIGN_OR_RETURN(registrar_, cluster::MemberRegistrar::Start(c));
    spdlog::info("cluster: registered {} in etcd (lease ttl {})",
                 registrar_->key(), absl::FormatDuration(c.lease_ttl));
  }
  spdlog::info("{}", StartupSummary(summary));
  return absl::OkStatus();
}

std::string Daemon::StartupSummary(
    const std::vector<std::string>& namespaces) const {
  const GlobalStats c = store_->Counters();
  absl::string_view metrics_host;
  int unused_port = 0;
  SplitHostPort(options_.metrics_listen, &metrics_host, &unused_port);
  // "serving on HOST:PORT" first: tests/python/daemon.py reads the port
  // from it.
  return absl::StrCat(
      "kvharbord serving on ", address(), ": metrics ",
      metrics_http_ == nullptr ? std::string("off")
                               : absl::StrCat("on http://", metrics_host, ":",
                                              metrics_port(), "/metrics"),
      ", pool budget ", HumanBytes(c.pool_budget_bytes),
      store_->options().device_tier != nullptr ? " on the GPU"
                                               : " in host memory",
      " (", HumanBytes(c.pool_reserved_bytes), " reserved), default namespace ",
      HumanBytes(options_.store.default_namespace_bytes), ", max ",
      options_.store.max_tokens_per_request, " tokens per request, lease ttl ",
      absl::FormatDuration(options_.store.default_lease_ttl), " (max ",
      absl::FormatDuration(options_.store.max_lease_ttl), "), drain ",
      absl::FormatDuration(options_.drain_timeout), ", log ",
      options_.log_format, "/", options_.log_level, ", ",
      LimitsSummary(options_.limits), ", ", namespaces.size(), " namespace(s)",
      namespaces.empty() ? "" : ": ", absl::StrJoin(namespaces, "; "));
}

KvHarborService& Daemon::service() { return *service_; }

int Daemon::metrics_port() const {
  return metrics_http_ == nullptr ? 0 : metrics_http_->port();
}

Daemon::~Daemon() { Shutdown(options_.drain_timeout); }

std::string Daemon::address() const {
  absl::string_view host;
  int unused_port = 0;
  SplitHostPort(options_.listen, &host, &unused_port);
  // A wildcard address is not something to connect to; loopback is.
  if (host == "0.0.0.0" || host == "[::]" || host == "::" || host.empty()) {
    host = "127.0.0.1";
  }
  return absl::StrCat(host, ":", port_);
}

void Daemon::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health =
      server_ == nullptr ? nullptr : server_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", serving);
  health->SetServingStatus(kServiceName, serving);
}

void Daemon::ReapLoop() {
  watcher_->Poll(absl::Now());  // corrupt pages found loading the disk tier
  while (!stop_reaper_.WaitForNotificationWithTimeout(
      options_.lease_reap_interval)) {
    const size_t n = store_->ReapExpiredLeases(absl::Now());
    if (n > 0) spdlog::debug("reaped {} expired lease(s)", n);
    if (const size_t u = service_->ReapDeviceUploads(absl::Now()); u > 0) {
      spdlog::info("aborted {} DeviceInsert upload(s) past their TTL", u);
    }
    watcher_->Poll(absl::Now());
    PollTokensFile();
  }
}

void Daemon::Shutdown(absl::Duration drain) {
  absl::MutexLock lock(&shutdown_mu_);
  if (shutting_down_) return;  // the first caller held the lock until done
  shutting_down_ = true;
  // Leave the cluster first, so that clients stop routing here while the
  // in-flight calls drain.
  if (registrar_ != nullptr) registrar_->Stop();
  if (server_ != nullptr) {
    spdlog::info(
        "shutting down: NOT_SERVING, draining in-flight calls for up to {}",
        absl::FormatDuration(drain));
    SetServing(false);
    const absl::Time drain_end = absl::Now() + drain;
    // New KvHarbor calls fail with UNAVAILABLE from here on; in-flight ones
    // run to completion until the deadline.
    CallTracker& calls = service_->calls();
    calls.StartDraining();
    if (!calls.AwaitIdle(drain_end)) {
      spdlog::warn("drain time over: cancelling {} call(s) still in flight",
                   calls.in_flight());
    }
    // Stops accepting and cancels what is left -- stuck calls, and streams
    // of other services such as health Watch, which never end by themselves
    // -- then waits for their reactors to finish. The health service writes
    // NOT_SERVING to its watchers asynchronously: their streams are
    // cancelled only after kHealthWatchGrace (within the drain time), so
    // that a watcher (a load balancer) reads NOT_SERVING rather than a
    // stream that just ends.
    server_->Shutdown(absl::ToChronoTime(
        std::min(drain_end, absl::Now() + kHealthWatchGrace)));
    server_->Wait();
  }
  if (reaper_.joinable()) {
    stop_reaper_.Notify();
    reaper_.join();
  }
  // The socket file goes with the daemon; clients that mapped the arena
  // keep their mapping until they notice the daemon id changed.
  if (host_ipc_ != nullptr) host_ipc_->Stop();
  // After the gRPC server: no Insert reads a region any more.
  if (staging_ != nullptr) staging_->Stop();
  // After the gRPC server too: its calls' end cancelled every transfer.
  if (bulk_ != nullptr) bulk_->Stop();
  // Last: metrics stay scrapeable while calls drain.
  if (metrics_http_ != nullptr) metrics_http_->Stop();
  if (server_ != nullptr) spdlog::info("kvharbord on {} stopped", address());
  done_.Notify();
}

void Daemon::Wait() { done_.WaitForNotification(); }

}  // namespace kvharbor
