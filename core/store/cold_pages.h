// ColdPages: the cold-page table of one namespace -- for every page in a
// cold tier (host-compressed buffer or disk file), by its unchanged handle,
// where its bytes are, the codec that encoded them and their checksum --
// with the bytes per tier and the pages and bytes per codec that the
// namespace's counters and budget read.
//
// A page is raw in the pool until a tier move makes it cold (Add), moves it
// colder (MoveTo) or it is dropped (Drop, which also removes its disk file);
// promotion back into the pool drops it here once the index holds its new
// raw handle. The index decides which pages exist; this table only says
// where a cold one's bytes are.
//
// Owns the records and shares the host buffers (readers keep a buffer alive
// after a drop); borrows the disk tier, which outlives it (null without
// one). Thread-safe: one leaf lock (mu_); the callbacks of Check run under it
// and must take no lock. Changes that must agree with the index are made by
// the namespace under its index lock (core/store/namespace.h).
#ifndef KVHARBOR_CORE_STORE_COLD_PAGES_H_
#define KVHARBOR_CORE_STORE_COLD_PAGES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/codec/codec.h"
#include "core/index/radix_index.h"
#include "core/memory/page_pool.h"
#include "core/store/disk_tier.h"
#include "core/store/namespace_calibrations.h"
#include "core/store/pinned_pages.h"
#include "core/store/slot_table.h"
#include "types/stats.h"
#include "types/tier.h"

namespace kvharbor {

class ColdPages {
 public:
  struct Page {
    Tier tier = Tier::kHostCompressed;
    std::shared_ptr<const std::string> buffer;  // kHostCompressed
    uint64_t file_id = 0;                       // kDisk
    uint64_t stored_bytes = 0;                  // buffer size
    uint64_t first_position = 0;
    std::shared_ptr<const Codec> codec;  // the one that encoded the buffer
    // XXH3-64 of the host buffer, taken when it was encoded: verified on
    // every read so a corrupted byte in memory is never served or written
    // to disk. (Disk files carry their own checksum.)
    uint64_t checksum = 0;
  };

  // `disk` may be null (no disk tier); `pool` and `calibrations` are the
  // namespace's, read by the decode and encode of fetched pages.
  ColdPages(DiskTier* disk, PagePool* pool,
            const NamespaceCalibrations& calibrations);

  // A copy of page h's record (sharing its buffer), or nullopt for a page
  // that is not cold.
  std::optional<Page> Find(PageHandle h) const ABSL_LOCKS_EXCLUDED(mu_);
  bool Contains(PageHandle h) const ABSL_LOCKS_EXCLUDED(mu_);
  bool empty() const ABSL_LOCKS_EXCLUDED(mu_);

  // Page h became cold (or was found on disk at a restart).
  void Add(PageHandle h, Page page) ABSL_LOCKS_EXCLUDED(mu_);
  // Page h left its cold tier: its record goes, and its disk file. No-op
  // for a page that is not cold.
  void Drop(PageHandle h) ABSL_LOCKS_EXCLUDED(mu_);
  // Cold page h moves to the colder tier `to` (a disk file `file_id` now
  // holds its bytes there; the host buffer is let go).
  void MoveTo(PageHandle h, Tier to, uint64_t file_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Stored bytes of the pages in tier t.
  uint64_t bytes(Tier t) const ABSL_LOCKS_EXCLUDED(mu_);
  // A fresh disk file id, and the first one after a restart's scan.
  uint64_t NextFileId() ABSL_LOCKS_EXCLUDED(mu_);
  void SetNextFileId(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Cold pages and bytes by the name of the codec that encoded them.
  std::vector<CodecStats> ByCodec() const ABSL_LOCKS_EXCLUDED(mu_);
  // Cold pages by calibration fingerprint of their codec.
  absl::flat_hash_map<uint64_t, uint64_t> PagesByFingerprint() const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Budget bytes of the table and of the host-compressed buffers.
  uint64_t memory_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

  // The table agrees with the index and itself: `tier_of(h)` (called under
  // mu_) is each page's tier in the index, `tier_pages[t]` the index's count
  // of pages in tier t; host buffers match their size and checksum, disk
  // files exist, and the per-tier and per-codec counters match the records.
  // InternalError naming the first disagreement.
  absl::Status Check(
      absl::FunctionRef<absl::StatusOr<Tier>(PageHandle)> tier_of,
      absl::FunctionRef<uint64_t(Tier)> tier_pages) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Reading pinned pages (no lock: the pins, the caller's reservation
  // of slots and the shared buffers keep the bytes in place) ----
  // Reads opened disk pages, verifies host buffers against their
  // checksums, decodes or encodes as the format needs, and computes
  // checksums of cold pages. DataLoss when stored bytes are corrupt; the
  // handles of those pages are appended to `*corrupt`.
  absl::Status Materialize(PinnedPages* out,
                           std::vector<std::pair<size_t, int>> fds,
                           std::vector<PageHandle>* corrupt) const;
  // Materialize's first step, for every format: reads the opened disk
  // pages into out->buffers_ and verifies host-compressed buffers against
  // their checksums (DataLoss naming the first bad page; all of them in
  // *corrupt).
  absl::Status LoadColdBuffers(PinnedPages* out,
                               std::vector<std::pair<size_t, int>> fds,
                               std::vector<PageHandle>* corrupt) const;
  // Whether each host-compressed buffer of `pages` hashes to its checksum
  // (true for pages of other tiers); several threads for a large fetch.
  static std::vector<bool> VerifyHostBuffers(const PinnedPages& pages);
  // StageLeaseOnDevice's decode: the cold pages of `cold` (pinned, buffers
  // loaded) into the reserved device `slots` of `table`, one each, with
  // their checksums.
  absl::Status DecodeIntoSlots(const PinnedPages& cold,
                               absl::Span<const uint32_t> slots,
                               const SlotTable& table,
                               std::vector<uint64_t>* checksums) const;

 private:
  // Materialize's RAW format: device pages are read back in one batch
  // through the pool's pinned bounce buffer, cold pages decoded (DecodeCold)
  // into out->raw_.
  absl::Status MaterializeRaw(PinnedPages* out) const;
  // Decodes cold pages `idx` of `out` into out->raw_ and sets their
  // checksums: grouped by codec, each group in GPU batches when its
  // calibration has a GPU decoder, else (and for a page the GPU refuses)
  // with the CPU codec. DataLoss naming the page when a buffer does not
  // decode.
  absl::Status DecodeCold(PinnedPages* out, absl::Span<const size_t> idx) const;
  // Pages `idx` of `pages` (cold, buffers loaded), grouped by codec: each
  // group with a GPU decoder is decoded by it into gpu_dst(i) (DecodeEach,
  // or DecodeEachToDevice with `to_device`); then finish(i, codec, gpu_ok)
  // runs for every page (the CPU decode of the pages the GPU did not).
  absl::Status DecodeByCodec(
      const PinnedPages& pages, absl::Span<const size_t> idx, bool to_device,
      absl::FunctionRef<MutablePageRef(size_t)> gpu_dst,
      absl::FunctionRef<absl::Status(size_t, const Codec&, bool)> finish) const;
  // The stored buffer of cold page i of `pages`.
  static absl::Span<const uint8_t> ColdBuffer(const PinnedPages& pages,
                                              size_t i);
  // Decodes cold page i of `pages` on the CPU into `dst`; DataLoss
  // "page H: stored buffer does not decode, not <not_done>: ...".
  absl::Status DecodeOnCpu(const PinnedPages& pages, size_t i,
                           const Codec& codec, MutablePageRef dst,
                           CodecWorkspace* ws,
                           absl::string_view not_done) const;
  // Adds (sign 1) or removes (-1) a page in codec_cold_.
  void CountLocked(const Page& c, int sign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  DiskTier* const disk_;
  PagePool* const pool_;
  const size_t page_bytes_;
  const NamespaceCalibrations& calibrations_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<PageHandle, Page> cold_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_[kNumTiers] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  std::map<std::string, CodecStats, std::less<>> codec_cold_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_file_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_COLD_PAGES_H_
