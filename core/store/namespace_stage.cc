// Namespace::StageLeaseOnDevice: a lease's cold pages decoded straight into
// free device slots and made raw there, so that GetDeviceHandles can hand
// them to a same-host client (GetDeviceHandlesRequest.stage_cold). See
// namespace.h and docs/tiers.md ("Same-host zero copy").
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/base/check.h"
#include "core/base/status_macros.h"
#include "core/store/namespace.h"

namespace kvharbor {

absl::StatusOr<uint32_t> Namespace::StageLeaseOnDevice(uint64_t lease_id) {
  uint32_t cold_pages = 0;
  {
    absl::MutexLock l(&mu_);
    KVH_ASSIGN_OR_RETURN(const Lease lease, leases_.Get(lease_id));
    if (pool_->kind() != MemoryKind::kDevice) return HostPoolError();
    for (PageHandle h : lease.pages) {
      if (index_.TierOf(h).value_or(Tier::kRaw) != Tier::kRaw) ++cold_pages;
    }
  }
  if (cold_pages == 0) return 0;
  // Room as an insert makes it: LRU raw pages demoted (the lease's own are
  // locked). Without mu_ (MakeRoom takes move_mu_ first).
  if (tiered() && FreeSlots() < cold_pages) tiers_.MakeRoom(cold_pages);

  PinnedPages cold;  // the cold pages' buffers; no slot is pinned
  cold.format_ = FetchFormat::kCompressed;
  std::vector<std::pair<size_t, int>> fds;
  std::vector<uint32_t> slots;
  {
    absl::MutexLock l(&mu_);
    KVH_ASSIGN_OR_RETURN(const Lease lease, leases_.Get(lease_id));
    cold.ns_ = shared_from_this();
    std::vector<std::pair<PageHandle, Located>> pages;
    for (PageHandle h : lease.pages) {
      // Leased pages are locked in the index: they resolve and stay put.
      absl::StatusOr<Located> loc = LocateLocked(h);
      KVH_CHECK(loc.ok(), "leased page %#x does not resolve: %s", h,
                loc.status().message());
      if (loc->tier != Tier::kRaw) pages.emplace_back(h, *loc);
    }
    if (pages.empty()) return 0;  // staged by someone else meanwhile
    const uint32_t free = slots_.free_count();
    if (free < pages.size()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "stage_cold: %u pages of lease %u are in cold tiers and need free "
          "device slots, but namespace '%s' has %u free of %u (the others "
          "hold leased, pinned or uploading pages); Fetch those pages "
          "instead (FETCH_FORMAT_COMPRESSED decodes on the client's GPU)",
          pages.size(), lease_id, config_.name, free, slots_.capacity()));
    }
    KVH_ASSIGN_OR_RETURN(
        slots, AllocateSlotsLocked(static_cast<uint32_t>(pages.size()),
                                   /*budget_full=*/nullptr));
    for (const auto& [h, loc] : pages) PinOneLocked(h, loc, &cold, &fds);
  }
  // The reserved slots are ours until CommitPromotionsLocked takes or frees
  // them.
  const auto give_back = [&] {
    absl::MutexLock l(&mu_);
    slots_.Free(slots);
  };
  std::vector<PageHandle> corrupt;
  absl::Status loaded = cold_.LoadColdBuffers(&cold, std::move(fds), &corrupt);
  if (!corrupt.empty()) DropCorrupt(corrupt);
  if (!loaded.ok()) {
    give_back();
    return loaded;
  }
  std::vector<uint64_t> checksums;
  if (absl::Status s = cold_.DecodeIntoSlots(cold, slots, slots_, &checksums);
      !s.ok()) {
    give_back();
    return s;
  }
  std::vector<Promotion> promotions;
  for (size_t k = 0; k < slots.size(); ++k) {
    promotions.push_back(
        {cold.handle(k), slots[k], checksums[k], cold.positions_[k]});
  }
  absl::MutexLock l(&mu_);
  uint32_t staged = 0;
  for (PageHandle h : CommitPromotionsLocked(promotions)) staged += h != 0;
  return staged;
}

}  // namespace kvharbor
