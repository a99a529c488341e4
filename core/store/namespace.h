// Namespace: the KV pages of one model geometry for one tenant.
//
// A namespace owns a PagePool (the page bytes), a RadixIndex (sequence
// elements -> page handles) and a slot table that ties them together: for
// every pool slot
// its generation, state, pin count and checksum. Leases (Match with lock) hold
// radix-tree locks with a time to live. Inserts are two-phase Uploads: slots
// are reserved, filled outside the lock, checked, and only then committed to
// the index; an Upload destroyed before Commit leaves nothing behind. An
// upload may skip a cached prefix (an append: only the pages after it are
// sent) and may take its bytes layer by layer (docs/engines_api.md).
//
// Sequences (types/key_kind.h): a token namespace is keyed by token ids,
// page_size per page; a page-key namespace by one opaque key per page, which
// callers encode with core/index/page_key.h into kPageKeyWords index
// elements. The calls below take the elements ("elements": token ids or
// encoded keys) and count in tokens (page_size per page) either way.
//
// PageHandle = (generation << 32) | slot. A handle goes stale the moment its
// page is evicted (the generation changes), so a late Fetch of an evicted
// page fails instead of returning another page's bytes.
//
// Tiers (types/tier.h, docs/tiers.md): a page starts raw in the pool; cold
// pages (host-compressed buffers, disk files) keep their handle in the
// namespace's cold-page table. Moving pages between tiers is NamespaceTiers'
// job (core/store/namespace_tiers.h), which calls back here to choose and to
// commit a batch. Fetch can return pages raw (cold pages are decoded) or as
// the stored codec buffers (raw pages are encoded).
//
// Calibrations: the tier codec, the calibrations cold pages still reference,
// online calibration and their persistence in disk_dir are
// NamespaceCalibrations' (core/store/namespace_calibrations.h); every cold
// page keeps a shared pointer to the codec that encoded it.
//
// Thread-safe. mu_ guards the index, slot table, cold-page table, leases and
// counters; page bytes are copied outside it, protected by pins (a pinned
// slot is not reused until unpinned), by the upload's reservation, or by
// shared ownership of cold buffers. The parts have their own locks
// (NamespaceTiers::move_mu_; NamespaceCalibrations::persist_mu_ and cal_mu_).
// Lock order: move_mu_ before persist_mu_ before mu_ before cal_mu_;
// lease_ids_mu_ (the lease ids HasLease reads) is a leaf after mu_. The
// namespace takes no lock of its parts while holding mu_ (it reads the
// active codec before taking mu_), and its parts call back into it only
// without their own locks, except NamespaceTiers under move_mu_.
#ifndef KVHARBOR_CORE_STORE_NAMESPACE_H_
#define KVHARBOR_CORE_STORE_NAMESPACE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/codec/codec.h"
#include "core/index/radix_index.h"
#include "core/memory/host_arena.h"
#include "core/memory/host_block.h"
#include "core/memory/memory_budget.h"
#include "core/memory/page_pool.h"
#include "core/store/disk_tier.h"
#include "core/store/namespace_calibrations.h"
#include "core/store/namespace_config.h"
#include "core/store/namespace_tiers.h"
#include "types/key_kind.h"
#include "types/tier.h"

namespace kvharbor {

class Namespace : public std::enable_shared_from_this<Namespace> {
 public:
  static absl::StatusOr<std::shared_ptr<Namespace>> Create(
      NamespaceConfig config, std::unique_ptr<PagePool> pool);
  ~Namespace();

  const NamespaceConfig& config() const { return config_; }
  const std::string& name() const { return config_.name; }
  size_t page_bytes() const { return page_bytes_; }
  KeyKind key_kind() const { return config_.key_kind; }
  // Index elements per page: page_size token ids, or kPageKeyWords words of
  // one encoded page key.
  uint32_t elements_per_page() const { return epp_; }

  // ---- Match and leases ----
  struct MatchOutcome {
    size_t matched_tokens = 0;
    std::vector<PageHandle> pages;
    std::vector<Tier> tiers;  // one per page, at the time of the match
    uint64_t lease_id = 0;    // 0 unless lock and matched_tokens > 0
    absl::Time lease_expiry = absl::InfinitePast();
  };
  // ttl 0 = default; capped at max_lease_ttl. `keep_going` is polled
  // during a long walk (the server passes its call's deadline and
  // cancellation); its error stops the Match, which then changed nothing.
  // The walk is linear in the pages matched (a 1M-page chain in tens of
  // milliseconds, bench/match_bench --chains) and holds only this
  // namespace's lock.
  absl::StatusOr<MatchOutcome> Match(
      absl::Span<const Token> elements, bool lock, absl::Duration ttl,
      absl::FunctionRef<absl::Status()> keep_going);
  absl::StatusOr<MatchOutcome> Match(absl::Span<const Token> elements,
                                     bool lock, absl::Duration ttl);
  // NotFound for an unknown (or expired) lease.
  absl::Status Release(uint64_t lease_id);
  absl::StatusOr<absl::Time> ExtendLease(uint64_t lease_id, absl::Duration ttl);
  // Without waiting for mu_: the server finds a lease's namespace by
  // asking each, and must not wait behind another namespace's long call.
  bool HasLease(uint64_t lease_id) const;
  // Releases leases whose expiry is before `now`; returns how many.
  size_t ReapExpiredLeases(absl::Time now);

  // ---- Insert (two-phase) ----
  struct InsertOutcome {
    size_t already_present_tokens = 0;
    uint32_t pages_stored = 0;
    uint32_t pages_evicted = 0;
  };
  class Upload {
   public:
    ~Upload();  // Aborts when not committed: frees slots, drops locks.
    Upload(const Upload&) = delete;
    Upload& operator=(const Upload&) = delete;

    // Pages of the sequence, and those whose bytes the stream carries (the
    // pages after the skipped prefix): total_bytes() = sent_pages() *
    // page bytes.
    uint32_t num_pages() const { return num_pages_; }
    uint32_t sent_pages() const { return num_pages_ - sent_from_; }
    uint64_t total_bytes() const { return total_bytes_; }
    uint64_t bytes_received() const { return received_; }
    // Pages already cached and raw when the upload began: the sent ones
    // among them are accepted and discarded.
    uint32_t skip_pages() const { return skip_pages_; }

    // Appends `data` at `offset`, which must equal bytes_received(): page
    // after page, or with layer_major the layers of all sent pages one
    // after another (InsertSpec), reserving slots for the new pages it
    // reaches (see BeginInsert). InvalidArgument past total_bytes() or out
    // of order; DataLoss when a completed page does not match its declared
    // checksum; ResourceExhausted when no slot can be had. After an error
    // the upload is dead: every later call fails.
    absl::Status Write(uint64_t offset, absl::string_view data);
    // Makes the pages visible. FailedPrecondition unless every byte arrived.
    absl::StatusOr<InsertOutcome> Commit();

    // ---- Placed upload (core/store/namespace_device.cc): a same-host
    // client writes the sent pages into the reserved slots itself (CUDA IPC
    // into device slots) instead of sending them through Write.
    // PagePool::Data of the slot reserved for page `page` of the sequence
    // (a device address for device pools); null for a page below
    // skip_pages() or past the end.
    uint8_t* SlotData(uint32_t page) const;
    // Accepts the sent pages [skip_pages(), num_pages()) as written in
    // place: hashes each where it lies (on the GPU for a device pool whose
    // tier can, else read back or in host memory) and compares it with
    // `checksums`, one per sent page in order. DataLoss naming
    // page_checksums[i] (i counted from the first sent page) at the first
    // mismatch, InvalidArgument naming page_checksums for a wrong count,
    // FailedPrecondition once Write took bytes or after a previous accept.
    // After an error the upload is dead: nothing is stored, and destroying
    // it gives the slots back. Then Commit as after Write.
    absl::Status AcceptPlaced(absl::Span<const uint64_t> checksums);

   private:
    friend class Namespace;
    Upload() = default;
    void Abort();
    std::shared_ptr<Namespace> ns_;
    // Where the bytes at stream offset received_ go: (page, offset in it,
    // bytes up to the end of that contiguous run).
    struct Target {
      uint32_t page;
      uint64_t in_page;
      uint64_t run;
    };
    Target Locate(uint64_t offset) const;
    // The pages [0, n) a write up to stream offset `end` reaches at least
    // partly (layer-major: every sent page once past the first layer).
    uint32_t PagesReached(uint64_t end) const;
    // Page `page` is whole with `checksum`: checked against the declared
    // one (DataLoss naming page_checksums[i]) and offered to the sampler.
    absl::Status PageDone(uint32_t page, uint64_t checksum);
    // Layer-major: once every byte arrived, PageDone of each sent page.
    absl::Status FinishPages();
    std::vector<Token> tokens_;        // the elements of the sequence
    std::vector<uint64_t> checksums_;  // empty, or one per sent page
    // Reserved so far, for pages skip_pages_, skip_pages_ + 1, ...
    std::vector<uint32_t> slots_;
    // Pages [skip_pages_, present_pages_) were cached but cold: their bytes
    // are stored raw again at commit (keeps the path invariant).
    uint32_t present_pages_ = 0;
    RadixNode* prefix_node_ = nullptr;  // locked while the upload lives
    // Handles of the cold pages [skip_pages_, sent_from_) RestoreSkipped
    // reads back (in slots_[0..]).
    std::vector<PageHandle> restore_;
    uint32_t num_pages_ = 0;
    uint32_t skip_pages_ = 0;
    // The first page whose bytes the stream carries (InsertSpec's skip);
    // pages [skip_pages_, sent_from_) are cold skipped pages whose slots
    // were filled from their stored copy when the upload began.
    uint32_t sent_from_ = 0;
    uint64_t prefix_lease_id_ = 0;
    bool layer_major_ = false;
    bool placed_ = false;  // every slot reserved at begin (InsertSpec)
    uint32_t evicted_for_room_ = 0;
    uint64_t total_bytes_ = 0;
    uint64_t received_ = 0;
    struct HashState;
    std::unique_ptr<HashState> hash_;
    std::vector<uint64_t> computed_;  // checksum of each completed page
    bool done_ = false;
    absl::Status error_;
  };
  // What an Insert stores (proto InsertHeader; errors name its fields).
  struct InsertSpec {
    // The elements of the whole sequence, skipped pages included: a whole
    // number of pages.
    absl::Span<const Token> elements;
    // Empty, or the XXH3-64 of each sent page (page_checksums[i] is page
    // skip + i).
    absl::Span<const uint64_t> checksums;
    // Append: the first skip_pages pages are not sent. They must be cached
    // (FailedPrecondition naming skip_pages otherwise, nothing stored) and
    // stay locked until the upload ends; cold ones among them are made raw
    // again from their stored copy, as a sent page would be, when that copy
    // is lossless (identity codec; FailedPrecondition naming skip_pages
    // otherwise: the client sends them).
    uint32_t skip_pages = 0;
    // Append after this lease of the namespace, which must hold a prefix of
    // the sequence (NotFound / FailedPrecondition naming prefix_lease_id):
    // skip exactly its pages (skip_pages, when set, must agree).
    uint64_t prefix_lease_id = 0;
    // Bytes arrive layer by layer: for each layer, for each sent page, K
    // then V of that layer (types/layer_range.h).
    bool layer_major = false;
    // A placed upload (Upload::SlotData / AcceptPlaced): the client writes
    // the slots itself, so every slot is reserved here, not as bytes arrive.
    bool placed = false;
  };
  // Slots are reserved as the bytes arrive: the first new page's here (with
  // those of cold skipped pages restored here), the others by Write when a
  // chunk reaches them, so an upload never evicts more than it is about to
  // fill, and one that stops sending holds one page's slot more than it
  // filled (layer-major: the first layer reaches every sent page; placed:
  // all at once). Room is made when the pool is full: untiered, by evicting
  // LRU pages; tiered, by demoting LRU raw pages, then (when concurrent
  // uploads took that room) by evicting LRU raw pages whose slot is free at
  // once -- never a cold page, which frees no slot.
  // ResourceExhausted, naming the namespace and what holds its slots, when
  // that is not enough (slots reserved, locked or pinned), here or from a
  // Write; more new pages than the namespace's capacity fail here.
  absl::StatusOr<std::unique_ptr<Upload>> BeginInsert(const InsertSpec& spec);
  // Every page sent, page after page.
  absl::StatusOr<std::unique_ptr<Upload>> BeginInsert(
      absl::Span<const Token> elements, absl::Span<const uint64_t> checksums);

  // ---- Fetch ----
  // Pages pinned for reading: their slots are not reused until destruction.
  class PinnedPages {
   public:
    PinnedPages() = default;
    PinnedPages(PinnedPages&&) noexcept;
    PinnedPages& operator=(PinnedPages&&) noexcept;
    ~PinnedPages();
    size_t size() const { return handles_.size(); }
    FetchFormat format() const { return format_; }
    // Tier the page was in when pinned.
    Tier tier(size_t i) const { return tiers_[i]; }
    // The page in the pinned format: page_bytes() raw bytes, or its codec
    // buffer. checksum(i) is the XXH3-64 of exactly these bytes.
    absl::string_view bytes(size_t i) const;
    // Raw format only.
    const uint8_t* data(size_t i) const;
    PageHandle handle(size_t i) const { return handles_[i]; }
    uint64_t checksum(size_t i) const { return checksums_[i]; }
    // Compressed format: the codec bytes(i) is in and its calibration's
    // fingerprint (pages of one fetch may differ after a codec switch).
    absl::string_view codec_name(size_t i) const;
    uint64_t calibration_fingerprint(size_t i) const;
    size_t page_bytes() const;
    // Counts bytes sent to a client in the namespace's bytes_out.
    void NoteBytesOut(uint64_t n) const;

   private:
    friend class Namespace;
    void Reset();
    std::shared_ptr<Namespace> ns_;
    FetchFormat format_ = FetchFormat::kRaw;
    std::vector<uint32_t> slots_;  // kNoSlot for cold pages
    std::vector<Tier> tiers_;
    std::vector<uint64_t> positions_;
    // Cold pages' buffers (shared with the tier) and bytes made for this
    // read (decoded or encoded), by page; empty where unused.
    std::vector<std::shared_ptr<const std::string>> buffers_;
    // The codec of each cold page's buffer; for raw pages the encoder.
    std::vector<std::shared_ptr<const Codec>> codecs_;
    std::vector<std::string> owned_;  // COMPRESSED format
    // RAW format: page i's bytes at raw_ + i * page_bytes when it is not
    // read in place from a host pool (one allocation for the whole read).
    std::unique_ptr<HostBlock> raw_;
    std::vector<PageHandle> handles_;
    std::vector<uint64_t> checksums_;
  };
  // Pages [start, start+count) of a lease (count 0 = to the end).
  absl::StatusOr<PinnedPages> PinLease(uint64_t lease_id, uint32_t start,
                                       uint32_t count,
                                       FetchFormat format = FetchFormat::kRaw);
  // NotFound naming the first handle that is not a cached page.
  absl::StatusOr<PinnedPages> PinPages(absl::Span<const PageHandle> handles,
                                       FetchFormat format = FetchFormat::kRaw);

  // ---- Same-host zero copy (core/store/namespace_device.cc) ----
  struct DevicePage {
    PageHandle handle = 0;
    uint64_t offset = 0;  // from the arena's base
    uint64_t bytes = 0;
  };
  struct LeaseDevicePages {
    std::vector<DevicePage> pages;  // the lease's, in order
    absl::Time expiry;
  };
  // Where the pages of a lease lie in the device arena whose byte 0 is at
  // device address `arena_base` (arena_bytes long). The lease keeps them
  // there (locked pages are neither evicted nor moved) until it ends.
  // NotFound naming lease_id for an inactive lease; FailedPrecondition when
  // the namespace's pool is in host memory, or naming the first page that is
  // not raw on the device (pages[i]).
  absl::StatusOr<LeaseDevicePages> DevicePagesOfLease(
      uint64_t lease_id, uintptr_t arena_base, uint64_t arena_bytes) const;
  // Brings the lease's cold pages (host-compressed, disk) into free device
  // slots so that DevicePagesOfLease can hand them out
  // (core/store/namespace_stage.cc): disk files are read, host buffers
  // checked, and each calibration's pages decoded by its GPU decoder
  // straight into the slots (DecodeEachToDevice) and checksummed there;
  // pages of a codec without one are decoded on the CPU and copied in. Then,
  // in one critical section, the pages become raw in their slots with new
  // handles that the lease (and every other lease) follows, as
  // promote_on_fetch does (counted in promoted_pages). A tiered namespace
  // first demotes LRU raw pages for room, as an insert would (never a
  // leased page). Returns the pages staged. NotFound naming lease_id;
  // FailedPrecondition for a host pool, or naming stage_cold when too few
  // slots are free (Fetch those pages instead); DataLoss naming the page
  // whose stored bytes are corrupt (nothing is staged).
  absl::StatusOr<uint32_t> StageLeaseOnDevice(uint64_t lease_id);

  // ---- Same-host Fetch through shared memory (core/store/namespace_host.cc)
  // ----
  struct HostPage {
    PageHandle handle = 0;
    uint64_t offset = 0;  // from byte 0 of the shared host arena
    uint64_t bytes = 0;
    uint64_t checksum = 0;  // XXH3-64 of the page, as Fetch sends it
  };
  struct LeaseHostPages {
    std::vector<HostPage> pages;  // the lease's, in order
    absl::Time expiry;
  };
  // Where the pages of a lease lie in the shared host arena `arena` (the
  // one the store cut this namespace's pool from). The lease keeps them
  // there until it ends (locked pages are neither evicted nor moved).
  // NotFound naming lease_id for an inactive lease; FailedPrecondition when
  // the pool is not cut from `arena` (a device pool, or a private mapping),
  // or naming the first page that is not raw in tier 0 (pages[i]).
  absl::StatusOr<LeaseHostPages> HostPagesOfLease(uint64_t lease_id,
                                                  const HostArena& arena) const;

  // ---- Eviction ----
  struct EvictOutcome {
    uint64_t pages = 0;
    uint64_t bytes = 0;
  };
  // These pages and their descendants; FailedPrecondition if any is leased.
  absl::StatusOr<EvictOutcome> EvictPages(absl::Span<const PageHandle> pages);
  // At least `bytes` of unlocked pages (fewer when not enough are unlocked).
  EvictOutcome EvictBytes(uint64_t bytes);
  EvictOutcome EvictAll();

  // ---- Tiers ----
  bool tiered() const { return tiers_.tiered(); }
  // Tier moves: DemoteAll, EnforceBudgets.
  NamespaceTiers& tiers() { return tiers_; }
  // Tier of a cached page (NotFound otherwise).
  absl::StatusOr<Tier> TierOf(PageHandle h) const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Memory (the store's MemoryBudget, NamespaceConfig::budget) ----
  // Bytes this namespace holds in the budget: committed raw slots, slot and
  // index metadata, cold-page metadata and host-compressed buffers.
  uint64_t memory_bytes() const {
    return charged_.load(std::memory_order_relaxed);
  }
  // Frees at least `bytes` of the budget when it can, for another
  // namespace (or this one): first the memory of free slots, then its
  // coldest pages leave memory -- untiered, its LRU unlocked pages are
  // evicted; tiered, host-compressed pages go to disk (or are dropped
  // without a disk tier) and raw pages are demoted. Raw pages leave only
  // when their pool gives memory back (not the sealed shared arena, not a
  // device pool). Returns what it freed.
  uint64_t ReclaimMemory(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Budget bytes a cached page's metadata is charged (slot, index entry and
  // its tokens), besides its page bytes.
  uint64_t page_meta_bytes() const;

  // ---- Introspection ----
  // Counters, tiers and calibration state now.
  NamespaceStats Counters() const ABSL_LOCKS_EXCLUDED(mu_);
  std::string DumpTree(size_t max_nodes) const;
  // Leases or uploads in flight.
  bool Busy() const;
  // Slot table, pool and index agree (every slot free, reserved by one
  // upload, or referenced by the index exactly once). For tests.
  absl::Status CheckInvariants() const;
  // Drops every lease (namespace deletion with force).
  void ReleaseAllLeases();

  // ---- Calibrations ----
  // The active codec, uploads, pins, online calibration.
  NamespaceCalibrations& calibrations() { return calibrations_; }
  const NamespaceCalibrations& calibrations() const { return calibrations_; }
  // Every calibration still active or referenced by a stored page (the
  // others are forgotten here), active first, then newest first, with the
  // number of cold pages of each.
  std::vector<CalibrationInfo> ListCalibrations() ABSL_LOCKS_EXCLUDED(mu_);
  // The store deleted this namespace: a running calibration is dropped.
  void MarkDeleted() { deleted_.store(true); }
  bool deleted() const { return deleted_.load(); }

 private:
  enum class SlotState : uint8_t { kFree, kReserved, kIndexed, kZombie };
  struct Slot {
    uint32_t generation = 1;
    SlotState state = SlotState::kFree;
    uint32_t pins = 0;
    uint64_t checksum = 0;
    uint64_t first_position = 0;
  };
  static constexpr uint32_t kNoSlot = TierMoveJob::kNoSlot;
  // A page in a cold tier, by its (unchanged) handle.
  struct ColdPage {
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
  // Where a cached page lives (cold points into cold_, valid under mu_).
  struct Located {
    Tier tier = Tier::kRaw;
    uint32_t slot = kNoSlot;
    const ColdPage* cold = nullptr;
  };
  struct Lease {
    RadixNode* node = nullptr;
    std::vector<PageHandle> pages;
    absl::Time expiry;
  };

  Namespace(NamespaceConfig config, std::unique_ptr<PagePool> pool,
            std::unique_ptr<DiskTier> disk);
  friend class NamespaceTiers;

  // Offers the completed uploaded page in `slot` (reserved by the caller)
  // to the calibrations' sampler, through a host copy for a device pool,
  // and requests a calibration once it has enough.
  void SampleSlot(uint32_t slot, uint64_t first_position);
  // XXH3-64 of the pages in `slots` (reserved or pinned by the caller), where
  // they lie: host pools on the CPU, device pools by the device tier's
  // ChecksumPages or, when it cannot, read back.
  absl::StatusOr<std::vector<uint64_t>> ChecksumSlots(
      absl::Span<const uint32_t> slots) const;
  // StageLeaseOnDevice's decode: the cold pages of `cold` (PinOneLocked'd,
  // buffers loaded) into `slots`, one each, with their checksums.
  absl::Status DecodeIntoSlots(const PinnedPages& cold,
                               absl::Span<const uint32_t> slots,
                               std::vector<uint64_t>* checksums) const;
  // FailedPrecondition naming the namespace: its pool is in host memory.
  absl::Status HostPoolError() const;

  static PageHandle MakeHandle(uint32_t slot, uint32_t generation) {
    return (uint64_t{generation} << 32) | slot;
  }
  // The slot of a live indexed page, or an error naming `field`.
  absl::StatusOr<uint32_t> ResolveLocked(PageHandle h) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Located> LocateLocked(PageHandle h) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds page h to `out` (pinning a raw slot, sharing a cold buffer, or
  // opening a disk file into *fd).
  void PinOneLocked(PageHandle h, const Located& loc, PinnedPages* out,
                    std::vector<std::pair<size_t, int>>* fds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Outside mu_: reads opened disk pages, verifies host buffers against
  // their checksums, decodes or encodes as the format needs, and computes
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
  // Materialize's RAW format (core/store/namespace_fetch.cc): device pages are
  // read back in one batch through the pool's pinned bounce buffer, cold
  // pages decoded (DecodeCold) into out->raw_.
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
  // promote_on_fetch: after a RAW fetch, moves its cold pages back into
  // free pool slots (in fetch order, as far as the path invariant allows)
  // and gives them their new handles in `out`.
  void PromoteFetched(PinnedPages* out);
  // A cold page whose bytes were written into a reserved slot, to be made
  // raw there; old_handle 0 gives the slot back.
  struct Promotion {
    PageHandle old_handle = 0;
    uint32_t slot = kNoSlot;
    uint64_t checksum = 0;  // XXH3-64 of the slot's page
    uint64_t first_position = 0;
  };
  // Makes each page raw in its slot, in order, where it is still cold and
  // the path invariant allows (its new handle replaces the old one in every
  // lease, counted in promoted_pages); frees the other slots. The new handle
  // of each page, 0 where it stayed cold.
  std::vector<PageHandle> CommitPromotionsLocked(
      absl::Span<const Promotion> promotions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Materialize, then drops the corrupt pages it found (DropCorrupt).
  absl::Status MaterializeOrDrop(PinnedPages* out,
                                 std::vector<std::pair<size_t, int>> fds);
  // Pages whose stored bytes failed their checksum: removed from the index
  // with their descendants (so the next Match misses them) and counted in
  // corrupt_dropped. A page still locked by a lease or an upload is never
  // served, Match stops before it (so no new lease holds it), and it is
  // dropped as soon as the last lease holding it ends (corrupt_pending_).
  void DropCorrupt(absl::Span<const PageHandle> handles);
  // Drops corrupt page h unless it is locked; false when locked.
  bool DropCorruptLocked(PageHandle h, std::vector<std::string>* lines)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the pending corrupt pages no lock holds any more (called where
  // leases and uploads end); appends a log line per page to `lines`.
  void DropPendingCorruptLocked(std::vector<std::string>* lines)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cuts a match before the first pending corrupt page in it.
  void TruncateAtCorruptLocked(absl::Span<const Token> tokens,
                               RadixIndex::MatchResult* m, MatchOutcome* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropColdLocked(PageHandle h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives up a raw page's slot (its handle lives on in cold_).
  void ReleaseSlotLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- For NamespaceTiers (core/store/namespace_tiers.h), which calls
  // these under its move_mu_; each takes mu_ itself.
  // Up to `max_pages` LRU pages of `from` to move to `to`: raw sources are
  // pinned and get `encoder`; disk targets get their prefix and a file id.
  std::vector<TierMoveJob> SelectMoves(Tier from, Tier to, size_t max_pages,
                                       std::shared_ptr<const Codec> encoder)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Unpins the jobs' sources and switches every ok job whose page is still
  // there, unlocked and not extended by a hotter page; removes the disk
  // files of the others and drops the pages found corrupt. Returns pages
  // moved.
  size_t CommitMoves(Tier from, Tier to, std::vector<TierMoveJob>* jobs)
      ABSL_LOCKS_EXCLUDED(mu_);
  // CommitMoves of one job; false when it did not move.
  bool CommitMoveLocked(Tier from, Tier to, const TierMoveJob& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops up to n pages of the coldest layer of `from`; returns how many.
  size_t DropColdest(Tier from, size_t n) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t ColdBytes(Tier t) const ABSL_LOCKS_EXCLUDED(mu_);
  // DiscardFreeSlotsLocked, after a demotion emptied slots.
  void DiscardFreeSlots() ABSL_LOCKS_EXCLUDED(mu_);
  // Cached pages in tiers hotter than `t`.
  uint64_t PagesHotterThan(Tier t) const ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t FreeSlots() const ABSL_LOCKS_EXCLUDED(mu_);
  void NoteDiskWriteError() ABSL_LOCKS_EXCLUDED(mu_);

  // Promotes cold prefix pages [skip, present) of an upload at commit.
  void PromoteLocked(Upload* up, absl::Span<const PageHandle> current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes cold page `old_h` raw from the upload's filled `slot`; the page
  // before it must be raw already.
  void PromoteOneLocked(PageHandle old_h, uint32_t slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status LoadDiskTier();
  absl::Status CheckColdLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Index eviction handed these pages back: retire their slots.
  void RetireLocked(absl::Span<const PageHandle> handles)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeSlotLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Slots for `n` new pages, evicting for room (see BeginInsert); adds the
  // pages evicted to *evicted. *budget_full as AllocateSlotsLocked.
  absl::StatusOr<std::vector<uint32_t>> ReserveLocked(uint32_t n,
                                                      uint32_t* evicted,
                                                      bool* budget_full)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `n` free slots of the pool (none when fewer are free), marked reserved:
  // committed ones first, then fresh ones, whose memory is charged to the
  // budget first. ResourceExhausted with *budget_full set when the budget
  // cannot take them.
  absl::StatusOr<std::vector<uint32_t>> AllocateSlotsLocked(uint32_t n,
                                                            bool* budget_full)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns the memory of every free committed slot to the system (where
  // the pool can) and to the budget.
  void DiscardFreeSlotsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Charges or releases the metadata part of this namespace's budget share
  // so that it matches the slot table, index, cold table and host tier now.
  void SyncMetaChargeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts up to `n` LRU raw pages whose slots are free at once; returns
  // how many.
  size_t EvictFreeAtOnceLocked(size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ResourceExhausted error of a reservation of `n` pages that found no
  // room: what holds the slots, counted from the slot table.
  absl::Status FullErrorLocked(uint32_t n) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Locks the upload's present prefix (checking its skip), counts it in
  // flight and reserves the slots of its cold skipped pages and of its
  // first new page (placed: of all); on error the upload holds nothing.
  absl::Status BeginUpload(Upload* up) ABSL_LOCKS_EXCLUDED(mu_);
  // Appends `k` slots to the upload's, making room for them (tiered: by
  // demotion first, see BeginInsert). ResourceExhausted as BeginInsert.
  absl::Status ReserveUploadSlots(Upload* up, uint32_t k)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Under BeginUpload: the upload's skip (from its prefix lease, or
  // checked against it) and whether the skipped pages are cached; `present`
  // are the handles of the cached prefix.
  absl::Status CheckSkipLocked(Upload* up, absl::Span<const PageHandle> present)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the cold skipped pages of `up` can be restored raw: only a
  // lossless (identity) copy can (a raw page is exact); FailedPrecondition
  // naming skip_pages otherwise, so that the client sends them.
  absl::Status CheckRestorableLocked(const Upload& up) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills the slots of the cold skipped pages [skip_pages_, sent_from_) of
  // `up` from their stored copies (decoded outside mu_; the upload's lock
  // keeps them in place). FailedPrecondition naming skip_pages when one
  // cannot be read.
  absl::Status RestoreSkipped(Upload* up) ABSL_LOCKS_EXCLUDED(mu_);
  // Elements `elements` make a whole number of pages within the request
  // limit, of valid tokens for a token namespace; errors name `field`.
  absl::Status CheckElements(absl::Span<const Token> elements,
                             absl::string_view field) const;
  // The elements of `pages` pages.
  size_t ElementsOf(size_t pages) const { return pages * epp_; }
  void UnpinLocked(absl::Span<const uint32_t> slots)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLeaseLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The active lease `id`, or NotFound naming lease_id: the one message
  // every lookup of a lease by id gives.
  absl::StatusOr<Lease*> FindLeaseLocked(uint64_t id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<const Lease*> FindLeaseLocked(uint64_t id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The slots of `lease`'s pages, in its order, for handing out where they
  // lie (GetDeviceHandles, GetHostHandles). Leased pages are locked in the
  // index: they resolve, and a raw one keeps its slot until the lease ends.
  // FailedPrecondition "pages[i]: page H of lease L is in tier T, <not_raw>"
  // for the first page that is not raw.
  absl::StatusOr<std::vector<uint32_t>> RawSlotsOfLeaseLocked(
      uint64_t lease_id, const Lease& lease, absl::string_view not_raw) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counters() but the calibration fields.
  NamespaceStats CountersWithoutCalibration() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Duration ClampTtl(absl::Duration ttl) const;
  // Adds (sign 1) or removes (-1) a cold page in codec_cold_.
  void CountColdLocked(const ColdPage& c, int sign)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortUpload(Upload* up);
  absl::StatusOr<InsertOutcome> CommitUpload(Upload* up);

  const NamespaceConfig config_;
  const size_t page_bytes_;
  const uint32_t epp_;              // index elements per page
  std::unique_ptr<PagePool> pool_;  // slot bookkeeping under mu_; bytes not
  std::unique_ptr<DiskTier> disk_;  // null without a disk tier
  NamespaceCalibrations calibrations_;
  NamespaceTiers tiers_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<PageHandle, ColdPage> cold_ ABSL_GUARDED_BY(mu_);
  uint64_t cold_bytes_[kNumTiers] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  // Cold pages and bytes by the name of the codec that encoded them.
  std::map<std::string, CodecStats, std::less<>> codec_cold_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_file_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint32_t next_restored_ ABSL_GUARDED_BY(mu_) = 0;
  RadixIndex index_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  // Pages found corrupt while locked, dropped when unlocked (DropCorrupt).
  absl::flat_hash_set<PageHandle> corrupt_pending_ ABSL_GUARDED_BY(mu_);
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
  uint64_t uploads_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // The event counters (Counters() fills the rest).
  NamespaceStats counters_ ABSL_GUARDED_BY(mu_);
  // Budget accounting: committed slots (each charged the pool's
  // host_bytes_per_slot) and the metadata charge last synced.
  uint64_t committed_slots_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t meta_charged_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> charged_{0};  // their sum in bytes, for the store
  // The ids of leases_, for HasLease; a leaf lock (taken under mu_ when a
  // lease comes or goes).
  mutable absl::Mutex lease_ids_mu_ ABSL_ACQUIRED_AFTER(mu_);
  absl::flat_hash_set<uint64_t> lease_ids_ ABSL_GUARDED_BY(lease_ids_mu_);
  mutable std::atomic<uint64_t> bytes_out_{0};
  mutable std::atomic<uint64_t> host_ipc_bytes_{0};
  std::atomic<bool> deleted_{false};
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_NAMESPACE_H_
