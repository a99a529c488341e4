// Namespace: the KV pages of one model geometry for one tenant.
//
// A namespace owns a PagePool (the page bytes), a RadixIndex (token ids ->
// page handles) and a slot table that ties them together: for every pool slot
// its generation, state, pin count and checksum. Leases (Match with lock) hold
// radix-tree locks with a time to live. Inserts are two-phase Uploads: slots
// are reserved, filled outside the lock, checked, and only then committed to
// the index; an Upload destroyed before Commit leaves nothing behind.
//
// PageHandle = (generation << 32) | slot. A handle goes stale the moment its
// page is evicted (the generation changes), so a late Fetch of an evicted
// page fails instead of returning another page's bytes.
//
// Tiers (types/tier.h, docs/tiers.md): a page starts raw in the pool. When the
// pool needs room, LRU unlocked pages are encoded with the namespace's codec
// (a batch at a time, outside mu_) into per-page buffers in the
// host-compressed tier, which has its own byte budget; over budget, the
// coldest of those go to the disk tier (a DiskTier directory) or are
// dropped; over the disk budget, disk pages are dropped. A page keeps its
// handle in every tier. A page is switched between tiers in one critical
// section after its new copy is complete, and never while locked, so no
// reader sees a half-moved page. Fetch can return pages raw (cold pages are
// decoded) or as the stored codec buffers (raw pages are encoded).
//
// Calibrations (docs/calibration.md): the tier codec can change while the
// namespace lives (online calibration, UploadCalibration). Every cold page
// keeps a shared pointer to the codec that encoded it, so pages of several
// codecs and calibrations coexist and each decodes with its own; the
// namespace keeps the bytes of every calibration its pages still reference.
// With online calibration the namespace samples inserted pages
// (core/calibration/online_calibration.h) and evicts with the fp8 fallback
// until the store's background calibrator hands it a KVTC calibration. With a
// disk tier, every calibration a disk page is written with, and the active
// calibration and pin, are persisted in disk_dir
// (core/calibration/calibration_store.h), so a warm restart decodes those pages
// and keeps the active calibration.
//
// Thread-safe. One mutex (mu_) guards the index, slot table, cold-page table,
// leases and counters; page bytes are copied outside it, protected by pins (a
// pinned slot is not reused until unpinned), by the upload's reservation, or
// by shared ownership of cold buffers. move_mu_ serialises tier moves;
// cal_mu_ guards the active codec and the calibration records and is a leaf.
// persist_mu_ serialises the writes and removals of persisted calibration
// files (file I/O happens under it, never under mu_ or cal_mu_).
// Lock order: move_mu_ before persist_mu_ before mu_ before cal_mu_.
#ifndef KVHARBOR_CORE_STORE_NAMESPACE_H_
#define KVHARBOR_CORE_STORE_NAMESPACE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/calibration/calibration_store.h"
#include "core/calibration/online_calibration.h"
#include "core/codec/codec.h"
#include "core/index/radix_index.h"
#include "core/memory/host_block.h"
#include "core/memory/page_pool.h"
#include "core/store/device_tier.h"
#include "core/store/disk_tier.h"
#include "core/transform/kv_transform.h"
#include "types/geometry.h"
#include "types/tier.h"

namespace kvharbor {

class Namespace;

struct NamespaceConfig {
  std::string name;
  std::string tenant;  // NamespaceSpec::tenant (core/store/store.h)
  Geometry geometry;
  uint64_t capacity_bytes = 0;  // resolved: capacity_pages * page bytes
  std::string codec = "identity";
  absl::Duration default_lease_ttl = absl::Seconds(30);
  absl::Duration max_lease_ttl = absl::Minutes(10);
  uint32_t max_tokens_per_request = 1 << 20;

  // ---- Tiers. With host_compressed_bytes == 0 there is no cold tier and
  // eviction drops pages. tier_codec also encodes COMPRESSED fetches of raw
  // pages; Create makes an identity codec when it is null.
  std::shared_ptr<const Codec> tier_codec;
  std::string calibration;  // calibration file bytes ("" for identity)
  uint64_t calibration_fingerprint = 0;
  uint64_t host_compressed_bytes = 0;  // budget of the host-compressed tier
  std::string disk_dir;                // "" = no disk tier
  uint64_t disk_bytes = 0;             // disk tier budget; 0 = unlimited
  uint32_t tier_batch_pages = 32;      // pages encoded per move batch
  // Online calibration (codec kvtc only). Without a calibration, tier_codec
  // is the fp8 fallback until the first calibration is installed.
  OnlineCalibrationOptions online;
  // Called (without any namespace lock) when the sample is big enough; the
  // store queues the namespace on its background calibrator. Null: nobody
  // calibrates (tests drive RunCalibrationJob themselves).
  std::function<void(std::weak_ptr<Namespace>)> request_calibration;
  // The disk tier's write-side file calls; null = the real ones (tests
  // inject disk-full and I/O faults here).
  std::shared_ptr<const FileOps> file_ops;
  // Device pools (core/store/device_tier.h): the tier that makes, for each
  // calibration the namespace uses, the GPU encoder that demotes raw pages
  // in batches and the GPU decoder that RAW fetches of cold pages use. Null,
  // or a calibration it has no GPU codec for: the CPU codec (over host
  // copies of device pages).
  std::shared_ptr<DeviceTier> device_tier;
  // store.promote_on_fetch: cold pages a RAW fetch decoded go back into the
  // pool (tier 0) when it has free slots (nothing is evicted for them).
  bool promote_on_fetch = false;
  // Notable events (calibration switches): `log`; warnings (dropped disk
  // files, failed writes, failed calibrations): `warn`, or `log` when only
  // that is set. Null prints to stderr.
  std::function<void(const std::string&)> log;
  std::function<void(const std::string&)> warn;

  // ---- Fetch transform. The KVCM compressor built once from kvcm_path at
  // creation (null without one); immutable and shared by concurrent
  // fetches (KvTransform is thread-safe). The namespace itself never calls
  // it: the server applies it to fetched pages.
  std::string kvcm_path;
  std::shared_ptr<const KvTransform> kvcm;
};

enum class FetchFormat { kRaw, kCompressed };

// Counters of one namespace; mirrors kvharbor.v1.NamespaceStats.
struct NamespaceCounters {
  uint64_t capacity_pages = 0;
  uint64_t free_pages = 0;
  uint64_t cached_pages = 0;
  uint64_t evictable_pages = 0;
  uint64_t protected_pages = 0;
  uint64_t hit_tokens = 0;
  uint64_t miss_tokens = 0;
  uint64_t inserted_pages = 0;
  uint64_t dedup_pages = 0;
  uint64_t evicted_pages = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  // Page bytes of the leases GetHostHandles described (same-host Fetch:
  // the client copies them out of shared memory; the daemon does not see
  // the copy, so these are bytes offered, not bytes_out).
  uint64_t host_ipc_bytes = 0;
  uint64_t active_leases = 0;
  uint64_t index_nodes = 0;
  uint64_t index_memory_bytes = 0;
  uint64_t page_bytes = 0;
  uint64_t uploads_in_flight = 0;
  // Per tier (index by Tier): pages, and bytes stored (raw: page bytes).
  uint64_t tier_pages[kNumTiers] = {0, 0, 0};
  uint64_t tier_bytes[kNumTiers] = {0, 0, 0};
  uint64_t demoted_pages = 0;  // moves to a colder tier
  // Cold pages made raw again: by an insert extending them, or by a RAW
  // fetch with promote_on_fetch.
  uint64_t promoted_pages = 0;
  uint64_t disk_write_errors = 0;
  // Cold pages dropped because their stored bytes failed a checksum: a
  // host-compressed buffer or disk file found corrupt when fetched or moved,
  // or a disk file at warm restart.
  uint64_t corrupt_dropped = 0;
};

// Checks a token list from a client: non-empty, at most `max_tokens`, no
// negative ids. `field` names it in the error ("token_ids").
absl::Status ValidateTokens(absl::Span<const Token> tokens, uint32_t max_tokens,
                            absl::string_view field);

class Namespace : public std::enable_shared_from_this<Namespace> {
 public:
  static absl::StatusOr<std::shared_ptr<Namespace>> Create(
      NamespaceConfig config, std::unique_ptr<PagePool> pool);
  ~Namespace();

  const NamespaceConfig& config() const { return config_; }
  const std::string& name() const { return config_.name; }
  size_t page_bytes() const { return page_bytes_; }

  // ---- Match and leases ----
  struct MatchOutcome {
    size_t matched_tokens = 0;
    std::vector<PageHandle> pages;
    std::vector<Tier> tiers;  // one per page, at the time of the match
    uint64_t lease_id = 0;    // 0 unless lock and matched_tokens > 0
    absl::Time lease_expiry = absl::InfinitePast();
  };
  // ttl 0 = default; capped at max_lease_ttl.
  absl::StatusOr<MatchOutcome> Match(absl::Span<const Token> tokens, bool lock,
                                     absl::Duration ttl);
  // NotFound for an unknown (or expired) lease.
  absl::Status Release(uint64_t lease_id);
  absl::StatusOr<absl::Time> ExtendLease(uint64_t lease_id, absl::Duration ttl);
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

    uint32_t num_pages() const { return num_pages_; }
    uint64_t total_bytes() const { return total_bytes_; }
    uint64_t bytes_received() const { return received_; }
    // Pages already cached when the upload began; their bytes are accepted
    // and discarded.
    uint32_t skip_pages() const { return skip_pages_; }

    // Appends `data` at `offset`, which must equal bytes_received().
    // InvalidArgument past total_bytes() or out of order; DataLoss when a
    // completed page does not match its declared checksum. After an error
    // the upload is dead: every later call fails.
    absl::Status Write(uint64_t offset, absl::string_view data);
    // Makes the pages visible. FailedPrecondition unless every byte arrived.
    absl::StatusOr<InsertOutcome> Commit();

   private:
    friend class Namespace;
    Upload() = default;
    void Abort();
    std::shared_ptr<Namespace> ns_;
    std::vector<Token> tokens_;
    std::vector<uint64_t> checksums_;  // empty when the client sent none
    std::vector<uint32_t> slots_;      // reserved, for pages >= skip_pages_
    // Pages [skip_pages_, present_pages_) were cached but cold: their bytes
    // are stored raw again at commit (keeps the path invariant).
    uint32_t present_pages_ = 0;
    RadixNode* prefix_node_ = nullptr;  // locked while the upload lives
    uint32_t num_pages_ = 0;
    uint32_t skip_pages_ = 0;
    uint32_t evicted_for_room_ = 0;
    uint64_t total_bytes_ = 0;
    uint64_t received_ = 0;
    struct HashState;
    std::unique_ptr<HashState> hash_;
    std::vector<uint64_t> computed_;  // checksum of each completed page
    bool done_ = false;
    absl::Status error_;
  };
  // `tokens` must be a whole number of pages; `checksums` empty or one per
  // page. Reserves slots, making room when the pool is full: untiered, by
  // evicting LRU pages; tiered, by demoting LRU raw pages, then (when
  // concurrent uploads took that room) by evicting LRU raw pages whose slot
  // is free at once -- never a cold page, which frees no slot.
  // ResourceExhausted, naming the namespace and what holds its slots, when
  // that is not enough (slots reserved, locked or pinned).
  absl::StatusOr<std::unique_ptr<Upload>> BeginInsert(
      absl::Span<const Token> tokens, absl::Span<const uint64_t> checksums);

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
  bool tiered() const { return config_.host_compressed_bytes > 0; }
  // Moves every unlocked page hotter than `to` into `to` (cold tiers only),
  // then enforces the budgets. Returns pages moved. FailedPrecondition when
  // the namespace has no such tier.
  absl::StatusOr<uint64_t> DemoteAll(Tier to);
  // Brings each cold tier back under its budget (moving colder or dropping).
  void EnforceBudgets();
  // Tier of a cached page (NotFound otherwise).
  absl::StatusOr<Tier> TierOf(PageHandle h) const;

  // ---- Introspection ----
  NamespaceCounters Counters() const;
  std::string DumpTree(size_t max_nodes) const;
  // Leases or uploads in flight.
  bool Busy() const;
  // Slot table, pool and index agree (every slot free, reserved by one
  // upload, or referenced by the index exactly once). For tests.
  absl::Status CheckInvariants() const;
  // Drops every lease (namespace deletion with force).
  void ReleaseAllLeases();

  // ---- Calibrations (core/store/namespace_calibration.cc) ----
  enum class CalibrationSource { kConfig, kUploaded, kOnline };
  struct CalibrationInfo {
    std::string codec;
    uint64_t fingerprint = 0;
    CalibrationSource source = CalibrationSource::kConfig;
    absl::Time created;
    bool active = false;
    bool pinned = false;
    uint64_t pages = 0;  // cold pages encoded with it
    // Its pages evict and decode on the GPU (a device tier made its GPU
    // encoder and decoder).
    bool gpu = false;
  };
  struct CalibrationStatus {
    CalibrationState state = CalibrationState::kNone;
    uint64_t tokens_offered = 0;  // inserted tokens seen by the sampler
    uint64_t tokens_sampled = 0;  // tokens in the reservoir
    std::string active_codec;     // the codec evictions use now
    uint64_t active_fingerprint = 0;
    bool pinned = false;
  };
  // The codec evictions and COMPRESSED fetches of raw pages use now.
  std::shared_ptr<const Codec> tier_codec() const;
  CalibrationStatus calibration_status() const;
  // Every calibration still active or referenced by a stored page (the
  // others are forgotten here), active first, then newest first.
  std::vector<CalibrationInfo> ListCalibrations();
  // Codec name and canonical bytes of the calibration with `fingerprint`
  // (0: the active one; empty bytes for a codec without calibration).
  // NotFound naming calibration_fingerprint.
  absl::StatusOr<std::pair<std::string, std::shared_ptr<const std::string>>>
  GetCalibration(uint64_t fingerprint) const;
  // Validates `bytes` fully for this namespace's calibrated codec and
  // geometry (InvalidArgument naming `field`) and makes it the active
  // calibration; FailedPrecondition when the namespace's codec takes none
  // or the active calibration is pinned. Returns its fingerprint.
  absl::StatusOr<uint64_t> UploadCalibration(std::string bytes, bool pin,
                                             absl::string_view field);
  // Pins or unpins the active calibration; `fingerprint` (0 = the active
  // one) must name it (FailedPrecondition otherwise).
  absl::Status PinCalibration(uint64_t fingerprint, bool pinned);
  // Online calibration, for the background calibrator: runs `fn` over a
  // snapshot of the sample without holding any namespace lock, then
  // installs the result unless the namespace was deleted, the run was
  // cancelled or the active calibration is pinned. No-op unless a
  // calibration was requested.
  void RunCalibrationJob(const OnlineCalibrateFn& fn,
                         const std::function<bool()>& cancelled);
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
  static constexpr uint32_t kNoSlot = UINT32_MAX;
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
  // A page chosen to move, between selection and commit.
  struct MoveJob {
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
  struct Lease {
    RadixNode* node = nullptr;
    std::vector<PageHandle> pages;
    absl::Time expiry;
  };

  Namespace(NamespaceConfig config, std::unique_ptr<PagePool> pool);

  struct CalibrationRecord {
    std::string codec;
    uint64_t fingerprint = 0;
    std::shared_ptr<const std::string> bytes;
    std::shared_ptr<const Codec> impl;
    CalibrationSource source = CalibrationSource::kConfig;
    absl::Time created;
    bool persisted = false;  // its file is in disk_dir
    // impl's GPU twins (config_.device_tier), null where there are none.
    std::shared_ptr<PageBatchEncoder> gpu_encoder;
    std::shared_ptr<PageBatchDecoder> gpu_decoder;
  };
  // Makes rec's GPU encoder and decoder when the namespace has a device
  // tier and a cold tier (nothing otherwise). Errors: the tier's.
  absl::Status AttachDeviceCodecs(CalibrationRecord* rec) const;
  // After creation (an upload, an online switch): a GPU failure is logged
  // and the calibration works on the CPU.
  void AttachDeviceCodecsOrWarn(CalibrationRecord* rec) const;
  // The GPU encoder / decoder of the calibration whose codec is `codec`
  // (null when it has none).
  std::shared_ptr<PageBatchEncoder> GpuEncoderOf(const Codec* codec) const;
  std::shared_ptr<PageBatchDecoder> GpuDecoderOf(const Codec* codec) const;
  // The record whose codec is `codec`, or null.
  const CalibrationRecord* RecordOfLocked(const Codec* codec) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cal_mu_);
  // Sets up the active codec, the config calibration's record and the
  // sampler from config_ (at creation).
  absl::Status InitCalibration();
  // Warm restart (before LoadDiskTier): loads the persisted calibrations
  // (each validated by building its codec; a bad one is removed with a
  // warning) and, when the spec is the one they were persisted under, the
  // active calibration and pin.
  void RestoreCalibrations();
  // The codec of a restored disk page written with (`codec`,
  // `fingerprint`); null when this namespace has no such codec.
  std::shared_ptr<const Codec> CodecForRestoredPage(const std::string& codec,
                                                    uint64_t fingerprint);
  // Writes the calibration of `codec` to disk_dir unless it is there
  // already (or `codec` has no calibration): before a disk page encoded
  // with it is written.
  absl::Status PersistCalibrationOf(const Codec& codec);
  absl::Status PersistRecordLocked(absl::string_view codec,
                                   uint64_t fingerprint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(persist_mu_);
  // Persists the active calibration and the state (after a switch or a pin
  // change); a failure is a warning (a restart then starts from the spec).
  void PersistCalibrationState();
  // Forgets the calibrations nothing needs any more (not active, no cold
  // page, move or fetch holds their codec) and removes their files.
  void ForgetUnusedCalibrations();
  // Makes `rec` the active codec (cal_mu_ held).
  void ActivateLocked(CalibrationRecord rec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cal_mu_);
  // Offers a completed uploaded page to the sampler and, once enough
  // tokens were seen, requests a calibration.
  void SamplePage(const uint8_t* page, uint64_t first_position);

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
  // promote_on_fetch: after a RAW fetch, moves its cold pages back into
  // free pool slots (in fetch order, as far as the path invariant allows)
  // and gives them their new handles in `out`.
  void PromoteFetched(PinnedPages* out);
  // Materialize, then drops the corrupt pages it found (DropCorrupt).
  absl::Status MaterializeOrDrop(PinnedPages* out,
                                 std::vector<std::pair<size_t, int>> fds);
  // Cold pages whose stored bytes failed their checksum: removed from the
  // index with their descendants (so the next Match misses them) and
  // counted in corrupt_dropped. A page still locked by a lease stays until
  // the first read after its locks are gone (it is never served meanwhile).
  void DropCorrupt(absl::Span<const PageHandle> handles);
  // Outside mu_, for a pinned or reserved raw slot: the buffer of that one
  // page encoded with `codec`. Device pools are read back into `host` first.
  absl::StatusOr<std::string> EncodeSlot(uint32_t slot, uint64_t position,
                                         const Codec& codec, CodecWorkspace* ws,
                                         std::string* host) const;
  // Outside mu_: sets job.buffer and job.checksum of every raw-source job
  // that encodes (batched through config_.tier_encoder when the jobs' codec
  // is the one it was built for); failures are logged and leave the buffer
  // null.
  void EncodeRawJobs(std::vector<MoveJob>* jobs) const;
  void DropColdLocked(PageHandle h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives up a raw page's slot (its handle lives on in cold_).
  void ReleaseSlotLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One batch from `from` to the next colder tier; returns pages moved.
  size_t MoveColder(Tier from, size_t max_pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(move_mu_);
  // Drops up to n pages of the coldest layer of `from`; returns how many.
  size_t DropColdest(Tier from, size_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(move_mu_);
  void EnforceBudgetsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(move_mu_);
  // Frees raw slots for `n` pages by demotion, before an insert reserves.
  void MakeRoom(uint32_t n);
  // Promotes cold prefix pages [skip, present) of an upload at commit.
  void PromoteLocked(Upload* up, absl::Span<const PageHandle> current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes cold page `old_h` raw from the upload's filled `slot`; the page
  // before it must be raw already.
  void PromoteOneLocked(PageHandle old_h, uint32_t slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status LoadDiskTier();
  absl::Status CheckColdLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Log(const std::string& line) const;       // a warning
  void LogEvent(const std::string& line) const;  // a notable event
  Tier ColdestTier() const {
    return disk_ != nullptr ? Tier::kDisk : Tier::kHostCompressed;
  }
  // Index eviction handed these pages back: retire their slots.
  void RetireLocked(absl::Span<const PageHandle> handles)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeSlotLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Slots for `n` new pages, evicting for room (see BeginInsert); adds the
  // pages evicted to *evicted.
  absl::StatusOr<std::vector<uint32_t>> ReserveLocked(uint32_t n,
                                                      uint32_t* evicted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ResourceExhausted error of a reservation of `n` pages that found no
  // room: what holds the slots, counted from the slot table.
  absl::Status FullErrorLocked(uint32_t n) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes room (tiered), locks the upload's present prefix and reserves its
  // slots; on error the upload holds nothing.
  absl::Status ReserveForUpload(Upload* up) ABSL_LOCKS_EXCLUDED(mu_, move_mu_);
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
  absl::Duration ClampTtl(absl::Duration ttl) const;
  void AbortUpload(Upload* up);
  absl::StatusOr<InsertOutcome> CommitUpload(Upload* up);

  const NamespaceConfig config_;
  const size_t page_bytes_;
  std::unique_ptr<PagePool> pool_;  // slot bookkeeping under mu_; bytes not
  std::unique_ptr<DiskTier> disk_;  // null without a disk tier
  std::unique_ptr<CalibrationStore> cal_store_;  // with disk_

  absl::Mutex move_mu_ ABSL_ACQUIRED_BEFORE(persist_mu_);
  absl::Mutex persist_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  absl::flat_hash_map<PageHandle, ColdPage> cold_ ABSL_GUARDED_BY(mu_);
  uint64_t cold_bytes_[kNumTiers] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  uint64_t next_file_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint32_t next_restored_ ABSL_GUARDED_BY(mu_) = 0;
  RadixIndex index_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
  uint64_t uploads_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  NamespaceCounters counters_ ABSL_GUARDED_BY(mu_);
  mutable std::atomic<uint64_t> bytes_out_{0};
  mutable std::atomic<uint64_t> host_ipc_bytes_{0};

  mutable absl::Mutex cal_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::shared_ptr<const Codec> active_codec_ ABSL_GUARDED_BY(cal_mu_);
  uint64_t active_fingerprint_ ABSL_GUARDED_BY(cal_mu_) = 0;
  bool pinned_ ABSL_GUARDED_BY(cal_mu_) = false;
  std::vector<CalibrationRecord> calibrations_ ABSL_GUARDED_BY(cal_mu_);
  CalibrationState cal_state_ ABSL_GUARDED_BY(cal_mu_) =
      CalibrationState::kNone;
  std::unique_ptr<PageSampler> sampler_;  // null without online calibration
  // Sampling until a calibration is requested (read on the insert path
  // without cal_mu_); next_request_tokens_ moves on after a failed run.
  std::atomic<bool> sampling_{false};
  std::atomic<uint64_t> next_request_tokens_{0};
  std::atomic<bool> deleted_{false};
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_NAMESPACE_H_
