// Uploads: the namespace side of two-phase inserts (core/store/upload.h).
// Begin locks the cached prefix an upload skips and reserves slots (making
// room by eviction or, tiered, by demotion first); Reserve adds slots as the
// bytes arrive; Commit indexes the filled pages (promoting cold prefix pages
// the new ones extend); Abort gives everything back. It also counts the
// uploads in flight and feeds completed pages to the calibration sampler.
//
// Owned by its Namespace, which it works on: the index, slot table,
// cold-page table and leases change together under the namespace's index
// lock (Namespace::mu_), so the *Locked methods require it. Thread-safe;
// its own lock (mu_) is a leaf that guards only the in-flight count.
#ifndef KVHARBOR_CORE_STORE_UPLOADS_H_
#define KVHARBOR_CORE_STORE_UPLOADS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/store/namespace.h"
#include "core/store/upload.h"

namespace kvharbor {

class Uploads {
 public:
  explicit Uploads(Namespace& ns) : ns_(ns) {}

  // Namespace::BeginInsert (see there).
  absl::StatusOr<std::unique_ptr<Upload>> Begin(const InsertSpec& spec);
  // Appends `k` slots to the upload's, making room for them (tiered: by
  // demotion first, see BeginInsert). ResourceExhausted as BeginInsert.
  absl::Status Reserve(Upload* up, uint32_t k) ABSL_LOCKS_EXCLUDED(ns_.mu_);
  // Whether `k` more slots for `up` could ever be had: not when the
  // upload's slots with them, and their metadata, exceed the whole budget
  // (RESOURCE_EXHAUSTED naming store.pool_budget_bytes). Checked before
  // reclaiming from other namespaces.
  absl::Status CheckAdmissible(const Upload& up, uint32_t k) const;
  // Indexes the upload's pages; every byte arrived and was checked.
  absl::StatusOr<InsertOutcome> Commit(Upload* up) ABSL_LOCKS_EXCLUDED(ns_.mu_);
  // Frees the upload's slots and unlocks its prefix.
  void Abort(Upload* up) ABSL_LOCKS_EXCLUDED(ns_.mu_);
  // Offers the completed uploaded page in `slot` (reserved by the caller)
  // to the calibrations' sampler, through a host copy for a device pool,
  // and requests a calibration once it has enough.
  void SampleSlot(uint32_t slot, uint64_t first_position);
  // Uploads begun and neither committed nor aborted.
  uint64_t in_flight() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The upload is over (committed or aborted): its locked prefix nodes
  // unlocked, its slots no longer its own, the in-flight count down.
  void EndLocked(Upload* up) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu_);
  // Locks the upload's present prefix (checking its skip), counts it in
  // flight and reserves the slots of its cold skipped pages and of its
  // first new page (placed: of all); on error the upload holds nothing.
  absl::Status BeginUpload(Upload* up) ABSL_LOCKS_EXCLUDED(ns_.mu_);
  // Under BeginUpload, by key kind: finds and locks what of the upload's
  // sequence is cached (the present prefix's path; in a page-hash namespace
  // the leading pages present each alone), checks its skip, and sets
  // present_pages_, skip_pages_ and the cold pages to restore.
  absl::Status LockPresentPrefixLocked(Upload* up)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu_);
  absl::Status LockPresentPagesLocked(Upload* up)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu_);
  // Under Commit, by key kind: indexes the upload's filled pages (the
  // sequence as one path, or each page alone) and returns how many pages
  // were present already.
  absl::StatusOr<uint32_t> CommitPathLocked(Upload* up)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu_);
  uint32_t CommitPagesLocked(Upload* up) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu_);
  // Under BeginUpload: the upload's skip (from its prefix lease, or
  // checked against it) and whether the skipped pages are cached; `present`
  // are the handles of the cached prefix.
  absl::Status CheckSkipLocked(Upload* up, absl::Span<const PageHandle> present)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu_);
  // Whether the cold skipped pages of `up` can be restored raw: only a
  // lossless (identity) copy can (a raw page is exact); FailedPrecondition
  // naming skip_pages otherwise, so that the client sends them.
  absl::Status CheckRestorableLocked(const Upload& up) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu_);
  // Fills the slots of the cold skipped pages [skip_pages_, sent_from_) of
  // `up` from their stored copies (decoded outside the index lock; the
  // upload's lock keeps them in place). FailedPrecondition naming
  // skip_pages when one cannot be read.
  absl::Status RestoreSkipped(Upload* up) ABSL_LOCKS_EXCLUDED(ns_.mu_);
  // Slots for `n` new pages, evicting for room (see BeginInsert); adds the
  // pages evicted to *evicted. *budget_full as SlotTable::Allocate.
  absl::StatusOr<std::vector<uint32_t>> ReserveLocked(uint32_t n,
                                                      uint32_t* evicted,
                                                      bool* budget_full)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu_);
  // The ResourceExhausted error of a reservation of `n` pages that found no
  // room: what holds the slots, counted from the slot table.
  absl::Status FullErrorLocked(uint32_t n) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu_);
  // Promotes cold prefix pages [skip, present) of an upload at commit.
  void PromoteLocked(Upload* up, absl::Span<const PageHandle> current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu_);
  // Makes cold page `old_h` raw from the upload's filled `slot` (its
  // checksum and first position given); the page before it must be raw
  // already.
  void PromoteOneLocked(PageHandle old_h, uint32_t slot, uint64_t checksum,
                        uint64_t first_position)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu_);

  Namespace& ns_;
  mutable absl::Mutex mu_;
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_UPLOADS_H_
