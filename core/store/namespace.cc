#include "core/store/namespace.h"

#include <unistd.h>
#include <xxh3.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/base/check.h"
#include "core/base/status_macros.h"
#include "core/index/page_key.h"

namespace kvharbor {

// ---------------------------------------------------------------------------
// Construction

absl::StatusOr<std::shared_ptr<Namespace>> Namespace::Create(
    NamespaceConfig config, std::unique_ptr<PagePool> pool) {
  KVH_RETURN_IF_ERROR(config.geometry.Validate("geometry"));
  if (pool == nullptr || pool->slot_bytes() != config.geometry.PageBytes()) {
    return absl::InvalidArgumentError(
        "namespace: pool slot size does not match the page size");
  }
  if (config.tier_codec == nullptr) {
    CodecParams params;
    params.geometry = config.geometry;
    KVH_ASSIGN_OR_RETURN(config.tier_codec, CreateIdentityCodec(params));
  }
  if (!config.disk_dir.empty() && config.host_compressed_bytes == 0) {
    return absl::InvalidArgumentError(
        "disk_dir: a disk tier needs a host-compressed tier "
        "(host_compressed_bytes > 0)");
  }
  if (config.tier_batch_pages == 0) {
    return absl::InvalidArgumentError("tier_batch_pages: must be >= 1");
  }
  std::unique_ptr<DiskTier> disk;
  if (!config.disk_dir.empty()) {
    KVH_ASSIGN_OR_RETURN(
        disk, DiskTier::Open(config.disk_dir, "disk_dir", config.file_ops));
  }
  std::shared_ptr<Namespace> ns(
      new Namespace(std::move(config), std::move(pool), std::move(disk)));
  KVH_RETURN_IF_ERROR(ns->calibrations_.Init());
  if (ns->disk_ != nullptr) {
    ns->calibrations_.Restore();
    KVH_RETURN_IF_ERROR(ns->LoadDiskTier());
    // Restored calibrations no remaining page needs.
    ns->calibrations_.ForgetUnused();
  }
  return ns;
}

Namespace::Namespace(NamespaceConfig config, std::unique_ptr<PagePool> pool,
                     std::unique_ptr<DiskTier> disk)
    : config_(std::move(config)),
      page_bytes_(config_.geometry.PageBytes()),
      epp_(config_.key_kind == KeyKind::kPageKeys ? kPageKeyWords
                                                  : config_.geometry.page_size),
      pool_(std::move(pool)),
      disk_(std::move(disk)),
      calibrations_(config_),
      tiers_(this, config_, pool_.get(), disk_.get(), &calibrations_),
      index_(epp_) {}

Namespace::~Namespace() {
  // The pool and every buffer go with the namespace.
  if (config_.budget != nullptr) config_.budget->Release(charged_.load());
}

absl::Duration Namespace::ClampTtl(absl::Duration ttl) const {
  if (ttl <= absl::ZeroDuration()) ttl = config_.default_lease_ttl;
  return std::min(ttl, config_.max_lease_ttl);
}

// ---------------------------------------------------------------------------
// Match and leases

absl::Status Namespace::CheckElements(absl::Span<const Token> elements,
                                      absl::string_view field) const {
  if (config_.key_kind == KeyKind::kTokens) {
    return ValidateTokens(elements, config_.max_tokens_per_request, field);
  }
  // Page keys: encoded by the caller (core/index/page_key.h), whole pages;
  // the request limit counts page_size tokens per key.
  const uint64_t max_keys =
      config_.max_tokens_per_request / config_.geometry.page_size;
  if (elements.empty() || elements.size() % epp_ != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %u elements is not a whole, non-zero number of page keys", field,
        elements.size()));
  }
  if (elements.size() / epp_ > max_keys) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %u page keys, over the limit of %u per request (%u tokens of "
        "page_size %u)",
        field, elements.size() / epp_, max_keys, config_.max_tokens_per_request,
        config_.geometry.page_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<Namespace::MatchOutcome> Namespace::Match(
    absl::Span<const Token> elements, bool lock, absl::Duration ttl) {
  return Match(elements, lock, ttl, [] { return absl::OkStatus(); });
}

absl::StatusOr<Namespace::MatchOutcome> Namespace::Match(
    absl::Span<const Token> elements, bool lock, absl::Duration ttl,
    absl::FunctionRef<absl::Status()> keep_going) {
  KVH_RETURN_IF_ERROR(CheckElements(
      elements,
      config_.key_kind == KeyKind::kTokens ? "token_ids" : "page_keys"));
  const uint32_t ps = config_.geometry.page_size;
  MatchOutcome out;
  out.pages.reserve(elements.size() / epp_);
  out.tiers.reserve(elements.size() / epp_);
  absl::MutexLock l(&mu_);
  KVH_ASSIGN_OR_RETURN(
      RadixIndex::MatchResult m,
      index_.Match(elements, &out.pages, &out.tiers, keep_going));
  if (!corrupt_pending_.empty()) TruncateAtCorruptLocked(elements, &m, &out);
  out.matched_tokens = out.pages.size() * ps;
  counters_.hit_tokens += out.matched_tokens;
  // Asked: the tokens (a trailing partial page included), or ps per key.
  const uint64_t asked = config_.key_kind == KeyKind::kTokens
                             ? elements.size()
                             : elements.size() / epp_ * ps;
  counters_.miss_tokens += asked - out.matched_tokens;
  if (lock && m.matched_tokens > 0) {
    uint64_t id;
    do {
      id = absl::Uniform<uint64_t>(rng_);
    } while (id == 0 || leases_.contains(id));
    index_.Lock(m.node);
    out.lease_id = id;
    out.lease_expiry = absl::Now() + ClampTtl(ttl);
    leases_.emplace(id, Lease{m.node, out.pages, out.lease_expiry});
    absl::MutexLock ids(&lease_ids_mu_);
    lease_ids_.insert(id);
  }
  return out;
}

void Namespace::TruncateAtCorruptLocked(absl::Span<const Token> elements,
                                        RadixIndex::MatchResult* m,
                                        MatchOutcome* out) {
  size_t keep = 0;
  while (keep < out->pages.size() &&
         !corrupt_pending_.contains(out->pages[keep])) {
    ++keep;
  }
  if (keep == out->pages.size()) return;
  // A page found corrupt while leased: a miss from there on, so that no new
  // lease keeps it alive (it goes when the leases holding it end).
  out->pages.resize(keep);
  out->tiers.resize(keep);
  std::vector<PageHandle> again;
  *m = index_.Match(elements.first(keep * epp_), &again);
}

void Namespace::ReleaseLeaseLocked(uint64_t id) {
  auto it = leases_.find(id);
  index_.Unlock(it->second.node);
  leases_.erase(it);
  absl::MutexLock ids(&lease_ids_mu_);
  lease_ids_.erase(id);
}

absl::Status Namespace::Release(uint64_t lease_id) {
  std::vector<std::string> lines;
  {
    absl::MutexLock l(&mu_);
    KVH_RETURN_IF_ERROR(FindLeaseLocked(lease_id).status());
    ReleaseLeaseLocked(lease_id);
    DropPendingCorruptLocked(&lines);
  }
  for (const std::string& line : lines) LogWarning(config_, line);
  return absl::OkStatus();
}

absl::StatusOr<Namespace::Lease*> Namespace::FindLeaseLocked(uint64_t id) {
  auto it = leases_.find(id);
  if (it == leases_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("lease_id: %u is not an active lease of namespace '%s'",
                        id, config_.name));
  }
  return &it->second;
}

absl::StatusOr<const Namespace::Lease*> Namespace::FindLeaseLocked(
    uint64_t id) const {
  return const_cast<Namespace*>(this)->FindLeaseLocked(id);
}

absl::StatusOr<std::vector<uint32_t>> Namespace::RawSlotsOfLeaseLocked(
    uint64_t lease_id, const Lease& lease, absl::string_view not_raw) const {
  std::vector<uint32_t> slots;
  slots.reserve(lease.pages.size());
  for (size_t i = 0; i < lease.pages.size(); ++i) {
    KVH_ASSIGN_OR_RETURN(Located loc, LocateLocked(lease.pages[i]));
    if (loc.tier != Tier::kRaw) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "pages[%u]: page %016x of lease %u is in tier %s, %s", i,
          lease.pages[i], lease_id, TierName(loc.tier), not_raw));
    }
    slots.push_back(loc.slot);
  }
  return slots;
}

absl::StatusOr<absl::Time> Namespace::ExtendLease(uint64_t lease_id,
                                                  absl::Duration ttl) {
  absl::MutexLock l(&mu_);
  KVH_ASSIGN_OR_RETURN(Lease * lease, FindLeaseLocked(lease_id));
  lease->expiry = absl::Now() + ClampTtl(ttl);
  return lease->expiry;
}

bool Namespace::HasLease(uint64_t lease_id) const {
  absl::MutexLock l(&lease_ids_mu_);
  return lease_ids_.contains(lease_id);
}

size_t Namespace::ReapExpiredLeases(absl::Time now) {
  std::vector<uint64_t> expired;
  std::vector<std::string> lines;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, lease] : leases_) {
      if (lease.expiry < now) expired.push_back(id);
    }
    for (uint64_t id : expired) ReleaseLeaseLocked(id);
    // Also catches pending pages an upload held: the reaper runs often.
    if (!corrupt_pending_.empty()) DropPendingCorruptLocked(&lines);
  }
  for (const std::string& line : lines) LogWarning(config_, line);
  return expired.size();
}

void Namespace::ReleaseAllLeases() {
  std::vector<std::string> lines;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, lease] : leases_) index_.Unlock(lease.node);
    leases_.clear();
    {
      absl::MutexLock ids(&lease_ids_mu_);
      lease_ids_.clear();
    }
    DropPendingCorruptLocked(&lines);
  }
  for (const std::string& line : lines) LogWarning(config_, line);
}

// ---------------------------------------------------------------------------
// Slot table

absl::StatusOr<uint32_t> Namespace::ResolveLocked(PageHandle h) const {
  const uint32_t slot = static_cast<uint32_t>(h);
  const uint32_t gen = static_cast<uint32_t>(h >> 32);
  if (slot >= slots_.size() || slots_[slot].state != SlotState::kIndexed ||
      slots_[slot].generation != gen) {
    return absl::NotFoundError(absl::StrFormat(
        "%#x is not a cached page of namespace '%s'", h, config_.name));
  }
  return slot;
}

void Namespace::FreeSlotLocked(uint32_t slot) {
  slots_[slot].state = SlotState::kFree;
  slots_[slot].checksum = 0;
  pool_->Free(slot);
}

void Namespace::RetireLocked(absl::Span<const PageHandle> handles) {
  for (PageHandle h : handles) {
    if (cold_.contains(h)) {
      DropColdLocked(h);
      ++counters_.evicted_pages;
      continue;
    }
    const uint32_t slot = static_cast<uint32_t>(h);
    Slot& s = slots_[slot];
    KVH_CHECK(s.state == SlotState::kIndexed &&
                  s.generation == static_cast<uint32_t>(h >> 32),
              "the index returned page %#x, which the slot table never gave "
              "it",
              h);
    // A new generation makes every outstanding handle of this page stale.
    if (++s.generation == 0) s.generation = 1;
    ++counters_.evicted_pages;
    if (s.pins > 0) {
      s.state = SlotState::kZombie;  // freed by the last unpin
    } else {
      FreeSlotLocked(slot);
    }
  }
  SyncMetaChargeLocked();
}

void Namespace::UnpinLocked(absl::Span<const uint32_t> slots) {
  for (uint32_t slot : slots) {
    if (slot == kNoSlot) continue;
    Slot& s = slots_[slot];
    if (--s.pins == 0 && s.state == SlotState::kZombie) FreeSlotLocked(slot);
  }
}

absl::StatusOr<std::vector<uint32_t>> Namespace::ReserveLocked(
    uint32_t n, uint32_t* evicted, bool* budget_full) {
  if (n > pool_->capacity()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "token_ids: %u new pages do not fit in namespace '%s' (capacity %u "
        "pages)",
        n, config_.name, pool_->capacity()));
  }
  // Tiered: demotion (MakeRoom) came first, so this is the fallback, and it
  // takes only raw pages whose slot is free at once. A cold page frees no
  // slot, and a pinned raw page (read, or mid-demotion: its move would find
  // it gone) frees its slot only at its last unpin; dropping either loses
  // cached data for nothing. Untiered: any unlocked page, LRU first.
  std::vector<PageHandle> victims;
  while (pool_->free_count() < n) {
    victims.clear();
    const size_t want = n - pool_->free_count();
    const size_t got =
        tiered() ? EvictFreeAtOnceLocked(want) : index_.Evict(want, &victims);
    if (got == 0) break;
    *evicted += got;
    if (!tiered()) RetireLocked(victims);
  }
  if (pool_->free_count() < n) return FullErrorLocked(n);
  return AllocateSlotsLocked(n, budget_full);
}

size_t Namespace::EvictFreeAtOnceLocked(size_t n) {
  const auto free_at_once = [this](PageHandle h,
                                   Tier t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return t == Tier::kRaw && slots_[static_cast<uint32_t>(h)].pins == 0;
  };
  std::vector<PageHandle> victims;
  const size_t got = index_.EvictIf(n, free_at_once, &victims);
  RetireLocked(victims);
  return got;
}

uint64_t Namespace::page_meta_bytes() const {
  // The slot table entry, the free list's, and the index: a node, its
  // handle map entry and LRU place, and the page's token ids.
  return sizeof(Slot) + 8 + 160 +
         uint64_t{config_.geometry.page_size} * sizeof(Token);
}

absl::StatusOr<std::vector<uint32_t>> Namespace::AllocateSlotsLocked(
    uint32_t n, bool* budget_full) {
  const uint32_t warm = pool_->committed_free_count();
  const uint64_t fresh = n > warm ? n - warm : 0;
  const uint64_t commit = fresh * pool_->host_bytes_per_slot();
  if (MemoryBudget* b = config_.budget.get(); b != nullptr) {
    // The new pages' metadata must fit too; it is charged when they are
    // indexed (SyncMetaChargeLocked), so only checked here.
    const uint64_t meta = uint64_t{n} * page_meta_bytes();
    if (!b->TryCharge(commit + meta)) {
      if (budget_full != nullptr) *budget_full = true;
      return absl::ResourceExhaustedError(absl::StrFormat(
          "store.pool_budget_bytes: the daemon's memory budget of %u bytes "
          "has %u free, not enough for %u new pages of namespace '%s' (%u "
          "bytes with their metadata)",
          b->capacity(), b->free_bytes(), n, config_.name, commit + meta));
    }
    b->Release(meta);
  }
  absl::StatusOr<std::vector<uint32_t>> slots = pool_->Allocate(n);
  if (!slots.ok()) {
    if (config_.budget != nullptr) config_.budget->Release(commit);
    return slots;
  }
  committed_slots_ += fresh;
  charged_.fetch_add(commit, std::memory_order_relaxed);
  if (pool_->high_water() > slots_.size()) slots_.resize(pool_->high_water());
  for (uint32_t s : *slots) slots_[s].state = SlotState::kReserved;
  SyncMetaChargeLocked();
  return slots;
}

void Namespace::DiscardFreeSlotsLocked() {
  const uint32_t n = pool_->Discard(UINT32_MAX);
  if (n == 0) return;
  const uint64_t bytes = uint64_t{n} * pool_->host_bytes_per_slot();
  committed_slots_ -= n;
  charged_.fetch_sub(bytes, std::memory_order_relaxed);
  if (config_.budget != nullptr) config_.budget->Release(bytes);
}

void Namespace::SyncMetaChargeLocked() {
  constexpr uint64_t kColdEntry =
      sizeof(std::pair<const PageHandle, ColdPage>) + 1;
  const uint64_t target =
      slots_.capacity() * sizeof(Slot) + uint64_t{pool_->high_water()} * 8 +
      index_.total_pages() * (page_meta_bytes() - sizeof(Slot) - 8) +
      cold_.capacity() * kColdEntry +
      cold_bytes_[static_cast<int>(Tier::kHostCompressed)];
  if (target == meta_charged_) return;
  if (target > meta_charged_) {
    const uint64_t d = target - meta_charged_;
    if (config_.budget != nullptr) config_.budget->ForceCharge(d);
    charged_.fetch_add(d, std::memory_order_relaxed);
  } else {
    const uint64_t d = meta_charged_ - target;
    if (config_.budget != nullptr) config_.budget->Release(d);
    charged_.fetch_sub(d, std::memory_order_relaxed);
  }
  meta_charged_ = target;
}

uint64_t Namespace::ReclaimMemory(uint64_t bytes) {
  const uint64_t before = memory_bytes();
  const auto freed = [&] {
    const uint64_t now = memory_bytes();
    return before > now ? before - now : 0;
  };
  {
    absl::MutexLock l(&mu_);
    DiscardFreeSlotsLocked();
  }
  const uint64_t per_page =
      std::max<uint64_t>(1, pool_->host_bytes_per_slot() + page_meta_bytes());
  // Raw pages leave only where that frees host memory (not a sealed shared
  // arena, not device memory): else they would be lost for nothing.
  const bool raw_frees = pool_->returns_memory();
  while (freed() < bytes) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(
        (bytes - freed() + per_page - 1) / per_page, config_.tier_batch_pages));
    size_t moved = 0;
    if (tiered()) {
      moved = tiers_.ShedColdest(want, raw_frees);
    } else if (raw_frees) {
      absl::MutexLock l(&mu_);
      moved = EvictFreeAtOnceLocked(want);
    }
    {
      absl::MutexLock l(&mu_);
      DiscardFreeSlotsLocked();
    }
    if (moved == 0) break;
  }
  return freed();
}

absl::Status Namespace::FullErrorLocked(uint32_t n) const {
  uint32_t reserved = 0, locked = 0, pinned = 0, other = 0;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state == SlotState::kReserved) {
      ++reserved;
    } else if (s.state == SlotState::kZombie) {
      ++pinned;  // its page is gone or cold; a read still holds the slot
    } else if (s.state == SlotState::kIndexed) {
      if (index_.IsLocked(MakeHandle(i, s.generation))) {
        ++locked;
      } else if (s.pins > 0) {
        ++pinned;
      } else {
        ++other;
      }
    }
  }
  std::string cold;
  if (tiered() && other > 0) {
    cold = absl::StrFormat(", %u hold raw pages extended by cold ones", other);
  }
  if (tiered()) cold += " (cold pages are never dropped to make room)";
  return absl::ResourceExhaustedError(absl::StrFormat(
      "namespace '%s' is full: %u pages needed, %u free; of the other %u "
      "slots %u are reserved by uploads in progress, %u locked by leases or "
      "uploads, %u pinned by reads or tier moves%s",
      config_.name, n, pool_->free_count(),
      pool_->capacity() - pool_->free_count(), reserved, locked, pinned, cold));
}

// ---------------------------------------------------------------------------
// Eviction

absl::StatusOr<Namespace::EvictOutcome> Namespace::EvictPages(
    absl::Span<const PageHandle> pages) {
  if (pages.empty()) {
    return absl::InvalidArgumentError("pages.page_handles: empty");
  }
  absl::MutexLock l(&mu_);
  for (size_t i = 0; i < pages.size(); ++i) {
    absl::StatusOr<Located> loc = LocateLocked(pages[i]);
    if (!loc.ok()) {
      return absl::NotFoundError(absl::StrFormat("pages.page_handles[%u]: %s",
                                                 i, loc.status().message()));
    }
  }
  std::vector<PageHandle> removed;
  KVH_RETURN_IF_ERROR(index_.Erase(pages, &removed));
  RetireLocked(removed);
  DiscardFreeSlotsLocked();  // the memory goes back to the system
  return EvictOutcome{removed.size(), removed.size() * page_bytes_};
}

Namespace::EvictOutcome Namespace::EvictBytes(uint64_t bytes) {
  const uint64_t want = (bytes + page_bytes_ - 1) / page_bytes_;
  absl::MutexLock l(&mu_);
  std::vector<PageHandle> removed;
  index_.Evict(static_cast<size_t>(std::min<uint64_t>(want, SIZE_MAX)),
               &removed);
  RetireLocked(removed);
  DiscardFreeSlotsLocked();
  return EvictOutcome{removed.size(), removed.size() * page_bytes_};
}

Namespace::EvictOutcome Namespace::EvictAll() {
  absl::MutexLock l(&mu_);
  std::vector<PageHandle> removed;
  index_.EvictAll(&removed);
  RetireLocked(removed);
  DiscardFreeSlotsLocked();
  return EvictOutcome{removed.size(), removed.size() * page_bytes_};
}

// ---------------------------------------------------------------------------
// Introspection

NamespaceStats Namespace::Counters() const {
  NamespaceStats c = CountersWithoutCalibration();
  // After mu_: the calibrations' lock is never taken under it.
  c.calibration = calibrations_.status();
  return c;
}

NamespaceStats Namespace::CountersWithoutCalibration() const {
  absl::MutexLock l(&mu_);
  NamespaceStats c = counters_;
  c.name = config_.name;
  c.capacity_pages = pool_->capacity();
  c.free_pages = pool_->free_count();
  c.cached_pages = index_.total_pages();
  c.evictable_pages = index_.evictable_pages();
  c.protected_pages = index_.protected_pages();
  c.active_leases = leases_.size();
  c.index_nodes = index_.node_count();
  c.index_memory_bytes = index_.MemoryBytes();
  c.page_bytes = page_bytes_;
  c.uploads_in_flight = uploads_in_flight_;
  c.memory_bytes = charged_.load(std::memory_order_relaxed);
  c.bytes_out = bytes_out_.load(std::memory_order_relaxed);
  c.host_ipc_bytes = host_ipc_bytes_.load(std::memory_order_relaxed);
  c.tiers.resize(kNumTiers);
  for (int t = 0; t < kNumTiers; ++t) {
    const Tier tier = static_cast<Tier>(t);
    const uint64_t pages = index_.tier_pages(tier);
    c.tiers[t] = TierStats{
        tier, pages, tier == Tier::kRaw ? pages * page_bytes_ : cold_bytes_[t]};
  }
  for (const auto& [name, s] : codec_cold_) c.codecs.push_back(s);
  return c;
}

std::vector<CalibrationInfo> Namespace::ListCalibrations() {
  calibrations_.ForgetUnused();
  absl::flat_hash_map<uint64_t, uint64_t> pages;  // fingerprint -> pages
  {
    absl::MutexLock l(&mu_);
    for (const auto& [h, c] : cold_) {
      if (c.codec != nullptr) ++pages[c.codec->calibration_fingerprint()];
    }
  }
  return calibrations_.List(pages);
}

std::string Namespace::DumpTree(size_t max_nodes) const {
  absl::MutexLock l(&mu_);
  return index_.Dump(max_nodes, config_.key_kind == KeyKind::kPageKeys);
}

bool Namespace::Busy() const {
  absl::MutexLock l(&mu_);
  return !leases_.empty() || uploads_in_flight_ > 0;
}

absl::Status Namespace::CheckInvariants() const {
  absl::MutexLock l(&mu_);
  if (!tiered() && !cold_.empty()) {
    return absl::InternalError("cold pages in a namespace without tiers");
  }
  KVH_RETURN_IF_ERROR(index_.CheckInvariants());
  size_t free = 0, indexed = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state == SlotState::kFree) ++free;
    if (s.state == SlotState::kIndexed) ++indexed;
    if (s.state == SlotState::kZombie && s.pins == 0) {
      return absl::InternalError(
          absl::StrFormat("slot %u: retired but not freed without pins", i));
    }
    if (s.pins > 0 && s.state != SlotState::kIndexed &&
        s.state != SlotState::kZombie) {
      return absl::InternalError(
          absl::StrFormat("slot %u: pinned but not holding a page", i));
    }
    // With the count check below this makes indexed slots and raw index
    // pages a bijection: every indexed slot is referenced exactly once.
    if (s.state == SlotState::kIndexed) {
      const absl::StatusOr<Tier> t =
          index_.TierOf(MakeHandle(static_cast<uint32_t>(i), s.generation));
      if (!t.ok() || *t != Tier::kRaw) {
        return absl::InternalError(absl::StrFormat(
            "slot %u: indexed but its handle is not a raw index page", i));
      }
    }
  }
  // The slot table ends at the pool's high-water mark: slots past it were
  // never handed out.
  free += pool_->capacity() - slots_.size();
  if (free != pool_->free_count()) {
    return absl::InternalError(
        absl::StrFormat("slot table has %u free slots, the pool %u", free,
                        pool_->free_count()));
  }
  if (config_.budget != nullptr &&
      charged_.load() !=
          committed_slots_ * pool_->host_bytes_per_slot() + meta_charged_) {
    return absl::InternalError("budget charge disagrees with its parts");
  }
  if (indexed != index_.tier_pages(Tier::kRaw)) {
    return absl::InternalError(absl::StrFormat(
        "slot table has %u indexed slots, the index %u raw pages", indexed,
        index_.tier_pages(Tier::kRaw)));
  }
  return CheckColdLocked();
}

}  // namespace kvharbor
