// Namespace: the cold-page table under mu_ -- where a page lives, the
// choice and commit of NamespaceTiers' batches, drops, promotion of cold
// pages an insert extends, the disk tier's warm restart and the table's
// invariants. See namespace.h and docs/tiers.md.
#include <unistd.h>
#include <xxh3.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/check.h"
#include "core/base/status_macros.h"
#include "core/store/namespace.h"

namespace kvharbor {

absl::StatusOr<Namespace::Located> Namespace::LocateLocked(PageHandle h) const {
  auto it = cold_.find(h);
  if (it != cold_.end()) return Located{it->second.tier, kNoSlot, &it->second};
  KVH_ASSIGN_OR_RETURN(uint32_t slot, ResolveLocked(h));
  return Located{Tier::kRaw, slot, nullptr};
}

absl::StatusOr<Tier> Namespace::TierOf(PageHandle h) const {
  absl::MutexLock l(&mu_);
  KVH_ASSIGN_OR_RETURN(Located loc, LocateLocked(h));
  return loc.tier;
}

void Namespace::DropCorrupt(absl::Span<const PageHandle> handles) {
  std::vector<std::string> lines;
  {
    absl::MutexLock l(&mu_);
    for (PageHandle h : handles) {
      if (!LocateLocked(h).ok()) continue;  // dropped or promoted meanwhile
      if (!DropCorruptLocked(h, &lines)) {
        corrupt_pending_.insert(h);
        lines.push_back(absl::StrFormat(
            "corrupt page %#x is leased; Match stops before it, and it is "
            "dropped when the leases holding it end",
            h));
      }
    }
  }
  for (const std::string& line : lines) LogWarning(config_, line);
}

bool Namespace::DropCorruptLocked(PageHandle h,
                                  std::vector<std::string>* lines) {
  std::vector<PageHandle> removed;
  if (!index_.Erase(absl::MakeConstSpan(&h, 1), &removed).ok()) return false;
  ++counters_.corrupt_dropped;
  RetireLocked(removed);
  lines->push_back(absl::StrFormat(
      "dropped corrupt page %#x (checksum mismatch) and %u pages extending it",
      h, removed.size() - 1));
  return true;
}

void Namespace::DropPendingCorruptLocked(std::vector<std::string>* lines) {
  for (auto it = corrupt_pending_.begin(); it != corrupt_pending_.end();) {
    const PageHandle h = *it;
    // Gone already (evicted, or replaced by an insert's fresh bytes), or
    // dropped now that no lock holds it: forget it. Still locked: keep.
    if (!LocateLocked(h).ok() || DropCorruptLocked(h, lines)) {
      corrupt_pending_.erase(it++);
    } else {
      ++it;
    }
  }
}

void Namespace::DropColdLocked(PageHandle h) {
  auto it = cold_.find(h);
  if (it == cold_.end()) return;
  cold_bytes_[static_cast<int>(it->second.tier)] -= it->second.stored_bytes;
  CountColdLocked(it->second, -1);
  if (it->second.tier == Tier::kDisk) disk_->Remove(it->second.file_id);
  cold_.erase(it);
}

void Namespace::CountColdLocked(const ColdPage& c, int sign) {
  const absl::string_view name =
      c.codec != nullptr ? c.codec->name() : absl::string_view("unknown");
  auto it = codec_cold_.find(name);
  if (it == codec_cold_.end()) {
    it = codec_cold_.emplace(std::string(name), CodecStats{std::string(name)})
             .first;
  }
  if (sign > 0) {
    ++it->second.pages;
    it->second.bytes += c.stored_bytes;
  } else {
    --it->second.pages;
    it->second.bytes -= c.stored_bytes;
  }
  if (it->second.pages == 0) codec_cold_.erase(it);
}

void Namespace::ReleaseSlotLocked(uint32_t slot) {
  Slot& s = slots_[slot];
  if (++s.generation == 0) s.generation = 1;
  if (s.pins > 0) {
    s.state = SlotState::kZombie;
  } else {
    FreeSlotLocked(slot);
  }
}

std::vector<TierMoveJob> Namespace::SelectMoves(
    Tier from, Tier to, size_t max_pages,
    std::shared_ptr<const Codec> encoder) {
  std::vector<TierMoveJob> jobs;
  absl::MutexLock l(&mu_);
  std::vector<RadixIndex::TierCandidate> cands;
  index_.TierCandidates(from, max_pages, &cands);
  for (const auto& c : cands) {
    TierMoveJob job;
    job.handle = c.handle;
    // The index counts elements; codecs and the disk tier, token positions.
    job.position = c.first_position / epp_ * config_.geometry.page_size;
    if (from == Tier::kRaw) {
      job.slot = static_cast<uint32_t>(c.handle);
      ++slots_[job.slot].pins;  // the encoder reads it outside mu_
      job.raw_checksum = slots_[job.slot].checksum;
      job.codec = encoder;
    } else {
      const ColdPage& cold = cold_.at(c.handle);
      job.buffer = cold.buffer;
      job.codec = cold.codec;
      job.checksum = cold.checksum;
    }
    if (to == Tier::kDisk) {
      (void)index_.PrefixTokens(c.handle, &job.tokens);
      job.file_id = next_file_id_++;
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

bool Namespace::CommitMoveLocked(Tier from, Tier to, const TierMoveJob& job) {
  if (job.slot != kNoSlot) UnpinLocked(absl::MakeConstSpan(&job.slot, 1));
  // The page may have been evicted, leased or extended meanwhile:
  // SetTier refuses a locked page or one a hotter page now extends.
  const bool still_here = index_.TierOf(job.handle).value_or(to) == from &&
                          (from == Tier::kRaw ? cold_.count(job.handle) == 0
                                              : cold_.count(job.handle) == 1);
  if (!job.ok || !still_here || !index_.SetTier(job.handle, to).ok()) {
    return false;
  }
  if (from == Tier::kRaw) {
    ReleaseSlotLocked(job.slot);
    const ColdPage& c = cold_[job.handle] =
        ColdPage{to,           job.buffer, 0,           job.buffer->size(),
                 job.position, job.codec,  job.checksum};
    CountColdLocked(c, 1);
  } else {
    ColdPage& c = cold_.at(job.handle);
    cold_bytes_[static_cast<int>(from)] -= c.stored_bytes;
    c.tier = to;
    c.buffer = nullptr;
    c.file_id = job.file_id;
  }
  cold_bytes_[static_cast<int>(to)] += job.buffer->size();
  ++counters_.demoted_pages;
  return true;
}

size_t Namespace::CommitMoves(Tier from, Tier to,
                              std::vector<TierMoveJob>* jobs) {
  size_t moved = 0;
  std::vector<uint64_t> unused_files;
  {
    absl::MutexLock l(&mu_);
    for (const TierMoveJob& job : *jobs) {
      if (CommitMoveLocked(from, to, job)) {
        ++moved;
      } else if (job.ok && to == Tier::kDisk) {
        unused_files.push_back(job.file_id);
      }
    }
    SyncMetaChargeLocked();
  }
  for (uint64_t id : unused_files) disk_->Remove(id);
  std::vector<PageHandle> corrupt;
  for (const TierMoveJob& job : *jobs) {
    if (job.corrupt) corrupt.push_back(job.handle);
  }
  if (!corrupt.empty()) DropCorrupt(corrupt);
  return moved;
}

size_t Namespace::DropColdest(Tier from, size_t n) {
  absl::MutexLock l(&mu_);
  std::vector<RadixIndex::TierCandidate> cands;
  index_.TierCandidates(from, n, &cands);
  std::vector<PageHandle> handles, removed;
  for (const auto& c : cands) handles.push_back(c.handle);
  // Candidates are unlocked and have no hotter successor; at the coldest
  // tier in use they have no successor at all, so Erase takes only them.
  if (!index_.Erase(handles, &removed).ok()) return 0;
  RetireLocked(removed);
  return removed.size();
}

void Namespace::DiscardFreeSlots() {
  absl::MutexLock l(&mu_);
  DiscardFreeSlotsLocked();
}

uint64_t Namespace::ColdBytes(Tier t) const {
  absl::MutexLock l(&mu_);
  return cold_bytes_[static_cast<int>(t)];
}

uint64_t Namespace::PagesHotterThan(Tier t) const {
  absl::MutexLock l(&mu_);
  uint64_t n = 0;
  for (int i = 0; i < static_cast<int>(t); ++i) {
    n += index_.tier_pages(static_cast<Tier>(i));
  }
  return n;
}

uint32_t Namespace::FreeSlots() const {
  absl::MutexLock l(&mu_);
  return pool_->free_count();
}

void Namespace::NoteDiskWriteError() {
  absl::MutexLock l(&mu_);
  ++counters_.disk_write_errors;
}

void Namespace::PromoteLocked(Upload* up,
                              absl::Span<const PageHandle> current) {
  for (uint32_t i = up->skip_pages_; i < up->present_pages_; ++i) {
    const uint32_t slot = up->slots_[i - up->skip_pages_];
    if (!cold_.contains(current[i])) {  // another upload promoted it already
      FreeSlotLocked(slot);
      continue;
    }
    PromoteOneLocked(current[i], slot);  // in path order
  }
}

void Namespace::PromoteOneLocked(PageHandle old_h, uint32_t slot) {
  const PageHandle new_h = MakeHandle(slot, slots_[slot].generation);
  // The caller promotes in path order from a raw page: neither may refuse.
  KVH_CHECK(index_.ReplaceHandle(old_h, new_h).ok() &&
                index_.SetTier(new_h, Tier::kRaw, /*allow_locked=*/true).ok(),
            "promotion of cold page %#x into slot %u refused", old_h, slot);
  // A lease taken while the page was cold lists it by its old handle;
  // keep it pointing at the page (PinLease relies on leased pages
  // resolving).
  for (auto& [id, lease] : leases_) {
    std::replace(lease.pages.begin(), lease.pages.end(), old_h, new_h);
  }
  DropColdLocked(old_h);
  slots_[slot].state = SlotState::kIndexed;
  ++counters_.promoted_pages;
}

absl::Status Namespace::LoadDiskTier() {
  DiskTier::ScanResult scan = disk_->Scan();
  for (const std::string& line : scan.dropped) LogWarning(config_, line);
  const uint32_t ps = config_.geometry.page_size;
  // Shorter prefixes first, so each page's parent is in before it.
  std::sort(scan.pages.begin(), scan.pages.end(),
            [](const auto& a, const auto& b) {
              return a.second.tokens.size() < b.second.tokens.size();
            });
  // Each page decodes with the codec it was written with: the spec's, a
  // calibration restored from disk_dir, or a codec without calibration.
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<const Codec>>
      codecs;
  for (const auto& [id, page] : scan.pages) {
    codecs.emplace(std::make_pair(page.codec, page.calibration_fingerprint),
                   nullptr);
  }
  for (auto& [key, codec] : codecs) {
    codec = calibrations_.CodecForRestoredPage(key.first, key.second);
  }
  absl::MutexLock l(&mu_);
  counters_.corrupt_dropped += scan.dropped.size();
  next_file_id_ = scan.max_id + 1;
  for (auto& [id, page] : scan.pages) {
    const std::string path = disk_->PathOf(id);
    std::string why;
    const size_t n = page.tokens.size();
    const std::shared_ptr<const Codec>& codec =
        codecs[{page.codec, page.calibration_fingerprint}];
    if (codec == nullptr) {
      why = absl::StrFormat(
          "written with codec %s and calibration %#x, which this namespace "
          "does not have (not in the spec, not persisted, or dropped)",
          page.codec, page.calibration_fingerprint);
    } else if (n == 0 || n % epp_ != 0 ||
               page.first_position != (n / epp_ - 1) * uint64_t{ps}) {
      why = "token count does not fit the page size";
    } else if (index_.PeekMatchTokens(page.tokens) != n - epp_) {
      why = "its prefix is not on disk (orphan)";
    }
    if (!why.empty()) {
      disk_->Remove(id);
      LogWarning(config_, absl::StrCat("dropped disk page ", path, ": ", why));
      continue;
    }
    // Restored pages get handles above every pool slot.
    const PageHandle h =
        MakeHandle(pool_->capacity() + next_restored_++, /*generation=*/1);
    std::vector<PageHandle> pages(n / epp_, 0);
    pages.back() = h;
    KVH_RETURN_IF_ERROR(
        index_.Insert(page.tokens, pages, Tier::kDisk).status());
    const ColdPage& c = cold_[h] =
        ColdPage{Tier::kDisk,         nullptr, id, page.buffer.size(),
                 page.first_position, codec};
    CountColdLocked(c, 1);
    cold_bytes_[static_cast<int>(Tier::kDisk)] += page.buffer.size();
  }
  SyncMetaChargeLocked();
  return absl::OkStatus();
}

absl::Status Namespace::CheckColdLocked() const {
  uint64_t count[kNumTiers] = {0, 0, 0}, bytes[kNumTiers] = {0, 0, 0};
  std::map<std::string, CodecStats, std::less<>> by_codec;
  for (const auto& [h, c] : cold_) {
    const std::string name(c.codec != nullptr ? c.codec->name() : "unknown");
    CodecStats& s = by_codec[name];
    s.codec = name;
    ++s.pages;
    s.bytes += c.stored_bytes;
    absl::StatusOr<Tier> t = index_.TierOf(h);
    if (!t.ok() || *t != c.tier || c.tier == Tier::kRaw) {
      return absl::InternalError(absl::StrFormat(
          "cold page %#x: not indexed in tier %s", h, TierName(c.tier)));
    }
    if ((c.tier == Tier::kHostCompressed) != (c.buffer != nullptr) ||
        (c.buffer != nullptr &&
         (c.buffer->size() != c.stored_bytes ||
          XXH3_64bits(c.buffer->data(), c.buffer->size()) != c.checksum))) {
      return absl::InternalError(
          absl::StrFormat("cold page %#x: buffer does not fit its tier", h));
    }
    if (c.tier == Tier::kDisk &&
        ::access(disk_->PathOf(c.file_id).c_str(), F_OK) != 0) {
      return absl::InternalError(
          absl::StrFormat("disk page %#x: its file is missing", h));
    }
    ++count[static_cast<int>(c.tier)];
    bytes[static_cast<int>(c.tier)] += c.stored_bytes;
  }
  for (int t = 1; t < kNumTiers; ++t) {
    if (count[t] != index_.tier_pages(static_cast<Tier>(t)) ||
        bytes[t] != cold_bytes_[t]) {
      return absl::InternalError(absl::StrFormat(
          "tier %s: %u cold pages / %u bytes, index says %u pages, counter "
          "%u bytes",
          TierName(static_cast<Tier>(t)), count[t], bytes[t],
          index_.tier_pages(static_cast<Tier>(t)), cold_bytes_[t]));
    }
  }
  for (const auto& [name, s] : by_codec) {
    auto it = codec_cold_.find(name);
    if (it == codec_cold_.end() || it->second.pages != s.pages ||
        it->second.bytes != s.bytes) {
      return absl::InternalError(absl::StrFormat(
          "codec %s: %u cold pages / %u bytes, counted %u / %u", name, s.pages,
          s.bytes, it == codec_cold_.end() ? 0 : it->second.pages,
          it == codec_cold_.end() ? 0 : it->second.bytes));
    }
  }
  if (by_codec.size() != codec_cold_.size()) {
    return absl::InternalError("a codec is counted without cold pages");
  }
  if (disk_ == nullptr && count[2] > 0) {
    return absl::InternalError("disk pages without a disk tier");
  }
  return absl::OkStatus();
}

}  // namespace kvharbor
