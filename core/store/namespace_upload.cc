// Namespace: Insert -- two-phase uploads (BeginInsert locks the cached
// prefix and reserves slots, Write fills them outside mu_, Commit indexes
// them), appends that skip a cached prefix (its cold pages restored from
// their stored copy), and layer-major uploads whose bytes arrive layer by
// layer. See namespace.h and docs/engines_api.md.
#include <xxh3.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/base/check.h"
#include "core/base/status_macros.h"
#include "core/store/namespace.h"
#include "types/layer_range.h"

namespace kvharbor {

struct Namespace::Upload::HashState {
  HashState() : state(XXH3_createState()) {}
  ~HashState() { XXH3_freeState(state); }
  XXH3_state_t* state;
};

absl::StatusOr<std::unique_ptr<Namespace::Upload>> Namespace::BeginInsert(
    absl::Span<const Token> elements, absl::Span<const uint64_t> checksums) {
  InsertSpec spec;
  spec.elements = elements;
  spec.checksums = checksums;
  return BeginInsert(spec);
}

absl::StatusOr<std::unique_ptr<Namespace::Upload>> Namespace::BeginInsert(
    const InsertSpec& spec) {
  const bool keys = config_.key_kind == KeyKind::kPageKeys;
  KVH_RETURN_IF_ERROR(
      CheckElements(spec.elements, keys ? "page_keys" : "token_ids"));
  if (spec.elements.size() % epp_ != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "token_ids: %u tokens is not a whole number of pages (page_size %u)",
        spec.elements.size(), epp_));
  }
  const uint32_t n = static_cast<uint32_t>(spec.elements.size() / epp_);
  if (spec.skip_pages > n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("skip_pages: %u is more than the sequence's %u pages",
                        spec.skip_pages, n));
  }
  std::unique_ptr<Upload> up(new Upload());
  up->ns_ = shared_from_this();
  up->tokens_.assign(spec.elements.begin(), spec.elements.end());
  up->checksums_.assign(spec.checksums.begin(), spec.checksums.end());
  up->num_pages_ = n;
  up->sent_from_ = spec.skip_pages;
  up->prefix_lease_id_ = spec.prefix_lease_id;
  up->layer_major_ = spec.layer_major;
  up->placed_ = spec.placed;
  up->hash_ = std::make_unique<Upload::HashState>();
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

absl::Status Namespace::CheckSkipLocked(Upload* up,
                                        absl::Span<const PageHandle> present) {
  if (up->prefix_lease_id_ != 0) {
    auto it = leases_.find(up->prefix_lease_id_);
    if (it == leases_.end()) {
      return absl::NotFoundError(absl::StrFormat(
          "prefix_lease_id: %u is not an active lease of namespace '%s'",
          up->prefix_lease_id_, config_.name));
    }
    const std::vector<PageHandle>& leased = it->second.pages;
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
        up->sent_from_, present.size(), config_.name));
  }
  const uint32_t sent = up->num_pages_ - up->sent_from_;
  if (!up->checksums_.empty() && up->checksums_.size() != sent) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "page_checksums: %u given for the %u sent pages (of %u, %u skipped); "
        "send one per sent page or none",
        up->checksums_.size(), sent, up->num_pages_, up->sent_from_));
  }
  up->total_bytes_ = uint64_t{sent} * page_bytes_;
  return absl::OkStatus();
}

absl::Status Namespace::BeginUpload(Upload* up) {
  const uint32_t n = up->num_pages_;
  {
    absl::MutexLock l(&mu_);
    // Lock the present prefix so the pages this upload skips stay cached
    // until it commits.
    std::vector<PageHandle> prefix;
    std::vector<Tier> tiers;
    RadixIndex::MatchResult m = *index_.Match(up->tokens_, &prefix, &tiers,
                                              [] { return absl::OkStatus(); });
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
    if (n - up->skip_pages_ > pool_->capacity()) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "token_ids: %u new pages do not fit in namespace '%s' (capacity %u "
          "pages)",
          n - up->skip_pages_, config_.name, pool_->capacity()));
    }
    if (m.matched_tokens > 0) {
      index_.Lock(m.node);
      up->prefix_node_ = m.node;
    }
    ++uploads_in_flight_;
  }
  // Slots come as the bytes arrive (Upload::Write), so that a header alone
  // neither evicts the pages its upload would replace nor holds their
  // slots. Now: those of the cold skipped pages RestoreSkipped fills and the
  // first sent one, so that a full namespace fails at once; a placed upload
  // all of them, since its client writes them itself.
  const uint32_t want =
      up->placed_
          ? n - up->skip_pages_
          : std::min<uint32_t>(n - up->skip_pages_,
                               static_cast<uint32_t>(up->restore_.size()) + 1);
  if (want > 0) {
    absl::Status s = ReserveUploadSlots(up, want);
    if (!s.ok()) {
      AbortUpload(up);
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Namespace::ReserveUploadSlots(Upload* up, uint32_t k) {
  absl::Status reserved;
  // Tiered: a second pass when there was no room, since its MakeRoom first
  // waits for the demotions in flight (move_mu_), whose slots are pinned
  // until they commit and free them. A full memory budget: the store frees
  // room (from the namespaces holding the most), then another pass.
  int passes = tiered() ? 2 : 1;
  for (int pass = 0; pass < passes; ++pass) {
    if (tiered()) tiers_.MakeRoom(k);
    bool budget_full = false;
    {
      absl::MutexLock l(&mu_);
      absl::StatusOr<std::vector<uint32_t>> slots =
          ReserveLocked(k, &up->evicted_for_room_, &budget_full);
      reserved = slots.status();
      if (slots.ok()) {
        up->slots_.insert(up->slots_.end(), slots->begin(), slots->end());
        return absl::OkStatus();
      }
    }
    if (!absl::IsResourceExhausted(reserved)) break;
    if (budget_full && config_.reclaim && passes < 4) {
      const uint64_t need =
          uint64_t{k} * (pool_->host_bytes_per_slot() + page_meta_bytes());
      if (config_.reclaim(need) > 0) ++passes;
    }
  }
  return reserved;
}

absl::Status Namespace::CheckRestorableLocked(const Upload& up) const {
  for (size_t j = 0; j < up.restore_.size(); ++j) {
    const ColdPage& cold = cold_.at(up.restore_[j]);
    if (cold.codec->name() != "identity") {
      return absl::FailedPreconditionError(absl::StrFormat(
          "skip_pages: skipped page %u is kept lossy in tier %s (codec %s); "
          "raw pages after it would need its decoded approximation stored as "
          "raw: nothing was stored: send the pages (skip_pages 0) to store "
          "them exact",
          up.skip_pages_ + j, TierName(cold.tier), cold.codec->name()));
    }
  }
  return absl::OkStatus();
}

absl::Status Namespace::RestoreSkipped(Upload* up) {
  if (up->restore_.empty()) return absl::OkStatus();
  PinnedPages cold;
  cold.format_ = FetchFormat::kRaw;
  std::vector<std::pair<size_t, int>> fds;
  std::vector<size_t> which;  // index in restore_ of each pinned page
  {
    absl::MutexLock l(&mu_);
    cold.ns_ = shared_from_this();
    for (size_t j = 0; j < up->restore_.size(); ++j) {
      // The upload's lock keeps the pages cached and in their tier, but
      // another upload that sends them may have made one raw since (a new
      // handle): its slot here goes unused (CommitUpload frees it).
      absl::StatusOr<Located> loc = LocateLocked(up->restore_[j]);
      if (!loc.ok() || loc->tier == Tier::kRaw) continue;
      PinOneLocked(up->restore_[j], *loc, &cold, &fds);
      which.push_back(j);
    }
  }
  const absl::Status read = MaterializeOrDrop(&cold, std::move(fds));
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
        pool_->Write(up->slots_[j], 0, cold.data(i), page_bytes_));
    up->computed_[up->skip_pages_ + j] = cold.checksum(i);
  }
  return absl::OkStatus();
}

Namespace::Upload::Target Namespace::Upload::Locate(uint64_t offset) const {
  const uint64_t pb = ns_->page_bytes_;
  if (!layer_major_) {
    return Target{sent_from_ + static_cast<uint32_t>(offset / pb), offset % pb,
                  pb - offset % pb};
  }
  // For each layer, for each sent page: K then V of the layer.
  const Geometry& g = ns_->config_.geometry;
  const uint64_t kvb = KvLayerBytes(g);
  const uint64_t layer_bytes = uint64_t{num_pages_ - sent_from_} * 2 * kvb;
  const uint32_t layer = static_cast<uint32_t>(offset / layer_bytes);
  const uint64_t in_layer = offset % layer_bytes;
  const uint32_t page = static_cast<uint32_t>(in_layer / (2 * kvb));
  const int kv = static_cast<int>(in_layer / kvb % 2);
  const uint64_t in = in_layer % kvb;
  return Target{sent_from_ + page, KvLayerOffset(g, layer, kv) + in, kvb - in};
}

uint32_t Namespace::Upload::PagesReached(uint64_t end) const {
  if (end == 0) return 0;
  if (layer_major_) {
    const uint64_t layer_bytes = uint64_t{num_pages_ - sent_from_} * 2 *
                                 KvLayerBytes(ns_->config_.geometry);
    if (end > layer_bytes) return num_pages_;
  }
  return Locate(end - 1).page + 1;
}

absl::Status Namespace::Upload::Write(uint64_t offset, absl::string_view data) {
  if (!error_.ok()) return error_;
  if (done_) return absl::FailedPreconditionError("upload: already committed");
  if (offset != received_) {
    return error_ = absl::InvalidArgumentError(absl::StrFormat(
               "chunk.offset: %u, expected %u (chunks must arrive in order)",
               offset, received_));
  }
  if (data.size() > total_bytes_ - received_) {
    return error_ = absl::InvalidArgumentError(absl::StrFormat(
               "chunk: %u bytes at offset %u run past the declared size of "
               "%u bytes (%u sent pages)",
               data.size(), offset, total_bytes_, num_pages_ - sent_from_));
  }
  const size_t pb = ns_->page_bytes_;
  // Slots for the new pages this chunk reaches, and no more: an upload never
  // evicts for pages it has not started to fill.
  if (!data.empty()) {
    const uint32_t reached = PagesReached(received_ + data.size());
    const uint64_t have = uint64_t{skip_pages_} + slots_.size();
    if (reached > have) {
      absl::Status s =
          ns_->ReserveUploadSlots(this, static_cast<uint32_t>(reached - have));
      if (!s.ok()) return error_ = s;
    }
  }
  while (!data.empty()) {
    const Target t = Locate(received_);
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(t.run, data.size()));
    // Pages below skip_pages_ are cached and raw: their bytes are dropped.
    if (t.page >= skip_pages_) {
      // The slot is reserved for this upload alone: no lock needed to fill.
      const uint32_t slot = slots_[t.page - skip_pages_];
      absl::Status copied = ns_->pool_->Write(
          slot, t.in_page, reinterpret_cast<const uint8_t*>(data.data()), n);
      if (!copied.ok()) return error_ = copied;
      // Page after page, the checksum streams along; layer by layer it is
      // taken once the page is whole (FinishPages).
      if (!layer_major_) {
        if (t.in_page == 0) XXH3_64bits_reset(hash_->state);
        XXH3_64bits_update(hash_->state, data.data(), n);
        if (t.in_page + n == pb) {
          absl::Status s = PageDone(t.page, XXH3_64bits_digest(hash_->state));
          if (!s.ok()) return error_ = s;
        }
      }
    }
    received_ += n;
    data.remove_prefix(n);
  }
  if (layer_major_ && received_ == total_bytes_) {
    if (absl::Status s = FinishPages(); !s.ok()) return error_ = s;
  }
  return absl::OkStatus();
}

absl::Status Namespace::Upload::PageDone(uint32_t page, uint64_t checksum) {
  computed_[page] = checksum;
  const uint32_t i = page - sent_from_;
  if (!checksums_.empty() && checksums_[i] != checksum) {
    return absl::DataLossError(absl::StrFormat(
        "page_checksums[%u]: the bytes of page %u hash to %#x, not the "
        "declared %#x",
        i, page, checksum, checksums_[i]));
  }
  if (ns_->calibrations_.has_sampler()) {
    ns_->SampleSlot(slots_[page - skip_pages_],
                    uint64_t{page} * ns_->config_.geometry.page_size);
  }
  return absl::OkStatus();
}

absl::Status Namespace::Upload::FinishPages() {
  const size_t pb = ns_->page_bytes_;
  PagePool& pool = *ns_->pool_;
  std::string host;  // a device page's copy
  for (uint32_t page = std::max(skip_pages_, sent_from_); page < num_pages_;
       ++page) {
    const uint32_t slot = slots_[page - skip_pages_];
    const uint8_t* bytes = pool.Data(slot);
    if (pool.kind() != MemoryKind::kHost) {
      host.resize(pb);
      KVH_RETURN_IF_ERROR(
          pool.Read(slot, reinterpret_cast<uint8_t*>(host.data())));
      bytes = reinterpret_cast<const uint8_t*>(host.data());
    }
    KVH_RETURN_IF_ERROR(PageDone(page, XXH3_64bits(bytes, pb)));
  }
  return absl::OkStatus();
}

void Namespace::SampleSlot(uint32_t slot, uint64_t first_position) {
  const uint8_t* page = pool_->Data(slot);
  std::string host;
  if (pool_->kind() == MemoryKind::kDevice) {
    // The sampler reads the page on the CPU.
    host.resize(page_bytes_);
    if (!pool_->Read(slot, reinterpret_cast<uint8_t*>(host.data())).ok()) {
      return;  // a page the sample misses costs nothing but a sample
    }
    page = reinterpret_cast<const uint8_t*>(host.data());
  }
  if (calibrations_.Sample(page, first_position) &&
      config_.request_calibration) {
    config_.request_calibration(weak_from_this());
  }
}

absl::StatusOr<Namespace::InsertOutcome> Namespace::Upload::Commit() {
  if (!error_.ok()) return error_;
  if (done_) return absl::FailedPreconditionError("upload: already committed");
  if (received_ != total_bytes_) {
    return error_ = absl::InvalidArgumentError(absl::StrFormat(
               "chunk: the stream ended after %u of %u bytes (%u sent pages "
               "of %u bytes)",
               received_, total_bytes_, num_pages_ - sent_from_,
               ns_->page_bytes_));
  }
  return ns_->CommitUpload(this);
}

absl::StatusOr<Namespace::InsertOutcome> Namespace::CommitUpload(Upload* up) {
  const uint32_t ps = config_.geometry.page_size;
  absl::MutexLock l(&mu_);
  std::vector<PageHandle> handles(up->num_pages_, 0);
  for (uint32_t i = up->skip_pages_; i < up->num_pages_; ++i) {
    const uint32_t slot = up->slots_[i - up->skip_pages_];
    handles[i] = MakeHandle(slot, slots_[slot].generation);
    slots_[slot].checksum = up->computed_[i];
    slots_[slot].first_position = uint64_t{i} * ps;
  }
  std::vector<PageHandle> current;  // the locked prefix's handles now
  if (up->skip_pages_ < up->present_pages_) {
    index_.Match(
        absl::MakeConstSpan(up->tokens_).first(ElementsOf(up->present_pages_)),
        &current);
  }
  KVH_ASSIGN_OR_RETURN(RadixIndex::InsertResult r,
                       index_.Insert(up->tokens_, handles));
  const uint32_t present =
      static_cast<uint32_t>(r.already_present_tokens / epp_);
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
    index_.Match(absl::MakeConstSpan(up->tokens_).first(ElementsOf(present)),
                 &stored);
  }
  for (uint32_t i = up->present_pages_; i < up->num_pages_; ++i) {
    const uint32_t slot = up->slots_[i - up->skip_pages_];
    if (i >= present) {
      slots_[slot].state = SlotState::kIndexed;
    } else if (!stored.empty() && cold_.contains(stored[i])) {
      PromoteOneLocked(stored[i], slot);
    } else {
      FreeSlotLocked(slot);  // another upload stored this page meanwhile
    }
  }
  if (up->prefix_node_ != nullptr) index_.Unlock(up->prefix_node_);
  up->prefix_node_ = nullptr;
  up->slots_.clear();
  up->done_ = true;
  --uploads_in_flight_;
  counters_.inserted_pages += up->num_pages_ - present;
  counters_.dedup_pages += present;
  counters_.bytes_in += up->total_bytes_;
  SyncMetaChargeLocked();
  InsertOutcome out;
  out.already_present_tokens = uint64_t{present} * ps;
  out.pages_stored = up->num_pages_ - present;
  out.pages_evicted = up->evicted_for_room_;
  return out;
}

void Namespace::AbortUpload(Upload* up) {
  absl::MutexLock l(&mu_);
  for (uint32_t slot : up->slots_) FreeSlotLocked(slot);
  if (up->prefix_node_ != nullptr) index_.Unlock(up->prefix_node_);
  up->prefix_node_ = nullptr;
  up->slots_.clear();
  up->done_ = true;
  --uploads_in_flight_;
}

Namespace::Upload::~Upload() {
  if (ns_ != nullptr && !done_) ns_->AbortUpload(this);
}

}  // namespace kvharbor
