// Uploads: two-phase inserts on the namespace's side -- Begin locks the
// cached prefix and reserves slots, Upload::Write fills them outside the
// index lock, Commit indexes them -- appends that skip a cached prefix (its
// cold pages restored from their stored copy), and layer-major uploads
// whose bytes arrive layer by layer. See uploads.h, upload.h and
// docs/engines_api.md.
#include "core/store/uploads.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/base/check.h"
#include "core/base/status_macros.h"

namespace kvharbor {

absl::StatusOr<std::unique_ptr<Upload>> Uploads::Begin(const InsertSpec& spec) {
  const bool keys = UsesPageKeys(ns_.config_.key_kind);
  KVH_RETURN_IF_ERROR(
      ns_.CheckElements(spec.elements, keys ? "page_keys" : "token_ids"));
  if (spec.elements.size() % ns_.epp_ != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "token_ids: %u tokens is not a whole number of pages (page_size %u)",
        spec.elements.size(), ns_.epp_));
  }
  const uint32_t n = static_cast<uint32_t>(spec.elements.size() / ns_.epp_);
  if (spec.skip_pages > n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("skip_pages: %u is more than the sequence's %u pages",
                        spec.skip_pages, n));
  }
  std::unique_ptr<Upload> up(new Upload());
  up->ns_ = ns_.shared_from_this();
  up->tokens_.assign(spec.elements.begin(), spec.elements.end());
  up->checksums_.assign(spec.checksums.begin(), spec.checksums.end());
  up->num_pages_ = n;
  up->sent_from_ = spec.skip_pages;
  up->prefix_lease_id_ = spec.prefix_lease_id;
  up->layer_major_ = spec.layer_major;
  up->placed_ = spec.placed;
  up->computed_.assign(n, 0);
  absl::Status begun = BeginUpload(up.get());
  if (!begun.ok()) {
    up->ns_ = nullptr;  // nothing to abort
    return begun;
  }
  // On an error the upload's destructor gives back what it holds.
  KVH_RETURN_IF_ERROR(RestoreSkipped(up.get()));
  return up;
}

absl::Status Uploads::CheckSkipLocked(Upload* up,
                                      absl::Span<const PageHandle> present) {
  if (up->prefix_lease_id_ != 0) {
    absl::StatusOr<Namespace::Lease> lease =
        ns_.leases_.Get(up->prefix_lease_id_);
    if (!lease.ok()) {
      return absl::NotFoundError(absl::StrFormat(
          "prefix_lease_id: %u is not an active lease of namespace '%s'",
          up->prefix_lease_id_, ns_.config_.name));
    }
    const std::vector<PageHandle>& leased = lease->pages;
    if (leased.size() > present.size() ||
        !std::equal(leased.begin(), leased.end(), present.begin())) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "prefix_lease_id: lease %u holds %u pages that are not a prefix of "
          "this sequence",
          up->prefix_lease_id_, leased.size()));
    }
    if (up->sent_from_ != 0 && up->sent_from_ != leased.size()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("skip_pages: %u, but prefix lease %u holds %u pages",
                          up->sent_from_, up->prefix_lease_id_, leased.size()));
    }
    up->sent_from_ = static_cast<uint32_t>(leased.size());
  }
  if (up->sent_from_ > present.size()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "skip_pages: the first %u pages are skipped, but only %u of them are "
        "cached in namespace '%s' (evicted meanwhile); nothing was stored: "
        "send them (skip_pages 0)",
        up->sent_from_, present.size(), ns_.config_.name));
  }
  const uint32_t sent = up->num_pages_ - up->sent_from_;
  if (!up->checksums_.empty() && up->checksums_.size() != sent) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "page_checksums: %u given for the %u sent pages (of %u, %u skipped); "
        "send one per sent page or none",
        up->checksums_.size(), sent, up->num_pages_, up->sent_from_));
  }
  up->total_bytes_ = uint64_t{sent} * ns_.page_bytes_;
  return absl::OkStatus();
}

absl::Status Uploads::LockPresentPrefixLocked(Upload* up) {
  const uint32_t n = up->num_pages_;
  // Lock the present prefix so the pages this upload skips stay cached
  // until it commits.
  std::vector<PageHandle> prefix;
  std::vector<Tier> tiers;
  RadixIndex::MatchResult m = *ns_.index_.Match(
      up->tokens_, &prefix, &tiers, [] { return absl::OkStatus(); });
  up->present_pages_ = static_cast<uint32_t>(prefix.size());
  KVH_RETURN_IF_ERROR(CheckSkipLocked(up, prefix));
  up->skip_pages_ = up->present_pages_;
  // New pages below a cold page would break the path invariant: the cold
  // tail of the prefix is stored raw again, from the client's bytes where
  // it sends them, else from the stored copy (RestoreSkipped).
  while (up->skip_pages_ > 0 && up->skip_pages_ < n &&
         tiers[up->skip_pages_ - 1] != Tier::kRaw) {
    --up->skip_pages_;
  }
  up->restore_.assign(
      prefix.begin() + up->skip_pages_,
      prefix.begin() + std::max(up->skip_pages_, up->sent_from_));
  KVH_RETURN_IF_ERROR(CheckRestorableLocked(*up));
  if (m.matched_tokens > 0) {
    ns_.index_.Lock(m.node);
    up->locked_.push_back(m.node);
  }
  return absl::OkStatus();
}

absl::Status Uploads::LockPresentPagesLocked(Upload* up) {
  // Each page is its own one-page path. The pages present now, wherever
  // they are in the list, are locked until the upload ends (their sent
  // bytes are dropped: the stored copy must stay); the leading run of them
  // is the "prefix" that skip_pages and prefix_lease_id refer to. A
  // streamed upload reserves slots only for the absent pages; a placed one
  // (its client writes every page after the leading run into a slot) gets
  // a slot for each of those, and a present one is deduplicated at commit.
  const uint32_t n = up->num_pages_;
  std::vector<PageHandle> leading;
  std::vector<RadixNode*> nodes;
  std::vector<bool> present(n, false);
  for (uint32_t i = 0; i < n; ++i) {
    std::vector<PageHandle> found;
    RadixIndex::MatchResult m = ns_.index_.Match(
        absl::MakeConstSpan(up->tokens_).subspan(ns_.ElementsOf(i), ns_.epp_),
        &found);
    if (m.matched_tokens == 0) continue;
    if (leading.size() == i) leading.push_back(found[0]);
    if (up->placed_ && leading.size() <= i) continue;
    present[i] = true;
    nodes.push_back(m.node);
  }
  up->present_pages_ = static_cast<uint32_t>(leading.size());
  KVH_RETURN_IF_ERROR(CheckSkipLocked(up, leading));
  // Cold present pages stay cold: no new page extends them.
  up->skip_pages_ = up->present_pages_;
  if (!up->placed_) {
    up->slot_index_.assign(n + 1, 0);
    for (uint32_t i = 0; i < n; ++i) {
      up->slot_index_[i + 1] = up->slot_index_[i] + (present[i] ? 0 : 1);
    }
  }
  for (RadixNode* node : nodes) ns_.index_.Lock(node);
  up->locked_ = std::move(nodes);
  return absl::OkStatus();
}

absl::Status Uploads::BeginUpload(Upload* up) {
  const uint32_t n = up->num_pages_;
  {
    absl::MutexLock l(&ns_.mu_);
    KVH_RETURN_IF_ERROR(IndependentPages(ns_.config_.key_kind)
                            ? LockPresentPagesLocked(up)
                            : LockPresentPrefixLocked(up));
    if (up->SlotsFor(n) > ns_.slots_.capacity()) {
      for (RadixNode* node : up->locked_) ns_.index_.Unlock(node);
      up->locked_.clear();
      return absl::ResourceExhaustedError(absl::StrFormat(
          "token_ids: %u new pages do not fit in namespace '%s' (capacity %u "
          "pages)",
          up->SlotsFor(n), ns_.config_.name, ns_.slots_.capacity()));
    }
    {
      absl::MutexLock count(&mu_);
      ++in_flight_;
    }
  }
  // Slots come as the bytes arrive (Upload::Write), so that a header alone
  // neither evicts the pages its upload would replace nor holds their
  // slots. Now: those of the cold skipped pages RestoreSkipped fills and the
  // first sent one, so that a full namespace fails at once; a placed upload
  // all of them, since its client writes them itself.
  const uint32_t want =
      up->placed_
          ? up->SlotsFor(n)
          : std::min<uint32_t>(up->SlotsFor(n),
                               static_cast<uint32_t>(up->restore_.size()) + 1);
  if (want > 0) {
    absl::Status s = Reserve(up, want);
    if (!s.ok()) {
      Abort(up);
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Uploads::Reserve(Upload* up, uint32_t k) {
  absl::Status reserved;
  // Tiered: a second pass when there was no room, since its MakeRoom first
  // waits for the demotions in flight (move_mu_), whose slots are pinned
  // until they commit and free them. A full memory budget: the store frees
  // room (from the namespaces holding the most), then another pass.
  int passes = ns_.tiered() ? 2 : 1;
  for (int pass = 0; pass < passes; ++pass) {
    if (ns_.tiered()) ns_.tiers_.MakeRoom(k);
    bool budget_full = false;
    {
      absl::MutexLock l(&ns_.mu_);
      absl::StatusOr<std::vector<uint32_t>> slots =
          ReserveLocked(k, &up->evicted_for_room_, &budget_full);
      reserved = slots.status();
      if (slots.ok()) {
        up->slots_.insert(up->slots_.end(), slots->begin(), slots->end());
        return absl::OkStatus();
      }
    }
    if (!absl::IsResourceExhausted(reserved)) break;
    if (budget_full && ns_.config_.reclaim && passes < 4) {
      const uint64_t need = uint64_t{k} * (ns_.pool_->host_bytes_per_slot() +
                                           ns_.page_meta_bytes());
      // Other namespaces' pages are taken only for a reservation that can
      // succeed: one larger than the whole budget would wipe every other
      // tenant's cache and still fail (issue 34, row 1).
      if (absl::Status s = CheckAdmissible(*up, k); !s.ok()) return s;
      if (ns_.config_.reclaim(need) > 0) ++passes;
    }
  }
  return reserved;
}

absl::Status Uploads::CheckAdmissible(const Upload& up, uint32_t k) const {
  const MemoryBudget* budget = ns_.config_.budget.get();
  // The upload's slots so far stay held while it waits for more.
  const uint64_t pages = up.slots_.size() + uint64_t{k};
  const uint64_t need =
      pages * (ns_.pool_->host_bytes_per_slot() + ns_.page_meta_bytes());
  if (budget == nullptr || need <= budget->capacity()) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "store.pool_budget_bytes: an upload of %u pages into namespace '%s' "
      "needs %u bytes with their metadata, more than the daemon's whole "
      "memory budget of %u bytes; nothing was taken from other namespaces",
      pages, ns_.config_.name, need, budget->capacity()));
}

absl::Status Uploads::CheckRestorableLocked(const Upload& up) const {
  for (size_t j = 0; j < up.restore_.size(); ++j) {
    const std::optional<ColdPages::Page> cold = ns_.cold_.Find(up.restore_[j]);
    KVH_CHECK(cold.has_value(), "locked cold prefix page %#x has no record",
              up.restore_[j]);
    if (cold->codec->name() != "identity") {
      return absl::FailedPreconditionError(absl::StrFormat(
          "skip_pages: skipped page %u is kept lossy in tier %s (codec %s); "
          "raw pages after it would need its decoded approximation stored as "
          "raw: nothing was stored: send the pages (skip_pages 0) to store "
          "them exact",
          up.skip_pages_ + j, TierName(cold->tier), cold->codec->name()));
    }
  }
  return absl::OkStatus();
}

absl::Status Uploads::RestoreSkipped(Upload* up) {
  if (up->restore_.empty()) return absl::OkStatus();
  PinnedPages cold;
  cold.format_ = FetchFormat::kRaw;
  std::vector<std::pair<size_t, int>> fds;
  std::vector<size_t> which;  // index in restore_ of each pinned page
  {
    absl::MutexLock l(&ns_.mu_);
    cold.ns_ = ns_.shared_from_this();
    for (size_t j = 0; j < up->restore_.size(); ++j) {
      // The upload's lock keeps the pages cached and in their tier, but
      // another upload that sends them may have made one raw since (a new
      // handle): its slot here goes unused (CommitUpload frees it).
      absl::StatusOr<Namespace::Located> loc =
          ns_.LocateLocked(up->restore_[j]);
      if (!loc.ok() || loc->tier == Tier::kRaw) continue;
      ns_.PinOneLocked(up->restore_[j], *loc, &cold, &fds);
      which.push_back(j);
    }
  }
  const absl::Status read = ns_.MaterializeOrDrop(&cold, std::move(fds));
  if (!read.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "skip_pages: a skipped page could not be read back from its cold "
        "tier to be stored raw before the new pages (%s); nothing was "
        "stored: send the pages (skip_pages 0)",
        read.message()));
  }
  for (size_t i = 0; i < cold.size(); ++i) {
    const size_t j = which[i];
    KVH_RETURN_IF_ERROR(
        ns_.pool_->Write(up->slots_[j], 0, cold.data(i), ns_.page_bytes_));
    up->computed_[up->skip_pages_ + j] = cold.checksum(i);
  }
  return absl::OkStatus();
}

void Uploads::SampleSlot(uint32_t slot, uint64_t first_position) {
  const uint8_t* page = ns_.pool_->Data(slot);
  std::string host;
  if (ns_.pool_->kind() == MemoryKind::kDevice) {
    // The sampler reads the page on the CPU.
    host.resize(ns_.page_bytes_);
    if (!ns_.pool_->Read(slot, reinterpret_cast<uint8_t*>(host.data())).ok()) {
      return;  // a page the sample misses costs nothing but a sample
    }
    page = reinterpret_cast<const uint8_t*>(host.data());
  }
  if (ns_.calibrations_.Sample(page, first_position) &&
      ns_.config_.request_calibration) {
    ns_.config_.request_calibration(ns_.weak_from_this());
  }
}

absl::StatusOr<InsertOutcome> Uploads::Commit(Upload* up) {
  const uint32_t ps = ns_.config_.geometry.page_size;
  absl::MutexLock l(&ns_.mu_);
  uint32_t present = 0;
  if (IndependentPages(ns_.config_.key_kind)) {
    present = CommitPagesLocked(up);
  } else {
    KVH_ASSIGN_OR_RETURN(present, CommitPathLocked(up));
  }
  EndLocked(up);
  ns_.counters_.inserted_pages += up->num_pages_ - present;
  ns_.counters_.dedup_pages += present;
  ns_.counters_.bytes_in += up->total_bytes_;
  ns_.SyncMetaChargeLocked();
  InsertOutcome out;
  out.already_present_tokens = uint64_t{present} * ps;
  out.pages_stored = up->num_pages_ - present;
  out.pages_evicted = up->evicted_for_room_;
  return out;
}

absl::StatusOr<uint32_t> Uploads::CommitPathLocked(Upload* up) {
  const uint32_t ps = ns_.config_.geometry.page_size;
  std::vector<PageHandle> handles(up->num_pages_, 0);
  for (uint32_t i = up->skip_pages_; i < up->num_pages_; ++i) {
    handles[i] = ns_.slots_.HandleOf(up->slots_[i - up->skip_pages_]);
  }
  std::vector<PageHandle> current;  // the locked prefix's handles now
  if (up->skip_pages_ < up->present_pages_) {
    ns_.index_.Match(absl::MakeConstSpan(up->tokens_)
                         .first(ns_.ElementsOf(up->present_pages_)),
                     &current);
  }
  KVH_ASSIGN_OR_RETURN(RadixIndex::InsertResult r,
                       ns_.index_.Insert(up->tokens_, handles));
  const uint32_t present =
      static_cast<uint32_t>(r.already_present_tokens / ns_.epp_);
  KVH_CHECK(present >= up->skip_pages_,
            "the upload's locked prefix of %u pages shrank to %u",
            up->skip_pages_, present);
  PromoteLocked(up, current);
  // Pages [present_pages_, present) were stored by another upload meanwhile
  // and may have been demoted since. When this upload appends raw pages
  // after them, they are promoted from the bytes it holds: a raw page under
  // a cold one would break the path invariant (types/tier.h).
  std::vector<PageHandle> stored;
  if (up->present_pages_ < present && present < up->num_pages_) {
    ns_.index_.Match(
        absl::MakeConstSpan(up->tokens_).first(ns_.ElementsOf(present)),
        &stored);
  }
  for (uint32_t i = up->present_pages_; i < up->num_pages_; ++i) {
    const uint32_t slot = up->slots_[i - up->skip_pages_];
    if (i >= present) {
      ns_.slots_.Index(slot, up->computed_[i], uint64_t{i} * ps);
    } else if (!stored.empty() && ns_.cold_.Contains(stored[i])) {
      PromoteOneLocked(stored[i], slot, up->computed_[i], uint64_t{i} * ps);
    } else {
      // Another upload stored this page meanwhile.
      ns_.slots_.Free(absl::MakeConstSpan(&slot, 1));
    }
  }
  return present;
}

uint32_t Uploads::CommitPagesLocked(Upload* up) {
  const uint32_t ps = ns_.config_.geometry.page_size;
  // Pages without a slot were present at begin and are locked; every other
  // page is inserted alone under its key, or found present (stored by
  // another upload meanwhile, or listed twice) and its slot freed. A
  // present page keeps its tier: nothing extends it.
  uint32_t present = 0;
  for (uint32_t i = 0; i < up->num_pages_; ++i) {
    if (!up->HasSlot(i)) {
      ++present;
      continue;
    }
    const uint32_t slot = up->slots_[up->SlotIndex(i)];
    const PageHandle h = ns_.slots_.HandleOf(slot);
    absl::StatusOr<RadixIndex::InsertResult> r = ns_.index_.Insert(
        absl::MakeConstSpan(up->tokens_).subspan(ns_.ElementsOf(i), ns_.epp_),
        absl::MakeConstSpan(&h, 1));
    KVH_CHECK(r.ok(), "one-page insert refused: %s", r.status().message());
    if (r->already_present_tokens > 0) {
      ns_.slots_.Free(absl::MakeConstSpan(&slot, 1));
      ++present;
    } else {
      ns_.slots_.Index(slot, up->computed_[i], uint64_t{i} * ps);
    }
  }
  return present;
}

void Uploads::EndLocked(Upload* up) {
  for (RadixNode* node : up->locked_) ns_.index_.Unlock(node);
  up->locked_.clear();
  up->slots_.clear();
  up->done_ = true;
  absl::MutexLock count(&mu_);
  --in_flight_;
}

void Uploads::Abort(Upload* up) {
  absl::MutexLock l(&ns_.mu_);
  ns_.slots_.Free(up->slots_);
  EndLocked(up);
}

void Uploads::PromoteLocked(Upload* up, absl::Span<const PageHandle> current) {
  const uint32_t ps = ns_.config_.geometry.page_size;
  for (uint32_t i = up->skip_pages_; i < up->present_pages_; ++i) {
    const uint32_t slot = up->slots_[i - up->skip_pages_];
    if (!ns_.cold_.Contains(
            current[i])) {  // another upload promoted it already
      ns_.slots_.Free(absl::MakeConstSpan(&slot, 1));
      continue;
    }
    // In path order.
    PromoteOneLocked(current[i], slot, up->computed_[i], uint64_t{i} * ps);
  }
}

void Uploads::PromoteOneLocked(PageHandle old_h, uint32_t slot,
                               uint64_t checksum, uint64_t first_position) {
  const PageHandle new_h = ns_.slots_.HandleOf(slot);
  // The caller promotes in path order from a raw page: neither may refuse.
  KVH_CHECK(
      ns_.index_.ReplaceHandle(old_h, new_h).ok() &&
          ns_.index_.SetTier(new_h, Tier::kRaw, /*allow_locked=*/true).ok(),
      "promotion of cold page %#x into slot %u refused", old_h, slot);
  // A lease taken while the page was cold lists it by its old handle;
  // keep it pointing at the page (PinLease relies on leased pages
  // resolving).
  ns_.leases_.ReplaceHandle(old_h, new_h);
  ns_.cold_.Drop(old_h);
  ns_.slots_.Index(slot, checksum, first_position);
  ++ns_.counters_.promoted_pages;
}

absl::StatusOr<std::vector<uint32_t>> Uploads::ReserveLocked(
    uint32_t n, uint32_t* evicted, bool* budget_full) {
  if (n > ns_.slots_.capacity()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "token_ids: %u new pages do not fit in namespace '%s' (capacity %u "
        "pages)",
        n, ns_.config_.name, ns_.slots_.capacity()));
  }
  // Tiered: demotion (MakeRoom) came first, so this is the fallback, and it
  // takes only raw pages whose slot is free at once. A cold page frees no
  // slot, and a pinned raw page (read, or mid-demotion: its move would find
  // it gone) frees its slot only at its last unpin; dropping either loses
  // cached data for nothing. Untiered: any unlocked page, LRU first.
  std::vector<PageHandle> victims;
  uint32_t free;
  while ((free = ns_.slots_.free_count()) < n) {
    victims.clear();
    const size_t want = n - free;
    const size_t got = ns_.tiered() ? ns_.EvictFreeAtOnceLocked(want)
                                    : ns_.index_.Evict(want, &victims);
    if (got == 0) break;
    *evicted += got;
    if (!ns_.tiered()) ns_.RetireLocked(victims);
  }
  if (ns_.slots_.free_count() < n) return FullErrorLocked(n);
  return ns_.AllocateSlotsLocked(n, budget_full);
}

absl::Status Uploads::FullErrorLocked(uint32_t n) const {
  const SlotTable::Census c = ns_.slots_.Count(
      [this](PageHandle h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu_) {
        return ns_.index_.IsLocked(h);  // under ns_.mu_, held by the caller
      });
  const uint32_t other = c.other;
  std::string cold;
  if (ns_.tiered() && other > 0) {
    cold = absl::StrFormat(", %u hold raw pages extended by cold ones", other);
  }
  if (ns_.tiered()) cold += " (cold pages are never dropped to make room)";
  const uint32_t free = ns_.slots_.free_count();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "namespace '%s' is full: %u pages needed, %u free; of the other %u "
      "slots %u are reserved by uploads in progress, %u locked by leases or "
      "uploads, %u pinned by reads or tier moves%s",
      ns_.config_.name, n, free, ns_.slots_.capacity() - free, c.reserved,
      c.locked, c.pinned, cold));
}

uint64_t Uploads::in_flight() const {
  absl::MutexLock l(&mu_);
  return in_flight_;
}

}  // namespace kvharbor
