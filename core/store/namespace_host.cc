// Namespace::HostPagesOfLease: where a lease's pages lie in the shared host
// arena, for same-host Fetch through shared memory (GetHostHandles). Like
// DevicePagesOfLease it only reads the slot table (SlotTable).
#include <cstdint>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/store/namespace.h"

namespace kvharbor {

absl::StatusOr<Namespace::LeaseHostPages> Namespace::HostPagesOfLease(
    uint64_t lease_id, const HostArena& arena) const {
  absl::MutexLock l(&mu_);
  KVH_ASSIGN_OR_RETURN(const Lease lease, leases_.Get(lease_id));
  // The pool type never changes after creation; only a host pool cut from
  // this very arena has offsets a client's mapping can use.
  const auto* host = pool_->kind() == MemoryKind::kHost
                         ? dynamic_cast<const HostPagePool*>(pool_.get())
                         : nullptr;
  if (host == nullptr || host->arena() != &arena) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "namespace: '%s' does not keep its pages in the shared host arena "
        "(%s); Fetch them instead",
        config_.name,
        pool_->kind() == MemoryKind::kDevice ? "they are in the device arena"
                                             : "its pool is private memory"));
  }
  LeaseHostPages out;
  out.expiry = lease.expiry;
  KVH_ASSIGN_OR_RETURN(
      const std::vector<uint32_t> slots,
      RawSlotsOfLeaseLocked(lease_id, lease,
                            "not in the shared host arena (it was evicted "
                            "before the lease took it); Fetch it"));
  const std::vector<PageHandle>& pages = lease.pages;
  out.pages.reserve(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    const uint64_t offset =
        host->arena_offset() + uint64_t{slots[i]} * page_bytes_;
    if (offset > arena.bytes() || arena.bytes() - offset < page_bytes_) {
      return absl::InternalError(absl::StrFormat(
          "pages[%u]: slot %u of namespace '%s' lies outside the shared host "
          "arena",
          i, slots[i], config_.name));
    }
    out.pages.push_back(
        {pages[i], offset, page_bytes_, slots_.checksum(slots[i])});
  }
  host_ipc_bytes_.fetch_add(uint64_t{page_bytes_} * out.pages.size(),
                            std::memory_order_relaxed);
  return out;
}

}  // namespace kvharbor
