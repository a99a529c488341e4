// GPU PCA for KVTC calibration: the mean and the top-k principal directions
// (with their variances) of fp32 rows [rows][features], returned in exactly
// the representation the CPU calibration uses
// (core/codec/kvtc/kvtc_calibration.h PcaBasis: KvtcBasis.mean [features],
// KvtcBasis.projection [features][components] row-major, components ordered by
// decreasing variance, each column's sign chosen so its largest-magnitude entry
// (the first one on ties) is positive), so bit allocation and file writing are
// shared with the CPU path.
//
// Method. Rows stream through a staging buffer of `chunk_rows` rows, so
// rows x features never has to be resident: each chunk is shifted by the
// first row seen (a one-pass, cancellation-safe centering; the column sums
// of the shifted rows are kept in double) and added to the scatter matrix
// S = sum (x - s)(x - s)^T with one cuBLAS GEMM (FP32, or TF32 tensor cores
// with FP32 accumulation). The covariance is C = S / rows - d d^T with
// d = mean - s (the CPU's normalization: eigenvalues are the variances of
// the projected rows). The eigensolver is either
//   kSyevd: cuSOLVER's 64-bit cusolverDnXsyevd on all of C (exact up to FP32
//     rounding; O(features^3));
//   kSubspace: randomized subspace iteration (Halko, Martinsson and Tropp
//     2011, algorithm 4.4) on l = components + oversample Gaussian vectors:
//     `iterations` rounds of Z = C Q, Q = qr(Z) (FP32 GEMM, cuSOLVER
//     geqrf/orgqr), then Rayleigh-Ritz (syevd of Q^T C Q). O(features^2 l)
//     per round; accurate for components whose variance is well above the
//     (l+1)-th, which is what calibration keeps.
//
// Memory: PcaGpu owns its device buffers (sizes: PcaGpuAccumulatorBytes,
// PcaGpuSolveBytes). cuBLAS and cuSOLVER handles and the stream belong to
// the caller; every call runs on that stream (the handles' stream is set to
// it). Row pointers given to AddDeviceRows must stay valid until the stream
// passes the call. Thread-compatible: one thread at a time per PcaGpu (and
// per handle).
#ifndef KVHARBOR_CUDA_CALIBRATION_PCA_GPU_H_
#define KVHARBOR_CUDA_CALIBRATION_PCA_GPU_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/codec/kvtc/kvtc_calibration.h"

namespace kvharbor {
namespace gpu {

enum class PcaPrecision : int {
  kFp32 = 0,  // cublasGemmEx, CUBLAS_COMPUTE_32F
  kTf32 = 1,  // CUBLAS_COMPUTE_32F_FAST_TF32 (10-bit mantissa inputs)
};
absl::string_view PcaPrecisionName(PcaPrecision p);

enum class PcaSolver : int {
  kSyevd = 0,
  kSubspace = 1,
};
absl::string_view PcaSolverName(PcaSolver s);

// Largest feature count: features^2 floats must stay addressable by cuBLAS
// leading dimensions and fit an 80 GiB GPU with the solver's workspace.
inline constexpr uint64_t kPcaGpuMaxFeatures = 65536;
inline constexpr uint64_t kPcaGpuMaxChunkRows = 65536;

struct PcaGpuOptions {
  uint64_t features = 0;
  PcaPrecision precision = PcaPrecision::kFp32;
  // Rows per covariance GEMM; the staging buffers hold chunk_rows x features
  // floats (two of them when rows come from the host).
  uint64_t chunk_rows = 4096;
};

struct PcaSolveOptions {
  uint64_t components = 0;  // top-k, 1 <= components <= features
  PcaSolver solver = PcaSolver::kSyevd;
  uint32_t iterations = 4;   // kSubspace: power rounds (0..64)
  uint64_t oversample = 32;  // kSubspace: extra vectors (capped at features)
  uint64_t seed = 1;         // kSubspace: the Gaussian start block
};

struct PcaGpuResult {
  KvtcBasis basis;  // mean, projection; ranges empty (as PcaBasis(..., {}))
  std::vector<double> variances;  // [components], decreasing eigenvalues of C
  uint64_t rows = 0;
  double solve_seconds = 0;  // eigensolver + orientation + download
};

// Device bytes PcaGpu::Create allocates for `options` (scatter matrix,
// staging buffers, column sums); InvalidArgument for bad options.
absl::StatusOr<size_t> PcaGpuAccumulatorBytes(const PcaGpuOptions& options);
// Device bytes one Solve allocates besides the accumulator, cuSOLVER's own
// workspace included (queried from `solver`, which is why it takes it).
absl::StatusOr<size_t> PcaGpuSolveBytes(uint64_t features,
                                        const PcaSolveOptions& options,
                                        cusolverDnHandle_t solver);

class PcaGpu {
 public:
  static absl::StatusOr<std::unique_ptr<PcaGpu>> Create(
      const PcaGpuOptions& options, cublasHandle_t blas,
      cusolverDnHandle_t solver, cudaStream_t stream);
  ~PcaGpu();
  PcaGpu(const PcaGpu&) = delete;
  PcaGpu& operator=(const PcaGpu&) = delete;

  // Adds `count` rows ([count][features] fp32, row-major, device memory).
  // Asynchronous on the stream. FailedPrecondition after the first Solve.
  absl::Status AddDeviceRows(const float* rows, uint64_t count);
  // Same for host memory (pageable or pinned); returns when `rows` may be
  // reused.
  absl::Status AddHostRows(const float* rows, uint64_t count);
  uint64_t rows() const { return rows_; }

  // Mean and top-k directions of the rows added so far (needs >= 2 rows).
  // The first call turns the scatter matrix into the covariance, so no rows
  // may be added afterwards; Solve may be called again (e.g. another
  // solver or k). Synchronizes the stream.
  absl::StatusOr<PcaGpuResult> Solve(const PcaSolveOptions& options);

  // The covariance [features][features] (symmetric, device) once Solve or
  // FinishCovariance ran; for benchmarks and tests comparing precisions.
  absl::Status FinishCovariance();
  const float* covariance() const { return cov_; }

 private:
  PcaGpu(const PcaGpuOptions& o, cublasHandle_t blas, cusolverDnHandle_t solver,
         cudaStream_t stream)
      : options_(o), blas_(blas), solver_(solver), stream_(stream) {}
  absl::Status Allocate();
  absl::Status AddChunk(const float* rows, uint64_t count);
  absl::Status SolveSyevd(uint64_t k, float* vectors_out,
                          std::vector<double>* variances);
  absl::Status SolveSubspace(const PcaSolveOptions& o, float* vectors_out,
                             std::vector<double>* variances);
  // After an eigensolve of an n x n problem (eigenvalues `w` ascending on
  // the device, eigenvectors in the n columns of `vectors`, features rows):
  // the top `k` vectors, oriented, into vectors_out and their eigenvalues,
  // largest first, into *variances.
  absl::Status TakeTop(const float* vectors, uint64_t n, uint64_t k,
                       const float* w, float* vectors_out,
                       std::vector<double>* variances);

  PcaGpuOptions options_;
  cublasHandle_t blas_;
  cusolverDnHandle_t solver_;
  cudaStream_t stream_;
  float* cov_ = nullptr;        // [features][features], column-major
  float* staging_ = nullptr;    // [chunk_rows][features], shifted rows
  float* host_in_ = nullptr;    // [chunk_rows][features], uploaded rows
  float* shift_ = nullptr;      // [features], the first row
  double* col_sums_ = nullptr;  // [features], sums of shifted rows
  uint64_t rows_ = 0;
  bool finished_ = false;
  std::vector<double> mean_;  // set by FinishCovariance
};

// Convenience with PcaBasis's signature: host samples [rows][features].
absl::StatusOr<PcaGpuResult> PcaBasisGpu(
    absl::Span<const float> samples, uint64_t rows,
    const PcaGpuOptions& options, const PcaSolveOptions& solve,
    cublasHandle_t blas, cusolverDnHandle_t solver, cudaStream_t stream);

// ---- Kernels (pca_gpu.cu), also used by benchmarks to make data.

// out[i] = scale * decay^(i / row_len) * N(0, 1), N from a counter-based
// hash of (seed, i): deterministic, independent of the launch shape.
struct GaussianFillArgs {
  float* out = nullptr;
  uint64_t count = 0;
  uint64_t row_len = 1;
  float scale = 1.0f;
  float decay = 1.0f;
  uint64_t seed = 0;
};
inline size_t GaussianFillWorkspaceBytes(const GaussianFillArgs&) { return 0; }
absl::Status LaunchGaussianFill(const GaussianFillArgs& args,
                                cudaStream_t stream);

// out[r][f] = in[r][f] - shift[f] (row-major [rows][features]) and
// col_sums[f] += sum_r out[r][f] (double).
struct CenterRowsArgs {
  const float* in = nullptr;
  const float* shift = nullptr;
  float* out = nullptr;
  double* col_sums = nullptr;
  uint64_t rows = 0;
  uint64_t features = 0;
};
inline size_t CenterRowsWorkspaceBytes(const CenterRowsArgs&) { return 0; }
absl::Status LaunchCenterRows(const CenterRowsArgs& args, cudaStream_t stream);

// cov[i][j] = cov[i][j] / rows - d[i] d[j], d = col_sums / rows
// ([features][features], symmetric so the order does not matter).
struct FinishCovarianceArgs {
  float* cov = nullptr;
  const double* col_sums = nullptr;
  uint64_t rows = 0;
  uint64_t features = 0;
};
inline size_t FinishCovarianceWorkspaceBytes(const FinishCovarianceArgs&) {
  return 0;
}
absl::Status LaunchFinishCovariance(const FinishCovarianceArgs& args,
                                    cudaStream_t stream);

// out[i][c] = sign_c * vectors[i][cols-1-c] for c < components: the
// eigenvectors (column-major [cols][features], ascending eigenvalues as
// cuSOLVER returns them) as a row-major [features][components] projection
// in decreasing order, each column's largest-|v| entry (first on ties)
// made positive.
struct OrientVectorsArgs {
  const float* vectors = nullptr;
  uint64_t features = 0;
  uint64_t cols = 0;
  uint64_t components = 0;
  float* out = nullptr;
};
// Bytes for the per-component signs.
inline size_t OrientVectorsWorkspaceBytes(const OrientVectorsArgs& a) {
  return a.components * sizeof(float);
}
absl::Status LaunchOrientVectors(const OrientVectorsArgs& args, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_CALIBRATION_PCA_GPU_H_
