// The PCA engine interface of KVTC calibration
// (core/calibration/kvtc_calibrate.h): the mean and leading principal
// directions of calibration rows read in chunks
// (core/calibration/calibration_rows.h). Implementations: the CPU one
// (core/calibration/pca_cpu.h: exact, or randomized subspace iteration for
// the top components) and the GPU one (cuda/calibration/calibration_pca_gpu.h).
//
// Implementations are thread-compatible; the calibration calls one at a
// time. The outcome is owned by the caller.
#ifndef KVHARBOR_CORE_CALIBRATION_CALIBRATION_PCA_H_
#define KVHARBOR_CORE_CALIBRATION_CALIBRATION_PCA_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/calibration/calibration_rows.h"
#include "core/codec/kvtc/kvtc_calibration.h"

namespace kvharbor {

// The mean and leading principal directions of calibration rows.
struct PcaOutcome {
  // mean [features]; projection [features][components], components ordered
  // by decreasing variance, each column's largest-magnitude entry (the
  // first on ties) positive, as PcaBasis returns them; ranges and blocks
  // empty.
  KvtcBasis basis;
};

struct PcaRequest {
  // The most components any of the calibration's ratios could give bits
  // to; an engine computing only the top ones needs no more.
  uint64_t useful_components = 1;
  // > 0: compute exactly this many (the caller checked 1 <= components <=
  // features); 0: the engine decides, at most useful_components.
  uint64_t components = 0;
  std::function<void(absl::string_view)> say;  // progress lines; may be empty
  std::function<bool()> cancelled;             // polled between passes
};

class CalibrationPca {
 public:
  virtual ~CalibrationPca() = default;
  virtual std::string name() const = 0;
  // Largest feature count Compute accepts.
  virtual uint64_t max_features() const = 0;
  // Needs rows.rows() >= 2. Cancelled when request.cancelled turned true.
  virtual absl::StatusOr<PcaOutcome> Compute(
      const CalibrationRows& rows, const PcaRequest& request) const = 0;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CALIBRATION_CALIBRATION_PCA_H_
