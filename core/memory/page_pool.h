// PagePool: fixed-size page slots cut from one arena, with a free list.
//
// A pool owns its arena (host memory here; cuda/tier/device_page_pool.h cuts a
// GPU pool from a cudaMalloc arena behind the same interface). Slots are
// identified by a dense uint32 index; Data() translates an index to the
// address of its bytes (a DEVICE address for MemoryKind::kDevice, which host
// code must never dereference), valid for the pool's lifetime. Write() and
// Read() move bytes between host memory and a slot whatever the kind, so
// code that only needs the bytes need not know where they live. The pool
// only does slot bookkeeping: who may read or write a slot is the owner's
// business (see Namespace's slot table).
//
// Not thread-safe for slot bookkeeping: the owning Namespace calls
// Allocate/Free under its mutex. Data(), Write() and Read() of an allocated
// slot may be used from any thread without the mutex, since the arena never
// moves (the owner makes sure one slot is not written while read).
#ifndef KVHARBOR_CORE_MEMORY_PAGE_POOL_H_
#define KVHARBOR_CORE_MEMORY_PAGE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/memory/host_arena.h"

namespace kvharbor {

enum class MemoryKind { kHost, kDevice };

class PagePool {
 public:
  virtual ~PagePool() = default;

  virtual MemoryKind kind() const = 0;
  virtual size_t slot_bytes() const = 0;
  virtual uint32_t capacity() const = 0;
  virtual uint32_t free_count() const = 0;

  // Takes `n` free slots, or none (ResourceExhausted) when fewer are free.
  virtual absl::StatusOr<std::vector<uint32_t>> Allocate(uint32_t n) = 0;
  // Returns a slot to the free list. Freeing a slot twice is a broken
  // invariant.
  virtual void Free(uint32_t slot) = 0;
  virtual uint8_t* Data(uint32_t slot) = 0;
  // Copies `n` host bytes at `src` into the slot at byte `offset`
  // (offset + n <= slot_bytes()). Device pools: a host-to-device copy.
  virtual absl::Status Write(uint32_t slot, size_t offset, const uint8_t* src,
                             size_t n) = 0;
  // Copies the slot's slot_bytes() bytes to host memory at `dst`.
  virtual absl::Status Read(uint32_t slot, uint8_t* dst) = 0;
  // Read of slots[i] into dst[i] for every i (equal lengths). Device pools
  // batch the copies through a reusable pinned bounce buffer (one
  // device-to-host stream of many pages instead of a synchronous copy into
  // pageable memory per page); this default reads one slot at a time.
  virtual absl::Status ReadMany(const std::vector<uint32_t>& slots,
                                const std::vector<uint8_t*>& dst);

  // ---- Host memory, for the store's budget (core/memory/memory_budget.h).
  // A slot's memory is committed once written and stays so until Discard.
  // Host memory one committed slot holds (0: not host memory).
  virtual uint64_t host_bytes_per_slot() const { return 0; }
  // Free slots whose memory is committed already (Allocate hands them out
  // first: they cost nothing new).
  virtual uint32_t committed_free_count() const { return free_count(); }
  // One past the highest slot ever handed out: the owner's slot table need
  // not be longer.
  virtual uint32_t high_water() const { return capacity(); }
  // Returns the memory of up to `max` committed free slots to the system;
  // how many it returned (0 where it cannot: device memory, or the sealed
  // shared arena, whose pages cannot be punched out).
  virtual uint32_t Discard(uint32_t max) { return 0; }
  // Whether Discard returns host memory at all: only then does evicting a
  // page free memory for another namespace.
  virtual bool returns_memory() const { return false; }
};

// The free list both pools keep: freed slots LIFO (warm, committed memory
// first), then slots whose memory was discarded, then slots never used (in
// ascending order), with a bitmap that catches double frees. It grows with
// use: a pool's capacity is a cap, and its bookkeeping costs memory only
// for the slots handed out so far. Not thread-safe (as PagePool).
class SlotFreeList {
 public:
  explicit SlotFreeList(uint32_t capacity) : capacity_(capacity) {}
  uint32_t free_count() const {
    return static_cast<uint32_t>(committed_.size() + clean_.size()) +
           (capacity_ - fresh_);
  }
  uint32_t committed_free_count() const {
    return static_cast<uint32_t>(committed_.size());
  }
  uint32_t high_water() const { return fresh_; }
  // `n` free slots, or none (ResourceExhausted naming `what`).
  absl::StatusOr<std::vector<uint32_t>> Allocate(uint32_t n, const char* what);
  // Aborts on a slot that is not allocated: a double free means the owner's
  // slot table is corrupt, and continuing would hand one slot to two pages.
  void Free(uint32_t slot);
  // Up to `max` free committed slots, now counted as discarded (the caller
  // returns their memory), in ascending order.
  std::vector<uint32_t> TakeCommittedFree(uint32_t max);

 private:
  const uint32_t capacity_;
  uint32_t fresh_ = 0;               // slots [fresh_, capacity_) never used
  std::vector<uint32_t> committed_;  // freed, memory still committed
  std::vector<uint32_t> clean_;      // freed and discarded
  std::vector<bool> allocated_;      // [0, fresh_)
};

// What both pools share: `capacity` slots of `slot_bytes` laid out from one
// base address, handed out through a SlotFreeList. `what` names the pool in
// errors ("page pool", "device page pool").
class SlotPagePool : public PagePool {
 public:
  // The bytes `capacity` slots of `slot_bytes` take; InvalidArgument naming
  // the pool when either is zero or their product overflows.
  static absl::StatusOr<size_t> RangeBytes(const char* what, size_t slot_bytes,
                                           uint32_t capacity);

  size_t slot_bytes() const final { return slot_bytes_; }
  uint32_t capacity() const final { return capacity_; }
  uint32_t free_count() const final { return slots_.free_count(); }
  absl::StatusOr<std::vector<uint32_t>> Allocate(uint32_t n) final {
    return slots_.Allocate(n, what_);
  }
  void Free(uint32_t slot) final { slots_.Free(slot); }
  uint8_t* Data(uint32_t slot) final {
    return base_ + uint64_t{slot} * slot_bytes_;
  }

 protected:
  SlotPagePool(const char* what, uint8_t* base, size_t slot_bytes,
               uint32_t capacity)
      : what_(what),
        base_(base),
        slot_bytes_(slot_bytes),
        capacity_(capacity),
        slots_(capacity) {}

  uint8_t* base() const { return base_; }
  SlotFreeList& free_list() { return slots_; }
  const SlotFreeList& free_list() const { return slots_; }

 private:
  const char* const what_;
  uint8_t* const base_;
  const size_t slot_bytes_;
  const uint32_t capacity_;
  SlotFreeList slots_;
};

// Host memory pool. The arena is one anonymous mapping reserved up front but
// committed lazily by the kernel, so an idle namespace costs no RSS, and
// Discard gives freed slots' memory back (MADV_DONTNEED); or, given a shared
// HostArena (core/memory/host_arena.h, store.host_ipc_socket), a range of
// that memfd, which local clients may map read-only, and whose memory stays
// committed once written (the arena is sealed against hole punching).
class HostPagePool : public SlotPagePool {
 public:
  // Fails (ResourceExhausted) when the mapping cannot be made or `arena`
  // (null = a private anonymous mapping) has no free range large enough.
  static absl::StatusOr<std::unique_ptr<HostPagePool>> Create(
      size_t slot_bytes, uint32_t capacity,
      std::shared_ptr<HostArena> arena = nullptr);
  ~HostPagePool() override;

  MemoryKind kind() const override { return MemoryKind::kHost; }
  absl::Status Write(uint32_t slot, size_t offset, const uint8_t* src,
                     size_t n) override;
  absl::Status Read(uint32_t slot, uint8_t* dst) override;
  uint64_t host_bytes_per_slot() const override { return slot_bytes(); }
  uint32_t committed_free_count() const override {
    return free_list().committed_free_count();
  }
  uint32_t high_water() const override { return free_list().high_water(); }
  // Whole system pages only: a page shared with a slot in use stays.
  uint32_t Discard(uint32_t max) override;
  bool returns_memory() const override { return arena_ == nullptr; }

  // The shared arena this pool was cut from (null: a private mapping), and
  // where its slot 0 lies in it.
  const HostArena* arena() const { return arena_.get(); }
  uint64_t arena_offset() const { return arena_offset_; }

 private:
  HostPagePool(uint8_t* base, size_t mapped, size_t slot_bytes,
               uint32_t capacity, std::shared_ptr<HostArena> arena,
               uint64_t arena_offset);

  const std::shared_ptr<HostArena> arena_;
  const uint64_t arena_offset_;
  const size_t mapped_bytes_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_MEMORY_PAGE_POOL_H_
