// RangeAllocator: first-fit allocation of aligned byte ranges of one fixed
// region, with freed ranges merged with their neighbours so that large
// requests fit again. It only does the bookkeeping (offsets); the memory is
// its owner's: the shared host arena (core/memory/host_arena.h) and the GPU
// arena (cuda/tier/device_page_pool.h) cut namespace pools out of their one
// mapping with it.
//
// Thread-safe (mu_).
#ifndef KVHARBOR_CORE_MEMORY_RANGE_ALLOCATOR_H_
#define KVHARBOR_CORE_MEMORY_RANGE_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvharbor {

class RangeAllocator {
 public:
  // A region of `bytes`, all free; ranges are multiples of `align` (> 0)
  // long and start at multiples of it. `name` starts the error messages,
  // e.g. "the shared host arena".
  RangeAllocator(uint64_t bytes, uint64_t align, std::string name);

  uint64_t Round(uint64_t n) const {
    return (n + align_ - 1) / align_ * align_;
  }
  uint64_t free_bytes() const;
  // Offset of the first free range of `n` bytes (rounded up to the
  // alignment), or ResourceExhausted saying how much is free and the
  // largest range.
  absl::StatusOr<uint64_t> Take(uint64_t n);
  // Frees a range Take returned (`n` as given to Take).
  void Give(uint64_t offset, uint64_t n);

 private:
  const uint64_t align_;
  const std::string name_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> size
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_MEMORY_RANGE_ALLOCATOR_H_
