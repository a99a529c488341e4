// Online KVTC calibration of a namespace: the defaults and checks of its
// options (OnlineCalibrationOptions, types/online_calibration.h: a
// NamespaceSpec field), the row sampler that keeps a bounded reservoir of
// inserted pages, and the calibration run that turns a sample into a KVTC
// calibration file.
//
// A namespace created with online calibration and no calibration stores its
// evicted pages with the fp8 codec (core/codec/fp8/fp8_codec.h) while it
// samples; once min_tokens tokens were offered, the store's background
// calibrator (core/store/online_calibrator.h) runs RunOnlineKvtcCalibration on
// a snapshot of the reservoir, outside every namespace lock, and the namespace
// switches its tier codec to KVTC (docs/calibration.md).
//
// Memory: PageSampler owns its reservoir (max_sample_tokens tokens of
// float32 K and V, at most kMaxOnlineSampleBytes); a calibration copies it
// once and adds the PCA's working set (OnlineCalibrationMemoryBytes states
// the whole bound; docs/calibration.md).
//
// PageSampler is thread-safe (its own mutex, never held while calling out).
// The other functions are pure.
#ifndef KVHARBOR_CORE_CALIBRATION_ONLINE_CALIBRATION_H_
#define KVHARBOR_CORE_CALIBRATION_ONLINE_CALIBRATION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/calibration/calibration_pca.h"
#include "core/calibration/kv_samples.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "types/geometry.h"
#include "types/online_calibration.h"

namespace kvharbor {

// Largest reservoir accepted (K and V floats together).
inline constexpr uint64_t kMaxOnlineSampleBytes = uint64_t{4} << 30;
// The reservoir max_sample_tokens = 0 asks for: as many whole pages as fit
// kDefaultOnlineSampleBytes, at most kDefaultOnlineSampleTokens (Llama-3-8B,
// 32 x 8 x 128: 4096 tokens; 160 features per token: 16384).
inline constexpr uint64_t kDefaultOnlineSampleBytes = uint64_t{1} << 30;
inline constexpr uint64_t kDefaultOnlineSampleTokens = 16384;
uint64_t DefaultOnlineSampleTokens(const Geometry& g);

// `o` with max_sample_tokens = 0 replaced by the default for `g`.
OnlineCalibrationOptions ResolveOnlineCalibration(OnlineCalibrationOptions o,
                                                  const Geometry& g);

// Features of one calibration row of `kind` for `g`.
uint64_t OnlineRowFeatures(KvtcRowKind kind, const Geometry& g);

// Peak bytes a calibration of the (resolved) options holds besides the
// daemon's pages: the reservoir, its snapshot, the CPU PCA's working set,
// the error coefficients and the result.
uint64_t OnlineCalibrationMemoryBytes(const OnlineCalibrationOptions& o,
                                      const Geometry& g);

// Checks every field against the geometry (a resolved max_sample_tokens or
// 0); messages start with `prefix` (e.g. "spec.online_calibration").
absl::Status ValidateOnlineCalibration(const OnlineCalibrationOptions& o,
                                       const Geometry& g,
                                       absl::string_view prefix);

// Reservoir sampling over whole pages (Vitter's algorithm R), so per-page
// rows keep their runs of consecutive positions.
class PageSampler {
 public:
  PageSampler(const Geometry& geometry, const OnlineCalibrationOptions& o);

  // Offers one stored page (page_bytes() bytes in the namespace's dtype and
  // layout) starting at `first_position`.
  void Offer(const uint8_t* page, uint64_t first_position);
  uint64_t tokens_offered() const;
  uint64_t tokens_sampled() const;
  size_t capacity_pages() const { return capacity_pages_; }
  // The reservoir as KV samples (tokens in page order), for the calibration.
  KvSamples Snapshot() const;

 private:
  // Converts a page into the reservoir's float layout.
  void Store(const uint8_t* page, uint64_t first_position, size_t index)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Geometry geometry_;
  const RopeStyle rope_style_;
  const size_t capacity_pages_;
  const uint64_t token_features_;  // layers * heads * head_dim
  mutable absl::Mutex mu_;
  uint64_t pages_offered_ ABSL_GUARDED_BY(mu_) = 0;
  size_t pages_kept_ ABSL_GUARDED_BY(mu_) = 0;
  // [page][token][layer][head][dim] for keys and for values.
  std::vector<float> k_ ABSL_GUARDED_BY(mu_);
  std::vector<float> v_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> first_positions_ ABSL_GUARDED_BY(mu_);
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
};

// What the background calibrator runs: a KVTC calibration file (canonical
// bytes) for `geometry` from `samples`, or an error (Cancelled when
// `cancelled` turned true). Tests inject slower or failing ones.
using OnlineCalibrateFn = std::function<absl::StatusOr<std::string>(
    const KvSamples& samples, const OnlineCalibrationOptions& options,
    const Geometry& geometry, const std::function<bool()>& cancelled)>;

// The real one: core/calibration/kvtc_calibrate.h with one ratio
// (target_ratio), the namespace's page size, dtype as raw_dtype, RoPE undone
// per options, on the CPU PCA (core/calibration/pca_cpu.h).
absl::StatusOr<std::string> RunOnlineKvtcCalibration(
    const KvSamples& samples, const OnlineCalibrationOptions& options,
    const Geometry& geometry, const std::function<bool()>& cancelled);

// The same on another PCA engine (a GPU daemon's,
// server/daemon/device_setup.cc); when the engine fails (e.g. out of device
// memory) the calibration runs on the CPU PCA instead. `pca` may be null (the
// CPU PCA only).
OnlineCalibrateFn MakeOnlineKvtcCalibrateFn(
    std::shared_ptr<const CalibrationPca> pca);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CALIBRATION_ONLINE_CALIBRATION_H_
