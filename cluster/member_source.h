// Member sources: where a kvharbor cluster client learns which daemons exist.
//
//  * StaticMemberSource: a fixed list of HOST:PORT.
//  * DnsMemberSource: every address a DNS name resolves to (A and AAAA), on
//    one port, re-resolved periodically: a Kubernetes headless Service
//    resolves to one address per ready pod.
//  * EtcdMemberSource: the keys under a prefix in etcd, as kvharbord's
//    MemberRegistrar writes them (cluster/registrar.h), read once and then
//    followed with a watch; when the watch breaks it re-reads and watches
//    again (backing off), keeping the last known view meanwhile.
//
// Members() returns a snapshot; each member carries an `epoch` that changes
// when the member re-registers (etcd mod revision; 0 for the other sources),
// so that a client can tell a restarted daemon from a live one.
//
// Thread-safe: Members() may be called from any thread while the source's
// own thread (DNS, etcd) updates the view. Sources own their threads and
// stop them in their destructors.
#ifndef KVHARBOR_CLUSTER_MEMBER_SOURCE_H_
#define KVHARBOR_CLUSTER_MEMBER_SOURCE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cluster/etcd_client.h"

namespace kvharbor {
namespace cluster {

struct Member {
  std::string address;  // HOST:PORT of the daemon's gRPC endpoint
  int64_t epoch = 0;    // changes when the member registers again

  bool operator==(const Member& o) const {
    return address == o.address && epoch == o.epoch;
  }
};

class MemberSource {
 public:
  virtual ~MemberSource() = default;
  // The current members, sorted by address, no duplicates.
  virtual std::vector<Member> Members() const = 0;
  // Increases whenever Members() changes.
  virtual uint64_t generation() const = 0;
  // "static: a,b", "dns: name:port", "etcd: endpoints prefix" (for status).
  virtual std::string Describe() const = 0;
};

class StaticMemberSource : public MemberSource {
 public:
  // INVALID_ARGUMENT naming `field` for an empty list or an entry that is
  // not HOST:PORT.
  static absl::StatusOr<std::unique_ptr<StaticMemberSource>> Create(
      std::vector<std::string> addresses, absl::string_view field = "members");
  std::vector<Member> Members() const override { return members_; }
  uint64_t generation() const override { return 1; }
  std::string Describe() const override;

 private:
  std::vector<Member> members_;
};

class DnsMemberSource : public MemberSource {
 public:
  // `name_port` is NAME:PORT. Resolves once (an error if that fails or finds
  // nothing), then every `refresh` on its own thread; a failed refresh keeps
  // the previous view.
  static absl::StatusOr<std::unique_ptr<DnsMemberSource>> Create(
      const std::string& name_port, absl::Duration refresh = absl::Seconds(5));
  ~DnsMemberSource() override;
  std::vector<Member> Members() const override;
  uint64_t generation() const override { return generation_.load(); }
  std::string Describe() const override;

 private:
  DnsMemberSource(std::string name, int port, absl::Duration refresh);
  absl::Status Resolve();

  const std::string name_;
  const int port_;
  const absl::Duration refresh_;
  mutable absl::Mutex mu_;
  std::vector<Member> members_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> generation_{0};
  absl::Notification stop_;
  std::thread thread_;
};

class EtcdMemberSource : public MemberSource {
 public:
  // Reads the prefix once (UNAVAILABLE when etcd does not answer) and starts
  // watching it.
  static absl::StatusOr<std::unique_ptr<EtcdMemberSource>> Create(
      EtcdOptions etcd, std::string key_prefix);
  ~EtcdMemberSource() override;
  std::vector<Member> Members() const override;
  uint64_t generation() const override { return generation_.load(); }
  std::string Describe() const override;
  // Times the watch broke and the view was re-read (for tests and status).
  uint64_t resyncs() const { return resyncs_.load(); }

 private:
  EtcdMemberSource(EtcdOptions etcd, std::string key_prefix);
  // Range + new watch from the range's revision; replaces the view.
  absl::Status Resync();
  void Apply(const std::vector<EtcdEvent>& events);
  void ResyncLoop();

  const EtcdOptions etcd_;
  const std::string prefix_;
  mutable absl::Mutex mu_;
  std::map<std::string, Member> by_key_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> resyncs_{0};
  // Written only by the creating thread and then the resync thread.
  std::unique_ptr<EtcdWatch> watch_;
  // Two mutexes, never held together (so no lock order between them):
  // mu_ guards the view (Resync, the watch's events, Members); broken_mu_
  // the watch's health and shutdown, which the resync thread waits on.
  absl::Mutex broken_mu_;
  bool broken_ ABSL_GUARDED_BY(broken_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(broken_mu_) = false;
  std::thread resync_thread_;
};

// The member address an etcd key's value names (the registrar's JSON
// "address"), or the key without the prefix when the value has none.
std::string MemberAddressFromEtcd(absl::string_view prefix,
                                  const EtcdKeyValue& kv);

}  // namespace cluster
}  // namespace kvharbor

#endif  // KVHARBOR_CLUSTER_MEMBER_SOURCE_H_
