// DaemonOptions: everything kvharbord's configuration sets (listen address,
// store, limits, security, same-host IPC, cluster membership), and
// ValidateDaemonOptions, which checks every field. server/daemon/config.h
// fills them from a YAML file, kvharbord's main from flags; the Daemon
// (server/daemon/daemon.h) runs them.
//
// Plain values and a stateless function; thread-safe.
#ifndef KVHARBOR_SERVER_DAEMON_DAEMON_OPTIONS_H_
#define KVHARBOR_SERVER_DAEMON_DAEMON_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cluster/registrar.h"
#include "core/base/host_port.h"
#include "core/store/store.h"
#include "server/daemon/limits.h"
#include "server/local/host_ipc_server.h"
#include "server/security/security.h"

namespace kvharbor {

// kvharbord's metrics address unless configured (Prometheus' registry of
// default ports lists 9464 for OpenTelemetry-style exporters).
inline constexpr char kDefaultMetricsListen[] = "127.0.0.1:9464";

// The bulk data plane (config section data_plane:, docs/data_plane.md):
// Fetch bytes on TCP connections beside gRPC, for clients that ask.
struct DataPlaneOptions {
  // HOST:PORT to listen on ("HOST:0" picks a free port); "" = no plane
  // (every byte goes through the gRPC stream).
  std::string listen;
  // Data connections open at once; more are refused (RESOURCE_EXHAUSTED).
  uint32_t max_connections = 64;
  // The plane is plain TCP. With security.tls on, the daemon refuses to
  // start with a plane unless this is true: an operator who trusts the
  // network between daemon and clients says so here.
  bool allow_plaintext = false;
};

struct DaemonOptions {
  std::string listen = "127.0.0.1:50051";  // "HOST:0" picks a free port
  // HOST:PORT of the HTTP metrics endpoint; "" serves none. Embedded
  // daemons serve none by default; kvharbord defaults to
  // kDefaultMetricsListen (config key metrics.listen).
  std::string metrics_listen;
  // Whether GET /metrics needs "Authorization: Bearer <token>" of a
  // daemon_admin token of security.tokens_file (config key
  // metrics.require_token; needs tokens). Off: the endpoint is open, so keep
  // it on loopback (the default address); it lists every tenant's
  // namespace names and counters.
  bool metrics_require_token = false;
  // Log output (config keys log.format, log.level). Process-wide, so the
  // Daemon only validates them; kvharbord's main applies them
  // (server/daemon/logging.h).
  std::string log_format = "text";  // text | json
  std::string log_level = "info";
  StoreOptions store;  // core/store/store.h
  // store.device_pool_bytes "auto": a device pool on GPU store.device when
  // the machine has one, sized by DefaultDevicePoolBytes
  // (server/daemon/device_setup.h), else host pools; store.device_pool_bytes is
  // then ignored. Embedded daemons take store.device_pool_bytes as given
  // (false); kvharbord defaults to auto (config key store.device_pool_bytes,
  // flag --device_pool_bytes).
  bool device_pool_auto = false;
  std::vector<NamespaceSpec> namespaces;   // created at start
  uint32_t default_chunk_bytes = 1 << 20;  // Fetch chunk size default
  uint32_t max_chunk_bytes = (4 << 20) - (64 << 10);
  absl::Duration drain_timeout = absl::Seconds(10);
  absl::Duration lease_reap_interval = absl::Milliseconds(500);
  LimitsOptions limits;  // config section limits: (server/daemon/limits.h)
  // TLS, mutual TLS and bearer tokens (config key security;
  // server/security/security.h). All off by default.
  SecurityOptions security;
  // Same-host Fetch through shared memory (config store.host_ipc_socket,
  // store.host_ipc_socket_mode; server/local/host_ipc_server.h): with a socket
  // path, host pools are cut from one shared memfd that local clients map
  // read-only. Off ("") by default.
  HostIpcOptions host_ipc;
  DataPlaneOptions data_plane;
  // etcd membership (config section cluster:, cluster/registrar.h): once
  // serving, the daemon registers itself under a lease and keeps it alive;
  // Shutdown revokes it first. nullopt = not a cluster member. Start fails
  // (UNAVAILABLE) when no etcd endpoint answers.
  std::optional<cluster::RegistrarOptions> cluster;
  // For tests: runs inside Start once every listener is bound (with the
  // gRPC port), before health turns SERVING.
  std::function<void(int port)> before_serving;
};

// The largest receive limit (limits.max_receive_message_bytes) is set in
// LimitsOptions; these bound Fetch chunks and header token counts.
inline constexpr uint32_t kMaxChunkBytesLimit = (16 << 20) - (64 << 10);
inline constexpr uint32_t kMaxTokensPerRequestLimit = 1 << 21;
// Largest CUDA device index store.device accepts.
inline constexpr int kMaxDeviceIndex = 1023;

// Checks every field; messages read "<prefix>: <field>: ..." (e.g.
// "config: store.pool_budget_bytes: must be > 0"). Namespace specs are
// checked by the store when Start creates them.
absl::Status ValidateDaemonOptions(const DaemonOptions& options,
                                   absl::string_view prefix);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DAEMON_DAEMON_OPTIONS_H_
