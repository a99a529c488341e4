// NamespaceTiers: moves the pages of one namespace between tiers
// (types/tier.h, docs/tiers.md): raw -> host-compressed -> disk -> gone.
//
// When the pool needs room, LRU unlocked raw pages are encoded with the
// namespace's active codec (a batch at a time; on the GPU when the
// calibration has a GPU encoder) into per-page buffers in the
// host-compressed tier, which has its own byte budget; over budget, the
// coldest of those go to the disk tier or are dropped; over the disk budget,
// disk pages are dropped. A batch is chosen and committed by the Namespace
// under its mu_ (the index, slots and cold-page table are the namespace's);
// the work between -- encoding, checksum checks, persisting the calibration
// and writing disk files -- runs here without mu_, so Match, Fetch and
// inserts proceed meanwhile. A page is switched between tiers in one critical
// section after its new copy is complete, and never while locked, so no
// reader sees a half-moved page.
//
// Owned by its Namespace (which it calls back for selection and commit);
// the pool, disk tier and calibrations it is given belong to that namespace
// and outlive it.
//
// Thread-safe. move_mu_ serialises tier moves: one batch at a time per
// namespace, held across a batch's work outside Namespace::mu_ and the
// namespace calls that take mu_. Lock order: move_mu_ before
// NamespaceCalibrations::persist_mu_ (a disk write persists its calibration
// first) before Namespace::mu_ before NamespaceCalibrations::cal_mu_.
#ifndef KVHARBOR_CORE_STORE_NAMESPACE_TIERS_H_
#define KVHARBOR_CORE_STORE_NAMESPACE_TIERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/codec/codec.h"
#include "core/index/radix_index.h"
#include "core/memory/page_pool.h"
#include "core/store/disk_tier.h"
#include "core/store/namespace_calibrations.h"
#include "core/store/namespace_config.h"
#include "types/tier.h"

namespace kvharbor {

class Namespace;

// The buffer of one raw page of `pool` (its slot pinned or reserved by the
// caller) encoded with `codec`; device pools are read back into `host`
// first. Called outside the namespace's mu_.
absl::StatusOr<std::string> EncodePoolPage(PagePool& pool, uint32_t slot,
                                           uint64_t position,
                                           const Codec& codec,
                                           CodecWorkspace* ws,
                                           std::string* host);

// A page chosen to move, between selection and commit.
struct TierMoveJob {
  static constexpr uint32_t kNoSlot = UINT32_MAX;
  PageHandle handle = 0;
  uint64_t position = 0;
  uint32_t slot = kNoSlot;  // raw source, pinned
  std::shared_ptr<const std::string> buffer;
  std::shared_ptr<const Codec> codec;  // the buffer's codec
  uint64_t checksum = 0;               // XXH3-64 of *buffer
  std::vector<Token> tokens;           // disk target
  uint64_t file_id = 0;
  bool ok = false;
  bool corrupt = false;  // host buffer failed its checksum
};

class NamespaceTiers {
 public:
  // `disk` null: no disk tier.
  NamespaceTiers(Namespace* ns, const NamespaceConfig& config, PagePool* pool,
                 DiskTier* disk, NamespaceCalibrations* calibrations);
  NamespaceTiers(const NamespaceTiers&) = delete;
  NamespaceTiers& operator=(const NamespaceTiers&) = delete;

  bool tiered() const { return config_.host_compressed_bytes > 0; }
  Tier ColdestTier() const {
    return disk_ != nullptr ? Tier::kDisk : Tier::kHostCompressed;
  }
  // Moves every unlocked page hotter than `to` into `to` (cold tiers only),
  // then enforces the budgets. Returns pages moved. FailedPrecondition when
  // the namespace has no such tier.
  absl::StatusOr<uint64_t> DemoteAll(Tier to) ABSL_LOCKS_EXCLUDED(move_mu_);
  // Brings each cold tier back under its budget (moving colder or dropping).
  void EnforceBudgets() ABSL_LOCKS_EXCLUDED(move_mu_);
  // Frees raw slots for `n` pages by demotion, before an insert reserves.
  void MakeRoom(uint32_t n) ABSL_LOCKS_EXCLUDED(move_mu_);

 private:
  // One batch from `from` to the next colder tier; returns pages moved.
  size_t MoveColder(Tier from, size_t max_pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(move_mu_);
  // Sets job.buffer and job.checksum of every raw-source job that encodes
  // (batched through the calibration's GPU encoder when it has one);
  // failures are logged and leave the buffer null.
  void EncodeRawJobs(std::vector<TierMoveJob>* jobs) const;
  // Marks `job` ok when its new copy is complete: encoded (raw source) or
  // verified (host source, else marked corrupt), and written when `to` is
  // the disk.
  void PrepareJob(Tier from, Tier to, TierMoveJob* job) const;
  void EnforceBudgetsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(move_mu_);

  Namespace& ns_;
  const NamespaceConfig& config_;
  PagePool& pool_;
  DiskTier* const disk_;
  NamespaceCalibrations& calibrations_;
  absl::Mutex move_mu_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_NAMESPACE_TIERS_H_
