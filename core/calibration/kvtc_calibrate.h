// Offline KVTC calibration (arXiv 2511.01815, sections 3.1-3.2): from KV
// samples (core/calibration/kv_samples.h) build the rows the codec will see
// (per token by default, or per page; keys with RoPE undone when asked),
// compute the mean and the full PCA basis of keys and of values on the CPU
// (LAPACK through OpenBLAS, core/codec/kvtc/kvtc_calibration.h PcaBasis),
// measure or model the error of each quantization choice per group of
// components, and run the bit-allocation DP
// (core/codec/kvtc/kvtc_bit_allocation.h) once per target ratio. One basis,
// several ratios: each ratio gives its own calibration with the projection cut
// to the components that received bits.
//
// The ratio is relative to the raw size of the rows in `raw_dtype`: a row of
// F features costs F * 8 * DTypeSize(raw_dtype) bits raw and gets
// floor(that / ratio) bits, per-row metadata included. Per-batch bytes (the
// 128-byte envelope, 8 bytes per page, 32 per section, 40 per range) and the
// attention-sink tokens (FP8) are outside the row budget; they amortize over
// a batch (docs/kv_samples.md gives the formula).
//
// The PCA can run elsewhere: CalibrateOptions::pca (a CalibrationPca, e.g.
// the GPU one in cuda/calibration_pca_gpu.h) replaces the CPU PCA and may
// return fewer components than features (a top-k solver); bit allocation,
// errors and the calibration are then computed exactly as on the CPU path
// over the components it returned.
//
// Memory: everything is owned by the returned values; the rows of the
// samples are copied once (up to max_rows). Thread-compatible; no state.
#ifndef KVHARBOR_CORE_CALIBRATION_KVTC_CALIBRATE_H_
#define KVHARBOR_CORE_CALIBRATION_KVTC_CALIBRATE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/calibration/kv_samples.h"
#include "core/codec/kvtc/kvtc_bit_allocation.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "types/geometry.h"

namespace kvharbor {

// The mean and leading principal directions of calibration rows.
struct PcaOutcome {
  // mean [features]; projection [features][components], components ordered
  // by decreasing variance (as PcaBasis returns them); ranges empty.
  KvtcBasis basis;
};

// A PCA engine for the calibration rows (the CPU path uses PcaBasis).
// Implementations are thread-compatible; CalibrateKvtc calls one at a time.
class CalibrationPca {
 public:
  virtual ~CalibrationPca() = default;
  virtual std::string name() const = 0;
  // Largest feature count Compute accepts.
  virtual uint64_t max_features() const = 0;
  // PCA of `x` ([rows][features], row-major). `useful_components` is how
  // many components any ratio could give bits to (an engine computing
  // only the top ones needs no more); progress lines go to `say`.
  virtual absl::StatusOr<PcaOutcome> Compute(
      absl::Span<const float> x, uint64_t rows, uint64_t features,
      uint64_t useful_components,
      const std::function<void(absl::string_view)>& say) const = 0;
};

// Largest feature count of the CPU PCA (features^2 doubles and LAPACK's
// dense eigensolver in memory).
inline constexpr uint64_t kCpuPcaMaxFeatures = 8192;

struct CalibrateOptions {
  KvtcRowKind row_kind = KvtcRowKind::kPerToken;
  uint32_t page_size = 16;   // the target namespace's page size
  uint32_t sink_tokens = 4;  // tokens at positions below are not calibrated
  // Undo RoPE on keys when the samples hold roped keys (the calibration then
  // says rope_style = the samples'); false keeps them as they are.
  bool undo_rope = true;
  // Components per DP group. With several sizes the DP runs for each and
  // each basis keeps, per ratio, the allocation with the least expected
  // error: small groups pay 64 bits of IntX metadata per few components,
  // large ones quantize coarsely, and which wins depends on the budget.
  std::vector<uint64_t> group_sizes = {4, 8, 16, 32};
  std::vector<double> ratios = {8, 16, 32};
  DType raw_dtype = DType::kBF16;
  // Measure each choice's error on the calibration rows (default) or use
  // ModelGroupErrors on the eigenvalues.
  bool measured_errors = true;
  bool merge_intx = false;
  // Rows beyond this are subsampled evenly (PCA cost is rows * features^2).
  uint64_t max_rows = 262144;
  // Called with one line per stage; may be empty.
  std::function<void(absl::string_view)> progress;
  // Polled between stages (may be empty): true stops the calibration with
  // Cancelled (the daemon's background calibrator,
  // core/store/online_calibrator.h).
  std::function<bool()> cancelled;
  // Null: the CPU PCA (at most kCpuPcaMaxFeatures features).
  std::shared_ptr<const CalibrationPca> pca;
};

struct CalibrationOutcome {
  double ratio = 0;
  uint64_t budget_bits_per_row = 0;
  uint64_t raw_bits_per_row = 0;
  KvtcCalibration calibration;
  BitAllocation keys;  // the DP results
  BitAllocation values;
  uint64_t keys_group_size = 0;  // the group size each allocation used
  uint64_t values_group_size = 0;
  double keys_variance = 0;    // total variance of the rows (sum of
  double values_variance = 0;  // eigenvalues), for relative errors
};

// Rows the codec would project for these samples and options: [rows][F].
// Per token: one row per token at position >= sink_tokens, features
// [layer][kv_head][head_dim]. Per page: runs of page_size consecutive
// positions starting at a multiple of page_size and at or after
// sink_tokens, one row per (page, layer), features [token][kv_head][dim].
// kv = 0 keys (RoPE undone when `undo_rope` and the keys are roped), 1 values.
absl::StatusOr<std::vector<float>> BuildCalibrationRows(
    const KvSamples& samples, const CalibrateOptions& options, int kv,
    uint64_t* rows, uint64_t* features);

// Validates options (messages name the option) and samples, then calibrates.
absl::StatusOr<std::vector<CalibrationOutcome>> CalibrateKvtc(
    const KvSamples& samples, const CalibrateOptions& options);

// One line per basis: budget, components kept, ranges, expected relative
// error.
std::string DescribeOutcome(const CalibrationOutcome& outcome);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CALIBRATION_KVTC_CALIBRATE_H_
