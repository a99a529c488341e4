// Same-host zero copy on the namespace's side: where a lease's pages lie in
// the device arena (GetDeviceHandles), and uploads whose pages a same-host
// client writes into the reserved slots itself (placed uploads, checked by
// hashing the slots where they lie). Kept apart from the fetch and tier
// code: it reads the slot table under mu_ and hashes reserved slots.
#include <xxh3.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/store/namespace.h"

namespace kvharbor {

absl::Status Namespace::HostPoolError() const {
  return absl::FailedPreconditionError(absl::StrFormat(
      "namespace: '%s' keeps its pages in host memory, not in the device "
      "arena (Fetch them instead)",
      config_.name));
}

absl::StatusOr<Namespace::LeaseDevicePages> Namespace::DevicePagesOfLease(
    uint64_t lease_id, uintptr_t arena_base, uint64_t arena_bytes) const {
  absl::MutexLock l(&mu_);
  KVH_ASSIGN_OR_RETURN(const Lease* lease, FindLeaseLocked(lease_id));
  if (pool_->kind() != MemoryKind::kDevice) return HostPoolError();
  LeaseDevicePages out;
  out.expiry = lease->expiry;
  KVH_ASSIGN_OR_RETURN(
      const std::vector<uint32_t> slots,
      RawSlotsOfLeaseLocked(lease_id, *lease,
                            "not on the device (it was evicted before the "
                            "lease took it; Fetch it, or Insert it again to "
                            "bring it back)"));
  const std::vector<PageHandle>& pages = lease->pages;
  out.pages.reserve(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>(pool_->Data(slots[i]));
    // A device pool cut from another arena would give offsets into the
    // wrong mapping: refuse rather than point the client at foreign bytes.
    if (addr < arena_base || addr - arena_base > arena_bytes ||
        arena_bytes - (addr - arena_base) < page_bytes_) {
      return absl::InternalError(absl::StrFormat(
          "pages[%u]: slot %u of namespace '%s' lies outside the device "
          "arena",
          i, slots[i], config_.name));
    }
    out.pages.push_back({pages[i], addr - arena_base, page_bytes_});
  }
  return out;
}

absl::StatusOr<std::vector<uint64_t>> Namespace::ChecksumSlots(
    absl::Span<const uint32_t> slots) const {
  std::vector<uint64_t> out(slots.size());
  if (pool_->kind() != MemoryKind::kDevice) {
    for (size_t i = 0; i < slots.size(); ++i) {
      out[i] = XXH3_64bits(pool_->Data(slots[i]), page_bytes_);
    }
    return out;
  }
  if (config_.device_tier != nullptr && !slots.empty()) {
    std::vector<const uint8_t*> pages;
    pages.reserve(slots.size());
    for (uint32_t s : slots) pages.push_back(pool_->Data(s));
    absl::StatusOr<std::vector<uint64_t>> gpu =
        config_.device_tier->ChecksumPages(pages, page_bytes_);
    if (gpu.ok() && gpu->size() == slots.size()) return gpu;
    if (!gpu.ok() && !absl::IsUnimplemented(gpu.status())) {
      return gpu.status();
    }
  }
  // A tier that cannot hash on the GPU: one page at a time through host
  // memory.
  std::string host(page_bytes_, '\0');
  for (size_t i = 0; i < slots.size(); ++i) {
    KVH_RETURN_IF_ERROR(
        pool_->Read(slots[i], reinterpret_cast<uint8_t*>(host.data())));
    out[i] = XXH3_64bits(host.data(), host.size());
  }
  return out;
}

uint8_t* Namespace::Upload::SlotData(uint32_t page) const {
  // Only pages the client sends: the cold skipped pages of an append
  // [skip_pages_, sent_from_) are restored by the daemon.
  if (ns_ == nullptr || done_ || !placed_ ||
      page < std::max(skip_pages_, sent_from_) || page >= num_pages_) {
    return nullptr;
  }
  return ns_->pool_->Data(slots_[page - skip_pages_]);
}

absl::Status Namespace::Upload::AcceptPlaced(
    absl::Span<const uint64_t> checksums) {
  if (!error_.ok()) return error_;
  if (done_) return absl::FailedPreconditionError("upload: already committed");
  if (!placed_) {
    return absl::FailedPreconditionError(
        "upload: not begun as a placed upload (InsertSpec.placed), so its "
        "slots are reserved as bytes arrive through Write");
  }
  if (received_ != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "upload: %u bytes already arrived through Write (or the pages were "
        "accepted before); a placed upload takes its pages in place, once",
        received_));
  }
  // The client wrote pages [first, num_pages_): those with a slot that it
  // sends (the cold skipped pages of an append are the daemon's to restore).
  const uint32_t first = std::max(skip_pages_, sent_from_);
  const uint32_t sent = num_pages_ - first;
  if (checksums.size() != sent) {
    return error_ = absl::InvalidArgumentError(absl::StrFormat(
               "page_checksums: %u given for %u written pages (one per page "
               "from page %u of the sequence on)",
               checksums.size(), sent, first));
  }
  const absl::Span<const uint32_t> written =
      absl::MakeConstSpan(slots_).subspan(first - skip_pages_);
  absl::StatusOr<std::vector<uint64_t>> got = ns_->ChecksumSlots(written);
  if (!got.ok()) return error_ = got.status();
  for (uint32_t i = 0; i < sent; ++i) {
    if ((*got)[i] != checksums[i]) {
      return error_ = absl::DataLossError(absl::StrFormat(
                 "page_checksums[%u]: page %u of the sequence hashes to %#x "
                 "in its slot, not the declared %#x; nothing is stored",
                 i, first + i, (*got)[i], checksums[i]));
    }
    computed_[first + i] = (*got)[i];
  }
  if (ns_->calibrations_.has_sampler()) {
    for (uint32_t i = 0; i < sent; ++i) {
      ns_->SampleSlot(written[i],
                      uint64_t{first + i} * ns_->config_.geometry.page_size);
    }
  }
  received_ = total_bytes_;
  return absl::OkStatus();
}

}  // namespace kvharbor
