// EtcdClient: the few etcd v3 calls kvharbor's membership needs (lease
// grant/keepalive/revoke, put, prefix range, prefix watch), spoken to etcd's
// JSON gateway (POST /v3/...; keys and values base64) with cpp-httplib. The
// gateway is part of every etcd >= 3.3 (Debian 12 ships 3.4.23), so no .proto
// files or gRPC stubs of etcd are needed.
//
// Endpoints are tried in order until one answers; a call that gets an HTTP
// answer with an error is not retried elsewhere. Every call has a timeout
// (EtcdOptions::request_timeout) so that a dead etcd never blocks a caller
// longer than that per endpoint.
//
// Thread-safe: each call opens its own HTTP connection (membership traffic is
// a few requests per second at most). EtcdWatch owns a thread that holds one
// streaming request; Stop() (or the destructor) cuts it and joins.
#ifndef KVHARBOR_CLUSTER_ETCD_CLIENT_H_
#define KVHARBOR_CLUSTER_ETCD_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
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

namespace kvharbor {
namespace cluster {

struct EtcdOptions {
  // "http://HOST:PORT" or "HOST:PORT" (http assumed); at least one.
  std::vector<std::string> endpoints;
  absl::Duration request_timeout = absl::Seconds(2);
};

// Checks the endpoints; INVALID_ARGUMENT naming `field` otherwise.
absl::Status ValidateEtcdOptions(const EtcdOptions& options,
                                 absl::string_view field);

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t lease = 0;
  int64_t mod_revision = 0;
};

struct EtcdRange {
  int64_t revision = 0;  // the store's revision when the range was read
  std::vector<EtcdKeyValue> kvs;
};

struct EtcdEvent {
  bool deleted = false;  // DELETE (lease expiry, revoke) or PUT
  EtcdKeyValue kv;
};

// The end of the key range that holds every key starting with `prefix`
// (etcd's range_end convention: the prefix with its last byte + 1).
std::string PrefixRangeEnd(absl::string_view prefix);

class EtcdClient {
 public:
  explicit EtcdClient(EtcdOptions options);

  // A lease of `ttl` (whole seconds, at least 1); returns its id.
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl);
  // Renews the lease once; returns its TTL left, or NOT_FOUND when etcd no
  // longer knows it (it expired: the caller must grant a new one).
  absl::StatusOr<absl::Duration> KeepAlive(int64_t lease);
  absl::Status RevokeLease(int64_t lease);
  // lease 0 = a key without lease.
  absl::Status Put(absl::string_view key, absl::string_view value,
                   int64_t lease);
  absl::Status Delete(absl::string_view key);
  absl::StatusOr<EtcdRange> RangePrefix(absl::string_view prefix);

  // POSTs `body` (JSON) to `path` on the first endpoint that answers;
  // returns the parsed-enough response body (JSON text).
  absl::StatusOr<std::string> Call(absl::string_view path,
                                   const std::string& body);

  const EtcdOptions& options() const { return options_; }

 private:
  const EtcdOptions options_;
};

// Watches every key under a prefix from a revision on and calls `on_events`
// (on the watch thread) with each batch. When the stream breaks (etcd
// restarts, the endpoint dies) it calls `on_broken` and stops; the owner
// resynchronises with a fresh RangePrefix and a new watch.
class EtcdWatch {
 public:
  using EventsFn = std::function<void(const std::vector<EtcdEvent>&)>;
  using BrokenFn = std::function<void(const absl::Status&)>;

  static std::unique_ptr<EtcdWatch> Start(EtcdOptions options,
                                          std::string prefix,
                                          int64_t start_revision,
                                          EventsFn on_events,
                                          BrokenFn on_broken);
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // Cuts the stream and joins the thread; on_broken is not called.
  void Stop();
  // True once etcd confirmed the watch (created), for tests and waiters.
  bool WaitCreated(absl::Duration timeout);

 private:
  EtcdWatch(EtcdOptions options, std::string prefix, int64_t start_revision,
            EventsFn on_events, BrokenFn on_broken);
  void Run();
  // Parses complete lines of `buffer_`; false when the stream must end.
  bool ConsumeLines();

  const EtcdOptions options_;
  const std::string prefix_;
  const int64_t start_revision_;
  EventsFn on_events_;
  BrokenFn on_broken_;
  std::string buffer_;  // watch thread only
  std::atomic<bool> stopping_{false};
  absl::Notification created_;
  absl::Mutex mu_;
  // The live HTTP client of the stream, so that Stop can cut it.
  void* http_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace cluster
}  // namespace kvharbor

#endif  // KVHARBOR_CLUSTER_ETCD_CLIENT_H_
