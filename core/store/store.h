// Store: every namespace of one daemon, and the memory budget they share.
//
// The store creates namespaces (validating their spec), finds them by name,
// deletes them, and routes lease operations that carry only a lease id. It
// holds no page data itself.
//
// Memory: every namespace charges what it holds in host memory -- raw pages
// once written, slot and index metadata, host-compressed buffers -- to one
// MemoryBudget of pool_budget_bytes (core/memory/memory_budget.h). A
// namespace's capacity_bytes is a cap on its raw pages, not a reservation:
// namespaces share the budget as they fill it. When an insert finds the
// budget full, the store takes memory back from the namespace holding the
// most (the inserting one included), down towards the next largest:
// its free slots' memory first, then its coldest pages leave memory
// (Namespace::ReclaimMemory). With a shared host arena (host_ipc_socket) or
// a device tier, each pool is still cut from the arena up front, so there
// the capacities are reserved and must fit the arena.
//
// Thread-safe. mu_ guards the name map and the budget; it is never held while
// calling into a Namespace that takes its own lock, except for the brief
// lookups in Release/ExtendLease (lock order: Store::mu_ before
// Namespace::mu_). The store owns the background calibrator thread that
// runs namespaces' online calibrations (core/store/online_calibrator.h).
#ifndef KVHARBOR_CORE_STORE_STORE_H_
#define KVHARBOR_CORE_STORE_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/calibration/online_calibration.h"
#include "core/memory/host_arena.h"
#include "core/memory/memory_budget.h"
#include "core/store/device_tier.h"
#include "core/store/namespace.h"
#include "core/store/online_calibrator.h"
#include "types/namespace_spec.h"
#include "types/stats.h"

namespace kvharbor {

struct StoreOptions {
  // Host memory all namespaces may hold together (raw pages, metadata,
  // host-compressed tiers).
  uint64_t pool_budget_bytes = uint64_t{4} << 30;
  // Capacity of a namespace that does not ask for one. 0: the whole budget
  // (a cap); with a shared host arena or a device tier, where capacities are
  // reserved, what is left of the budget and at most 1 GiB.
  uint64_t default_namespace_bytes = 0;
  absl::Duration default_lease_ttl = absl::Seconds(30);
  absl::Duration max_lease_ttl = absl::Minutes(10);
  uint32_t max_tokens_per_request = 1 << 20;
  // What the background calibrator runs (tests inject slow or failing ones).
  OnlineCalibrateFn online_calibrate = RunOnlineKvtcCalibration;
  // Lines of the namespaces, called as log(namespace name, line): notable
  // events (calibration switches) go to `log`, warnings (dropped disk
  // files, failed writes, failed calibrations) to `warn`, or to `log` when
  // `warn` is null. Both null: stderr.
  std::function<void(const std::string&, const std::string&)> log;
  std::function<void(const std::string&, const std::string&)> warn;
  // GPU tier 0 (docs/tiers.md): bytes of the device arena (config
  // store.device_pool_bytes; 0 = host pools) on GPU `device`
  // (store.device). The daemon opens `device_tier` from them; with a
  // device_tier every namespace's pool is cut from its arena and
  // pool_budget_bytes is the arena's size. Null = host pools.
  uint64_t device_pool_bytes = 0;
  int device = 0;
  std::shared_ptr<DeviceTier> device_tier;
  // Same-host zero copy (config store.allow_ipc, default off): whether
  // GetDeviceHandles may hand out the CUDA IPC handle of device_tier's arena.
  // The handle maps the WHOLE arena (every namespace's pages), so turn it on
  // only where every local client that can reach the daemon is trusted with
  // all of it (docs/tiers.md "Same-host zero copy").
  bool allow_ipc = false;
  // Same-host Fetch through shared memory (config store.host_ipc_socket):
  // the shared host arena (core/memory/host_arena.h) every namespace's host
  // pool is cut from, made by the daemon with room for pool_budget_bytes. Null
  // = each host pool maps its own private memory. Ignored with device_tier.
  std::shared_ptr<HostArena> host_arena;
  // store.promote_on_fetch (NamespaceConfig::promote_on_fetch): RAW fetches
  // put the cold pages they decoded back into tier 0 when it has room.
  bool promote_on_fetch = false;
};

// Adds one namespace's traffic, page and lease counters into `c` (the
// store's totals, or a tenant's in the server).
void AddNamespaceStats(const NamespaceStats& n, GlobalStats* c);

// 1..128 characters of [A-Za-z0-9_.-]; the message names `field`.
absl::Status ValidateNamespaceName(absl::string_view name,
                                   absl::string_view field);

class Store {
 public:
  explicit Store(StoreOptions options);
  const StoreOptions& options() const { return options_; }

  // Second element: true when created, false when it existed already and
  // `if_not_exists` (same geometry and tenant) allowed that. AlreadyExists
  // otherwise. FailedPrecondition (spec.disk_dir) while another namespace,
  // even a deleted one still held by requests in flight, has that disk tier.
  absl::StatusOr<std::pair<std::shared_ptr<Namespace>, bool>> CreateNamespace(
      const NamespaceSpec& spec, bool if_not_exists);
  // NotFound naming the namespace.
  absl::StatusOr<std::shared_ptr<Namespace>> Get(absl::string_view name) const;
  std::vector<std::shared_ptr<Namespace>> List() const;  // sorted by name
  // FailedPrecondition when busy (leases/uploads) unless `force`.
  absl::Status DeleteNamespace(absl::string_view name, bool force);

  // Leases by id alone (the id is unique across namespaces).
  absl::Status Release(uint64_t lease_id);
  absl::StatusOr<absl::Time> ExtendLease(uint64_t lease_id, absl::Duration ttl);
  // Called periodically by the daemon.
  size_t ReapExpiredLeases(absl::Time now);

  // Store-wide totals (uptime_seconds is the daemon's: left 0).
  GlobalStats Counters() const;
  const MemoryBudget& budget() const { return *budget_; }
  // Frees at least `bytes` of the budget from the namespaces holding the
  // most (see above); returns what was freed. Takes no store lock while a
  // namespace frees.
  uint64_t Reclaim(uint64_t bytes);
  // Online calibrations queued or running.
  size_t calibrations_pending() const { return calibrator_->pending(); }

 private:
  // Every namespace made, weakly (deleted ones still holding memory too),
  // for Reclaim; shared with the namespaces' reclaim callbacks, so that a
  // namespace outliving the store finds nothing to reclaim from.
  struct Members;
  // Whether pools are cut up front from an arena (host_arena, device tier).
  bool reserves_capacity() const {
    return options_.device_tier != nullptr || options_.host_arena != nullptr;
  }
  // A host pool, or with a device tier a pool cut from its arena and the
  // device tier in config->device_tier (the namespace's GPU codecs).
  absl::StatusOr<std::unique_ptr<PagePool>> CreatePool(
      uint64_t page_bytes, uint32_t pages, const NamespaceSpec& spec,
      NamespaceConfig* config) const;

  // Pages of the namespace `spec` asks for (its capacity, or the default,
  // within what is left of the budget); errors name spec.capacity_bytes.
  absl::StatusOr<uint32_t> CapacityPagesLocked(const NamespaceSpec& spec,
                                               uint64_t page_bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The config fields that come from `spec` and the store's options: name,
  // tenant, geometry, lease and request limits, and the log and calibration
  // callbacks.
  void FillConfig(const NamespaceSpec& spec, NamespaceConfig* config) const;

  // FailedPrecondition naming spec.disk_dir when a namespace still alive
  // (listed, or deleted but held by requests in flight) uses `dir`: two
  // namespaces in one directory would hand out the same file ids and remove
  // each other's page files. Forgets directories of namespaces now gone.
  absl::Status CheckDiskDirFreeLocked(const std::string& dir)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StoreOptions options_;
  mutable absl::Mutex mu_;
  // Disk tier directories (normalised) of the namespaces that may still use
  // them; weak, so a dropped namespace frees its directory.
  std::map<std::string, std::weak_ptr<Namespace>> disk_dirs_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Namespace>, std::less<>> namespaces_
      ABSL_GUARDED_BY(mu_);
  uint64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  const std::shared_ptr<MemoryBudget> budget_;
  const std::shared_ptr<Members> members_;
  // Last: destroyed (cancelled and joined) first.
  std::shared_ptr<OnlineCalibrator> calibrator_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_STORE_H_
