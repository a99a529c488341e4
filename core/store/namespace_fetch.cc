// Namespace: Fetch -- pinning pages of a lease or by handle, reading them
// outside mu_ (disk pages read, host buffers verified, RAW fetches: device
// pages read back in one batch, cold pages decoded on the GPU in batches or
// on the CPU; COMPRESSED fetches: raw pages encoded) and promotion of
// fetched cold pages back into the pool. See namespace.h and docs/tiers.md.
#include <unistd.h>
#include <xxh3.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/check.h"
#include "core/base/status_macros.h"
#include "core/store/namespace.h"

namespace kvharbor {

absl::StatusOr<Namespace::PinnedPages> Namespace::PinLease(uint64_t lease_id,
                                                           uint32_t start,
                                                           uint32_t count,
                                                           FetchFormat format) {
  PinnedPages out;
  out.format_ = format;
  std::vector<std::pair<size_t, int>> fds;
  {
    absl::MutexLock l(&mu_);
    KVH_ASSIGN_OR_RETURN(const std::vector<PageHandle> pages,
                         leases_.Slice(lease_id, start, count));
    out.ns_ = shared_from_this();
    for (PageHandle h : pages) {
      // Leased pages are locked in the index: they resolve and stay put.
      absl::StatusOr<Located> loc = LocateLocked(h);
      KVH_CHECK(loc.ok(), "leased page %#x does not resolve: %s", h,
                loc.status().message());
      PinOneLocked(h, *loc, &out, &fds);
    }
  }
  KVH_RETURN_IF_ERROR(MaterializeOrDrop(&out, std::move(fds)));
  if (config_.promote_on_fetch && format == FetchFormat::kRaw) {
    PromoteFetched(&out);
  }
  return out;
}

absl::StatusOr<Namespace::PinnedPages> Namespace::PinPages(
    absl::Span<const PageHandle> handles, FetchFormat format) {
  if (handles.empty()) {
    return absl::InvalidArgumentError("pages.page_handles: empty");
  }
  if (handles.size() > slots_.capacity()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pages.page_handles: %u handles, more than the namespace's %u slots",
        handles.size(), slots_.capacity()));
  }
  PinnedPages out;
  out.format_ = format;
  std::vector<std::pair<size_t, int>> fds;
  {
    absl::MutexLock l(&mu_);
    out.ns_ = shared_from_this();
    for (size_t i = 0; i < handles.size(); ++i) {
      absl::StatusOr<Located> loc = LocateLocked(handles[i]);
      if (!loc.ok()) {
        slots_.Unpin(out.slots_);
        out.slots_.clear();
        for (const auto& f : fds) ::close(f.second);
        return absl::NotFoundError(absl::StrFormat("pages.page_handles[%u]: %s",
                                                   i, loc.status().message()));
      }
      PinOneLocked(handles[i], *loc, &out, &fds);
    }
  }
  KVH_RETURN_IF_ERROR(MaterializeOrDrop(&out, std::move(fds)));
  if (config_.promote_on_fetch && format == FetchFormat::kRaw) {
    PromoteFetched(&out);
  }
  return out;
}

void Namespace::PinOneLocked(PageHandle h, const Located& loc, PinnedPages* out,
                             std::vector<std::pair<size_t, int>>* fds) {
  const size_t i = out->handles_.size();
  out->handles_.push_back(h);
  out->tiers_.push_back(loc.tier);
  out->buffers_.emplace_back();
  out->codecs_.push_back(loc.cold.has_value() ? loc.cold->codec : nullptr);
  out->owned_.emplace_back();
  if (loc.tier == Tier::kRaw) {
    const SlotTable::PinnedSlot pinned = slots_.Pin(loc.slot);
    out->slots_.push_back(loc.slot);
    out->checksums_.push_back(pinned.checksum);
    out->positions_.push_back(pinned.first_position);
    return;
  }
  out->slots_.push_back(kNoSlot);
  // Host buffers: the stored checksum, verified by Materialize. Disk pages:
  // set by Materialize (the file carries its own).
  out->checksums_.push_back(loc.cold->checksum);
  out->positions_.push_back(loc.cold->first_position);
  if (loc.tier == Tier::kHostCompressed) {
    out->buffers_[i] = loc.cold->buffer;
  } else {
    // Opened under mu_: a later drop unlinks the name, not the open file.
    absl::StatusOr<int> fd = disk_->OpenPage(loc.cold->file_id);
    fds->emplace_back(i, fd.ok() ? *fd : -1);
  }
}

absl::Status Namespace::MaterializeOrDrop(
    PinnedPages* out, std::vector<std::pair<size_t, int>> fds) {
  std::vector<PageHandle> corrupt;
  absl::Status s = cold_.Materialize(out, std::move(fds), &corrupt);
  if (!corrupt.empty()) DropCorrupt(corrupt);
  return s;
}

void Namespace::PromoteFetched(PinnedPages* out) {
  std::vector<size_t> cold;
  for (size_t i = 0; i < out->size(); ++i) {
    if (out->tiers_[i] != Tier::kRaw) cold.push_back(i);
  }
  if (cold.empty()) return;
  std::vector<uint32_t> slots;
  {
    absl::MutexLock l(&mu_);
    // Only free slots: promotion never evicts (nor demotes) another page,
    // nor asks the budget for room.
    const uint32_t n = std::min<uint32_t>(cold.size(), slots_.free_count());
    if (n == 0) return;
    absl::StatusOr<std::vector<uint32_t>> got =
        AllocateSlotsLocked(n, /*budget_full=*/nullptr);
    if (!got.ok()) return;
    slots = *std::move(got);
  }
  // Outside mu_: the reserved slots are ours; the bytes were decoded and
  // checked by Materialize.
  size_t written = 0;
  for (; written < slots.size(); ++written) {
    const absl::Status s =
        pool_->Write(slots[written], 0, out->data(cold[written]), page_bytes_);
    if (!s.ok()) {
      LogWarning(config_, absl::StrCat("promotion of fetched pages stopped: ",
                                       s.message()));
      break;
    }
  }
  std::vector<Promotion> promotions;
  for (size_t k = 0; k < slots.size(); ++k) {
    const size_t i = cold[k];
    // A slot whose write failed is given back with the page left cold.
    promotions.push_back({k < written ? out->handles_[i] : PageHandle{0},
                          slots[k], out->checksums_[i], out->positions_[i]});
  }
  absl::MutexLock l(&mu_);
  const std::vector<PageHandle> now = CommitPromotionsLocked(promotions);
  for (size_t k = 0; k < slots.size(); ++k) {
    if (now[k] != 0) out->handles_[cold[k]] = now[k];
  }
}

std::vector<PageHandle> Namespace::CommitPromotionsLocked(
    absl::Span<const Promotion> promotions) {
  std::vector<PageHandle> now(promotions.size(), 0);
  for (size_t k = 0; k < promotions.size(); ++k) {
    const Promotion& p = promotions[k];
    const uint32_t slot = p.slot;
    const PageHandle old_h = p.old_handle;
    const std::optional<ColdPage> cold =
        old_h == 0 ? std::nullopt : cold_.Find(old_h);
    // Dropped, evicted or promoted meanwhile, or the path invariant (a raw
    // page's predecessor is raw) refuses it: the page stays where it is.
    if (!cold.has_value() ||
        !index_.SetTier(old_h, Tier::kRaw, /*allow_locked=*/true).ok()) {
      slots_.Free(absl::MakeConstSpan(&slot, 1));
      continue;
    }
    const Tier was = cold->tier;
    const PageHandle new_h = slots_.HandleOf(slot);
    if (!index_.ReplaceHandle(old_h, new_h).ok()) {
      // The tier it had a moment ago, under the same lock.
      KVH_CHECK(index_.SetTier(old_h, was, /*allow_locked=*/true).ok(),
                "page %#x cannot go back to tier %s", old_h, TierName(was));
      slots_.Free(absl::MakeConstSpan(&slot, 1));
      continue;
    }
    leases_.ReplaceHandle(old_h, new_h);
    cold_.Drop(old_h);
    slots_.Index(slot, p.checksum, p.first_position);
    now[k] = new_h;
    ++counters_.promoted_pages;
  }
  SyncMetaChargeLocked();
  return now;
}

}  // namespace kvharbor
