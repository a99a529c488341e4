// Namespace: RAW fetches (device pages read back in one batch, cold pages
// decoded on the GPU in batches or on the CPU) and promotion of fetched cold
// pages back into the pool. See namespace.h and docs/tiers.md.
#include <xxh3.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/store/namespace.h"

namespace kvharbor {

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

absl::Status Namespace::DecodeCold(PinnedPages* out,
                                   absl::Span<const size_t> idx) const {
  // Pages of one fetch may hold buffers of several calibrations.
  absl::flat_hash_map<const Codec*, std::vector<size_t>> groups;
  for (size_t i : idx) groups[out->codecs_[i].get()].push_back(i);
  const auto buffer = [&](size_t i) {
    const std::string& b = *out->buffers_[i];
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(b.data()),
                               b.size());
  };
  const auto ref = [&](size_t i) {
    return MutablePageRef{out->raw_->data() + i * page_bytes_,
                          out->positions_[i]};
  };
  CodecWorkspace ws;
  for (const auto& [codec, pages] : groups) {
    std::vector<absl::Status> gpu_status(pages.size(),
                                         absl::UnavailableError("no GPU"));
    if (const std::shared_ptr<PageBatchDecoder> gpu = GpuDecoderOf(codec)) {
      std::vector<absl::Span<const uint8_t>> bufs;
      std::vector<MutablePageRef> refs;
      for (size_t i : pages) {
        bufs.push_back(buffer(i));
        refs.push_back(ref(i));
      }
      gpu_status = gpu->DecodeEach(bufs, refs);
      if (gpu_status.size() != pages.size()) std::abort();  // broken decoder
    }
    for (size_t k = 0; k < pages.size(); ++k) {
      const size_t i = pages[k];
      // A page the GPU refused is decoded again on the CPU: a corrupt
      // buffer fails there too, a GPU fault does not cost the page.
      if (!gpu_status[k].ok()) {
        const MutablePageRef r = ref(i);
        absl::Status s =
            codec->Decode(buffer(i), absl::MakeConstSpan(&r, 1), &ws);
        if (!s.ok()) {
          return absl::DataLossError(absl::StrFormat(
              "page %#x: stored buffer does not decode, not served: %s",
              out->handles_[i], s.message()));
        }
      }
      out->checksums_[i] = XXH3_64bits(ref(i).data, page_bytes_);
    }
  }
  return absl::OkStatus();
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
    // Only free slots: promotion never evicts (nor demotes) another page.
    const uint32_t n = std::min<uint32_t>(cold.size(), pool_->free_count());
    if (n == 0) return;
    absl::StatusOr<std::vector<uint32_t>> got = pool_->Allocate(n);
    if (!got.ok()) return;
    slots = *std::move(got);
    for (uint32_t s : slots) slots_[s].state = SlotState::kReserved;
  }
  // Outside mu_: the reserved slots are ours; the bytes were decoded and
  // checked by Materialize.
  size_t written = 0;
  for (; written < slots.size(); ++written) {
    const absl::Status s =
        pool_->Write(slots[written], 0, out->data(cold[written]), page_bytes_);
    if (!s.ok()) {
      Log(absl::StrCat("promotion of fetched pages stopped: ", s.message()));
      break;
    }
  }
  absl::MutexLock l(&mu_);
  for (size_t k = 0; k < slots.size(); ++k) {
    const uint32_t slot = slots[k];
    const size_t i = cold[k];
    const PageHandle old_h = out->handles_[i];
    auto it = cold_.find(old_h);
    // Dropped, evicted or promoted meanwhile, or the path invariant (a raw
    // page's predecessor is raw) refuses it: the page stays where it is.
    if (k >= written || it == cold_.end() ||
        !index_.SetTier(old_h, Tier::kRaw, /*allow_locked=*/true).ok()) {
      FreeSlotLocked(slot);
      continue;
    }
    const Tier was = it->second.tier;
    const PageHandle new_h = MakeHandle(slot, slots_[slot].generation);
    if (!index_.ReplaceHandle(old_h, new_h).ok()) {
      if (!index_.SetTier(old_h, was, /*allow_locked=*/true).ok()) {
        std::abort();  // the tier it had a moment ago under the same lock
      }
      FreeSlotLocked(slot);
      continue;
    }
    for (auto& [id, lease] : leases_) {
      std::replace(lease.pages.begin(), lease.pages.end(), old_h, new_h);
    }
    DropColdLocked(old_h);
    slots_[slot].state = SlotState::kIndexed;
    slots_[slot].checksum = out->checksums_[i];
    slots_[slot].first_position = out->positions_[i];
    out->handles_[i] = new_h;
    ++counters_.promoted_pages;
  }
}

}  // namespace kvharbor
