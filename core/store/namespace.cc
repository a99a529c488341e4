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
#include "core/store/uploads.h"

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
      epp_(UsesPageKeys(config_.key_kind) ? kPageKeyWords
                                          : config_.geometry.page_size),
      pool_(std::move(pool)),
      disk_(std::move(disk)),
      calibrations_(config_),
      tiers_(this, config_, pool_.get(), disk_.get(), &calibrations_),
      leases_(config_.name, config_.default_lease_ttl, config_.max_lease_ttl),
      slots_(config_.name, pool_.get(), config_.budget, config_.device_tier),
      cold_(disk_.get(), pool_.get(), calibrations_),
      uploads_(std::make_unique<Uploads>(*this)),
      index_(epp_) {}

Namespace::~Namespace() {
  // The pool and every buffer go with the namespace.
  if (config_.budget != nullptr) config_.budget->Release(memory_bytes());
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

bool Namespace::ElementsValid(absl::Span<const Token> elements) const {
  if (!UsesPageKeys(config_.key_kind)) {
    return std::all_of(elements.begin(), elements.end(),
                       [](Token t) { return t >= 0; });
  }
  for (size_t i = 0; i + epp_ <= elements.size(); i += epp_) {
    if (DecodePageKey(elements.data() + i).empty()) return false;
  }
  return true;
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
  LeaseTable::Nodes nodes;
  absl::MutexLock l(&mu_);
  if (IndependentPages(config_.key_kind)) {
    KVH_RETURN_IF_ERROR(MatchEachLocked(elements, keep_going, &out, &nodes));
  } else {
    KVH_ASSIGN_OR_RETURN(
        RadixIndex::MatchResult m,
        index_.Match(elements, &out.pages, &out.tiers, keep_going));
    if (!corrupt_pending_.empty()) TruncateAtCorruptLocked(elements, &m, &out);
    if (m.matched_tokens > 0) nodes.push_back(m.node);
  }
  out.matched_tokens = out.pages.size() * ps;
  counters_.hit_tokens += out.matched_tokens;
  // Asked: the tokens (a trailing partial page included), or ps per key.
  const uint64_t asked = config_.key_kind == KeyKind::kTokens
                             ? elements.size()
                             : elements.size() / epp_ * ps;
  counters_.miss_tokens += asked - out.matched_tokens;
  if (lock && out.matched_tokens > 0) {
    KVH_RETURN_IF_ERROR(CheckLeaseRoomLocked(out.pages.size(), nodes.size()));
    for (RadixNode* node : nodes) index_.Lock(node);
    out.lease_id =
        leases_.Add(std::move(nodes), out.pages, ttl, &out.lease_expiry);
    SyncMetaChargeLocked();  // the lease's record is charged to the budget
  }
  return out;
}

absl::Status Namespace::MatchEachLocked(
    absl::Span<const Token> elements,
    absl::FunctionRef<absl::Status()> keep_going, MatchOutcome* out,
    LeaseTable::Nodes* nodes) {
  // Each page is a one-page path under the root, found through the root's
  // child hash (O(1) per key). First count the present run without changing
  // anything, polling the caller's deadline, so that a stopped Match
  // changed nothing (not even LRU times); then take the run.
  constexpr size_t kPollKeys = 4096;
  const size_t keys = elements.size() / epp_;
  size_t run = 0;
  while (run < keys) {
    if (run % kPollKeys == kPollKeys - 1) KVH_RETURN_IF_ERROR(keep_going());
    if (index_.PeekMatchTokens(elements.subspan(run * epp_, epp_)) == 0) break;
    ++run;
  }
  nodes->reserve(run);
  for (size_t i = 0; i < run; ++i) {
    const size_t before = out->pages.size();
    RadixIndex::MatchResult m =
        index_.Match(elements.subspan(i * epp_, epp_), &out->pages);
    KVH_CHECK(out->pages.size() == before + 1,
              "page key %u vanished under the index lock", i);
    // A page found corrupt while leased is a miss from there on, so that no
    // new lease keeps it alive (it goes when the leases holding it end).
    if (corrupt_pending_.contains(out->pages.back())) {
      out->pages.pop_back();
      break;
    }
    KVH_ASSIGN_OR_RETURN(Tier tier, index_.TierOf(out->pages.back()));
    out->tiers.push_back(tier);
    nodes->push_back(m.node);
  }
  return absl::OkStatus();
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

absl::Status Namespace::CheckLeaseRoomLocked(size_t pages, size_t nodes) {
  // Lease records are the one thing a client makes the daemon hold for
  // pages it already stores: bounded by the namespace's own memory (pages
  // and metadata; at least kMinLeaseBytes), so a loop of locked Matches
  // cannot grow the daemon past its budget (issue 34, row 3).
  const uint64_t held = leases_.bytes();
  const uint64_t add = pages * sizeof(PageHandle) + nodes * sizeof(RadixNode*) +
                       LeaseTable::kRecordBytes;
  const uint64_t own = memory_bytes() - std::min(memory_bytes(), held);
  const uint64_t limit = std::max(kMinLeaseBytes, own);
  if (held + add <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "lock: the %u leases of namespace '%s' already hold %u bytes of "
      "records for %u page references, and this one needs %u more (at most "
      "%u: the namespace's own memory, or %u bytes); release leases, or "
      "Match without lock",
      leases_.size(), config_.name, held, leases_.page_refs(), add, limit,
      kMinLeaseBytes));
}

absl::Status Namespace::ReleaseLeaseLocked(uint64_t id) {
  KVH_ASSIGN_OR_RETURN(const LeaseTable::Nodes nodes, leases_.Remove(id));
  for (RadixNode* node : nodes) index_.Unlock(node);
  SyncMetaChargeLocked();
  return absl::OkStatus();
}

absl::Status Namespace::Release(uint64_t lease_id) {
  std::vector<std::string> lines;
  {
    absl::MutexLock l(&mu_);
    KVH_RETURN_IF_ERROR(ReleaseLeaseLocked(lease_id));
    DropPendingCorruptLocked(&lines);
  }
  for (const std::string& line : lines) LogWarning(config_, line);
  return absl::OkStatus();
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
  return leases_.Extend(lease_id, ttl);
}

bool Namespace::HasLease(uint64_t lease_id) const {
  return leases_.Contains(lease_id);
}

size_t Namespace::ReapExpiredLeases(absl::Time now) {
  std::vector<std::string> lines;
  size_t reaped = 0;
  {
    absl::MutexLock l(&mu_);
    for (const LeaseTable::Nodes& nodes : leases_.RemoveExpired(now)) {
      for (RadixNode* node : nodes) index_.Unlock(node);
      ++reaped;
    }
    if (reaped > 0) SyncMetaChargeLocked();
    // Also catches pending pages an upload held: the reaper runs often.
    if (!corrupt_pending_.empty()) DropPendingCorruptLocked(&lines);
  }
  for (const std::string& line : lines) LogWarning(config_, line);
  return reaped;
}

void Namespace::ReleaseAllLeases() {
  std::vector<std::string> lines;
  {
    absl::MutexLock l(&mu_);
    for (const LeaseTable::Nodes& nodes : leases_.RemoveAll()) {
      for (RadixNode* node : nodes) index_.Unlock(node);
    }
    SyncMetaChargeLocked();
    DropPendingCorruptLocked(&lines);
  }
  for (const std::string& line : lines) LogWarning(config_, line);
}

// ---------------------------------------------------------------------------
// Slot table

void Namespace::RetireLocked(absl::Span<const PageHandle> handles) {
  std::vector<PageHandle> raw;
  raw.reserve(handles.size());
  for (PageHandle h : handles) {
    if (cold_.Contains(h)) {
      cold_.Drop(h);
    } else {
      raw.push_back(h);
    }
  }
  counters_.evicted_pages += handles.size();
  slots_.Retire(raw);
  SyncMetaChargeLocked();
}

size_t Namespace::EvictFreeAtOnceLocked(size_t n) {
  const auto free_at_once = [this](PageHandle h,
                                   Tier t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return t == Tier::kRaw && slots_.Unpinned(static_cast<uint32_t>(h));
  };
  std::vector<PageHandle> victims;
  const size_t got = index_.EvictIf(n, free_at_once, &victims);
  RetireLocked(victims);
  return got;
}

uint64_t Namespace::page_meta_bytes() const {
  // The slot table entry, the free list's, and the index: a node, its
  // handle map entry and LRU place, and the page's token ids.
  return SlotTable::MetaBytesPerSlot() + 160 +
         uint64_t{config_.geometry.page_size} * sizeof(Token);
}

absl::StatusOr<std::vector<uint32_t>> Namespace::AllocateSlotsLocked(
    uint32_t n, bool* budget_full) {
  absl::StatusOr<std::vector<uint32_t>> slots =
      slots_.Allocate(n, page_meta_bytes(), budget_full);
  if (slots.ok()) SyncMetaChargeLocked();
  return slots;
}

void Namespace::SyncMetaChargeLocked() {
  const uint64_t target =
      slots_.meta_bytes() +
      index_.total_pages() *
          (page_meta_bytes() - SlotTable::MetaBytesPerSlot()) +
      cold_.memory_bytes() + leases_.bytes();
  const uint64_t charged = meta_charged_.load(std::memory_order_relaxed);
  if (target == charged) return;
  if (target > charged) {
    if (config_.budget != nullptr)
      config_.budget->ForceCharge(target - charged);
  } else {
    if (config_.budget != nullptr) config_.budget->Release(charged - target);
  }
  meta_charged_.store(target, std::memory_order_relaxed);
}

uint64_t Namespace::ReclaimMemory(uint64_t bytes) {
  const uint64_t before = memory_bytes();
  const auto freed = [&] {
    const uint64_t now = memory_bytes();
    return before > now ? before - now : 0;
  };
  slots_.DiscardFree();
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
    slots_.DiscardFree();
    if (moved == 0) break;
  }
  return freed();
}

// ---------------------------------------------------------------------------
// Insert (core/store/uploads.cc)

absl::StatusOr<std::unique_ptr<Namespace::Upload>> Namespace::BeginInsert(
    const InsertSpec& spec) {
  return uploads_->Begin(spec);
}

absl::StatusOr<std::unique_ptr<Namespace::Upload>> Namespace::BeginInsert(
    absl::Span<const Token> elements, absl::Span<const uint64_t> checksums) {
  InsertSpec spec;
  spec.elements = elements;
  spec.checksums = checksums;
  return uploads_->Begin(spec);
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
  slots_.DiscardFree();  // the memory goes back to the system
  return EvictOutcome{removed.size(), removed.size() * page_bytes_};
}

Namespace::EvictOutcome Namespace::EvictBytes(uint64_t bytes) {
  const uint64_t want = (bytes + page_bytes_ - 1) / page_bytes_;
  absl::MutexLock l(&mu_);
  std::vector<PageHandle> removed;
  index_.Evict(static_cast<size_t>(std::min<uint64_t>(want, SIZE_MAX)),
               &removed);
  RetireLocked(removed);
  slots_.DiscardFree();
  return EvictOutcome{removed.size(), removed.size() * page_bytes_};
}

Namespace::EvictOutcome Namespace::EvictAll() {
  absl::MutexLock l(&mu_);
  std::vector<PageHandle> removed;
  index_.EvictAll(&removed);
  RetireLocked(removed);
  slots_.DiscardFree();
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
  c.capacity_pages = slots_.capacity();
  c.free_pages = slots_.free_count();
  c.cached_pages = index_.total_pages();
  c.evictable_pages = index_.evictable_pages();
  c.protected_pages = index_.protected_pages();
  c.active_leases = leases_.size();
  c.index_nodes = index_.node_count();
  c.index_memory_bytes = index_.MemoryBytes();
  c.page_bytes = page_bytes_;
  c.uploads_in_flight = uploads_->in_flight();
  c.memory_bytes = memory_bytes();
  c.bytes_out = bytes_out_.load(std::memory_order_relaxed);
  c.host_ipc_bytes = host_ipc_bytes_.load(std::memory_order_relaxed);
  c.tiers.resize(kNumTiers);
  for (int t = 0; t < kNumTiers; ++t) {
    const Tier tier = static_cast<Tier>(t);
    const uint64_t pages = index_.tier_pages(tier);
    c.tiers[t] =
        TierStats{tier, pages,
                  tier == Tier::kRaw ? pages * page_bytes_ : cold_.bytes(tier)};
  }
  c.codecs = cold_.ByCodec();
  return c;
}

std::vector<CalibrationInfo> Namespace::ListCalibrations() {
  calibrations_.ForgetUnused();
  return calibrations_.List(cold_.PagesByFingerprint());
}

std::string Namespace::DumpTree(size_t max_nodes) const {
  absl::MutexLock l(&mu_);
  return index_.Dump(max_nodes, UsesPageKeys(config_.key_kind));
}

bool Namespace::Busy() const {
  absl::MutexLock l(&mu_);
  return leases_.size() > 0 || uploads_->in_flight() > 0;
}

absl::Status Namespace::CheckInvariants() const {
  absl::MutexLock l(&mu_);
  if (!tiered() && !cold_.empty()) {
    return absl::InternalError("cold pages in a namespace without tiers");
  }
  KVH_RETURN_IF_ERROR(index_.CheckInvariants());
  // The callbacks run under the tables' locks and read the index under mu_,
  // which this call holds.
  uint64_t indexed = 0;
  KVH_RETURN_IF_ERROR(slots_.Check(
      [this](PageHandle h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const absl::StatusOr<Tier> t = index_.TierOf(h);
        return t.ok() && *t == Tier::kRaw;
      },
      &indexed));
  if (indexed != index_.tier_pages(Tier::kRaw)) {
    return absl::InternalError(absl::StrFormat(
        "slot table has %u indexed slots, the index %u raw pages", indexed,
        index_.tier_pages(Tier::kRaw)));
  }
  return cold_.Check(
      [this](PageHandle h)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return index_.TierOf(h); },
      [this](Tier t)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return index_.tier_pages(t); });
}

}  // namespace kvharbor
