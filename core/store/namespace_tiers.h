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
  uint32_t slot = kNoSlot;    // raw source, pinned
  uint64_t raw_checksum = 0;  // raw source: XXH3-64 of the page as inserted
  std::shared_ptr<const std::string> buffer;
  std::shared_ptr<const Codec> codec;  // the buffer's codec
  uint64_t checksum = 0;               // XXH3-64 of *buffer
  std::vector<Token> tokens;           // disk target
  uint64_t file_id = 0;
  bool ok = false;
  // The source failed its checksum (a raw page in a host pool, or a host
  // buffer): it is dropped, never encoded or written with a fresh checksum.
  bool corrupt = false;
};

// What a demotion did (NamespaceTiers::Demote).
struct DemoteOutcome {
  uint64_t pages_moved = 0;  // tier moves; a page raw -> disk counts twice
  uint64_t to_host_compressed = 0;
  uint64_t to_disk = 0;
  // Pages still hotter than the target when it stopped: leased ones, and
  // those that found the host tier full with no disk below it.
  uint64_t pages_left = 0;
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
  // Moves unlocked pages hotter than `to` into `to` (cold tiers only), a
  // batch at a time, and never drops a page: raw pages enter the host tier
  // only while it has room for them; when it has none, its coldest pages
  // move to the disk tier, if there is one. Stops when the host tier is full
  // and nothing can go below it (pages_left says how many stayed), and when
  // the disk refuses a write: Unavailable, naming what moved before, with
  // every page still cached (the refused ones in the host tier, byte-exact)
  // and the refusals counted in disk_write_errors.
  // FailedPrecondition when the namespace has no such tier.
  absl::StatusOr<DemoteOutcome> Demote(Tier to) ABSL_LOCKS_EXCLUDED(move_mu_);
  // Demote(to), as the number of tier moves.
  absl::StatusOr<uint64_t> DemoteAll(Tier to) ABSL_LOCKS_EXCLUDED(move_mu_);
  // Brings each cold tier back under its budget (moving colder or dropping).
  void EnforceBudgets() ABSL_LOCKS_EXCLUDED(move_mu_);
  // Frees raw slots for `n` pages by demotion, before an insert reserves.
  void MakeRoom(uint32_t n) ABSL_LOCKS_EXCLUDED(move_mu_);
  // One step of taking this namespace's memory back for the store's budget
  // (Namespace::ReclaimMemory): a batch of the coldest host-compressed
  // pages goes to disk, or is dropped without a disk (or when it refuses);
  // with none, and `raw` set, up to `max_pages` LRU raw pages are demoted.
  // Returns the pages it moved or dropped (0: nothing left to take).
  size_t ShedColdest(size_t max_pages, bool raw) ABSL_LOCKS_EXCLUDED(move_mu_);

 private:
  // One batch from `from` to the next colder tier; returns pages moved,
  // and adds the disk writes that failed (and the first error) to the
  // optional outputs.
  size_t MoveColder(Tier from, size_t max_pages, size_t* disk_errors = nullptr,
                    absl::Status* first_disk_error = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(move_mu_);
  // Raw pages the host tier still has room for (by their raw size), at
  // most one batch.
  size_t HostRoomPages() const;
  // Sets job.buffer and job.checksum of every raw-source job that encodes
  // (batched through the calibration's GPU encoder when it has one);
  // failures are logged and leave the buffer null. Host-pool pages are first
  // checked against the checksum they were inserted with (job.corrupt when
  // they fail): an encoded or written copy would carry a fresh, valid
  // checksum over whatever bytes the slot holds.
  void EncodeRawJobs(std::vector<TierMoveJob>* jobs) const;
  // Marks `job` ok when its new copy is complete: encoded (raw source) or
  // verified (host source, else marked corrupt), and written when `to` is
  // the disk; returns the disk's error when it refused the write.
  absl::Status PrepareJob(Tier from, Tier to, TierMoveJob* job) const;
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
