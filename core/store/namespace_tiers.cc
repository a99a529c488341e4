#include "core/store/namespace_tiers.h"

#include <xxh3.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/check.h"
#include "core/base/status_macros.h"
#include "core/store/namespace.h"

namespace kvharbor {

absl::StatusOr<std::string> EncodePoolPage(PagePool& pool, uint32_t slot,
                                           uint64_t position,
                                           const Codec& codec,
                                           CodecWorkspace* ws,
                                           std::string* host) {
  const uint8_t* data = pool.Data(slot);
  if (pool.kind() == MemoryKind::kDevice) {
    host->resize(pool.slot_bytes());
    uint8_t* h = reinterpret_cast<uint8_t*>(&(*host)[0]);
    KVH_RETURN_IF_ERROR(pool.Read(slot, h));
    data = h;
  }
  const PageRef ref{data, position};
  return codec.EncodeToString(absl::MakeConstSpan(&ref, 1), ws);
}

NamespaceTiers::NamespaceTiers(Namespace* ns, const NamespaceConfig& config,
                               PagePool* pool, DiskTier* disk,
                               NamespaceCalibrations* calibrations)
    : ns_(*ns),
      config_(config),
      pool_(*pool),
      disk_(disk),
      calibrations_(*calibrations) {}

void NamespaceTiers::EncodeRawJobs(std::vector<TierMoveJob>* jobs) const {
  std::vector<absl::StatusOr<std::string>> bufs;
  // Every job of a batch has the batch's codec (MoveColder); its
  // calibration's GPU encoder, if any, follows calibration switches.
  const std::shared_ptr<PageBatchEncoder> gpu =
      jobs->empty() ? nullptr
                    : calibrations_.GpuEncoderOf((*jobs)[0].codec.get());
  if (gpu != nullptr) {
    std::vector<PageRef> refs;
    refs.reserve(jobs->size());
    for (const TierMoveJob& job : *jobs) {
      refs.push_back(PageRef{pool_.Data(job.slot), job.position});
    }
    bufs = gpu->EncodeEach(refs);
    KVH_CHECK(bufs.size() == jobs->size(),
              "GPU encoder returned %u buffers for %u pages", bufs.size(),
              jobs->size());
  } else {
    CodecWorkspace ws;
    std::string host;
    for (const TierMoveJob& job : *jobs) {
      bufs.push_back(EncodePoolPage(pool_, job.slot, job.position, *job.codec,
                                    &ws, &host));
    }
  }
  for (size_t i = 0; i < jobs->size(); ++i) {
    if (!bufs[i].ok()) {
      LogWarning(config_, absl::StrCat("encode failed, page stays raw: ",
                                       bufs[i].status().message()));
      continue;
    }
    TierMoveJob& job = (*jobs)[i];
    job.buffer = std::make_shared<const std::string>(*std::move(bufs[i]));
    job.checksum = XXH3_64bits(job.buffer->data(), job.buffer->size());
  }
}

void NamespaceTiers::PrepareJob(Tier from, Tier to, TierMoveJob* job) const {
  if (from == Tier::kRaw) {
    if (job->buffer == nullptr) return;  // the encode failed: stays raw
  } else if (XXH3_64bits(job->buffer->data(), job->buffer->size()) !=
             job->checksum) {
    // Writing it would give corrupt bytes a fresh, valid file checksum.
    job->corrupt = true;
    return;
  }
  if (to == Tier::kDisk) {
    DiskPage page{std::string(job->codec->name()),
                  job->codec->calibration_fingerprint(), job->position,
                  std::move(job->tokens), *job->buffer};
    // The calibration first: a disk page whose calibration is not in
    // disk_dir could not be decoded after a restart.
    absl::Status s = calibrations_.PersistCalibrationOf(*job->codec);
    if (s.ok()) s = disk_->Write(job->file_id, page);
    if (!s.ok()) {
      LogWarning(config_,
                 absl::StrCat("disk write failed, page stays in host tier: ",
                              s.message()));
      ns_.NoteDiskWriteError();
      return;
    }
  }
  job->ok = true;
}

size_t NamespaceTiers::MoveColder(Tier from, size_t max_pages) {
  const Tier to = static_cast<Tier>(static_cast<int>(from) + 1);
  if (to > ColdestTier()) return 0;
  // One codec for the batch: a switch meanwhile applies to the next batch.
  std::vector<TierMoveJob> jobs =
      ns_.SelectMoves(from, to, max_pages, calibrations_.tier_codec());
  if (jobs.empty()) return 0;
  // Outside mu_: Match, Fetch and inserts proceed while pages encode/write.
  if (from == Tier::kRaw) EncodeRawJobs(&jobs);
  for (TierMoveJob& job : jobs) PrepareJob(from, to, &job);
  return ns_.CommitMoves(from, to, &jobs);
}

void NamespaceTiers::EnforceBudgetsLocked() {
  const size_t batch = config_.tier_batch_pages;
  const auto over = [&](Tier t, uint64_t budget) {
    return budget > 0 && ns_.ColdBytes(t) > budget;
  };
  if (disk_ != nullptr) {
    while (over(Tier::kHostCompressed, config_.host_compressed_bytes)) {
      if (MoveColder(Tier::kHostCompressed, batch) > 0) continue;
      // The disk refuses (full, failing) or nothing can move: drop instead.
      if (ns_.DropColdest(Tier::kHostCompressed, batch) == 0) break;
    }
    while (over(Tier::kDisk, config_.disk_bytes)) {
      if (ns_.DropColdest(Tier::kDisk, batch) == 0) break;
    }
  } else {
    while (over(Tier::kHostCompressed, config_.host_compressed_bytes)) {
      if (ns_.DropColdest(Tier::kHostCompressed, batch) == 0) break;
    }
  }
}

void NamespaceTiers::EnforceBudgets() {
  if (!tiered()) return;
  absl::MutexLock ml(&move_mu_);
  EnforceBudgetsLocked();
}

void NamespaceTiers::MakeRoom(uint32_t n) {
  absl::MutexLock ml(&move_mu_);
  for (;;) {
    const uint32_t free = ns_.FreeSlots();
    if (free >= n) break;
    const size_t want = std::max<size_t>(n - free, config_.tier_batch_pages);
    if (MoveColder(Tier::kRaw, want) == 0) break;
  }
  EnforceBudgetsLocked();
}

absl::StatusOr<uint64_t> NamespaceTiers::DemoteAll(Tier to) {
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

}  // namespace kvharbor
