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
  std::optional<ColdPage> cold = cold_.Find(h);
  if (cold.has_value()) {
    const Tier tier = cold->tier;
    return Located{tier, kNoSlot, std::move(cold)};
  }
  KVH_ASSIGN_OR_RETURN(uint32_t slot, slots_.Resolve(h));
  return Located{Tier::kRaw, slot, std::nullopt};
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
      // The encoder reads it outside mu_.
      job.raw_checksum = slots_.Pin(job.slot).checksum;
      job.codec = encoder;
    } else {
      const std::optional<ColdPage> cold = cold_.Find(c.handle);
      KVH_CHECK(cold.has_value(), "cold candidate %#x has no cold record",
                c.handle);
      job.buffer = cold->buffer;
      job.codec = cold->codec;
      job.checksum = cold->checksum;
    }
    if (to == Tier::kDisk) {
      (void)index_.PrefixTokens(c.handle, &job.tokens);
      job.file_id = cold_.NextFileId();
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

bool Namespace::CommitMoveLocked(Tier from, Tier to, const TierMoveJob& job) {
  if (job.slot != kNoSlot) slots_.Unpin(absl::MakeConstSpan(&job.slot, 1));
  // The page may have been evicted, leased or extended meanwhile:
  // SetTier refuses a locked page or one a hotter page now extends.
  const bool still_here = index_.TierOf(job.handle).value_or(to) == from &&
                          cold_.Contains(job.handle) == (from != Tier::kRaw);
  if (!job.ok || !still_here || !index_.SetTier(job.handle, to).ok()) {
    return false;
  }
  if (from == Tier::kRaw) {
    // The page keeps its handle; its slot gets a new generation.
    slots_.Retire(absl::MakeConstSpan(&job.handle, 1));
    cold_.Add(job.handle, ColdPage{to, job.buffer, 0, job.buffer->size(),
                                   job.position, job.codec, job.checksum});
  } else {
    cold_.MoveTo(job.handle, to, job.file_id);
  }
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

void Namespace::DiscardFreeSlots() { slots_.DiscardFree(); }

uint64_t Namespace::PagesHotterThan(Tier t) const {
  absl::MutexLock l(&mu_);
  uint64_t n = 0;
  for (int i = 0; i < static_cast<int>(t); ++i) {
    n += index_.tier_pages(static_cast<Tier>(i));
  }
  return n;
}

void Namespace::NoteDiskWriteError() {
  absl::MutexLock l(&mu_);
  ++counters_.disk_write_errors;
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
  cold_.SetNextFileId(scan.max_id + 1);
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
    } else if (IndependentPages(config_.key_kind)
                   ? n != epp_
                   : n == 0 || n % epp_ != 0 ||
                         page.first_position != (n / epp_ - 1) * uint64_t{ps}) {
      // A page-hash page is its own one-key path; its position is where it
      // was in the Insert that stored it, which its key does not encode.
      why = "token count does not fit the page size";
    } else if (!ElementsValid(page.tokens)) {
      why = UsesPageKeys(config_.key_kind) ? "not an encoding of page keys"
                                           : "negative token id";
    } else if (index_.PeekMatchTokens(page.tokens) != n - epp_) {
      why = "its prefix is not on disk (orphan)";
    }
    if (!why.empty()) {
      disk_->Remove(id);
      LogWarning(config_, absl::StrCat("dropped disk page ", path, ": ", why));
      continue;
    }
    // Restored pages get handles above every pool slot.
    const PageHandle h = SlotTable::MakeHandle(
        slots_.capacity() + next_restored_++, /*generation=*/1);
    std::vector<PageHandle> pages(n / epp_, 0);
    pages.back() = h;
    KVH_RETURN_IF_ERROR(
        index_.Insert(page.tokens, pages, Tier::kDisk).status());
    cold_.Add(h, ColdPage{Tier::kDisk, nullptr, id, page.buffer.size(),
                          page.first_position, codec});
  }
  SyncMetaChargeLocked();
  return absl::OkStatus();
}

}  // namespace kvharbor
