#include "core/memory/page_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/base/check.h"

namespace kvharbor {

absl::StatusOr<size_t> SlotPagePool::RangeBytes(const char* what,
                                                size_t slot_bytes,
                                                uint32_t capacity) {
  if (slot_bytes == 0 || capacity == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: slot_bytes (%u) and capacity (%u) must be positive", what,
        slot_bytes, capacity));
  }
  if (slot_bytes > SIZE_MAX / capacity) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: size overflows", what));
  }
  return slot_bytes * capacity;
}

absl::StatusOr<std::unique_ptr<HostPagePool>> HostPagePool::Create(
    size_t slot_bytes, uint32_t capacity, std::shared_ptr<HostArena> arena) {
  absl::StatusOr<size_t> bytes_or =
      RangeBytes("page pool", slot_bytes, capacity);
  if (!bytes_or.ok()) return bytes_or.status();
  const size_t bytes = *bytes_or;
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
    : SlotPagePool("page pool", base, slot_bytes, capacity),
      arena_(std::move(arena)),
      arena_offset_(arena_offset),
      mapped_bytes_(mapped) {}

HostPagePool::~HostPagePool() {
  if (arena_ != nullptr) {
    arena_->Give(arena_offset_, mapped_bytes_);
  } else {
    munmap(base(), mapped_bytes_);
  }
}

absl::StatusOr<std::vector<uint32_t>> SlotFreeList::Allocate(uint32_t n,
                                                             const char* what) {
  if (n > free_count()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: %u slots requested, %u free", what, n, free_count()));
  }
  std::vector<uint32_t> out;
  out.reserve(n);
  // Committed slots come out last in `out` (its end is the LIFO end), so a
  // caller taking from the back sees the warmest first, as before.
  const uint32_t from_committed =
      std::min<uint32_t>(n, static_cast<uint32_t>(committed_.size()));
  const uint32_t from_clean = std::min<uint32_t>(
      n - from_committed, static_cast<uint32_t>(clean_.size()));
  const uint32_t from_fresh = n - from_committed - from_clean;
  for (uint32_t i = from_fresh; i > 0; --i) out.push_back(fresh_ + i - 1);
  fresh_ += from_fresh;
  allocated_.resize(fresh_, false);
  out.insert(out.end(), clean_.end() - from_clean, clean_.end());
  clean_.resize(clean_.size() - from_clean);
  out.insert(out.end(), committed_.end() - from_committed, committed_.end());
  committed_.resize(committed_.size() - from_committed);
  for (uint32_t s : out) allocated_[s] = true;
  return out;
}

void SlotFreeList::Free(uint32_t slot) {
  KVH_CHECK(slot < allocated_.size() && allocated_[slot],
            "SlotFreeList::Free of slot %u, which is not allocated", slot);
  allocated_[slot] = false;
  committed_.push_back(slot);
}

std::vector<uint32_t> SlotFreeList::TakeCommittedFree(uint32_t max) {
  const size_t n = std::min<size_t>(max, committed_.size());
  // The coldest (first freed) go; the warm end stays for reuse.
  std::vector<uint32_t> out(committed_.begin(), committed_.begin() + n);
  committed_.erase(committed_.begin(), committed_.begin() + n);
  clean_.insert(clean_.end(), out.begin(), out.end());
  std::sort(out.begin(), out.end());
  return out;
}

uint32_t HostPagePool::Discard(uint32_t max) {
  if (arena_ != nullptr) return 0;  // sealed: no hole punching
  const std::vector<uint32_t> slots = free_list().TakeCommittedFree(max);
  const long sys = sysconf(_SC_PAGESIZE);
  const uint64_t page = sys > 0 ? static_cast<uint64_t>(sys) : 4096;
  // Runs of adjacent slots, each rounded inwards to whole system pages.
  for (size_t i = 0; i < slots.size();) {
    size_t j = i + 1;
    while (j < slots.size() && slots[j] == slots[j - 1] + 1) ++j;
    const uint64_t begin = reinterpret_cast<uintptr_t>(Data(slots[i]));
    const uint64_t end =
        reinterpret_cast<uintptr_t>(Data(slots[j - 1])) + slot_bytes();
    const uint64_t a = (begin + page - 1) / page * page;
    const uint64_t b = end / page * page;
    if (a < b) {
      madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
    }
    i = j;
  }
  return static_cast<uint32_t>(slots.size());
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
  std::memcpy(dst, Data(slot), slot_bytes());
  return absl::OkStatus();
}

}  // namespace kvharbor
