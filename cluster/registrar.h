// MemberRegistrar: a kvharbord's entry in the cluster's etcd membership.
//
// Start() grants an etcd lease of `lease_ttl`, writes the key
// `key_prefix + advertise` (value: a small JSON object with the address and
// the start time) under that lease and keeps the lease alive from a thread
// (every ttl/3). If etcd forgets the lease (it was unreachable for longer than
// the TTL) the thread grants a new one and writes the key again, so a daemon
// rejoins by itself after an etcd outage. Stop() revokes the lease: the key
// disappears at once and clients drop the member without waiting for expiry.
// A daemon that dies without Stop disappears when its lease expires.
//
// Owns its thread; Start/Stop from one owner; the counters are atomic.
#ifndef KVHARBOR_CLUSTER_REGISTRAR_H_
#define KVHARBOR_CLUSTER_REGISTRAR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cluster/etcd_client.h"

namespace kvharbor {
namespace cluster {

inline constexpr char kDefaultKeyPrefix[] = "/kvharbor/members/";

struct RegistrarOptions {
  EtcdOptions etcd;
  std::string key_prefix = kDefaultKeyPrefix;
  absl::Duration lease_ttl = absl::Seconds(10);  // whole seconds, >= 1
  // HOST:PORT clients connect to; "" = the daemon's own address.
  std::string advertise;
};

// Messages read "<prefix>: cluster.<field>: ...".
absl::Status ValidateRegistrarOptions(const RegistrarOptions& options,
                                      absl::string_view prefix);

class MemberRegistrar {
 public:
  // Registers `options.advertise` (must be set) and starts the keepalive
  // thread; UNAVAILABLE when no etcd endpoint answers.
  static absl::StatusOr<std::unique_ptr<MemberRegistrar>> Start(
      RegistrarOptions options);
  ~MemberRegistrar();  // Stop()
  MemberRegistrar(const MemberRegistrar&) = delete;
  MemberRegistrar& operator=(const MemberRegistrar&) = delete;

  // Revokes the lease (best effort, bounded by the etcd request timeout) and
  // joins the thread. Idempotent.
  void Stop();

  const std::string& key() const { return key_; }
  int64_t lease() const { return lease_.load(); }
  uint64_t keepalive_failures() const { return keepalive_failures_.load(); }
  uint64_t registrations() const { return registrations_.load(); }

 private:
  explicit MemberRegistrar(RegistrarOptions options);
  absl::Status Register();
  void KeepAliveLoop();

  const RegistrarOptions options_;
  const std::string key_;
  EtcdClient etcd_;
  std::atomic<int64_t> lease_{0};
  std::atomic<uint64_t> keepalive_failures_{0};
  std::atomic<uint64_t> registrations_{0};
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace cluster
}  // namespace kvharbor

#endif  // KVHARBOR_CLUSTER_REGISTRAR_H_
