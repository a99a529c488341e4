// GPU tier 0: one cudaMalloc arena per GPU, cut into namespace page pools.
//
// DeviceArena owns one cudaMalloc allocation (never managed memory) on one
// GPU and hands out aligned byte ranges of it; DevicePagePool is a
// PagePool (MemoryKind::kDevice) over one such range, with a LIFO free list
// like HostPagePool (SlotFreeList). Data() returns DEVICE addresses; Write/Read
// copy between host memory and a slot (synchronous cudaMemcpy on the arena's
// device, made current in the calling thread first); ReadMany copies many
// slots through the pool's pinned bounce buffer (cuda/tier/pinned_bounce.h,
// made on first use, 2 x 32 MiB or two slots if larger).
//
// Memory: the arena frees its allocation when the last owner (the tier and
// every pool cut from it) lets go; a pool gives its range back on
// destruction.
//
// Thread-safety: DeviceArena is thread-safe (mu_). DevicePagePool follows
// the PagePool contract: Allocate/Free under the owner's lock; Data, Write,
// Read and ReadMany from any thread (ReadMany calls take turns on the bounce
// buffer, bounce_mu_).
#ifndef KVHARBOR_CUDA_TIER_DEVICE_PAGE_POOL_H_
#define KVHARBOR_CUDA_TIER_DEVICE_PAGE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/memory/page_pool.h"
#include "core/memory/range_allocator.h"
#include "cuda/tier/pinned_bounce.h"

namespace kvharbor {
namespace gpu {

class DeviceArena {
 public:
  // cudaMalloc of `bytes` on `device`. FailedPrecondition naming the field
  // when the device does not exist; ResourceExhausted when it lacks memory.
  static absl::StatusOr<std::shared_ptr<DeviceArena>> Create(int device,
                                                             uint64_t bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  int device() const { return device_; }
  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t free_bytes() const { return ranges_.free_bytes(); }

  // Offset of a free range of `n` bytes (first fit, 256-byte aligned), or
  // ResourceExhausted saying how much is free.
  absl::StatusOr<uint64_t> Take(uint64_t n) { return ranges_.Take(n); }
  void Give(uint64_t offset, uint64_t n) { ranges_.Give(offset, n); }

 private:
  DeviceArena(int device, uint8_t* base, uint64_t bytes);
  const int device_;
  uint8_t* const base_;
  const uint64_t bytes_;
  RangeAllocator ranges_;  // thread-safe
};

class DevicePagePool final : public SlotPagePool {
 public:
  // `capacity` slots of `slot_bytes` from `arena` (InvalidArgument for zero
  // sizes; ResourceExhausted when the arena has no room).
  static absl::StatusOr<std::unique_ptr<DevicePagePool>> Create(
      std::shared_ptr<DeviceArena> arena, size_t slot_bytes, uint32_t capacity);
  ~DevicePagePool() override;

  MemoryKind kind() const override { return MemoryKind::kDevice; }
  absl::Status Write(uint32_t slot, size_t offset, const uint8_t* src,
                     size_t n) override;
  absl::Status Read(uint32_t slot, uint8_t* dst) override;
  absl::Status ReadMany(const std::vector<uint32_t>& slots,
                        const std::vector<uint8_t*>& dst) override;

  int device() const { return arena_->device(); }
  // Where this pool's slot 0 lies in the arena (for IPC offsets).
  uint64_t arena_offset() const { return offset_; }

 private:
  DevicePagePool(std::shared_ptr<DeviceArena> arena, uint64_t offset,
                 size_t slot_bytes, uint32_t capacity);
  const std::shared_ptr<DeviceArena> arena_;
  const uint64_t offset_;
  absl::Mutex bounce_mu_;
  std::unique_ptr<PinnedBounce> bounce_ ABSL_GUARDED_BY(bounce_mu_);
};

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_TIER_DEVICE_PAGE_POOL_H_
