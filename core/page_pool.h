// PagePool: fixed-size page slots cut from one arena, with a free list.
//
// A pool owns its arena (host memory here; a GPU arena implements the same
// interface in cuda/). Slots are identified by a dense uint32 index; Data()
// translates an index to the address of its bytes, which stay valid for the
// pool's lifetime. The pool only does slot bookkeeping: who may read or write
// a slot is the owner's business (see Namespace's slot table).
//
// Not thread-safe: the owning Namespace calls it under its mutex. Data() of
// an allocated slot may be used from any thread without the mutex, since the
// arena never moves.
#ifndef KVHARBOR_CORE_PAGE_POOL_H_
#define KVHARBOR_CORE_PAGE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

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
};

// Host memory pool. The arena is one anonymous mapping reserved up front but
// committed lazily by the kernel, so an idle namespace costs no RSS.
class HostPagePool : public PagePool {
 public:
  // Fails (ResourceExhausted) when the mapping cannot be made.
  static absl::StatusOr<std::unique_ptr<HostPagePool>> Create(
      size_t slot_bytes, uint32_t capacity);
  ~HostPagePool() override;

  MemoryKind kind() const override { return MemoryKind::kHost; }
  size_t slot_bytes() const override { return slot_bytes_; }
  uint32_t capacity() const override { return capacity_; }
  uint32_t free_count() const override {
    return static_cast<uint32_t>(free_.size());
  }
  absl::StatusOr<std::vector<uint32_t>> Allocate(uint32_t n) override;
  void Free(uint32_t slot) override;
  uint8_t* Data(uint32_t slot) override { return base_ + slot * slot_bytes_; }

 private:
  HostPagePool(uint8_t* base, size_t mapped, size_t slot_bytes,
               uint32_t capacity);

  uint8_t* const base_;
  const size_t mapped_bytes_;
  const size_t slot_bytes_;
  const uint32_t capacity_;
  std::vector<uint32_t> free_;       // LIFO: reuse warm slots first
  std::vector<bool> allocated_;      // catches double frees
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_PAGE_POOL_H_
