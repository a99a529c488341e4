#include "core/store/slot_table.h"

#include <xxh3.h>

#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/base/check.h"
#include "core/base/status_macros.h"

namespace kvharbor {

uint64_t SlotTable::MetaBytesPerSlot() { return sizeof(Slot) + 8; }

SlotTable::SlotTable(std::string ns_name, PagePool* pool,
                     std::shared_ptr<MemoryBudget> budget,
                     std::shared_ptr<DeviceTier> device_tier)
    : ns_name_(std::move(ns_name)),
      pool_(*pool),
      budget_(std::move(budget)),
      device_tier_(std::move(device_tier)) {}

uint32_t SlotTable::free_count() const {
  absl::MutexLock l(&mu_);
  return pool_.free_count();
}

absl::StatusOr<uint32_t> SlotTable::Resolve(PageHandle h) const {
  const uint32_t slot = static_cast<uint32_t>(h);
  const uint32_t gen = static_cast<uint32_t>(h >> 32);
  absl::MutexLock l(&mu_);
  if (slot >= slots_.size() || slots_[slot].state != State::kIndexed ||
      slots_[slot].generation != gen) {
    return absl::NotFoundError(absl::StrFormat(
        "%#x is not a cached page of namespace '%s'", h, ns_name_));
  }
  return slot;
}

PageHandle SlotTable::HandleOf(uint32_t slot) const {
  absl::MutexLock l(&mu_);
  return MakeHandle(slot, slots_[slot].generation);
}

absl::StatusOr<std::vector<uint32_t>> SlotTable::Allocate(uint32_t n,
                                                          uint64_t meta_bytes,
                                                          bool* budget_full) {
  absl::MutexLock l(&mu_);
  const uint32_t warm = pool_.committed_free_count();
  const uint64_t fresh = n > warm ? n - warm : 0;
  const uint64_t commit = fresh * pool_.host_bytes_per_slot();
  if (budget_ != nullptr) {
    const uint64_t meta = uint64_t{n} * meta_bytes;
    if (!budget_->TryCharge(commit + meta)) {
      if (budget_full != nullptr) *budget_full = true;
      return absl::ResourceExhaustedError(absl::StrFormat(
          "store.pool_budget_bytes: the daemon's memory budget of %u bytes "
          "has %u free, not enough for %u new pages of namespace '%s' (%u "
          "bytes with their metadata)",
          budget_->capacity(), budget_->free_bytes(), n, ns_name_,
          commit + meta));
    }
    budget_->Release(meta);
  }
  absl::StatusOr<std::vector<uint32_t>> slots = pool_.Allocate(n);
  if (!slots.ok()) {
    if (budget_ != nullptr) budget_->Release(commit);
    return slots;
  }
  committed_slots_ += fresh;
  committed_bytes_.fetch_add(commit, std::memory_order_relaxed);
  if (pool_.high_water() > slots_.size()) slots_.resize(pool_.high_water());
  for (uint32_t s : *slots) slots_[s].state = State::kReserved;
  return slots;
}

void SlotTable::FreeLocked(uint32_t slot) {
  slots_[slot].state = State::kFree;
  slots_[slot].checksum = 0;
  pool_.Free(slot);
}

void SlotTable::Free(absl::Span<const uint32_t> slots) {
  absl::MutexLock l(&mu_);
  for (uint32_t slot : slots) FreeLocked(slot);
}

void SlotTable::Index(uint32_t slot, uint64_t checksum,
                      uint64_t first_position) {
  absl::MutexLock l(&mu_);
  Slot& s = slots_[slot];
  s.state = State::kIndexed;
  s.checksum = checksum;
  s.first_position = first_position;
}

void SlotTable::Retire(absl::Span<const PageHandle> handles) {
  absl::MutexLock l(&mu_);
  for (PageHandle h : handles) {
    const uint32_t slot = static_cast<uint32_t>(h);
    KVH_CHECK(slot < slots_.size() && slots_[slot].state == State::kIndexed &&
                  slots_[slot].generation == static_cast<uint32_t>(h >> 32),
              "the index returned page %#x, which the slot table never gave "
              "it",
              h);
    Slot& s = slots_[slot];
    // A new generation makes every outstanding handle of this page stale.
    if (++s.generation == 0) s.generation = 1;
    if (s.pins > 0) {
      s.state = State::kZombie;  // freed by the last unpin
    } else {
      FreeLocked(slot);
    }
  }
}

SlotTable::PinnedSlot SlotTable::Pin(uint32_t slot) {
  absl::MutexLock l(&mu_);
  Slot& s = slots_[slot];
  ++s.pins;
  return PinnedSlot{s.checksum, s.first_position};
}

void SlotTable::Unpin(absl::Span<const uint32_t> slots) {
  absl::MutexLock l(&mu_);
  for (uint32_t slot : slots) {
    if (slot == kNoSlot) continue;
    Slot& s = slots_[slot];
    if (--s.pins == 0 && s.state == State::kZombie) FreeLocked(slot);
  }
}

bool SlotTable::Unpinned(uint32_t slot) const {
  absl::MutexLock l(&mu_);
  return slots_[slot].pins == 0;
}

uint64_t SlotTable::checksum(uint32_t slot) const {
  absl::MutexLock l(&mu_);
  return slots_[slot].checksum;
}

void SlotTable::DiscardFree() {
  absl::MutexLock l(&mu_);
  const uint32_t n = pool_.Discard(UINT32_MAX);
  if (n == 0) return;
  const uint64_t bytes = uint64_t{n} * pool_.host_bytes_per_slot();
  committed_slots_ -= n;
  committed_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  if (budget_ != nullptr) budget_->Release(bytes);
}

uint64_t SlotTable::meta_bytes() const {
  absl::MutexLock l(&mu_);
  return slots_.capacity() * sizeof(Slot) + uint64_t{pool_.high_water()} * 8;
}

SlotTable::Census SlotTable::Count(
    absl::FunctionRef<bool(PageHandle)> locked) const {
  Census c;
  absl::MutexLock l(&mu_);
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state == State::kReserved) {
      ++c.reserved;
    } else if (s.state == State::kZombie) {
      ++c.pinned;  // its page is gone or cold; a read still holds the slot
    } else if (s.state == State::kIndexed) {
      if (locked(MakeHandle(i, s.generation))) {
        ++c.locked;
      } else if (s.pins > 0) {
        ++c.pinned;
      } else {
        ++c.other;
      }
    }
  }
  return c;
}

absl::Status SlotTable::Check(absl::FunctionRef<bool(PageHandle)> raw_indexed,
                              uint64_t* indexed) const {
  absl::MutexLock l(&mu_);
  size_t free = 0;
  *indexed = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state == State::kFree) ++free;
    if (s.state == State::kZombie && s.pins == 0) {
      return absl::InternalError(
          absl::StrFormat("slot %u: retired but not freed without pins", i));
    }
    if (s.pins > 0 && s.state != State::kIndexed && s.state != State::kZombie) {
      return absl::InternalError(
          absl::StrFormat("slot %u: pinned but not holding a page", i));
    }
    // With the namespace's count check this makes indexed slots and raw
    // index pages a bijection: every indexed slot is referenced exactly once.
    if (s.state == State::kIndexed) {
      ++*indexed;
      if (!raw_indexed(MakeHandle(static_cast<uint32_t>(i), s.generation))) {
        return absl::InternalError(absl::StrFormat(
            "slot %u: indexed but its handle is not a raw index page", i));
      }
    }
  }
  // The table ends at the pool's high-water mark: slots past it were never
  // handed out.
  free += pool_.capacity() - slots_.size();
  if (free != pool_.free_count()) {
    return absl::InternalError(absl::StrFormat(
        "slot table has %u free slots, the pool %u", free, pool_.free_count()));
  }
  if (committed_bytes_.load() !=
      committed_slots_ * pool_.host_bytes_per_slot()) {
    return absl::InternalError("budget charge disagrees with its parts");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> SlotTable::Checksum(
    absl::Span<const uint32_t> slots) const {
  std::vector<uint64_t> out(slots.size());
  if (pool_.kind() != MemoryKind::kDevice) {
    for (size_t i = 0; i < slots.size(); ++i) {
      out[i] = XXH3_64bits(pool_.Data(slots[i]), pool_.slot_bytes());
    }
    return out;
  }
  if (device_tier_ != nullptr && !slots.empty()) {
    std::vector<const uint8_t*> pages;
    pages.reserve(slots.size());
    for (uint32_t s : slots) pages.push_back(pool_.Data(s));
    absl::StatusOr<std::vector<uint64_t>> gpu =
        device_tier_->ChecksumPages(pages, pool_.slot_bytes());
    if (gpu.ok() && gpu->size() == slots.size()) return gpu;
    if (!gpu.ok() && !absl::IsUnimplemented(gpu.status())) {
      return gpu.status();
    }
  }
  // A tier that cannot hash on the GPU: one page at a time through host
  // memory.
  std::string host(pool_.slot_bytes(), '\0');
  for (size_t i = 0; i < slots.size(); ++i) {
    KVH_RETURN_IF_ERROR(
        pool_.Read(slots[i], reinterpret_cast<uint8_t*>(host.data())));
    out[i] = XXH3_64bits(host.data(), host.size());
  }
  return out;
}

}  // namespace kvharbor
