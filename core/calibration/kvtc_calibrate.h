// Offline KVTC calibration (arXiv 2511.01815, sections 3.1-3.2): from KV
// samples (core/calibration/kv_samples.h) build the rows the codec will see
// (per token by default, or per page; keys with RoPE undone when asked),
// compute the mean and the leading PCA directions of keys and of values
// (core/calibration/calibration_pca.h: the CPU engine of
// core/calibration/pca_cpu.h unless CalibrateOptions::pca gives another,
// e.g. the GPU one of cuda/calibration/calibration_pca_gpu.h), measure or model
// the error of each quantization choice per group of components, and run the
// bit-allocation DP (core/codec/kvtc/kvtc_bit_allocation.h) once per target
// ratio, over keys' and values' groups together (they share what a page may
// cost; the DP minimizes the sum of their relative squared errors). One basis,
// several ratios: each ratio gives its own calibration with the projection cut
// to the components that received bits.
//
// Held-out expectation: the PCA and the DP see 90% of the rows; the other
// 10% (core/calibration/calibration_rows.h SplitHeldOut: contiguous stripes
// spread over the samples) are projected onto the fitted basis, and the
// expected relative errors the calibration states (its estimate, hence the
// stats, metrics and CLI) are measured on them with the allocation's
// choices, energy outside the kept components included. The basis shipped
// is the one fitted to the 90%, not a refit on all rows, so the estimate
// describes it. A basis fitted to fewer rows than features captures its own
// rows and little else; the held-out error says so where the fitted rows'
// error would be near 0.
//
// The ratio is raw bytes (the pages in `raw_dtype`) over stored bytes, over
// the stream of buffers the codec writes (one page per buffer by default,
// as the store evicts): every byte a buffer holds is counted (envelope,
// positions, section and range headers, IntX min/max, the attention sinks
// in FP8; the sinks' share comes from the fraction of sample tokens at
// positions < sink_tokens). KvtcRowBudgetFor turns that into a per-row
// budget for the DP, so the stored stream meets the ratio (zstd, when
// enabled, only shrinks it).
//
// With layer_groups > 1 (per-token rows only) each basis is block-diagonal:
// one PCA per group of consecutive layers, so the codec's projection costs
// 1/layer_groups of the full one's at the same total component count
// (docs/kvtc_format.md, docs/calibration.md).
//
// Memory: the rows are read from the samples in chunks, never held whole;
// besides the samples a calibration holds the PCA engine's working set
// (CpuPcaWorkingBytes), the coefficients of the rows the errors are
// measured on (at most kErrorRowsBytes unless max_error_rows says
// otherwise; the fitted and the held-out rows one after the other) and the
// outcomes' projections. Thread-compatible; no state.
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
#include "core/calibration/calibration_pca.h"
#include "core/calibration/kv_samples.h"
#include "core/calibration/pca_cpu.h"
#include "core/codec/kvtc/kvtc_bit_allocation.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "types/geometry.h"

namespace kvharbor {

// Coefficient bytes the error measurement holds at most (rows are
// subsampled evenly beyond), unless CalibrateOptions::max_error_rows is set.
inline constexpr uint64_t kErrorRowsBytes = uint64_t{256} << 20;

struct CalibrateOptions {
  KvtcRowKind row_kind = KvtcRowKind::kPerToken;
  uint32_t page_size = 16;   // the target namespace's page size
  uint32_t sink_tokens = 4;  // tokens at positions below are not calibrated
  // Undo RoPE on keys when the samples hold roped keys (the calibration then
  // says rope_style = the samples'); false keeps them as they are.
  bool undo_rope = true;
  // Components per DP group. With several sizes the DP runs for each and
  // the calibration keeps, per ratio, the allocation with the least
  // expected error: small groups pay 64 bits of IntX metadata per few
  // components, large ones quantize coarsely, and which wins depends on the
  // budget.
  std::vector<uint64_t> group_sizes = {4, 8, 16, 32, 64, 128};
  std::vector<double> ratios = {8, 16, 32};
  DType raw_dtype = DType::kBF16;
  // Measure each choice's error on the calibration rows (default) or use
  // ModelGroupErrors on the eigenvalues.
  bool measured_errors = true;
  bool merge_intx = false;
  // Rows beyond this are subsampled evenly.
  uint64_t max_rows = 262144;
  // Components each basis (each block with layer_groups) computes. 0: the
  // engine decides, at most what the ratios could give bits to (the CPU
  // subspace solver at most kCpuSubspaceDefaultComponents). More than the
  // features, or than the rows - 1 the samples give, is refused.
  uint64_t components = 0;
  // Block-diagonal bases: per-token rows in this many groups of consecutive
  // layers, one PCA each (1: one full PCA). Must divide the layer count.
  uint32_t layer_groups = 1;
  // Pages per stored buffer the ratio is counted over (1: the store's
  // eviction, one buffer per page).
  uint32_t pages_per_buffer = 1;
  // Rows the errors are measured on (evenly spaced), of the fitted rows and
  // of the held-out ones each; 0: as many as fit kErrorRowsBytes of
  // coefficients (at least 4096).
  uint64_t max_error_rows = 0;
  // Called with one line per stage; may be empty.
  std::function<void(absl::string_view)> progress;
  // Polled between stages and passes (may be empty): true stops the
  // calibration with Cancelled (the daemon's background calibrator,
  // core/store/online_calibrator.h).
  std::function<bool()> cancelled;
  // Null: CpuCalibrationPca with `cpu`.
  std::shared_ptr<const CalibrationPca> pca;
  CpuPcaOptions cpu;
};

struct CalibrationOutcome {
  double ratio = 0;
  // Bits a row of keys (or values) may cost, range records included, and
  // what the stream's fixed bytes and sinks leave (KvtcRowBudgetFor).
  uint64_t budget_bits_per_row = 0;
  uint64_t raw_bits_per_row = 0;
  KvtcRowBudget budget;
  // Raw / stored bytes over the stream, as allocated (>= ratio).
  double expected_ratio = 0;
  KvtcCalibration calibration;  // its estimate says the same
  BitAllocation keys;           // the DP results
  BitAllocation values;
  uint64_t keys_group_size = 0;  // the group size each allocation used
  uint64_t values_group_size = 0;
  uint64_t keys_computed = 0;  // components the PCA computed (before the cut)
  uint64_t values_computed = 0;
  double keys_variance = 0;    // total variance of the fitted rows (sum
  double values_variance = 0;  // of eigenvalues), for relative errors
  // Relative error sqrt(squared error / variance) of keys [0] and values
  // [1] with this allocation, energy outside the kept components included:
  // rel_error on rows held out of the fit (what the calibration's estimate
  // states), fit_rel_error on the fitted rows (optimistic: a basis fitted
  // to few rows captures them and little else).
  double rel_error[2] = {0, 0};
  double fit_rel_error[2] = {0, 0};
  uint64_t fit_rows = 0;  // rows each error was measured on
  uint64_t held_out_rows = 0;
};

// Validates options (messages name the option) and samples, then calibrates.
absl::StatusOr<std::vector<CalibrationOutcome>> CalibrateKvtc(
    const KvSamples& samples, const CalibrateOptions& options);

// Row sources (core/calibration/calibration_rows.h) and what a calibration
// file says about them: the rows of keys and values exactly as the codec
// projects them for options.row_kind (keys with RoPE already undone when
// rope_style != kNone), the geometry, and the stream's average attention
// sinks per page. CalibrateKvtc builds this from KvSamples; benchmarks feed
// generated rows.
struct CalibrationRowsInput {
  const CalibrationRows* keys = nullptr;
  const CalibrationRows* values = nullptr;
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  RopeStyle rope_style = RopeStyle::kNone;  // the codec's, on keys
  float rope_theta = 0.0f;
  double sink_tokens_per_page = 0;
};
absl::StatusOr<std::vector<CalibrationOutcome>> CalibrateKvtcRows(
    const CalibrationRowsInput& input, const CalibrateOptions& options);

// One line per basis: budget, components computed and kept, ranges,
// expected relative error (held out, and on the fitted rows) and stored
// ratio.
std::string DescribeOutcome(const CalibrationOutcome& outcome);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CALIBRATION_KVTC_CALIBRATE_H_
