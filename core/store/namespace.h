// Namespace: the KV pages of one model geometry for one tenant -- a facade
// over the parts that each do one job:
//   RadixIndex (core/index)  sequence elements -> page handles, LRU, locks;
//   SlotTable                per pool slot: generation, state, pins,
//                            checksum; slot reservation and freeing;
//   LeaseTable               leases (Match with lock): a locked index node,
//                            its pages and a time to live;
//   ColdPages                the cold-page table (host-compressed buffers,
//                            disk files) and the reading, decoding and
//                            encoding of fetched pages;
//   Uploads / Upload         two-phase inserts: slots reserved, filled
//                            outside the locks, checked, and only then
//                            committed to the index; an Upload destroyed
//                            before Commit leaves nothing behind. An upload
//                            may skip a cached prefix (an append) and take
//                            its bytes layer by layer (docs/engines_api.md);
//   NamespaceTiers           moves pages between tiers, calling back here
//                            to choose and to commit a batch;
//   NamespaceCalibrations    the tier codec, the calibrations cold pages
//                            still reference, online calibration and their
//                            persistence in disk_dir.
// The namespace owns the PagePool (the page bytes) and ties the parts
// together where a change must be atomic with the index.
//
// Sequences (types/key_kind.h): a token namespace is keyed by token ids,
// page_size per page; a page-key namespace by one opaque key per page, which
// callers encode with core/index/page_key.h into kPageKeyWords index
// elements. The calls below take the elements ("elements": token ids or
// encoded keys) and count in tokens (page_size per page) either way. A
// page-hash namespace (kPageHashes) encodes keys alike, but stores each page
// as its own one-page path under the index's root (its key names everything
// before it): Match looks each key up alone (O(1) through the root's child
// hash) and takes the run of leading keys present, and an upload stores
// each page whether or not the pages before it are cached. Leases and
// uploads then lock one node per page.
//
// PageHandle = (generation << 32) | slot. A handle goes stale the moment its
// page is evicted (the generation changes), so a late Fetch of an evicted
// page fails instead of returning another page's bytes.
//
// Tiers (types/tier.h, docs/tiers.md): a page starts raw in the pool; cold
// pages keep their handle in ColdPages. Fetch can return pages raw (cold
// pages are decoded) or as the stored codec buffers (raw pages are encoded).
//
// Thread-safe. Page bytes are copied outside every lock, protected by pins
// (a pinned slot is not reused until unpinned), by an upload's reservation,
// or by shared ownership of cold buffers. Lock order: NamespaceTiers::
// move_mu_ before NamespaceCalibrations::persist_mu_ before mu_ (the index
// lock: it guards the index, the pending corrupt pages and the counters, and
// is held wherever the slot table, cold-page table or leases must change
// together with the index) before NamespaceCalibrations::cal_mu_; the
// tables' own locks -- LeaseTable::mu_, SlotTable::mu_, ColdPages::mu_,
// Uploads::mu_ -- are leaves, taken one at a time under mu_ or without it
// (HasLease and unpinning never wait for mu_), never while holding another
// lock of this list, and they call out under it only into the index (whose
// lock mu_ the caller then holds). The namespace reads the active codec
// before taking mu_, and its parts call back into it only without their own
// locks, except NamespaceTiers under move_mu_.
#ifndef KVHARBOR_CORE_STORE_NAMESPACE_H_
#define KVHARBOR_CORE_STORE_NAMESPACE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/codec/codec.h"
#include "core/index/radix_index.h"
#include "core/memory/host_arena.h"
#include "core/memory/host_block.h"
#include "core/memory/memory_budget.h"
#include "core/memory/page_pool.h"
#include "core/store/cold_pages.h"
#include "core/store/disk_tier.h"
#include "core/store/lease_table.h"
#include "core/store/namespace_calibrations.h"
#include "core/store/namespace_config.h"
#include "core/store/namespace_tiers.h"
#include "core/store/pinned_pages.h"
#include "core/store/slot_table.h"
#include "core/store/upload.h"
#include "types/key_kind.h"
#include "types/tier.h"

namespace kvharbor {

class Uploads;

class Namespace : public std::enable_shared_from_this<Namespace> {
 public:
  static absl::StatusOr<std::shared_ptr<Namespace>> Create(
      NamespaceConfig config, std::unique_ptr<PagePool> pool);
  ~Namespace();

  const NamespaceConfig& config() const { return config_; }
  const std::string& name() const { return config_.name; }
  size_t page_bytes() const { return page_bytes_; }
  KeyKind key_kind() const { return config_.key_kind; }
  // Index elements per page: page_size token ids, or kPageKeyWords words of
  // one encoded page key.
  uint32_t elements_per_page() const { return epp_; }

  // ---- Match and leases ----
  struct MatchOutcome {
    size_t matched_tokens = 0;
    std::vector<PageHandle> pages;
    std::vector<Tier> tiers;  // one per page, at the time of the match
    uint64_t lease_id = 0;    // 0 unless lock and matched_tokens > 0
    absl::Time lease_expiry = absl::InfinitePast();
  };
  // ttl 0 = default; capped at max_lease_ttl. `keep_going` is polled
  // during a long walk (the server passes its call's deadline and
  // cancellation); its error stops the Match, which then changed nothing.
  // The walk is linear in the pages matched (a 1M-page chain in ~3 ms,
  // kvharbor_bench_match_bench --chains, as README.md says) and holds only
  // this namespace's index lock.
  absl::StatusOr<MatchOutcome> Match(
      absl::Span<const Token> elements, bool lock, absl::Duration ttl,
      absl::FunctionRef<absl::Status()> keep_going);
  absl::StatusOr<MatchOutcome> Match(absl::Span<const Token> elements,
                                     bool lock, absl::Duration ttl);
  // NotFound for an unknown (or expired) lease.
  absl::Status Release(uint64_t lease_id);
  absl::StatusOr<absl::Time> ExtendLease(uint64_t lease_id, absl::Duration ttl);
  // Without waiting for mu_: the server finds a lease's namespace by
  // asking each, and must not wait behind another namespace's long call.
  bool HasLease(uint64_t lease_id) const;
  // Releases leases whose expiry is before `now`; returns how many.
  size_t ReapExpiredLeases(absl::Time now);

  // ---- Insert (two-phase) ----
  // Upload, InsertSpec and InsertOutcome: core/store/upload.h.
  using InsertOutcome = ::kvharbor::InsertOutcome;
  using Upload = ::kvharbor::Upload;
  using InsertSpec = ::kvharbor::InsertSpec;
  // Slots are reserved as the bytes arrive: the first new page's here (with
  // those of cold skipped pages restored here), the others by Write when a
  // chunk reaches them, so an upload never evicts more than it is about to
  // fill, and one that stops sending holds one page's slot more than it
  // filled (layer-major: the first layer reaches every sent page; placed:
  // all at once). Room is made when the pool is full: untiered, by evicting
  // LRU pages; tiered, by demoting LRU raw pages, then (when concurrent
  // uploads took that room) by evicting LRU raw pages whose slot is free at
  // once -- never a cold page, which frees no slot.
  // ResourceExhausted, naming the namespace and what holds its slots, when
  // that is not enough (slots reserved, locked or pinned), here or from a
  // Write; more new pages than the namespace's capacity fail here.
  absl::StatusOr<std::unique_ptr<Upload>> BeginInsert(const InsertSpec& spec);
  // Every page sent, page after page.
  absl::StatusOr<std::unique_ptr<Upload>> BeginInsert(
      absl::Span<const Token> elements, absl::Span<const uint64_t> checksums);

  // ---- Fetch ----
  // Pages pinned for reading (core/store/pinned_pages.h).
  using PinnedPages =
      ::kvharbor::PinnedPages;  // Pages [start, start+count) of a lease (count
                                // 0 = to the end).
  absl::StatusOr<PinnedPages> PinLease(uint64_t lease_id, uint32_t start,
                                       uint32_t count,
                                       FetchFormat format = FetchFormat::kRaw);
  // NotFound naming the first handle that is not a cached page.
  absl::StatusOr<PinnedPages> PinPages(absl::Span<const PageHandle> handles,
                                       FetchFormat format = FetchFormat::kRaw);

  // ---- Same-host zero copy (core/store/namespace_device.cc) ----
  struct DevicePage {
    PageHandle handle = 0;
    uint64_t offset = 0;  // from the arena's base
    uint64_t bytes = 0;
  };
  struct LeaseDevicePages {
    std::vector<DevicePage> pages;  // the lease's, in order
    absl::Time expiry;
  };
  // Where the pages of a lease lie in the device arena whose byte 0 is at
  // device address `arena_base` (arena_bytes long). The lease keeps them
  // there (locked pages are neither evicted nor moved) until it ends.
  // NotFound naming lease_id for an inactive lease; FailedPrecondition when
  // the namespace's pool is in host memory, or naming the first page that is
  // not raw on the device (pages[i]).
  absl::StatusOr<LeaseDevicePages> DevicePagesOfLease(
      uint64_t lease_id, uintptr_t arena_base, uint64_t arena_bytes) const;
  // Brings the lease's cold pages (host-compressed, disk) into free device
  // slots so that DevicePagesOfLease can hand them out
  // (core/store/namespace_stage.cc): disk files are read, host buffers
  // checked, and each calibration's pages decoded by its GPU decoder
  // straight into the slots (DecodeEachToDevice) and checksummed there;
  // pages of a codec without one are decoded on the CPU and copied in. Then,
  // in one critical section, the pages become raw in their slots with new
  // handles that the lease (and every other lease) follows, as
  // promote_on_fetch does (counted in promoted_pages). A tiered namespace
  // first demotes LRU raw pages for room, as an insert would (never a
  // leased page). Returns the pages staged. NotFound naming lease_id;
  // FailedPrecondition for a host pool, or naming stage_cold when too few
  // slots are free (Fetch those pages instead); DataLoss naming the page
  // whose stored bytes are corrupt (nothing is staged).
  absl::StatusOr<uint32_t> StageLeaseOnDevice(uint64_t lease_id);

  // ---- Same-host Fetch through shared memory (core/store/namespace_host.cc)
  // ----
  struct HostPage {
    PageHandle handle = 0;
    uint64_t offset = 0;  // from byte 0 of the shared host arena
    uint64_t bytes = 0;
    uint64_t checksum = 0;  // XXH3-64 of the page, as Fetch sends it
  };
  struct LeaseHostPages {
    std::vector<HostPage> pages;  // the lease's, in order
    absl::Time expiry;
  };
  // Where the pages of a lease lie in the shared host arena `arena` (the
  // one the store cut this namespace's pool from). The lease keeps them
  // there until it ends (locked pages are neither evicted nor moved).
  // NotFound naming lease_id for an inactive lease; FailedPrecondition when
  // the pool is not cut from `arena` (a device pool, or a private mapping),
  // or naming the first page that is not raw in tier 0 (pages[i]).
  absl::StatusOr<LeaseHostPages> HostPagesOfLease(uint64_t lease_id,
                                                  const HostArena& arena) const;

  // ---- Eviction ----
  struct EvictOutcome {
    uint64_t pages = 0;
    uint64_t bytes = 0;
  };
  // These pages and their descendants; FailedPrecondition if any is leased.
  absl::StatusOr<EvictOutcome> EvictPages(absl::Span<const PageHandle> pages);
  // At least `bytes` of unlocked pages (fewer when not enough are unlocked).
  EvictOutcome EvictBytes(uint64_t bytes);
  EvictOutcome EvictAll();

  // ---- Tiers ----
  bool tiered() const { return tiers_.tiered(); }
  // Tier moves: DemoteAll, EnforceBudgets.
  NamespaceTiers& tiers() { return tiers_; }
  // Tier of a cached page (NotFound otherwise).
  absl::StatusOr<Tier> TierOf(PageHandle h) const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Memory (the store's MemoryBudget, NamespaceConfig::budget) ----
  // Bytes this namespace holds in the budget: committed raw slots, slot and
  // index metadata, cold-page metadata, host-compressed buffers and the
  // records of its leases.
  uint64_t memory_bytes() const {
    return slots_.committed_bytes() +
           meta_charged_.load(std::memory_order_relaxed);
  }
  // Frees at least `bytes` of the budget when it can, for another
  // namespace (or this one): first the memory of free slots, then its
  // coldest pages leave memory -- untiered, its LRU unlocked pages are
  // evicted; tiered, host-compressed pages go to disk (or are dropped
  // without a disk tier) and raw pages are demoted. Raw pages leave only
  // when their pool gives memory back (not the sealed shared arena, not a
  // device pool). Returns what it freed.
  uint64_t ReclaimMemory(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Budget bytes a cached page's metadata is charged (slot, index entry and
  // its tokens), besides its page bytes.
  uint64_t page_meta_bytes() const;

  // ---- Introspection ----
  // Counters, tiers and calibration state now.
  NamespaceStats Counters() const ABSL_LOCKS_EXCLUDED(mu_);
  std::string DumpTree(size_t max_nodes) const;
  // Leases or uploads in flight.
  bool Busy() const;
  // Slot table, pool and index agree (every slot free, reserved by one
  // upload, or referenced by the index exactly once). For tests.
  absl::Status CheckInvariants() const;
  // Drops every lease (namespace deletion with force).
  void ReleaseAllLeases();

  // ---- Calibrations ----
  // The active codec, uploads, pins, online calibration.
  NamespaceCalibrations& calibrations() { return calibrations_; }
  const NamespaceCalibrations& calibrations() const { return calibrations_; }
  // Every calibration still active or referenced by a stored page (the
  // others are forgotten here), active first, then newest first, with the
  // number of cold pages of each.
  std::vector<CalibrationInfo> ListCalibrations() ABSL_LOCKS_EXCLUDED(mu_);
  // The store deleted this namespace: a running calibration is dropped.
  void MarkDeleted() { deleted_.store(true); }
  bool deleted() const { return deleted_.load(); }

 private:
  static constexpr uint32_t kNoSlot = SlotTable::kNoSlot;
  static_assert(kNoSlot == TierMoveJob::kNoSlot);
  using ColdPage = ColdPages::Page;
  using Lease = LeaseTable::Lease;
  // Where a cached page lives: a raw page's slot, or a cold page's record.
  struct Located {
    Tier tier = Tier::kRaw;
    uint32_t slot = kNoSlot;
    std::optional<ColdPage> cold;
  };

  Namespace(NamespaceConfig config, std::unique_ptr<PagePool> pool,
            std::unique_ptr<DiskTier> disk);
  friend class NamespaceTiers;
  friend class Uploads;
  friend class ::kvharbor::Upload;
  friend class ::kvharbor::PinnedPages;

  // FailedPrecondition naming the namespace: its pool is in host memory.
  absl::Status HostPoolError() const;

  absl::StatusOr<Located> LocateLocked(PageHandle h) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds page h to `out` (pinning a raw slot, sharing a cold buffer, or
  // opening a disk file into *fd).
  void PinOneLocked(PageHandle h, const Located& loc, PinnedPages* out,
                    std::vector<std::pair<size_t, int>>* fds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // promote_on_fetch: after a RAW fetch, moves its cold pages back into
  // free pool slots (in fetch order, as far as the path invariant allows)
  // and gives them their new handles in `out`.
  void PromoteFetched(PinnedPages* out);
  // A cold page whose bytes were written into a reserved slot, to be made
  // raw there; old_handle 0 gives the slot back.
  struct Promotion {
    PageHandle old_handle = 0;
    uint32_t slot = kNoSlot;
    uint64_t checksum = 0;  // XXH3-64 of the slot's page
    uint64_t first_position = 0;
  };
  // Makes each page raw in its slot, in order, where it is still cold and
  // the path invariant allows (its new handle replaces the old one in every
  // lease, counted in promoted_pages); frees the other slots. The new handle
  // of each page, 0 where it stayed cold.
  std::vector<PageHandle> CommitPromotionsLocked(
      absl::Span<const Promotion> promotions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Materialize, then drops the corrupt pages it found (DropCorrupt).
  absl::Status MaterializeOrDrop(PinnedPages* out,
                                 std::vector<std::pair<size_t, int>> fds);
  // Pages whose stored bytes failed their checksum: removed from the index
  // with their descendants (so the next Match misses them) and counted in
  // corrupt_dropped. A page still locked by a lease or an upload is never
  // served, Match stops before it (so no new lease holds it), and it is
  // dropped as soon as the last lease holding it ends (corrupt_pending_).
  void DropCorrupt(absl::Span<const PageHandle> handles);
  // Drops corrupt page h unless it is locked; false when locked.
  bool DropCorruptLocked(PageHandle h, std::vector<std::string>* lines)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the pending corrupt pages no lock holds any more (called where
  // leases and uploads end); appends a log line per page to `lines`.
  void DropPendingCorruptLocked(std::vector<std::string>* lines)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Match of a page-hash namespace (IndependentPages): the run of leading
  // keys each present alone, appended to *out with the node of each page
  // (to lock); stops before a pending corrupt page. `keep_going`'s error
  // stops it having changed nothing.
  absl::Status MatchEachLocked(absl::Span<const Token> elements,
                               absl::FunctionRef<absl::Status()> keep_going,
                               MatchOutcome* out, LeaseTable::Nodes* nodes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cuts a match before the first pending corrupt page in it.
  void TruncateAtCorruptLocked(absl::Span<const Token> tokens,
                               RadixIndex::MatchResult* m, MatchOutcome* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- For NamespaceTiers (core/store/namespace_tiers.h), which calls
  // these under its move_mu_; each takes mu_ itself.
  // Up to `max_pages` LRU pages of `from` to move to `to`: raw sources are
  // pinned and get `encoder`; disk targets get their prefix and a file id.
  std::vector<TierMoveJob> SelectMoves(Tier from, Tier to, size_t max_pages,
                                       std::shared_ptr<const Codec> encoder)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Unpins the jobs' sources and switches every ok job whose page is still
  // there, unlocked and not extended by a hotter page; removes the disk
  // files of the others and drops the pages found corrupt. Returns pages
  // moved.
  size_t CommitMoves(Tier from, Tier to, std::vector<TierMoveJob>* jobs)
      ABSL_LOCKS_EXCLUDED(mu_);
  // CommitMoves of one job; false when it did not move.
  bool CommitMoveLocked(Tier from, Tier to, const TierMoveJob& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops up to n pages of the coldest layer of `from`; returns how many.
  size_t DropColdest(Tier from, size_t n) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t ColdBytes(Tier t) const { return cold_.bytes(t); }
  // SlotTable::DiscardFree, after a demotion emptied slots.
  void DiscardFreeSlots() ABSL_LOCKS_EXCLUDED(mu_);
  // Cached pages in tiers hotter than `t`.
  uint64_t PagesHotterThan(Tier t) const ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t FreeSlots() const { return slots_.free_count(); }
  void NoteDiskWriteError() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status LoadDiskTier();
  // Index eviction handed these pages back: retire their slots or drop
  // their cold records.
  void RetireLocked(absl::Span<const PageHandle> handles)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SlotTable::Allocate with this namespace's page metadata, then the
  // metadata charge synced.
  absl::StatusOr<std::vector<uint32_t>> AllocateSlotsLocked(uint32_t n,
                                                            bool* budget_full)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Charges or releases the metadata part of this namespace's budget share
  // so that it matches the slot table, index, cold table and host tier now.
  void SyncMetaChargeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts up to `n` LRU raw pages whose slots are free at once; returns
  // how many.
  size_t EvictFreeAtOnceLocked(size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elements `elements` make a whole number of pages within the request
  // limit, of valid tokens for a token namespace; errors name `field`.
  absl::Status CheckElements(absl::Span<const Token> elements,
                             absl::string_view field) const;
  // The elements of `pages` pages.
  size_t ElementsOf(size_t pages) const { return pages * epp_; }
  // Whether `elements` (whole pages) are what this namespace indexes:
  // non-negative token ids, or page keys as core/index/page_key.h encodes
  // them. For pages read back from the disk tier.
  bool ElementsValid(absl::Span<const Token> elements) const;
  // Ends lease `id` (NotFound naming lease_id): its node unlocked.
  absl::Status ReleaseLeaseLocked(uint64_t id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a lease of `pages` pages on `nodes` nodes fits beside the
  // others: RESOURCE_EXHAUSTED naming lock when the leases' records would
  // pass the namespace's own memory (at least kMinLeaseBytes).
  absl::Status CheckLeaseRoomLocked(size_t pages, size_t nodes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr uint64_t kMinLeaseBytes = uint64_t{1} << 20;
  // The slots of `lease`'s pages, in its order, for handing out where they
  // lie (GetDeviceHandles, GetHostHandles). Leased pages are locked in the
  // index: they resolve, and a raw one keeps its slot until the lease ends.
  // FailedPrecondition "pages[i]: page H of lease L is in tier T, <not_raw>"
  // for the first page that is not raw.
  absl::StatusOr<std::vector<uint32_t>> RawSlotsOfLeaseLocked(
      uint64_t lease_id, const Lease& lease, absl::string_view not_raw) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counters() but the calibration fields.
  NamespaceStats CountersWithoutCalibration() const ABSL_LOCKS_EXCLUDED(mu_);

  const NamespaceConfig config_;
  const size_t page_bytes_;
  const uint32_t epp_;              // index elements per page
  std::unique_ptr<PagePool> pool_;  // slot bookkeeping in slots_; bytes not
  std::unique_ptr<DiskTier> disk_;  // null without a disk tier
  NamespaceCalibrations calibrations_;
  NamespaceTiers tiers_;
  LeaseTable leases_;
  SlotTable slots_;
  ColdPages cold_;
  std::unique_ptr<Uploads> uploads_;  // works on the tables above

  // The index lock (see the lock order above).
  mutable absl::Mutex mu_;
  uint32_t next_restored_ ABSL_GUARDED_BY(mu_) = 0;
  RadixIndex index_ ABSL_GUARDED_BY(mu_);
  // Pages found corrupt while locked, dropped when unlocked (DropCorrupt).
  absl::flat_hash_set<PageHandle> corrupt_pending_ ABSL_GUARDED_BY(mu_);
  // The event counters (Counters() fills the rest).
  NamespaceStats counters_ ABSL_GUARDED_BY(mu_);
  // Budget accounting: the metadata charge last synced (the slot table
  // keeps the committed slots' charge).
  std::atomic<uint64_t> meta_charged_{0};
  mutable std::atomic<uint64_t> bytes_out_{0};
  mutable std::atomic<uint64_t> host_ipc_bytes_{0};
  std::atomic<bool> deleted_{false};
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_NAMESPACE_H_
