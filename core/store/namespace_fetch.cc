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

Namespace::PinnedPages::PinnedPages(PinnedPages&& o) noexcept {
  *this = std::move(o);
}

Namespace::PinnedPages& Namespace::PinnedPages::operator=(
    PinnedPages&& o) noexcept {
  if (this != &o) {
    Reset();
    ns_ = std::move(o.ns_);
    format_ = o.format_;
    slots_ = std::move(o.slots_);
    handles_ = std::move(o.handles_);
    checksums_ = std::move(o.checksums_);
    tiers_ = std::move(o.tiers_);
    positions_ = std::move(o.positions_);
    buffers_ = std::move(o.buffers_);
    codecs_ = std::move(o.codecs_);
    owned_ = std::move(o.owned_);
    raw_ = std::move(o.raw_);
    o.ns_ = nullptr;
  }
  return *this;
}

Namespace::PinnedPages::~PinnedPages() { Reset(); }

void Namespace::PinnedPages::Reset() {
  if (ns_ != nullptr) {
    absl::MutexLock l(&ns_->mu_);
    ns_->UnpinLocked(slots_);
  }
  ns_ = nullptr;
  slots_.clear();
  handles_.clear();
  checksums_.clear();
  tiers_.clear();
  positions_.clear();
  buffers_.clear();
  codecs_.clear();
  owned_.clear();
  raw_.reset();
}

const uint8_t* Namespace::PinnedPages::data(size_t i) const {
  // Device pools' raw pages and decoded cold pages were copied to raw_ by
  // Materialize.
  if (format_ == FetchFormat::kRaw) {
    if (slots_[i] != kNoSlot && ns_->pool_->kind() == MemoryKind::kHost) {
      return ns_->pool_->Data(slots_[i]);
    }
    return raw_->data() + i * ns_->page_bytes_;
  }
  return reinterpret_cast<const uint8_t*>(owned_[i].data());
}

absl::string_view Namespace::PinnedPages::bytes(size_t i) const {
  if (format_ == FetchFormat::kRaw) {
    return absl::string_view(reinterpret_cast<const char*>(data(i)),
                             ns_->page_bytes_);
  }
  if (buffers_[i] != nullptr) return *buffers_[i];
  return owned_[i];
}

size_t Namespace::PinnedPages::page_bytes() const {
  return ns_ == nullptr ? 0 : ns_->page_bytes_;
}

void Namespace::PinnedPages::NoteBytesOut(uint64_t n) const {
  if (ns_ != nullptr) ns_->bytes_out_.fetch_add(n, std::memory_order_relaxed);
}

absl::StatusOr<Namespace::PinnedPages> Namespace::PinLease(uint64_t lease_id,
                                                           uint32_t start,
                                                           uint32_t count,
                                                           FetchFormat format) {
  PinnedPages out;
  out.format_ = format;
  std::vector<std::pair<size_t, int>> fds;
  {
    absl::MutexLock l(&mu_);
    KVH_ASSIGN_OR_RETURN(const Lease* lease, FindLeaseLocked(lease_id));
    const std::vector<PageHandle>& pages = lease->pages;
    if (start >= pages.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "start_page: %u is past the lease's %u pages", start, pages.size()));
    }
    if (count == 0) count = static_cast<uint32_t>(pages.size() - start);
    if (count > pages.size() - start) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "page_count: %u pages from start_page %u run past the lease's %u "
          "pages",
          count, start, pages.size()));
    }
    out.ns_ = shared_from_this();
    for (uint32_t i = start; i < start + count; ++i) {
      // Leased pages are locked in the index: they resolve and stay put.
      absl::StatusOr<Located> loc = LocateLocked(pages[i]);
      KVH_CHECK(loc.ok(), "leased page %#x does not resolve: %s", pages[i],
                loc.status().message());
      PinOneLocked(pages[i], *loc, &out, &fds);
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
  if (handles.size() > pool_->capacity()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pages.page_handles: %u handles, more than the namespace's %u slots",
        handles.size(), pool_->capacity()));
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
        UnpinLocked(out.slots_);
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

absl::string_view Namespace::PinnedPages::codec_name(size_t i) const {
  return codecs_[i] != nullptr ? codecs_[i]->name() : absl::string_view();
}

uint64_t Namespace::PinnedPages::calibration_fingerprint(size_t i) const {
  return codecs_[i] != nullptr ? codecs_[i]->calibration_fingerprint() : 0;
}

void Namespace::PinOneLocked(PageHandle h, const Located& loc, PinnedPages* out,
                             std::vector<std::pair<size_t, int>>* fds) {
  const size_t i = out->handles_.size();
  out->handles_.push_back(h);
  out->tiers_.push_back(loc.tier);
  out->buffers_.emplace_back();
  out->codecs_.push_back(loc.cold != nullptr ? loc.cold->codec : nullptr);
  out->owned_.emplace_back();
  if (loc.tier == Tier::kRaw) {
    ++slots_[loc.slot].pins;
    out->slots_.push_back(loc.slot);
    out->checksums_.push_back(slots_[loc.slot].checksum);
    out->positions_.push_back(slots_[loc.slot].first_position);
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

absl::Status Namespace::Materialize(PinnedPages* out,
                                    std::vector<std::pair<size_t, int>> fds,
                                    std::vector<PageHandle>* corrupt) const {
  KVH_RETURN_IF_ERROR(LoadColdBuffers(out, std::move(fds), corrupt));
  if (out->format_ == FetchFormat::kRaw) return MaterializeRaw(out);
  // Raw pages fetched COMPRESSED are encoded with the codec active now.
  const std::shared_ptr<const Codec> encoder = calibrations_.tier_codec();
  CodecWorkspace ws;
  std::string host;
  for (size_t i = 0; i < out->size(); ++i) {
    if (out->tiers_[i] == Tier::kRaw) {
      KVH_ASSIGN_OR_RETURN(
          out->owned_[i],
          EncodePoolPage(*pool_, out->slots_[i], out->positions_[i], *encoder,
                         &ws, &host));
      out->codecs_[i] = encoder;
    }
    // A host-compressed buffer's stored checksum was just verified against
    // its bytes (LoadColdBuffers): hashing it again would only repeat that.
    if (out->tiers_[i] == Tier::kHostCompressed) continue;
    const absl::string_view b = out->bytes(i);
    out->checksums_[i] = XXH3_64bits(b.data(), b.size());
  }
  return absl::OkStatus();
}

absl::Status Namespace::LoadColdBuffers(
    PinnedPages* out, std::vector<std::pair<size_t, int>> fds,
    std::vector<PageHandle>* corrupt) const {
  // Every page is checked (not just up to the first bad one) so all corrupt
  // pages of the request are found and dropped at once.
  std::string first_error;
  const auto bad = [&](size_t i, const std::string& why) {
    corrupt->push_back(out->handles_[i]);
    if (first_error.empty()) {
      first_error =
          absl::StrFormat("page %#x: %s, not served", out->handles_[i], why);
    }
  };
  for (const auto& [i, fd] : fds) {
    if (fd < 0) {
      bad(i, "its disk file cannot be opened");
      continue;
    }
    absl::StatusOr<DiskPage> page = DiskTier::ReadOpened(fd);
    if (!page.ok()) {
      bad(i, absl::StrCat("disk file unreadable: ", page.status().message()));
      continue;
    }
    out->buffers_[i] =
        std::make_shared<const std::string>(std::move(page->buffer));
  }
  for (size_t i = 0; i < out->size(); ++i) {
    if (out->tiers_[i] != Tier::kHostCompressed) continue;
    const std::string& buf = *out->buffers_[i];
    if (XXH3_64bits(buf.data(), buf.size()) != out->checksums_[i]) {
      bad(i, "host-compressed buffer fails its checksum");
    }
  }
  if (!first_error.empty()) return absl::DataLossError(first_error);
  return absl::OkStatus();
}

absl::Status Namespace::MaterializeOrDrop(
    PinnedPages* out, std::vector<std::pair<size_t, int>> fds) {
  std::vector<PageHandle> corrupt;
  absl::Status s = Materialize(out, std::move(fds), &corrupt);
  if (!corrupt.empty()) DropCorrupt(corrupt);
  return s;
}

absl::Status Namespace::MaterializeRaw(PinnedPages* out) const {
  const bool device = pool_->kind() == MemoryKind::kDevice;
  std::vector<uint32_t> read_slots;
  std::vector<uint8_t*> read_dst;
  std::vector<size_t> cold;
  const auto dst = [&](size_t i) {
    return out->raw_->data() + i * page_bytes_;
  };
  for (size_t i = 0; i < out->size(); ++i) {
    if (out->tiers_[i] != Tier::kRaw) {
      cold.push_back(i);
    } else if (device) {
      read_slots.push_back(out->slots_[i]);
    }
  }
  if (read_slots.empty() && cold.empty()) return absl::OkStatus();
  // One allocation for the read (core/memory/host_block.h: huge pages,
  // populated by the kernel); host-pool raw pages are read in place and leave
  // their part unused.
  KVH_ASSIGN_OR_RETURN(out->raw_, HostBlock::Create(out->size() * page_bytes_));
  for (size_t i = 0; i < out->size(); ++i) {
    if (device && out->tiers_[i] == Tier::kRaw) read_dst.push_back(dst(i));
  }
  // Device bytes go to the client through host memory; the slots' checksums
  // (of the uploaded bytes) still describe them.
  if (!read_slots.empty()) {
    KVH_RETURN_IF_ERROR(pool_->ReadMany(read_slots, read_dst));
  }
  return DecodeCold(out, cold);
}

absl::Span<const uint8_t> Namespace::ColdBuffer(const PinnedPages& pages,
                                                size_t i) {
  const std::string& b = *pages.buffers_[i];
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(b.data()),
                             b.size());
}

absl::Status Namespace::DecodeOnCpu(const PinnedPages& pages, size_t i,
                                    const Codec& codec, MutablePageRef dst,
                                    CodecWorkspace* ws,
                                    absl::string_view not_done) const {
  absl::Status s =
      codec.Decode(ColdBuffer(pages, i), absl::MakeConstSpan(&dst, 1), ws);
  if (!s.ok()) {
    return absl::DataLossError(
        absl::StrFormat("page %#x: stored buffer does not decode, not %s: %s",
                        pages.handles_[i], not_done, s.message()));
  }
  return absl::OkStatus();
}

absl::Status Namespace::DecodeByCodec(
    const PinnedPages& pages, absl::Span<const size_t> idx, bool to_device,
    absl::FunctionRef<MutablePageRef(size_t)> gpu_dst,
    absl::FunctionRef<absl::Status(size_t, const Codec&, bool)> finish) const {
  // Pages of one fetch may hold buffers of several calibrations.
  absl::flat_hash_map<const Codec*, std::vector<size_t>> groups;
  for (size_t i : idx) groups[pages.codecs_[i].get()].push_back(i);
  for (const auto& [codec, group] : groups) {
    std::vector<absl::Status> gpu_status(group.size(),
                                         absl::UnavailableError("no GPU"));
    if (const std::shared_ptr<PageBatchDecoder> gpu =
            calibrations_.GpuDecoderOf(codec)) {
      std::vector<absl::Span<const uint8_t>> bufs;
      std::vector<MutablePageRef> refs;
      for (size_t i : group) {
        bufs.push_back(ColdBuffer(pages, i));
        refs.push_back(gpu_dst(i));
      }
      gpu_status = to_device ? gpu->DecodeEachToDevice(bufs, refs)
                             : gpu->DecodeEach(bufs, refs);
      KVH_CHECK(gpu_status.size() == group.size(),
                "GPU decoder returned %u results for %u pages",
                gpu_status.size(), group.size());
    }
    for (size_t k = 0; k < group.size(); ++k) {
      KVH_RETURN_IF_ERROR(finish(group[k], *codec, gpu_status[k].ok()));
    }
  }
  return absl::OkStatus();
}

absl::Status Namespace::DecodeCold(PinnedPages* out,
                                   absl::Span<const size_t> idx) const {
  const auto ref = [&](size_t i) {
    return MutablePageRef{out->raw_->data() + i * page_bytes_,
                          out->positions_[i]};
  };
  CodecWorkspace ws;
  return DecodeByCodec(
      *out, idx, /*to_device=*/false, ref,
      [&](size_t i, const Codec& codec, bool gpu_ok) -> absl::Status {
        // A page the GPU refused is decoded again on the CPU: a corrupt
        // buffer fails there too, a GPU fault does not cost the page.
        if (!gpu_ok) {
          KVH_RETURN_IF_ERROR(
              DecodeOnCpu(*out, i, codec, ref(i), &ws, "served"));
        }
        out->checksums_[i] = XXH3_64bits(ref(i).data, page_bytes_);
        return absl::OkStatus();
      });
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
    const uint32_t n = std::min<uint32_t>(cold.size(), pool_->free_count());
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
    auto it = old_h == 0 ? cold_.end() : cold_.find(old_h);
    // Dropped, evicted or promoted meanwhile, or the path invariant (a raw
    // page's predecessor is raw) refuses it: the page stays where it is.
    if (it == cold_.end() ||
        !index_.SetTier(old_h, Tier::kRaw, /*allow_locked=*/true).ok()) {
      FreeSlotLocked(slot);
      continue;
    }
    const Tier was = it->second.tier;
    const PageHandle new_h = MakeHandle(slot, slots_[slot].generation);
    if (!index_.ReplaceHandle(old_h, new_h).ok()) {
      // The tier it had a moment ago, under the same lock.
      KVH_CHECK(index_.SetTier(old_h, was, /*allow_locked=*/true).ok(),
                "page %#x cannot go back to tier %s", old_h, TierName(was));
      FreeSlotLocked(slot);
      continue;
    }
    for (auto& [id, lease] : leases_) {
      std::replace(lease.pages.begin(), lease.pages.end(), old_h, new_h);
    }
    DropColdLocked(old_h);
    slots_[slot].state = SlotState::kIndexed;
    slots_[slot].checksum = p.checksum;
    slots_[slot].first_position = p.first_position;
    now[k] = new_h;
    ++counters_.promoted_pages;
  }
  SyncMetaChargeLocked();
  return now;
}

}  // namespace kvharbor
