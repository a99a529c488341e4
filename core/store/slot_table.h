// SlotTable: what a namespace knows about each slot of its PagePool -- its
// generation, state (free, reserved by an upload or a promotion, indexed,
// or retired while still pinned), pin count, and the checksum and first
// token position of the page in it -- and the reservation and freeing of
// slots, with the budget charge of the slots' committed memory.
//
// PageHandle = (generation << 32) | slot. Retiring a page bumps its slot's
// generation, so every outstanding handle of the page goes stale at once; a
// retired slot that a read still pins is a zombie, freed by the last unpin.
//
// Borrows the pool and the budget (both outlive it). Thread-safe: one leaf
// lock (mu_) guards the table and the pool's slot bookkeeping (Allocate,
// Free, Discard); callbacks (Count, Check) run under it and must take no
// lock. State changes that must agree with the index (indexing, retiring)
// are made by the namespace under its index lock (core/store/namespace.h).
#ifndef KVHARBOR_CORE_STORE_SLOT_TABLE_H_
#define KVHARBOR_CORE_STORE_SLOT_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/index/radix_index.h"
#include "core/memory/memory_budget.h"
#include "core/memory/page_pool.h"
#include "core/store/device_tier.h"

namespace kvharbor {

class SlotTable {
 public:
  static constexpr uint32_t kNoSlot = UINT32_MAX;
  static PageHandle MakeHandle(uint32_t slot, uint32_t generation) {
    return (uint64_t{generation} << 32) | slot;
  }

  // What a page costs in the budget besides its bytes, for its slot: the
  // table entry and the pool's free-list entry.
  static uint64_t MetaBytesPerSlot();

  // `ns_name` names the namespace in errors; `budget` and `device_tier`
  // (which hashes device pages where they lie) may be null.
  SlotTable(std::string ns_name, PagePool* pool,
            std::shared_ptr<MemoryBudget> budget,
            std::shared_ptr<DeviceTier> device_tier = nullptr);

  uint32_t capacity() const { return pool_.capacity(); }
  uint32_t free_count() const ABSL_LOCKS_EXCLUDED(mu_);

  // The slot of an indexed page, or NotFound "H is not a cached page of
  // namespace 'N'" for a stale or unknown handle.
  absl::StatusOr<uint32_t> Resolve(PageHandle h) const ABSL_LOCKS_EXCLUDED(mu_);
  // The handle the page in `slot` gets (or has) in its current generation.
  PageHandle HandleOf(uint32_t slot) const ABSL_LOCKS_EXCLUDED(mu_);

  // `n` free slots, marked reserved (none when fewer are free): committed
  // ones first, then fresh ones, whose memory is charged to the budget
  // first, together with `meta_bytes` of metadata per page (checked only:
  // the namespace charges metadata when the pages are indexed).
  // ResourceExhausted naming store.pool_budget_bytes, with *budget_full set,
  // when the budget cannot take them; the pool's error when it has fewer.
  absl::StatusOr<std::vector<uint32_t>> Allocate(uint32_t n,
                                                 uint64_t meta_bytes,
                                                 bool* budget_full)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Reserved slots given back unused.
  void Free(absl::Span<const uint32_t> slots) ABSL_LOCKS_EXCLUDED(mu_);
  // A reserved slot now holds an indexed page with this checksum and first
  // token position.
  void Index(uint32_t slot, uint64_t checksum, uint64_t first_position)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The pages left the index (evicted, dropped, or demoted out of the
  // pool): their slots get a new generation and are freed, or become
  // zombies until their last unpin. Each must be an indexed page of this
  // table (KVH_CHECK: the index hands back only what it was given).
  void Retire(absl::Span<const PageHandle> handles) ABSL_LOCKS_EXCLUDED(mu_);

  // A pin keeps an indexed slot from being reused until Unpin; the page's
  // checksum and first token position when pinned.
  struct PinnedSlot {
    uint64_t checksum = 0;
    uint64_t first_position = 0;
  };
  PinnedSlot Pin(uint32_t slot) ABSL_LOCKS_EXCLUDED(mu_);
  // kNoSlot entries are skipped.
  void Unpin(absl::Span<const uint32_t> slots) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether evicting the page in `slot` frees the slot at once (no pins).
  bool Unpinned(uint32_t slot) const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t checksum(uint32_t slot) const ABSL_LOCKS_EXCLUDED(mu_);
  // XXH3-64 of the pages in `slots` (reserved or pinned by the caller),
  // where they lie: host pools on the CPU, device pools by the device
  // tier's ChecksumPages or, when it cannot, read back. Takes no lock.
  absl::StatusOr<std::vector<uint64_t>> Checksum(
      absl::Span<const uint32_t> slots) const;

  // Returns the memory of every free committed slot to the system (where
  // the pool can) and to the budget.
  void DiscardFree() ABSL_LOCKS_EXCLUDED(mu_);
  // Budget bytes of the committed slots (read without the lock).
  uint64_t committed_bytes() const {
    return committed_bytes_.load(std::memory_order_relaxed);
  }
  // Budget bytes of the table itself and the pool's free list.
  uint64_t meta_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

  // What holds the slots, for a "namespace is full" error; `locked(h)` says
  // whether indexed page h is locked in the index (called under mu_).
  struct Census {
    uint32_t reserved = 0;
    uint32_t locked = 0;
    uint32_t pinned = 0;  // by reads or tier moves, zombies included
    uint32_t other = 0;   // indexed, neither locked nor pinned
  };
  Census Count(absl::FunctionRef<bool(PageHandle)> locked) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Table and pool agree (free slots counted alike, zombies pinned, pins
  // only on pages, the committed charge matches the slots) and every indexed
  // slot's handle is a raw index page (`raw_indexed`, called under mu_).
  // Sets *indexed to the number of indexed slots. InternalError otherwise.
  absl::Status Check(absl::FunctionRef<bool(PageHandle)> raw_indexed,
                     uint64_t* indexed) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class State : uint8_t { kFree, kReserved, kIndexed, kZombie };
  struct Slot {
    uint32_t generation = 1;
    State state = State::kFree;
    uint32_t pins = 0;
    uint64_t checksum = 0;
    uint64_t first_position = 0;
  };
  void FreeLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string ns_name_;
  PagePool& pool_;
  const std::shared_ptr<MemoryBudget> budget_;
  const std::shared_ptr<DeviceTier> device_tier_;
  mutable absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  uint64_t committed_slots_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> committed_bytes_{0};
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_SLOT_TABLE_H_
