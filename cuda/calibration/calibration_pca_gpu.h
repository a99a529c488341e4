// GpuCalibrationPca: the KVTC calibration's PCA
// (core/calibration/calibration_pca.h CalibrationPca) on the GPU through
// PcaGpu (cuda/calibration/pca_gpu.h): calibration rows stream from the host in
// chunks (read from the rows' source into one host buffer) into the covariance
// (cuBLAS), then cuSOLVER's syevd on the whole covariance or randomized
// subspace iteration for the top components. kvharbor-calibrate
// --device=gpu|auto and a GPU daemon's online calibration
// (server/daemon/device_setup.cc) use it; the bit allocation and the file are
// the CPU path's.
//
// Memory: owns its CUDA stream and its cuBLAS and cuSOLVER handles; each
// Compute allocates the PcaGpu buffers (features^2 floats plus the solver's
// workspace) and a host buffer of chunk_rows rows, and frees them before
// returning. Thread-compatible: one
// Compute at a time (the handles are not shared).
#ifndef KVHARBOR_CUDA_CALIBRATION_CALIBRATION_PCA_GPU_H_
#define KVHARBOR_CUDA_CALIBRATION_CALIBRATION_PCA_GPU_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/calibration/calibration_pca.h"
#include "cuda/calibration/pca_gpu.h"

namespace kvharbor {
namespace gpu {

enum class CalibrationSolver {
  kAuto,      // syevd when the components wanted exceed features / 4
  kSyevd,     // every component, exact
  kSubspace,  // randomized top-k
};

struct GpuCalibrationPcaOptions {
  CalibrationSolver solver = CalibrationSolver::kAuto;
  // Components to compute when the request leaves it open (0: as many as
  // any ratio can use, the request's useful_components). Capped at the
  // feature count.
  uint64_t components = 0;
  PcaPrecision precision = PcaPrecision::kFp32;
  uint64_t chunk_rows = 4096;
  uint32_t iterations = 4;   // kSubspace power rounds
  uint64_t oversample = 32;  // kSubspace extra vectors
  int device = 0;            // CUDA device ordinal
};

// Number of CUDA devices (0 when none or the driver is missing).
int CudaDeviceCount();

class GpuCalibrationPca final : public CalibrationPca {
 public:
  static absl::StatusOr<std::unique_ptr<GpuCalibrationPca>> Create(
      const GpuCalibrationPcaOptions& options);
  ~GpuCalibrationPca() override;
  GpuCalibrationPca(const GpuCalibrationPca&) = delete;
  GpuCalibrationPca& operator=(const GpuCalibrationPca&) = delete;

  std::string name() const override { return name_; }
  uint64_t max_features() const override { return kPcaGpuMaxFeatures; }
  absl::StatusOr<PcaOutcome> Compute(const CalibrationRows& rows,
                                     const PcaRequest& request) const override;

 private:
  explicit GpuCalibrationPca(const GpuCalibrationPcaOptions& o) : options_(o) {}
  GpuCalibrationPcaOptions options_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cusolverDnHandle_t solver_ = nullptr;
};

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_CALIBRATION_CALIBRATION_PCA_GPU_H_
