// Namespace: the tier state machine (raw -> host-compressed -> disk -> gone).
// See namespace.h and docs/tiers.md for the invariants kept here.
#include <unistd.h>
#include <xxh3.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/store/namespace.h"

namespace kvharbor {

void Namespace::Log(const std::string& line) const {
  if (config_.warn) {
    config_.warn(line);
  } else {
    LogEvent(line);
  }
}

void Namespace::LogEvent(const std::string& line) const {
  if (config_.log) {
    config_.log(line);
  } else {
    std::fprintf(stderr, "kvharbor namespace '%s': %s\n", config_.name.c_str(),
                 line.c_str());
  }
}

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
  if (out->format_ == FetchFormat::kRaw) return MaterializeRaw(out);
  // Raw pages fetched COMPRESSED are encoded with the codec active now.
  const std::shared_ptr<const Codec> encoder = tier_codec();
  CodecWorkspace ws;
  std::string host;
  for (size_t i = 0; i < out->size(); ++i) {
    if (out->tiers_[i] == Tier::kRaw) {
      KVH_ASSIGN_OR_RETURN(
          out->owned_[i],
          EncodeSlot(out->slots_[i], out->positions_[i], *encoder, &ws, &host));
      out->codecs_[i] = encoder;
    }
    const absl::string_view b = out->bytes(i);
    out->checksums_[i] = XXH3_64bits(b.data(), b.size());
  }
  return absl::OkStatus();
}

absl::Status Namespace::MaterializeOrDrop(
    PinnedPages* out, std::vector<std::pair<size_t, int>> fds) {
  std::vector<PageHandle> corrupt;
  absl::Status s = Materialize(out, std::move(fds), &corrupt);
  if (!corrupt.empty()) DropCorrupt(corrupt);
  return s;
}

void Namespace::DropCorrupt(absl::Span<const PageHandle> handles) {
  std::vector<std::string> lines;
  {
    absl::MutexLock l(&mu_);
    for (PageHandle h : handles) {
      if (!cold_.contains(h)) continue;  // dropped or promoted meanwhile
      std::vector<PageHandle> removed;
      if (!index_.Erase(absl::MakeConstSpan(&h, 1), &removed).ok()) {
        lines.push_back(absl::StrFormat(
            "corrupt page %#x is leased; dropped at the next read after the "
            "lease",
            h));
        continue;
      }
      ++counters_.corrupt_dropped;
      RetireLocked(removed);
      lines.push_back(absl::StrFormat(
          "dropped corrupt page %#x (checksum mismatch) and %u pages "
          "extending it",
          h, removed.size() - 1));
    }
  }
  for (const std::string& line : lines) Log(line);
}

absl::StatusOr<std::string> Namespace::EncodeSlot(uint32_t slot,
                                                  uint64_t position,
                                                  const Codec& codec,
                                                  CodecWorkspace* ws,
                                                  std::string* host) const {
  const uint8_t* data = pool_->Data(slot);
  if (pool_->kind() == MemoryKind::kDevice) {
    host->resize(page_bytes_);
    uint8_t* h = reinterpret_cast<uint8_t*>(&(*host)[0]);
    KVH_RETURN_IF_ERROR(pool_->Read(slot, h));
    data = h;
  }
  const PageRef ref{data, position};
  return codec.EncodeToString(absl::MakeConstSpan(&ref, 1), ws);
}

void Namespace::EncodeRawJobs(std::vector<MoveJob>* jobs) const {
  std::vector<absl::StatusOr<std::string>> bufs;
  // Every job of a batch has the batch's codec (MoveColder); its
  // calibration's GPU encoder, if any, follows calibration switches.
  const std::shared_ptr<PageBatchEncoder> gpu =
      jobs->empty() ? nullptr : GpuEncoderOf((*jobs)[0].codec.get());
  if (gpu != nullptr) {
    std::vector<PageRef> refs;
    refs.reserve(jobs->size());
    for (const MoveJob& job : *jobs) {
      refs.push_back(PageRef{pool_->Data(job.slot), job.position});
    }
    bufs = gpu->EncodeEach(refs);
    if (bufs.size() != jobs->size()) std::abort();  // broken encoder
  } else {
    CodecWorkspace ws;
    std::string host;
    for (const MoveJob& job : *jobs) {
      bufs.push_back(
          EncodeSlot(job.slot, job.position, *job.codec, &ws, &host));
    }
  }
  for (size_t i = 0; i < jobs->size(); ++i) {
    if (!bufs[i].ok()) {
      Log(absl::StrCat("encode failed, page stays raw: ",
                       bufs[i].status().message()));
      continue;
    }
    MoveJob& job = (*jobs)[i];
    job.buffer = std::make_shared<const std::string>(*std::move(bufs[i]));
    job.checksum = XXH3_64bits(job.buffer->data(), job.buffer->size());
  }
}

void Namespace::DropColdLocked(PageHandle h) {
  auto it = cold_.find(h);
  if (it == cold_.end()) return;
  cold_bytes_[static_cast<int>(it->second.tier)] -= it->second.stored_bytes;
  if (it->second.tier == Tier::kDisk) disk_->Remove(it->second.file_id);
  cold_.erase(it);
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

size_t Namespace::MoveColder(Tier from, size_t max_pages) {
  const Tier to = static_cast<Tier>(static_cast<int>(from) + 1);
  if (to > ColdestTier()) return 0;
  std::vector<MoveJob> jobs;
  // One codec for the batch: a switch meanwhile applies to the next batch.
  const std::shared_ptr<const Codec> encoder = tier_codec();
  {
    absl::MutexLock l(&mu_);
    std::vector<RadixIndex::TierCandidate> cands;
    index_.TierCandidates(from, max_pages, &cands);
    for (const auto& c : cands) {
      MoveJob job;
      job.handle = c.handle;
      job.position = c.first_position;
      if (from == Tier::kRaw) {
        job.slot = static_cast<uint32_t>(c.handle);
        ++slots_[job.slot].pins;  // the encoder reads it outside mu_
        job.codec = encoder;
      } else {
        job.buffer = cold_.at(c.handle).buffer;
        job.codec = cold_.at(c.handle).codec;
        job.checksum = cold_.at(c.handle).checksum;
      }
      if (to == Tier::kDisk) {
        (void)index_.PrefixTokens(c.handle, &job.tokens);
        job.file_id = next_file_id_++;
      }
      jobs.push_back(std::move(job));
    }
  }
  if (jobs.empty()) return 0;
  // Outside mu_: Match, Fetch and inserts proceed while pages encode/write.
  if (from == Tier::kRaw) EncodeRawJobs(&jobs);
  for (MoveJob& job : jobs) {
    if (from == Tier::kRaw) {
      if (job.buffer == nullptr) continue;  // the encode failed: stays raw
    } else if (XXH3_64bits(job.buffer->data(), job.buffer->size()) !=
               job.checksum) {
      // Writing it would give corrupt bytes a fresh, valid file checksum.
      job.corrupt = true;
      continue;
    }
    if (to == Tier::kDisk) {
      DiskPage page{std::string(job.codec->name()),
                    job.codec->calibration_fingerprint(), job.position,
                    std::move(job.tokens), *job.buffer};
      // The calibration first: a disk page whose calibration is not in
      // disk_dir could not be decoded after a restart.
      absl::Status s = PersistCalibrationOf(*job.codec);
      if (s.ok()) s = disk_->Write(job.file_id, page);
      if (!s.ok()) {
        Log(absl::StrCat("disk write failed, page stays in host tier: ",
                         s.message()));
        absl::MutexLock l(&mu_);
        ++counters_.disk_write_errors;
        continue;
      }
    }
    job.ok = true;
  }
  size_t moved = 0;
  std::vector<uint64_t> unused_files;
  {
    absl::MutexLock l(&mu_);
    for (MoveJob& job : jobs) {
      if (job.slot != kNoSlot) UnpinLocked(absl::MakeConstSpan(&job.slot, 1));
      // The page may have been evicted, leased or extended meanwhile:
      // SetTier refuses a locked page or one a hotter page now extends.
      const bool still_here =
          index_.TierOf(job.handle).value_or(to) == from &&
          (from == Tier::kRaw ? cold_.count(job.handle) == 0
                              : cold_.count(job.handle) == 1);
      if (!job.ok || !still_here || !index_.SetTier(job.handle, to).ok()) {
        if (job.ok && to == Tier::kDisk) unused_files.push_back(job.file_id);
        continue;
      }
      if (from == Tier::kRaw) {
        ReleaseSlotLocked(job.slot);
        cold_[job.handle] =
            ColdPage{to,           job.buffer, 0,           job.buffer->size(),
                     job.position, job.codec,  job.checksum};
      } else {
        ColdPage& c = cold_.at(job.handle);
        cold_bytes_[static_cast<int>(from)] -= c.stored_bytes;
        c.tier = to;
        c.buffer = nullptr;
        c.file_id = job.file_id;
      }
      cold_bytes_[static_cast<int>(to)] += job.buffer->size();
      ++counters_.demoted_pages;
      ++moved;
    }
  }
  for (uint64_t id : unused_files) disk_->Remove(id);
  std::vector<PageHandle> corrupt;
  for (const MoveJob& job : jobs) {
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

void Namespace::EnforceBudgetsLocked() {
  const size_t batch = config_.tier_batch_pages;
  const auto over = [&](Tier t, uint64_t budget) {
    absl::MutexLock l(&mu_);
    return budget > 0 && cold_bytes_[static_cast<int>(t)] > budget;
  };
  if (disk_ != nullptr) {
    while (over(Tier::kHostCompressed, config_.host_compressed_bytes)) {
      if (MoveColder(Tier::kHostCompressed, batch) > 0) continue;
      // The disk refuses (full, failing) or nothing can move: drop instead.
      if (DropColdest(Tier::kHostCompressed, batch) == 0) break;
    }
    while (over(Tier::kDisk, config_.disk_bytes)) {
      if (DropColdest(Tier::kDisk, batch) == 0) break;
    }
  } else {
    while (over(Tier::kHostCompressed, config_.host_compressed_bytes)) {
      if (DropColdest(Tier::kHostCompressed, batch) == 0) break;
    }
  }
}

void Namespace::EnforceBudgets() {
  if (!tiered()) return;
  absl::MutexLock ml(&move_mu_);
  EnforceBudgetsLocked();
}

void Namespace::MakeRoom(uint32_t n) {
  absl::MutexLock ml(&move_mu_);
  for (;;) {
    uint32_t free;
    {
      absl::MutexLock l(&mu_);
      free = pool_->free_count();
    }
    if (free >= n) break;
    const size_t want = std::max<size_t>(n - free, config_.tier_batch_pages);
    if (MoveColder(Tier::kRaw, want) == 0) break;
  }
  EnforceBudgetsLocked();
}

absl::StatusOr<uint64_t> Namespace::DemoteAll(Tier to) {
  if (to == Tier::kRaw || !tiered() || to > ColdestTier()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "tier: namespace '%s' has no %s tier", config_.name, TierName(to)));
  }
  absl::MutexLock ml(&move_mu_);
  uint64_t moved = 0;
  for (int t = 0; t < static_cast<int>(to); ++t) {
    while (size_t m = MoveColder(static_cast<Tier>(t), SIZE_MAX)) moved += m;
  }
  EnforceBudgetsLocked();
  return moved;
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
  if (!index_.ReplaceHandle(old_h, new_h).ok() ||
      !index_.SetTier(new_h, Tier::kRaw, /*allow_locked=*/true).ok()) {
    std::abort();  // the caller promotes in path order from a raw page
  }
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
  for (const std::string& line : scan.dropped) Log(line);
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
    codec = CodecForRestoredPage(key.first, key.second);
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
    } else if (n % ps != 0 || page.first_position != n - ps) {
      why = "token count does not fit the page size";
    } else if (index_.PeekMatchTokens(page.tokens) != n - ps) {
      why = "its prefix is not on disk (orphan)";
    }
    if (!why.empty()) {
      disk_->Remove(id);
      Log(absl::StrCat("dropped disk page ", path, ": ", why));
      continue;
    }
    // Restored pages get handles above every pool slot.
    const PageHandle h =
        MakeHandle(pool_->capacity() + next_restored_++, /*generation=*/1);
    std::vector<PageHandle> pages(n / ps, 0);
    pages.back() = h;
    KVH_RETURN_IF_ERROR(
        index_.Insert(page.tokens, pages, Tier::kDisk).status());
    cold_[h] = ColdPage{Tier::kDisk,         nullptr, id, page.buffer.size(),
                        page.first_position, codec};
    cold_bytes_[static_cast<int>(Tier::kDisk)] += page.buffer.size();
  }
  return absl::OkStatus();
}

absl::Status Namespace::CheckColdLocked() const {
  uint64_t count[kNumTiers] = {0, 0, 0}, bytes[kNumTiers] = {0, 0, 0};
  for (const auto& [h, c] : cold_) {
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
  if (disk_ == nullptr && count[2] > 0) {
    return absl::InternalError("disk pages without a disk tier");
  }
  return absl::OkStatus();
}

}  // namespace kvharbor
