#include "core/memory/page_pool.h"

#include <sys/mman.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/base/check.h"

namespace kvharbor {

absl::StatusOr<std::unique_ptr<HostPagePool>> HostPagePool::Create(
    size_t slot_bytes, uint32_t capacity, std::shared_ptr<HostArena> arena) {
  if (slot_bytes == 0 || capacity == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "page pool: slot_bytes (%u) and capacity (%u) must be positive",
        slot_bytes, capacity));
  }
  if (slot_bytes > SIZE_MAX / capacity) {
    return absl::InvalidArgumentError("page pool: size overflows");
  }
  const size_t bytes = slot_bytes * capacity;
  if (arena != nullptr) {
    absl::StatusOr<uint64_t> off = arena->Take(bytes);
    if (!off.ok()) return off.status();
    uint8_t* base = arena->base() + *off;
    return std::unique_ptr<HostPagePool>(new HostPagePool(
        base, bytes, slot_bytes, capacity, std::move(arena), *off));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("page pool: cannot map %u bytes", bytes));
  }
  return std::unique_ptr<HostPagePool>(new HostPagePool(
      static_cast<uint8_t*>(p), bytes, slot_bytes, capacity, nullptr, 0));
}

HostPagePool::HostPagePool(uint8_t* base, size_t mapped, size_t slot_bytes,
                           uint32_t capacity, std::shared_ptr<HostArena> arena,
                           uint64_t arena_offset)
    : arena_(std::move(arena)),
      arena_offset_(arena_offset),
      base_(base),
      mapped_bytes_(mapped),
      slot_bytes_(slot_bytes),
      capacity_(capacity),
      slots_(capacity) {}

HostPagePool::~HostPagePool() {
  if (arena_ != nullptr) {
    arena_->Give(arena_offset_, mapped_bytes_);
  } else {
    munmap(base_, mapped_bytes_);
  }
}

SlotFreeList::SlotFreeList(uint32_t capacity) : allocated_(capacity, false) {
  free_.reserve(capacity);
  for (uint32_t i = capacity; i > 0; --i) free_.push_back(i - 1);
}

absl::StatusOr<std::vector<uint32_t>> SlotFreeList::Allocate(uint32_t n,
                                                             const char* what) {
  if (n > free_.size()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: %u slots requested, %u free", what, n, free_.size()));
  }
  std::vector<uint32_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - n);
  for (uint32_t s : out) allocated_[s] = true;
  return out;
}

void SlotFreeList::Free(uint32_t slot) {
  KVH_CHECK(slot < allocated_.size() && allocated_[slot],
            "SlotFreeList::Free of slot %u, which is not allocated", slot);
  allocated_[slot] = false;
  free_.push_back(slot);
}

absl::Status HostPagePool::Write(uint32_t slot, size_t offset,
                                 const uint8_t* src, size_t n) {
  std::memcpy(Data(slot) + offset, src, n);
  return absl::OkStatus();
}

absl::Status PagePool::ReadMany(const std::vector<uint32_t>& slots,
                                const std::vector<uint8_t*>& dst) {
  if (slots.size() != dst.size()) {
    return absl::InvalidArgumentError("dst: one destination per slot");
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (absl::Status s = Read(slots[i], dst[i]); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status HostPagePool::Read(uint32_t slot, uint8_t* dst) {
  std::memcpy(dst, Data(slot), slot_bytes_);
  return absl::OkStatus();
}

}  // namespace kvharbor
