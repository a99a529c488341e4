// LeaseTable: the active leases of one namespace -- for each lease id the
// radix nodes it locks, its pages (handles in sequence order) and its expiry.
//
// A lease is what Match with lock hands out: its nodes are locked in the
// namespace's RadixIndex, so its pages stay cached until the lease ends (one
// node, the end of the matched path, in a prefix-keyed namespace; one node
// per page in a page-hash namespace, whose pages each stand alone). The
// table only keeps the record; locking and unlocking the nodes is the
// namespace's job (it holds the index lock), so every call that ends leases
// returns their nodes for the caller to unlock. Ids are random, non-zero and
// unique among the active leases; ttls are clamped to [default, max] as
// NamespaceConfig says (0 = default).
//
// Owns its records (copies of the handles); the nodes belong to the index.
// Thread-safe: one leaf lock (mu_) guards the table and is never held while
// calling out, so HasLease-style lookups (Contains) never wait behind the
// namespace's index lock. The namespace takes it under its index lock when a
// lease must change together with the index (core/store/namespace.h states
// the lock order).
#ifndef KVHARBOR_CORE_STORE_LEASE_TABLE_H_
#define KVHARBOR_CORE_STORE_LEASE_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/index/radix_index.h"

namespace kvharbor {

class LeaseTable {
 public:
  // The nodes a lease locks (each once per lease).
  using Nodes = absl::InlinedVector<RadixNode*, 1>;
  struct Lease {
    Nodes nodes;  // locked in the index while the lease lives
    std::vector<PageHandle> pages;
    absl::Time expiry;
  };

  // `ns_name` names the namespace in errors; a ttl <= 0 means default_ttl,
  // and every ttl is capped at max_ttl.
  LeaseTable(std::string ns_name, absl::Duration default_ttl,
             absl::Duration max_ttl);

  // A new lease of `pages` on `nodes`, expiring ttl from now (*expiry); its
  // id.
  uint64_t Add(Nodes nodes, std::vector<PageHandle> pages, absl::Duration ttl,
               absl::Time* expiry) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends lease `id` and returns its nodes (to unlock); NotFound naming
  // lease_id for an unknown or ended lease.
  absl::StatusOr<Nodes> Remove(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every lease expired before `now`, or every lease; the nodes of
  // each, one entry per lease.
  std::vector<Nodes> RemoveExpired(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<Nodes> RemoveAll() ABSL_LOCKS_EXCLUDED(mu_);

  bool Contains(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  // Page handles the active leases list, all together (a page leased twice
  // counts twice), and the bytes their records hold: what a client's locked
  // Matches make the daemon keep (charged to the memory budget by the
  // namespace, and bounded by it: Namespace::Match).
  uint64_t page_refs() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes of one lease's record besides its handles and nodes (map entry,
  // vectors): an estimate, on the high side.
  static constexpr uint64_t kRecordBytes = 128;
  // A copy of lease `id`; NotFound naming lease_id.
  absl::StatusOr<Lease> Get(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Pages [start, start + count) of lease `id` (count 0 = to the end);
  // NotFound naming lease_id, InvalidArgument naming start_page or
  // page_count for a range outside the lease.
  absl::StatusOr<std::vector<PageHandle>> Slice(uint64_t id, uint32_t start,
                                                uint32_t count) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Expiry reset to ttl from now (clamped as Add); the new expiry.
  absl::StatusOr<absl::Time> Extend(uint64_t id, absl::Duration ttl)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A page changed its handle (a cold page made raw): every lease listing
  // `old_h` lists `new_h` instead, so leased pages keep resolving.
  void ReplaceHandle(PageHandle old_h, PageHandle new_h)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Duration ClampTtl(absl::Duration ttl) const;
  absl::Status NotFound(uint64_t id) const;

  const std::string ns_name_;
  const absl::Duration default_ttl_;
  const absl::Duration max_ttl_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  uint64_t page_refs_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t node_refs_ ABSL_GUARDED_BY(mu_) = 0;
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_LEASE_TABLE_H_
