// NamespaceCalibrations: the calibration state of one namespace and its
// persistence (docs/calibration.md).
//
// The tier codec can change while a namespace lives (online calibration,
// UploadCalibration). This class holds the active codec and a record of every
// calibration the namespace's cold pages may still reference: each cold page
// keeps a shared pointer to the codec that encoded it, so pages of several
// codecs and calibrations coexist and each decodes with its own. With online
// calibration it samples inserted pages (core/calibration/online_calibration.h)
// and the fp8 fallback encodes until the store's background calibrator runs
// RunJob and installs a KVTC calibration. With a disk tier, every calibration
// a disk page is written with, and the active calibration and pin, are
// persisted in disk_dir (core/calibration/calibration_store.h), so a warm
// restart decodes those pages and keeps the active calibration. With a device
// tier each calibration also gets its GPU encoder and decoder.
//
// Owned by its Namespace, which it never calls: it knows nothing of pages,
// slots or the index (the page counts ListCalibrations shows come from the
// namespace). The NamespaceConfig it is given outlives it.
//
// Thread-safe. cal_mu_ guards the active codec, the records, the pin and the
// state; it is a leaf (no other lock is taken under it; only the log
// callbacks run under it). persist_mu_ serialises the writes and removals of
// persisted calibration files: file I/O happens under it, never under
// cal_mu_. Lock order: persist_mu_ before cal_mu_. Relative to the
// namespace's other locks: NamespaceTiers::move_mu_ before persist_mu_, and
// neither of this class's locks is ever held with Namespace::mu_ (the
// namespace reads the active codec before it takes mu_).
#ifndef KVHARBOR_CORE_STORE_NAMESPACE_CALIBRATIONS_H_
#define KVHARBOR_CORE_STORE_NAMESPACE_CALIBRATIONS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/calibration/calibration_store.h"
#include "core/calibration/online_calibration.h"
#include "core/codec/codec.h"
#include "core/store/device_tier.h"
#include "core/store/namespace_config.h"
#include "types/stats.h"

namespace kvharbor {

enum class CalibrationSource { kConfig, kUploaded, kOnline };

// One calibration of a namespace (ListCalibrations).
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

class NamespaceCalibrations {
 public:
  explicit NamespaceCalibrations(const NamespaceConfig& config);
  NamespaceCalibrations(const NamespaceCalibrations&) = delete;
  NamespaceCalibrations& operator=(const NamespaceCalibrations&) = delete;

  // ---- Creation (before the namespace is shared) ----
  // Sets up the active codec, the config calibration's record and the
  // sampler from the config. A device tier that cannot make the config
  // calibration's GPU codecs is an error naming `codec`.
  absl::Status Init();
  // Warm restart (with a disk tier, before its pages are loaded): opens the
  // calibration files in disk_dir and loads the persisted calibrations (each
  // validated by building its codec; a bad one is removed with a warning)
  // and, when the spec is the one they were persisted under, the active
  // calibration and pin.
  void Restore();
  // The codec of a restored disk page written with (`codec`,
  // `fingerprint`); null when this namespace has no such codec.
  std::shared_ptr<const Codec> CodecForRestoredPage(const std::string& codec,
                                                    uint64_t fingerprint);

  // ---- The active codec ----
  // The codec evictions and COMPRESSED fetches of raw pages use now.
  std::shared_ptr<const Codec> tier_codec() const ABSL_LOCKS_EXCLUDED(cal_mu_);
  CalibrationStats status() const ABSL_LOCKS_EXCLUDED(cal_mu_);
  // Every calibration still active or referenced by a stored page, active
  // first, then newest first; `pages` counts the cold pages of each
  // fingerprint. Call ForgetUnused first to leave out the others.
  std::vector<CalibrationInfo> List(
      const absl::flat_hash_map<uint64_t, uint64_t>& pages) const
      ABSL_LOCKS_EXCLUDED(cal_mu_);
  // Codec name and canonical bytes of the calibration with `fingerprint`
  // (0: the active one; empty bytes for a codec without calibration).
  // NotFound naming calibration_fingerprint.
  absl::StatusOr<std::pair<std::string, std::shared_ptr<const std::string>>>
  Get(uint64_t fingerprint) const ABSL_LOCKS_EXCLUDED(cal_mu_);
  // Validates `bytes` fully for the namespace's calibrated codec and
  // geometry (InvalidArgument naming `field`) and makes it the active
  // calibration; FailedPrecondition when the namespace's codec takes none
  // or the active calibration is pinned. Returns its fingerprint.
  absl::StatusOr<uint64_t> Upload(std::string bytes, bool pin,
                                  absl::string_view field)
      ABSL_LOCKS_EXCLUDED(persist_mu_, cal_mu_);
  // Pins or unpins the active calibration; `fingerprint` (0 = the active
  // one) must name it (FailedPrecondition otherwise).
  absl::Status Pin(uint64_t fingerprint, bool pinned)
      ABSL_LOCKS_EXCLUDED(persist_mu_, cal_mu_);
  // Forgets the calibrations nothing needs any more (not active, no cold
  // page, move or fetch holds their codec) and removes their files.
  void ForgetUnused() ABSL_LOCKS_EXCLUDED(persist_mu_, cal_mu_);

  // ---- Online calibration ----
  // Offers a completed uploaded page to the sampler. True once enough
  // tokens were seen: the caller then requests a calibration (the state is
  // kCalibrating from here on).
  bool Sample(const uint8_t* page, uint64_t first_position)
      ABSL_LOCKS_EXCLUDED(cal_mu_);
  bool has_sampler() const { return sampler_ != nullptr; }
  // For the background calibrator: runs `fn` over a snapshot of the sample
  // without holding any lock, then installs the result unless `stop` says
  // so (namespace deleted, calibrator shutting down) or the active
  // calibration is pinned. No-op unless a calibration was requested.
  void RunJob(const OnlineCalibrateFn& fn, const std::function<bool()>& stop)
      ABSL_LOCKS_EXCLUDED(persist_mu_, cal_mu_);

  // ---- For the namespace's tier moves and fetches ----
  // The GPU encoder / decoder of the calibration whose codec is `codec`
  // (null when it has none).
  std::shared_ptr<PageBatchEncoder> GpuEncoderOf(const Codec* codec) const
      ABSL_LOCKS_EXCLUDED(cal_mu_);
  std::shared_ptr<PageBatchDecoder> GpuDecoderOf(const Codec* codec) const
      ABSL_LOCKS_EXCLUDED(cal_mu_);
  // Writes the calibration of `codec` to disk_dir unless it is there
  // already (or `codec` has no calibration): before a disk page encoded
  // with it is written.
  absl::Status PersistCalibrationOf(const Codec& codec)
      ABSL_LOCKS_EXCLUDED(persist_mu_, cal_mu_);

 private:
  struct Record {
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
  // The record made of a validated `codec` built from `bytes`.
  Record MakeRecord(std::unique_ptr<Codec> codec,
                    std::shared_ptr<const std::string> bytes,
                    CalibrationSource source) const;
  // Makes rec's GPU encoder and decoder when the namespace has a device
  // tier and a cold tier (nothing otherwise). Errors: the tier's.
  absl::Status AttachDeviceCodecs(Record* rec) const;
  // After creation (an upload, an online switch): a GPU failure is logged
  // and the calibration works on the CPU.
  void AttachDeviceCodecsOrWarn(Record* rec) const;
  // The record whose codec is `codec`, or null.
  const Record* RecordOfLocked(const Codec* codec) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cal_mu_);
  // The record of (`codec`, `fingerprint`), or calibrations_.end().
  std::vector<Record>::iterator FindLocked(absl::string_view codec,
                                           uint64_t fingerprint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cal_mu_);
  // Makes `rec` the active codec.
  void ActivateLocked(Record rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(cal_mu_);
  // Restore's steps: the persisted calibrations that validate, then the
  // active calibration and pin persisted under this spec.
  std::vector<Record> LoadPersisted(CalibrationStore::ScanResult* scan) const;
  void RestoreStateLocked(const CalibrationStore::ScanResult& scan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cal_mu_);
  // RunJob's result: installs `rec` (when `codec_status` is OK) or goes back
  // to sampling.
  void InstallOnline(absl::Status codec_status, Record rec, uint64_t tokens,
                     double seconds) ABSL_LOCKS_EXCLUDED(persist_mu_, cal_mu_);
  absl::Status PersistRecordLocked(absl::string_view codec,
                                   uint64_t fingerprint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(persist_mu_) ABSL_LOCKS_EXCLUDED(cal_mu_);
  // Persists the active calibration and the state (after a switch or a pin
  // change); a failure is a warning (a restart then starts from the spec).
  void PersistState() ABSL_LOCKS_EXCLUDED(persist_mu_, cal_mu_);

  const NamespaceConfig& config_;
  std::unique_ptr<CalibrationStore> store_;  // with a disk tier (Restore)

  absl::Mutex persist_mu_ ABSL_ACQUIRED_BEFORE(cal_mu_);
  mutable absl::Mutex cal_mu_;
  std::shared_ptr<const Codec> active_codec_ ABSL_GUARDED_BY(cal_mu_);
  uint64_t active_fingerprint_ ABSL_GUARDED_BY(cal_mu_) = 0;
  bool pinned_ ABSL_GUARDED_BY(cal_mu_) = false;
  std::vector<Record> calibrations_ ABSL_GUARDED_BY(cal_mu_);
  CalibrationState state_ ABSL_GUARDED_BY(cal_mu_) = CalibrationState::kNone;
  std::unique_ptr<PageSampler> sampler_;  // null without online calibration
  // Sampling until a calibration is requested (read on the insert path
  // without cal_mu_); next_request_tokens_ moves on after a failed run.
  std::atomic<bool> sampling_{false};
  std::atomic<uint64_t> next_request_tokens_{0};
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_NAMESPACE_CALIBRATIONS_H_
