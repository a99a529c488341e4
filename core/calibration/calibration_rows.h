// Calibration rows read in chunks: the matrix [rows][features] a KVTC basis
// is fitted to, never materialized whole. A PCA engine
// (core/calibration/kvtc_calibrate.h CalibrationPca) reads it in passes of
// a few thousand rows, so the memory a calibration needs is the samples it
// reads from plus a working set independent of the row count.
//
// KvSampleRows are the rows the KVTC codec would project for a KvSamples
// (core/calibration/kv_samples.h): per token or per page, keys with RoPE
// undone when asked, sinks and partial pages left out, evenly subsampled to
// at most max_rows. It keeps a reference to the samples (which must outlive
// it) and an index of its rows (16 bytes per row).
//
// MemoryRows wraps a row-major matrix the caller owns (tests, benchmarks).
//
// Read is const and uses only local scratch: thread-safe on a constant source.
#ifndef KVHARBOR_CORE_CALIBRATION_CALIBRATION_ROWS_H_
#define KVHARBOR_CORE_CALIBRATION_CALIBRATION_ROWS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/calibration/kv_samples.h"
#include "core/codec/kvtc/kvtc_calibration.h"

namespace kvharbor {

class CalibrationRows {
 public:
  virtual ~CalibrationRows() = default;
  virtual uint64_t rows() const = 0;
  virtual uint64_t features() const = 0;
  // Writes columns [col_begin, col_end) of rows [first, first + count) to
  // `out` ([count][col_end - col_begin], row-major). The caller keeps the
  // arguments in range.
  virtual void Read(uint64_t first, uint64_t count, uint64_t col_begin,
                    uint64_t col_end, float* out) const = 0;
  void ReadRows(uint64_t first, uint64_t count, float* out) const {
    Read(first, count, 0, features(), out);
  }
};

// A column range [begin, end) of another source (a block of a
// block-diagonal basis). `base` must outlive it.
class ColumnRows final : public CalibrationRows {
 public:
  ColumnRows(const CalibrationRows& base, uint64_t begin, uint64_t end)
      : base_(base), begin_(begin), end_(end) {}
  uint64_t rows() const override { return base_.rows(); }
  uint64_t features() const override { return end_ - begin_; }
  void Read(uint64_t first, uint64_t count, uint64_t col_begin,
            uint64_t col_end, float* out) const override {
    base_.Read(first, count, begin_ + col_begin, begin_ + col_end, out);
  }

 private:
  const CalibrationRows& base_;
  uint64_t begin_, end_;
};

// Runs of another source's rows, in order: the fitted or the held-out part
// of a calibration's rows (SplitHeldOut). `base` must outlive it.
class RowRuns final : public CalibrationRows {
 public:
  struct Run {
    uint64_t first = 0;  // the base's row
    uint64_t count = 0;
  };
  // The runs must lie inside `base` and not overlap.
  RowRuns(const CalibrationRows& base, std::vector<Run> runs);
  uint64_t rows() const override { return rows_; }
  uint64_t features() const override { return base_.features(); }
  void Read(uint64_t first, uint64_t count, uint64_t col_begin,
            uint64_t col_end, float* out) const override;

 private:
  const CalibrationRows& base_;
  std::vector<Run> runs_;
  std::vector<uint64_t> starts_;  // this view's first row of each run
  uint64_t rows_ = 0;
};

// The deterministic split behind a calibration's expected error: of `rows`
// rows, max(1, rows / 10) are held out, in at most kHeldOutStripes
// contiguous stripes spread evenly over the rows (contiguous, so that the
// neighbouring tokens of one sequence seldom land on both sides and the
// held-out rows are as new to the basis as a later sequence's); the rest
// are fitted. With rows < 3 nothing is held out.
inline constexpr uint64_t kHeldOutStripes = 10;
struct HeldOutSplit {
  std::vector<RowRuns::Run> fit, held_out;
};
HeldOutSplit SplitHeldOut(uint64_t rows);

class MemoryRows final : public CalibrationRows {
 public:
  // `data` is [rows][features]; it must outlive this object.
  MemoryRows(absl::Span<const float> data, uint64_t rows, uint64_t features)
      : data_(data), rows_(rows), features_(features) {}
  uint64_t rows() const override { return rows_; }
  uint64_t features() const override { return features_; }
  void Read(uint64_t first, uint64_t count, uint64_t col_begin,
            uint64_t col_end, float* out) const override;

 private:
  absl::Span<const float> data_;
  uint64_t rows_, features_;
};

// Which rows to build from samples, as the codec will see them.
struct SampleRowSpec {
  KvtcRowKind row_kind = KvtcRowKind::kPerToken;
  uint32_t page_size = 16;
  uint32_t sink_tokens = 4;
  bool unrope = false;  // un-rotate keys (kv = 0) per the samples' RoPE
  uint64_t max_rows = 262144;
};

class KvSampleRows final : public CalibrationRows {
 public:
  // kv = 0 keys, 1 values. Per token: one row per token at position >=
  // sink_tokens, features [layer][kv_head][head_dim]. Per page: runs of
  // page_size consecutive positions starting at a multiple of page_size and
  // at or after sink_tokens, one row per (page, layer), features
  // [token][kv_head][head_dim]. Fails (naming the field) on a zero page
  // size or a row too large to address.
  static absl::StatusOr<KvSampleRows> Create(const KvSamples& samples,
                                             const SampleRowSpec& spec, int kv);

  uint64_t rows() const override { return index_.size(); }
  uint64_t features() const override { return features_; }
  void Read(uint64_t first, uint64_t count, uint64_t col_begin,
            uint64_t col_end, float* out) const override;

 private:
  KvSampleRows(const KvSamples& s, const SampleRowSpec& spec, int kv)
      : samples_(&s), spec_(spec), kv_(kv) {}
  // One token's K or V of `layer` ([kv_head][head_dim]) into dst, keys
  // un-rotated with the token's tables when unrope.
  void CopyRun(uint64_t token, uint32_t layer, const float* cos,
               const float* sin, float* dst) const;

  const KvSamples* samples_;
  SampleRowSpec spec_;
  int kv_;
  uint64_t features_ = 0;
  // (first token, layer) of each row.
  std::vector<std::pair<uint64_t, uint32_t>> index_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CALIBRATION_CALIBRATION_ROWS_H_
