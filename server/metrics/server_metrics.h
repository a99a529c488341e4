// ServerMetrics: kvharbord's Prometheus metrics (names under kvharbor_).
//
// Lock order: prefix_mu_ before the match_prefix_ family's mutex.
//
// Recorded on the RPC path (relaxed atomics on series looked up once):
//   kvharbor_rpc_duration_seconds{method}      histogram, handler to OnDone
//   kvharbor_rpcs_handled_total{method,code}   completions by gRPC status
//   kvharbor_match_prefix_tokens{namespace}    histogram of matched prefixes
// Read from the Store (and the CallTracker) at scrape time, so they cost the
// RPC path nothing: per namespace hit/miss tokens, pages and stored bytes per
// tier, compression ratio of the cold tiers, evictions, demotions, bytes in
// and out, active leases; pool budget and reservation; calls in flight.
// The full list, with help texts, is in server_metrics.cc.
//
// The Daemon owns one; the service and the HTTP endpoint hold pointers. The
// Store and CallTracker given to AttachStore must outlive every Render.
// Thread-safe.
#ifndef KVHARBOR_SERVER_METRICS_SERVER_METRICS_H_
#define KVHARBOR_SERVER_METRICS_SERVER_METRICS_H_

#include <grpcpp/grpcpp.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/store/store.h"
#include "server/metrics/metrics.h"

namespace kvharbor {

// The KvHarbor methods, for per-method series.
enum class RpcMethod : int {
  kCreateNamespace,
  kDescribeNamespace,
  kListNamespaces,
  kDeleteNamespace,
  kMatch,
  kInsert,
  kFetch,
  kRelease,
  kExtendLease,
  kEvict,
  kStats,
  kDumpTree,
  kGetCalibration,
  kDemote,
  kUploadCalibration,
  kListCalibrations,
  kPinCalibration,
  kGetDeviceHandles,
  kGetHostHandles,
  kDeviceInsert,
};
inline constexpr int kNumRpcMethods = 20;
absl::string_view RpcMethodName(RpcMethod m);
// "OK", "INVALID_ARGUMENT", ... as gRPC spells them.
absl::string_view GrpcCodeName(grpc::StatusCode code);

// The call-limit gauges, read at scrape time (in the daemon, from the
// service's CallTracker, server/rpc/call_tracker.h).
struct CallCounters {
  int64_t in_flight = 0;
  uint64_t rejected = 0;
  uint64_t idle_cancelled = 0;
  // The bulk data plane (server/data/bulk_server.h), when it is served.
  bool data_plane = false;
  uint64_t data_plane_bytes = 0;
  uint64_t data_plane_refused = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // One finished call: its status code and how long it took (seconds).
  void RecordRpc(RpcMethod method, grpc::StatusCode code, double seconds);
  // A Match in `ns` that matched `tokens` tokens (0 for a full miss).
  void ObserveMatch(const std::string& ns, uint64_t tokens);
  // Stops rendering the per-namespace series recorded here for `ns`.
  void ForgetNamespace(const std::string& ns);

  // Adds the scrape-time metrics of `store` (may be null) and of the call
  // counters `calls` returns (may be empty: no call-limit gauges).
  void AttachStore(const Store* store, std::function<CallCounters()> calls);

  metrics::Registry& registry() { return registry_; }
  std::string Render() const { return registry_.Render(); }

 private:
  static constexpr int kNumCodes = 17;  // OK .. UNAUTHENTICATED
  struct PerMethod {
    std::shared_ptr<metrics::Histogram> latency;
    // Series made on first use of a code, so only codes seen are rendered;
    // the family keeps them alive (they are never removed).
    std::array<std::atomic<metrics::Counter*>, kNumCodes> handled{};
  };

  metrics::Registry registry_;
  metrics::Family<metrics::Histogram>* latency_ = nullptr;
  metrics::Family<metrics::Counter>* handled_ = nullptr;
  metrics::Family<metrics::Histogram>* match_prefix_ = nullptr;
  std::array<PerMethod, kNumRpcMethods> methods_;
  // The match_prefix_ series by namespace, found without allocating.
  absl::Mutex prefix_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<metrics::Histogram>>
      prefix_by_ns_ ABSL_GUARDED_BY(prefix_mu_);
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_METRICS_SERVER_METRICS_H_
