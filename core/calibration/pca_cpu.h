// The CPU PCA of KVTC calibration, on OpenBLAS and its LAPACK, reading the
// rows in chunks so that memory does not grow with the row count.
//
//   kExact: the covariance (features^2 doubles, accumulated with dsyrk over
//     chunks of rows shifted by the first row) and LAPACK's dsyevr for the
//     top components. Exact up to double rounding; O(rows * features^2)
//     time; at most kCpuExactPcaMaxFeatures features.
//   kSubspace: randomized subspace iteration (Halko, Martinsson and Tropp
//     2011, algorithm 4.4) on the covariance without forming it: l =
//     components + oversample directions, `iterations` passes of Z = C Q
//     (two sgemms per chunk of centered rows) and Q = qr(Z) (sgeqrf /
//     sorgqr), then one Rayleigh-Ritz pass (B = (X Q)^T (X Q) / rows, dsyev).
//     O(rows * features * l) per pass; accurate for components whose
//     variance is well above the (l+1)-th, which is what the bit allocation
//     keeps. Up to kCpuPcaMaxFeatures features.
//   kAuto: kExact for features <= kCpuExactPcaAutoFeatures, or up to
//     kCpuExactPcaMaxFeatures when more than a quarter of the features are
//     wanted; kSubspace otherwise.
//
// Memory (CpuPcaWorkingBytes states it, and the calibration prints it):
// besides the rows' source, exact needs 8 * features^2 + 8 * features *
// (components + chunk_rows) bytes; subspace 12 * features * l + 4 *
// chunk_rows * (features + l) + 16 * l^2 bytes plus the result (4 *
// features * components). At 32768 features, 1024 components, 64
// oversample and 1024-row chunks that is about 0.7 GiB.
//
// Thread-compatible (no state besides the options); OpenBLAS may use its
// own threads inside each call.
#ifndef KVHARBOR_CORE_CALIBRATION_PCA_CPU_H_
#define KVHARBOR_CORE_CALIBRATION_PCA_CPU_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/calibration/calibration_pca.h"

namespace kvharbor {

enum class CpuPcaSolver { kAuto, kExact, kSubspace };
absl::string_view CpuPcaSolverName(CpuPcaSolver s);

inline constexpr uint64_t kCpuExactPcaMaxFeatures = 8192;
inline constexpr uint64_t kCpuExactPcaAutoFeatures = 2048;
inline constexpr uint64_t kCpuPcaMaxFeatures = 65536;
// Components the subspace solver computes when the request leaves it open:
// at 32768 features x 64K rows its passes take minutes on two cores, and
// the work grows linearly with it (docs/calibration.md, "CPU PCA").
inline constexpr uint64_t kCpuSubspaceDefaultComponents = 1024;

struct CpuPcaOptions {
  CpuPcaSolver solver = CpuPcaSolver::kAuto;
  uint32_t iterations = 2;   // subspace: power passes (0..16)
  uint64_t oversample = 64;  // subspace: extra directions
  uint64_t chunk_rows = 1024;
  uint64_t seed = 1;  // subspace: the Gaussian start block
};

// The solver kAuto picks for these sizes.
CpuPcaSolver ResolveCpuPcaSolver(CpuPcaSolver s, uint64_t features,
                                 uint64_t components);
// Components computed for a request (components if set, else
// min(useful_components, features), capped at
// kCpuSubspaceDefaultComponents for the subspace solver).
uint64_t CpuPcaComponents(CpuPcaSolver resolved, uint64_t features,
                          const PcaRequest& request);
// Bytes the engine allocates for one Compute (see the header comment).
uint64_t CpuPcaWorkingBytes(CpuPcaSolver resolved, uint64_t features,
                            uint64_t components, const CpuPcaOptions& o);

class CpuCalibrationPca final : public CalibrationPca {
 public:
  explicit CpuCalibrationPca(CpuPcaOptions options = {}) : options_(options) {}
  std::string name() const override;
  uint64_t max_features() const override;
  absl::StatusOr<PcaOutcome> Compute(const CalibrationRows& rows,
                                     const PcaRequest& request) const override;
  const CpuPcaOptions& options() const { return options_; }

 private:
  CpuPcaOptions options_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CALIBRATION_PCA_CPU_H_
