// Daemon: the kvharbord gRPC server as an embeddable object.
//
// Start() builds a Store from DaemonOptions, creates the configured
// namespaces, binds the listen address and serves kvharbor.v1.KvHarbor (on
// gRPC's callback API), the standard health service (grpc.health.v1; both ""
// and "kvharbor.v1.KvHarbor" report SERVING once Start returns) and server
// reflection. With metrics_listen set it also serves Prometheus metrics over
// HTTP (GET /metrics; server_metrics.h lists them). Health reports
// NOT_SERVING until Start has finished everything (gRPC's default of SERVING
// for "" lasts only from the moment the listener opens until the next
// statement). A background thread reaps expired leases and logs notable
// store events (store_watcher.h). Shutdown() reports
// NOT_SERVING, turns new KvHarbor calls away (UNAVAILABLE), lets in-flight
// calls finish for up to the drain time, then closes the listener and cancels
// whatever is left (including health Watch streams, which never end by
// themselves).
//
// The Daemon owns the Store and the gRPC server; store() stays valid for the
// Daemon's lifetime. All methods are thread-safe; Shutdown may be called from
// any thread (but not from inside an RPC handler, which it would wait for).
// The process-wide gRPC settings it turns on (default health service,
// reflection plugin) apply to every server built afterwards.
#ifndef KVHARBOR_SERVER_DAEMON_DAEMON_H_
#define KVHARBOR_SERVER_DAEMON_DAEMON_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cluster/registrar.h"
#include "core/store/store.h"
#include "server/daemon/daemon_options.h"
#include "server/data/bulk_server.h"
#include "server/data/bulk_ticket_table.h"
#include "server/local/staging_registry.h"
#include "server/local/staging_server.h"

namespace grpc {
class Server;
class ServerCredentials;
}  // namespace grpc

namespace kvharbor {

class KvHarborService;
class MetricsHttpServer;
class ServerMetrics;
class StoreWatcher;
class TokenStore;

class Daemon {
 public:
  // Binds and serves; returns when ready (health SERVING).
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  ~Daemon();  // Shutdown(drain_timeout) if still running
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  int port() const { return port_; }  // the bound port
  // The bound metrics port; 0 when metrics_listen is empty.
  int metrics_port() const;
  ServerMetrics& metrics() { return *metrics_; }
  // The gRPC service (its calls in flight, limits' counters).
  KvHarborService& service();
  std::string address() const;  // "127.0.0.1:PORT"
  Store& store() { return *store_; }
  const DaemonOptions& options() const { return options_; }
  // Random 64-bit identity made at start (GetHostHandles and the host IPC
  // socket's greeting carry it).
  uint64_t daemon_id() const { return daemon_id_; }
  // The host IPC socket path while it is served, else "".
  std::string host_ipc_socket() const;
  // The bulk data plane's TCP port; 0 when it is not served.
  uint16_t data_plane_port() const;
  // Page bytes the bulk data plane moved so far, both ways (also the
  // metric kvharbor_data_plane_bytes_total).
  uint64_t data_plane_bytes() const;

  // Health NOT_SERVING, stop accepting (new KvHarbor calls get UNAVAILABLE),
  // drain in-flight calls up to `drain`, then cancel the rest. Idempotent; a
  // concurrent caller returns once the first one has finished.
  void Shutdown(absl::Duration drain);
  void Wait();  // blocks until shut down
  bool shut_down() const { return done_.HasBeenNotified(); }

  // Reads security.tokens_file again (kvharbord calls it on SIGHUP; the
  // reaper thread also reloads when the file changes). On error the old
  // tokens stay in force and the error is logged and returned. OK without
  // auth.
  absl::Status ReloadTokens();

 private:
  explicit Daemon(DaemonOptions options);
  absl::Status Init();
  // The store's options: the configured ones with the daemon's log sinks,
  // the device tier when one opens, and the shared host arena for
  // store.host_ipc_socket (host pools only).
  absl::StatusOr<StoreOptions> MakeStoreOptions() const;
  // Serves the host IPC socket when the store's pools are in the shared
  // host arena (server/local/host_ipc_server.h).
  absl::Status StartHostIpc();
  // The bulk data plane, when data_plane.listen is set.
  absl::Status StartDataPlane();
  // Creates the configured namespaces; returns one summary line each.
  absl::StatusOr<std::vector<std::string>> CreateNamespaces();
  // Creates service_ and attaches its call counters to metrics_.
  void StartService();
  // Serves /metrics on metrics_listen (with its token check when
  // metrics.require_token is set).
  absl::Status StartMetricsHttp();
  // Builds and starts the gRPC server on the listen address.
  absl::Status StartGrpc(
      const std::shared_ptr<grpc::ServerCredentials>& credentials);
  void ReapLoop();
  void SetServing(bool serving);
  std::string StartupSummary(const std::vector<std::string>& namespaces) const;
  // Loads the tokens (auth on) and builds the port's credentials
  // (daemon_security.cc).
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> SetUpSecurity();
  void PollTokensFile();  // reaper thread

  const DaemonOptions options_;
  std::unique_ptr<Store> store_;
  std::shared_ptr<TokenStore> tokens_;      // null without auth
  std::unique_ptr<ServerMetrics> metrics_;  // reads store_ and service_
  // Declared first: it outlives the service that reads it and the staging
  // server that fills it.
  std::unique_ptr<StagingRegistry> staging_registry_;
  // The same for the bulk data plane's tickets (its server stops after the
  // gRPC server, whose reactors file and drop them).
  std::unique_ptr<BulkTicketTable> bulk_tickets_;
  std::unique_ptr<KvHarborService> service_;
  std::unique_ptr<StoreWatcher> watcher_;  // used by the reaper thread only
  std::unique_ptr<grpc::Server> server_;   // destroyed before service_, store_
  std::unique_ptr<MetricsHttpServer> metrics_http_;      // stopped first
  std::unique_ptr<cluster::MemberRegistrar> registrar_;  // etcd membership
  std::unique_ptr<HostIpcServer> host_ipc_;  // null unless serving the arena
  // Same-host Insert through shared memory (with host_ipc_).
  std::unique_ptr<StagingServer> staging_;
  std::unique_ptr<BulkServer> bulk_;  // data_plane.listen
  const uint64_t daemon_id_;
  int port_ = 0;
  std::thread reaper_;
  absl::Notification stop_reaper_;
  absl::Mutex shutdown_mu_;
  bool shutting_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  absl::Notification done_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DAEMON_DAEMON_H_
