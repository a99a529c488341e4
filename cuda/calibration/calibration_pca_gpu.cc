#include "cuda/calibration/calibration_pca_gpu.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "cuda/kernels/cuda_check.h"

namespace kvharbor {
namespace gpu {

namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

absl::StatusOr<std::unique_ptr<GpuCalibrationPca>> GpuCalibrationPca::Create(
    const GpuCalibrationPcaOptions& options) {
  if (options.chunk_rows == 0 || options.chunk_rows > kPcaGpuMaxChunkRows) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gpu chunk_rows: %u is outside 1..%u",
                        options.chunk_rows, kPcaGpuMaxChunkRows));
  }
  std::unique_ptr<GpuCalibrationPca> p(new GpuCalibrationPca(options));
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  cudaDeviceProp prop{};
  KVH_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.device));
  p->name_ = absl::StrCat("GPU ", prop.name);
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&p->stream_));
  KVH_CUBLAS_RETURN_IF_ERROR(cublasCreate(&p->blas_));
  const cusolverStatus_t st = cusolverDnCreate(&p->solver_);
  if (st != CUSOLVER_STATUS_SUCCESS) {
    p->solver_ = nullptr;
    return absl::InternalError(
        absl::StrCat("cusolverDnCreate(&solver) failed: status ", st));
  }
  return p;
}

GpuCalibrationPca::~GpuCalibrationPca() {
  if (solver_ != nullptr) cusolverDnDestroy(solver_);
  if (blas_ != nullptr) cublasDestroy(blas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<PcaOutcome> GpuCalibrationPca::Compute(
    const CalibrationRows& x, const PcaRequest& request) const {
  const uint64_t rows = x.rows(), features = x.features();
  const auto& say = request.say;
  PcaGpuOptions o;
  o.features = features;
  o.precision = options_.precision;
  o.chunk_rows = std::min(options_.chunk_rows, rows);
  PcaSolveOptions so;
  so.components = std::min(
      features, request.components != 0 ? request.components
                : options_.components != 0
                    ? options_.components
                    : std::max<uint64_t>(1, request.useful_components));
  so.iterations = options_.iterations;
  so.oversample = options_.oversample;
  const bool syevd = options_.solver == CalibrationSolver::kSyevd ||
                     (options_.solver == CalibrationSolver::kAuto &&
                      so.components * 4 > features);
  so.solver = syevd ? PcaSolver::kSyevd : PcaSolver::kSubspace;
  const auto t0 = std::chrono::steady_clock::now();
  KVH_ASSIGN_OR_RETURN(std::unique_ptr<PcaGpu> pca,
                       PcaGpu::Create(o, blas_, solver_, stream_));
  std::vector<float> host(o.chunk_rows * features);
  uint64_t next_say = rows / 10;
  for (uint64_t r = 0; r < rows; r += o.chunk_rows) {
    if (request.cancelled && request.cancelled()) {
      return absl::CancelledError("calibration: cancelled");
    }
    const uint64_t n = std::min(o.chunk_rows, rows - r);
    x.ReadRows(r, n, host.data());
    KVH_RETURN_IF_ERROR(pca->AddHostRows(host.data(), n));
    if (say && (r + n >= next_say || r + n == rows)) {
      next_say += rows / 10;
      say(absl::StrFormat("  gpu covariance (%s): %u / %u rows, %.2fs",
                          PcaPrecisionName(o.precision), r + n, rows,
                          SecondsSince(t0)));
    }
  }
  if (say) {
    say(absl::StrFormat("  gpu eigensolver %s for %u of %u components",
                        PcaSolverName(so.solver), so.components, features));
  }
  KVH_ASSIGN_OR_RETURN(PcaGpuResult res, pca->Solve(so));
  if (say) {
    say(absl::StrFormat("  gpu PCA done: solve %.2fs, total %.2fs",
                        res.solve_seconds, SecondsSince(t0)));
  }
  PcaOutcome out;
  out.basis = std::move(res.basis);
  return out;
}

}  // namespace gpu
}  // namespace kvharbor
