// kvharbor::ClusterClient: several kvharbord daemons used as one cache.
//
// Members come from a cluster::MemberSource (static list, DNS name such as a
// Kubernetes headless Service, or etcd where each daemon registers itself;
// cluster/member_source.h). Every prefix is owned by one member, chosen by
// rendezvous hashing of the namespace and the prefix's FIRST page of tokens
// (cluster/rendezvous.h): all continuations of a prefix land on the same
// daemon, so Match is one round trip to one daemon and needs no coordination
// between clients.
//
// Failure contract (what an inference worker sees):
//  * A member that does not answer (connection refused, UNAVAILABLE, or no
//    answer within `member_timeout`) is marked down for `retry_down_after`
//    (or until its etcd registration changes); its prefixes are MISSES
//    meanwhile: Match and Lookup return 0 tokens, Insert drops the pages and
//    says so in ClusterInsertResult::dropped (counted per member), never an
//    error. Errors that are the caller's (INVALID_ARGUMENT, NOT_FOUND for an
//    unknown namespace...) still come back as errors.
//  * No call waits past its own deadline, and a call to one member never
//    waits longer than member_timeout, whichever is sooner.
//  * A member that comes back (re-registers in etcd, or answers again after
//    retry_down_after) rejoins: the namespaces created through this client
//    are created on it again (if_not_exists) before it gets traffic, and its
//    prefixes are misses until they are inserted again.
//  * Fetch of a lease from Match goes to the member that matched; if that
//    member died in between, Fetch fails with UNAVAILABLE. Lookup (Match +
//    Fetch in one call) turns that into a miss instead.
//
// Memory: the ClusterClient owns one kvharbor::Client per member and shares
// the MemberSource; page memory belongs to the caller as with Client.
// Thread-safe: every method may be called from any thread.
#ifndef KVHARBOR_CLIENT_CLUSTER_CLIENT_H_
#define KVHARBOR_CLIENT_CLUSTER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cluster/member_source.h"
#include "kvharbor/client.h"

namespace kvharbor {

struct ClusterClientOptions {
  std::shared_ptr<cluster::MemberSource> members;  // required
  // Template of every member's Client (address is replaced per member).
  ClientOptions client;
  // Longest a call to one member may take (capped by the call's deadline).
  absl::Duration member_timeout = absl::Seconds(1);
  // How long a member that failed stays down before it is tried again.
  absl::Duration retry_down_after = absl::Seconds(2);
};

// Match's answer and the member that gave it (Fetch goes there).
struct ClusterLease {
  client::Lease lease;
  std::string member;  // "" when no live member owns the prefix
};

struct ClusterInsertResult {
  client::InsertResult result;
  std::string member;
  bool dropped = false;  // the owner was down: nothing was stored
};

// A Lookup: the longest cached prefix and its pages, back to back.
struct ClusterLookup {
  uint64_t matched_tokens = 0;
  uint64_t page_bytes = 0;
  std::vector<uint8_t> pages;  // matched_tokens / page_size pages
  std::string member;
};

// Client-side view of one member (kvharbor cluster status prints it).
struct ClusterMemberStatus {
  std::string address;
  int64_t epoch = 0;
  bool up = false;
  uint64_t calls = 0;            // calls routed to it
  uint64_t failures = 0;         // calls that marked it down
  uint64_t down_misses = 0;      // Match/Lookup answered as misses while down
  uint64_t dropped_inserts = 0;  // Inserts dropped while down
  // The daemon's own Stats; absent (status set) when it did not answer.
  absl::StatusOr<client::Stats> stats = absl::UnavailableError("not asked");
};

class ClusterClient {
 public:
  static absl::StatusOr<std::unique_ptr<ClusterClient>> Create(
      ClusterClientOptions options);
  ~ClusterClient();
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  // Creates the namespace (if_not_exists) on every live member and
  // remembers it for members that join later. An error if a live member
  // refuses it (e.g. a different geometry there); down members are skipped.
  absl::Status CreateNamespace(const client::NamespaceSpec& spec,
                               const CallOptions& call = {});

  // The member that owns the prefix `tokens` of namespace `ns` (whether up
  // or not); "" when there are no members or tokens hold less than a page.
  absl::StatusOr<std::string> Owner(absl::string_view ns,
                                    absl::Span<const client::Token> tokens,
                                    const CallOptions& call = {});

  absl::StatusOr<ClusterLease> Match(absl::string_view ns,
                                     absl::Span<const client::Token> tokens,
                                     bool lock = false,
                                     absl::Duration ttl = absl::ZeroDuration(),
                                     const CallOptions& call = {});
  // Pages of a ClusterLease, from the member that matched.
  absl::StatusOr<std::vector<std::vector<uint8_t>>> Fetch(
      absl::string_view ns, const ClusterLease& lease,
      const CallOptions& call = {});
  absl::Status Release(const ClusterLease& lease, const CallOptions& call = {});
  // Match then fetch the matched pages; a member failing in between makes
  // it a miss.
  absl::StatusOr<ClusterLookup> Lookup(absl::string_view ns,
                                       absl::Span<const client::Token> tokens,
                                       const CallOptions& call = {});
  // Stores the pages of `tokens` on the prefix's owner (see the contract).
  absl::StatusOr<ClusterInsertResult> Insert(
      absl::string_view ns, absl::Span<const client::Token> tokens,
      absl::Span<const uint8_t> pages, uint64_t page_bytes,
      const CallOptions& call = {});

  // Every member the source lists, with counters and (with_stats) the
  // daemon's Stats, each asked within member_timeout.
  std::vector<ClusterMemberStatus> MemberStatus(bool with_stats = true);
  const cluster::MemberSource& source() const { return *options_.members; }

 private:
  struct MemberState;
  struct View;
  explicit ClusterClient(ClusterClientOptions options);

  std::shared_ptr<const View> CurrentView();
  // A connected Client for `m`, reconnecting when its down time is over;
  // nullptr while it is down.
  std::shared_ptr<Client> Connection(MemberState& m, absl::Time deadline);
  void MarkDown(MemberState& m, const absl::Status& why);
  // Runs `op` on `m`'s connection (counted in m.calls): true. A member that
  // is down, or whose `op` fails as a member (then marked down), is a miss
  // counted in `*misses`: false. Other errors of `op` are returned.
  absl::StatusOr<bool> CallMember(MemberState& m, std::atomic<uint64_t>* misses,
                                  const CallOptions& call,
                                  absl::FunctionRef<absl::Status(Client&)> op);
  // The deadline of one member call.
  CallOptions MemberCall(const CallOptions& call) const;
  absl::Time CallDeadline(const CallOptions& call) const;
  absl::StatusOr<uint32_t> PageSize(absl::string_view ns,
                                    const CallOptions& call);
  // The owner's state for a prefix, or nullptr (no member, short prompt).
  absl::StatusOr<std::shared_ptr<MemberState>> Route(
      absl::string_view ns, absl::Span<const client::Token> tokens,
      const CallOptions& call);
  std::shared_ptr<MemberState> FindMember(absl::string_view address);

  const ClusterClientOptions options_;
  // Lock order: mu_ before a MemberState's mu (CurrentView holds both).
  absl::Mutex mu_;
  std::shared_ptr<const View> view_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<MemberState>> states_
      ABSL_GUARDED_BY(mu_);
  std::vector<client::NamespaceSpec> specs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint32_t, std::less<>> page_sizes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CLUSTER_CLIENT_H_
