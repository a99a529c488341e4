// Same-host zero copy on the namespace's side: where a lease's pages lie in
// the device arena (GetDeviceHandles). Placed uploads, whose pages a
// same-host client writes into the reserved slots itself, are Upload's
// (core/store/upload.cc).
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
  KVH_ASSIGN_OR_RETURN(const Lease lease, leases_.Get(lease_id));
  if (pool_->kind() != MemoryKind::kDevice) return HostPoolError();
  LeaseDevicePages out;
  out.expiry = lease.expiry;
  KVH_ASSIGN_OR_RETURN(
      const std::vector<uint32_t> slots,
      RawSlotsOfLeaseLocked(lease_id, lease,
                            "not on the device (it was evicted before the "
                            "lease took it; Fetch it, or Insert it again to "
                            "bring it back)"));
  const std::vector<PageHandle>& pages = lease.pages;
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

}  // namespace kvharbor
