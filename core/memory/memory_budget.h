// MemoryBudget: the host memory every namespace of a store shares
// (store.pool_budget_bytes): raw pages once their slot's memory is
// committed, per-slot and per-page metadata (slot table, index), and
// host-compressed buffers. A ledger, not an allocator: owners charge what
// they are about to hold and release what they gave back to the system.
//
// New raw pages are admitted only within the capacity (TryCharge); what a
// namespace already holds changing shape -- a page moving to the host tier,
// the index of pages just stored -- is charged with ForceCharge, which may go
// over briefly (by at most a tier batch), since refusing it would not free
// anything. The store makes room by reclaiming from the namespace holding
// the most (core/store/store.h).
//
// Thread-safe (one atomic counter); shared by the store and its namespaces.
#ifndef KVHARBOR_CORE_MEMORY_MEMORY_BUDGET_H_
#define KVHARBOR_CORE_MEMORY_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>

namespace kvharbor {

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t capacity) : capacity_(capacity) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t free_bytes() const {
    const uint64_t u = used();
    return u < capacity_ ? capacity_ - u : 0;
  }

  // Charges `n` bytes if they fit within the capacity; false (nothing
  // charged) otherwise.
  bool TryCharge(uint64_t n) {
    uint64_t u = used_.load(std::memory_order_relaxed);
    do {
      if (n > capacity_ || u > capacity_ - n) return false;
    } while (!used_.compare_exchange_weak(u, u + n, std::memory_order_relaxed));
    return true;
  }
  // Charges `n` bytes even past the capacity.
  void ForceCharge(uint64_t n) {
    used_.fetch_add(n, std::memory_order_relaxed);
  }
  // Gives back bytes charged before (never more than was charged).
  void Release(uint64_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }

 private:
  const uint64_t capacity_;
  std::atomic<uint64_t> used_{0};
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_MEMORY_MEMORY_BUDGET_H_
