#include "cuda/calibration/pca_gpu.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "cuda/kernels/cuda_check.h"
#include "types/enum_names.h"

namespace kvharbor {
namespace gpu {
namespace {

absl::Status CusolverError(cusolverStatus_t st, const char* call,
                           const char* file, int line) {
  const GpuErrorClass c = ClassifyGpuError(
      st, CUSOLVER_STATUS_ALLOC_FAILED, {CUSOLVER_STATUS_INVALID_VALUE},
      {CUSOLVER_STATUS_NOT_SUPPORTED, CUSOLVER_STATUS_ARCH_MISMATCH});
  return GpuLibraryError(
      c, call, absl::StrFormat("cusolver status %d", static_cast<int>(st)),
      file, line);
}

#define KVH_CUSOLVER_RETURN_IF_ERROR(call) \
  KVH_GPU_RETURN_IF_ERROR(call, #call, CUSOLVER_STATUS_SUCCESS, CusolverError)

// Device memory freed on scope exit (solver temporaries).
class DeviceBlock {
 public:
  DeviceBlock() = default;
  ~DeviceBlock() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  absl::Status Allocate(size_t bytes) {
    KVH_CUDA_RETURN_IF_ERROR(cudaMalloc(&p_, std::max<size_t>(bytes, 1)));
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

// cuSOLVER's params object, destroyed on scope exit.
class SolverParams {
 public:
  ~SolverParams() {
    if (p_ != nullptr) cusolverDnDestroyParams(p_);
  }
  absl::Status Create() {
    KVH_CUSOLVER_RETURN_IF_ERROR(cusolverDnCreateParams(&p_));
    return absl::OkStatus();
  }
  cusolverDnParams_t get() const { return p_; }

 private:
  cusolverDnParams_t p_ = nullptr;
};

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status CheckOptions(const PcaGpuOptions& o) {
  if (o.features < 2 || o.features > kPcaGpuMaxFeatures) {
    return Bad("options.features",
               absl::StrFormat("%u is out of range [2, %u]", o.features,
                               kPcaGpuMaxFeatures));
  }
  if (o.precision != PcaPrecision::kFp32 &&
      o.precision != PcaPrecision::kTf32) {
    return Bad("options.precision",
               absl::StrCat("unknown value ", static_cast<int>(o.precision)));
  }
  if (o.chunk_rows == 0 || o.chunk_rows > kPcaGpuMaxChunkRows) {
    return Bad("options.chunk_rows",
               absl::StrFormat("%u is out of range [1, %u]", o.chunk_rows,
                               kPcaGpuMaxChunkRows));
  }
  return absl::OkStatus();
}

absl::Status CheckSolve(uint64_t features, const PcaSolveOptions& o) {
  if (o.components == 0 || o.components > features) {
    return Bad("solve.components",
               absl::StrFormat("%u is out of range [1, features=%u]",
                               o.components, features));
  }
  if (o.solver != PcaSolver::kSyevd && o.solver != PcaSolver::kSubspace) {
    return Bad("solve.solver",
               absl::StrCat("unknown value ", static_cast<int>(o.solver)));
  }
  if (o.iterations > 64) {
    return Bad("solve.iterations",
               absl::StrCat(o.iterations, " is out of range [0, 64]"));
  }
  // Capped at features by SubspaceWidth; bounded so k + oversample cannot
  // wrap.
  if (o.oversample > kPcaGpuMaxFeatures) {
    return Bad("solve.oversample",
               absl::StrFormat("%u is out of range [0, %u]", o.oversample,
                               kPcaGpuMaxFeatures));
  }
  return absl::OkStatus();
}

uint64_t SubspaceWidth(uint64_t features, const PcaSolveOptions& o) {
  return std::min(features, o.components + o.oversample);
}

// cuSOLVER's syevd workspace for an n x n float matrix at `a`.
absl::Status SyevdBytes(cusolverDnHandle_t h, cusolverDnParams_t params,
                        uint64_t n, float* a, float* w, size_t* device_bytes,
                        size_t* host_bytes) {
  KVH_CUSOLVER_RETURN_IF_ERROR(cusolverDnXsyevd_bufferSize(
      h, params, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER,
      static_cast<int64_t>(n), CUDA_R_32F, a, static_cast<int64_t>(n),
      CUDA_R_32F, w, CUDA_R_32F, device_bytes, host_bytes));
  return absl::OkStatus();
}

// geqrf + orgqr workspace (floats) for an n x l matrix at `a`.
absl::Status QrFloats(cusolverDnHandle_t h, uint64_t n, uint64_t l, float* a,
                      const float* tau, int* floats) {
  int g = 0, q = 0;
  const int m = static_cast<int>(n), k = static_cast<int>(l);
  KVH_CUSOLVER_RETURN_IF_ERROR(cusolverDnSgeqrf_bufferSize(h, m, k, a, m, &g));
  KVH_CUSOLVER_RETURN_IF_ERROR(
      cusolverDnSorgqr_bufferSize(h, m, k, k, a, m, tau, &q));
  *floats = std::max(g, q);
  return absl::OkStatus();
}

// Host copy of the device `info`; nonzero is an error naming the routine.
absl::Status CheckInfo(const int* d_info, cudaStream_t stream,
                       absl::string_view routine) {
  int info = 0;
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&info, d_info, sizeof(int),
                                           cudaMemcpyDeviceToHost, stream));
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (info != 0) {
    return absl::InternalError(
        absl::StrCat(routine, " failed: info=", info,
                     info > 0 ? " (no convergence)" : " (bad parameter)"));
  }
  return absl::OkStatus();
}

// Eigen-decomposition of the symmetric n x n matrix `a` (lower triangle) in
// place: eigenvectors into `a`, eigenvalues ascending into `w`. `work` holds
// the `device_bytes` SyevdBytes asked for; `info` is a device int.
absl::Status Syevd(cusolverDnHandle_t h, cusolverDnParams_t params, uint64_t n,
                   float* a, float* w, void* work, size_t device_bytes,
                   size_t host_bytes, int* info, cudaStream_t stream) {
  std::vector<char> host_work(std::max<size_t>(host_bytes, 1));
  KVH_CUSOLVER_RETURN_IF_ERROR(cusolverDnXsyevd(
      h, params, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER,
      static_cast<int64_t>(n), CUDA_R_32F, a, static_cast<int64_t>(n),
      CUDA_R_32F, w, CUDA_R_32F, work, device_bytes, host_work.data(),
      host_bytes, info));
  return CheckInfo(info, stream, "cusolverDnXsyevd");
}

// Column-major C[m][n] = op(A) * B in FP32.
absl::Status Sgemm(cublasHandle_t h, cublasOperation_t op_a, uint64_t m,
                   uint64_t n, uint64_t k, const float* a, uint64_t lda,
                   const float* b, uint64_t ldb, float* c, uint64_t ldc) {
  const float one = 1.0f, zero = 0.0f;
  KVH_CUBLAS_RETURN_IF_ERROR(cublasSgemm(
      h, op_a, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n),
      static_cast<int>(k), &one, a, static_cast<int>(lda), b,
      static_cast<int>(ldb), &zero, c, static_cast<int>(ldc)));
  return absl::OkStatus();
}

}  // namespace

absl::string_view PcaPrecisionName(PcaPrecision p) {
  return EnumName(p, {"fp32", "tf32"});
}

absl::string_view PcaSolverName(PcaSolver s) {
  return EnumName(s, {"syevd", "subspace"});
}

absl::StatusOr<size_t> PcaGpuAccumulatorBytes(const PcaGpuOptions& o) {
  KVH_RETURN_IF_ERROR(CheckOptions(o));
  const size_t f = o.features;
  return f * f * sizeof(float) + 2 * o.chunk_rows * f * sizeof(float) +
         f * sizeof(float) + f * sizeof(double);
}

absl::StatusOr<size_t> PcaGpuSolveBytes(uint64_t features,
                                        const PcaSolveOptions& o,
                                        cusolverDnHandle_t solver) {
  KVH_RETURN_IF_ERROR(CheckOptions(PcaGpuOptions{features}));
  KVH_RETURN_IF_ERROR(CheckSolve(features, o));
  if (solver == nullptr) return Bad("solver", "null cuSOLVER handle");
  SolverParams params;
  KVH_RETURN_IF_ERROR(params.Create());
  const size_t f = features, k = o.components;
  // Output projection, signs, info.
  size_t bytes = f * k * sizeof(float) + k * sizeof(float) + sizeof(int);
  size_t dev = 0, host = 0;
  if (o.solver == PcaSolver::kSyevd) {
    KVH_RETURN_IF_ERROR(
        SyevdBytes(solver, params.get(), f, nullptr, nullptr, &dev, &host));
    return bytes + f * f * sizeof(float) + f * sizeof(float) + dev;
  }
  const size_t l = SubspaceWidth(features, o);
  int qr = 0;
  KVH_RETURN_IF_ERROR(QrFloats(solver, f, l, nullptr, nullptr, &qr));
  KVH_RETURN_IF_ERROR(
      SyevdBytes(solver, params.get(), l, nullptr, nullptr, &dev, &host));
  // Q, Z, tau, B, its eigenvalues.
  return bytes + 2 * f * l * sizeof(float) + l * sizeof(float) +
         l * l * sizeof(float) + l * sizeof(float) +
         std::max(size_t(qr) * sizeof(float), dev);
}

absl::StatusOr<std::unique_ptr<PcaGpu>> PcaGpu::Create(
    const PcaGpuOptions& options, cublasHandle_t blas,
    cusolverDnHandle_t solver, cudaStream_t stream) {
  KVH_RETURN_IF_ERROR(CheckOptions(options));
  if (blas == nullptr) return Bad("blas", "null cuBLAS handle");
  if (solver == nullptr) return Bad("solver", "null cuSOLVER handle");
  std::unique_ptr<PcaGpu> p(new PcaGpu(options, blas, solver, stream));
  KVH_RETURN_IF_ERROR(p->Allocate());
  return p;
}

absl::Status PcaGpu::Allocate() {
  const size_t f = options_.features;
  const size_t chunk = options_.chunk_rows * f * sizeof(float);
  KVH_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&cov_), f * f * sizeof(float)));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&staging_), chunk));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&host_in_), chunk));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&shift_), f * sizeof(float)));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&col_sums_), f * sizeof(double)));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(cov_, 0, f * f * sizeof(float), stream_));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(col_sums_, 0, f * sizeof(double), stream_));
  return absl::OkStatus();
}

PcaGpu::~PcaGpu() {
  for (void* p : {static_cast<void*>(cov_), static_cast<void*>(staging_),
                  static_cast<void*>(host_in_), static_cast<void*>(shift_),
                  static_cast<void*>(col_sums_)}) {
    if (p != nullptr) cudaFree(p);
  }
}

absl::Status PcaGpu::AddChunk(const float* rows, uint64_t count) {
  const uint64_t f = options_.features;
  if (rows_ == 0) {
    KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        shift_, rows, f * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  }
  CenterRowsArgs c;
  c.in = rows;
  c.shift = shift_;
  c.out = staging_;
  c.col_sums = col_sums_;
  c.rows = count;
  c.features = f;
  KVH_RETURN_IF_ERROR(LaunchCenterRows(c, stream_));
  // Column-major: staging is X^T [f][count]; S += X^T (X^T)^T.
  KVH_CUBLAS_RETURN_IF_ERROR(cublasSetStream(blas_, stream_));
  const float one = 1.0f;
  const int n = static_cast<int>(f);
  const cublasComputeType_t compute = options_.precision == PcaPrecision::kTf32
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  KVH_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      blas_, CUBLAS_OP_N, CUBLAS_OP_T, n, n, static_cast<int>(count), &one,
      staging_, CUDA_R_32F, n, staging_, CUDA_R_32F, n, &one, cov_, CUDA_R_32F,
      n, compute, CUBLAS_GEMM_DEFAULT));
  rows_ += count;
  return absl::OkStatus();
}

absl::Status PcaGpu::AddDeviceRows(const float* rows, uint64_t count) {
  if (finished_) {
    return absl::FailedPreconditionError(
        "rows: the covariance is already finished (Solve ran); make a new "
        "PcaGpu to add rows");
  }
  if (count == 0) return absl::OkStatus();
  if (rows == nullptr) return Bad("rows", "null pointer with count > 0");
  const uint64_t f = options_.features;
  for (uint64_t r = 0; r < count; r += options_.chunk_rows) {
    const uint64_t n = std::min(options_.chunk_rows, count - r);
    KVH_RETURN_IF_ERROR(AddChunk(rows + r * f, n));
  }
  return absl::OkStatus();
}

absl::Status PcaGpu::AddHostRows(const float* rows, uint64_t count) {
  if (finished_) return AddDeviceRows(rows, count);  // the same refusal
  if (count == 0) return absl::OkStatus();
  if (rows == nullptr) return Bad("rows", "null pointer with count > 0");
  const uint64_t f = options_.features;
  for (uint64_t r = 0; r < count; r += options_.chunk_rows) {
    const uint64_t n = std::min(options_.chunk_rows, count - r);
    KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_in_, rows + r * f,
                                             n * f * sizeof(float),
                                             cudaMemcpyHostToDevice, stream_));
    KVH_RETURN_IF_ERROR(AddChunk(host_in_, n));
  }
  // Pageable copies may return before the DMA finished reading `rows`.
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status PcaGpu::FinishCovariance() {
  if (finished_) return absl::OkStatus();
  if (rows_ < 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("rows: PCA needs >= 2 rows, ", rows_, " were added"));
  }
  const uint64_t f = options_.features;
  std::vector<float> shift(f);
  std::vector<double> sums(f);
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(shift.data(), shift_,
                                           f * sizeof(float),
                                           cudaMemcpyDeviceToHost, stream_));
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sums.data(), col_sums_,
                                           f * sizeof(double),
                                           cudaMemcpyDeviceToHost, stream_));
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  mean_.resize(f);
  for (uint64_t i = 0; i < f; ++i) {
    // A NaN or infinity anywhere in column i makes its sum non-finite.
    if (!std::isfinite(sums[i]) || !std::isfinite(shift[i])) {
      return Bad("rows", absl::StrCat("feature ", i,
                                      " holds a non-finite value (NaN or "
                                      "infinity) in some row"));
    }
    mean_[i] = shift[i] + sums[i] / static_cast<double>(rows_);
  }
  FinishCovarianceArgs a;
  a.cov = cov_;
  a.col_sums = col_sums_;
  a.rows = rows_;
  a.features = f;
  KVH_RETURN_IF_ERROR(LaunchFinishCovariance(a, stream_));
  finished_ = true;
  return absl::OkStatus();
}

absl::Status PcaGpu::SolveSyevd(uint64_t k, float* vectors_out,
                                std::vector<double>* variances) {
  const uint64_t f = options_.features;
  SolverParams params;
  KVH_RETURN_IF_ERROR(params.Create());
  DeviceBlock a, w, info;
  KVH_RETURN_IF_ERROR(a.Allocate(f * f * sizeof(float)));
  KVH_RETURN_IF_ERROR(w.Allocate(f * sizeof(float)));
  KVH_RETURN_IF_ERROR(info.Allocate(sizeof(int)));
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(a.as<float>(), cov_,
                                           f * f * sizeof(float),
                                           cudaMemcpyDeviceToDevice, stream_));
  size_t dev = 0, host = 0;
  KVH_RETURN_IF_ERROR(SyevdBytes(solver_, params.get(), f, a.as<float>(),
                                 w.as<float>(), &dev, &host));
  DeviceBlock work;
  KVH_RETURN_IF_ERROR(work.Allocate(dev));
  KVH_RETURN_IF_ERROR(Syevd(solver_, params.get(), f, a.as<float>(),
                            w.as<float>(), work.as<void>(), dev, host,
                            info.as<int>(), stream_));
  return TakeTop(a.as<float>(), f, k, w.as<float>(), vectors_out, variances);
}

absl::Status PcaGpu::TakeTop(const float* vectors, uint64_t n, uint64_t k,
                             const float* w, float* vectors_out,
                             std::vector<double>* variances) {
  std::vector<float> w_host(n);
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(w_host.data(), w, n * sizeof(float),
                                           cudaMemcpyDeviceToHost, stream_));
  OrientVectorsArgs o;
  o.vectors = vectors;
  o.features = options_.features;
  o.cols = n;
  o.components = k;
  o.out = vectors_out;
  DeviceBlock signs;
  KVH_RETURN_IF_ERROR(signs.Allocate(OrientVectorsWorkspaceBytes(o)));
  KVH_RETURN_IF_ERROR(LaunchOrientVectors(
      o, signs.as<void>(), OrientVectorsWorkspaceBytes(o), stream_));
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  variances->resize(k);
  for (uint64_t c = 0; c < k; ++c) (*variances)[c] = w_host[n - 1 - c];
  return absl::OkStatus();
}

absl::Status PcaGpu::SolveSubspace(const PcaSolveOptions& o, float* vectors_out,
                                   std::vector<double>* variances) {
  const uint64_t f = options_.features;
  const uint64_t l = SubspaceWidth(f, o);
  SolverParams params;
  KVH_RETURN_IF_ERROR(params.Create());
  DeviceBlock q, z, tau, b, w, info;
  KVH_RETURN_IF_ERROR(q.Allocate(f * l * sizeof(float)));
  KVH_RETURN_IF_ERROR(z.Allocate(f * l * sizeof(float)));
  KVH_RETURN_IF_ERROR(tau.Allocate(l * sizeof(float)));
  KVH_RETURN_IF_ERROR(b.Allocate(l * l * sizeof(float)));
  KVH_RETURN_IF_ERROR(w.Allocate(l * sizeof(float)));
  KVH_RETURN_IF_ERROR(info.Allocate(sizeof(int)));
  int qr_floats = 0;
  KVH_RETURN_IF_ERROR(
      QrFloats(solver_, f, l, z.as<float>(), tau.as<float>(), &qr_floats));
  size_t dev = 0, host = 0;
  KVH_RETURN_IF_ERROR(SyevdBytes(solver_, params.get(), l, b.as<float>(),
                                 w.as<float>(), &dev, &host));
  DeviceBlock work;
  KVH_RETURN_IF_ERROR(
      work.Allocate(std::max(size_t(qr_floats) * sizeof(float), dev)));
  GaussianFillArgs g;
  g.out = z.as<float>();
  g.count = f * l;
  g.seed = o.seed;
  KVH_RETURN_IF_ERROR(LaunchGaussianFill(g, stream_));
  const int m = static_cast<int>(f), n = static_cast<int>(l);
  float* qp = q.as<float>();
  float* zp = z.as<float>();
  // Round 0 orthonormalizes the start block; each later round multiplies by
  // C first. Each round leaves Q in zp, then swaps it into qp.
  for (uint32_t round = 0; round <= o.iterations; ++round) {
    if (round > 0) {
      KVH_RETURN_IF_ERROR(
          Sgemm(blas_, CUBLAS_OP_N, f, l, f, cov_, f, qp, f, zp, f));
    }
    KVH_CUSOLVER_RETURN_IF_ERROR(
        cusolverDnSgeqrf(solver_, m, n, zp, m, tau.as<float>(),
                         work.as<float>(), qr_floats, info.as<int>()));
    KVH_RETURN_IF_ERROR(CheckInfo(info.as<int>(), stream_, "cusolverDnSgeqrf"));
    KVH_CUSOLVER_RETURN_IF_ERROR(
        cusolverDnSorgqr(solver_, m, n, n, zp, m, tau.as<float>(),
                         work.as<float>(), qr_floats, info.as<int>()));
    KVH_RETURN_IF_ERROR(CheckInfo(info.as<int>(), stream_, "cusolverDnSorgqr"));
    std::swap(qp, zp);
  }
  // Rayleigh-Ritz: B = Q^T C Q, B = U diag(w) U^T, vectors Q U.
  KVH_RETURN_IF_ERROR(
      Sgemm(blas_, CUBLAS_OP_N, f, l, f, cov_, f, qp, f, zp, f));
  KVH_RETURN_IF_ERROR(
      Sgemm(blas_, CUBLAS_OP_T, l, l, f, qp, f, zp, f, b.as<float>(), l));
  KVH_RETURN_IF_ERROR(Syevd(solver_, params.get(), l, b.as<float>(),
                            w.as<float>(), work.as<void>(), dev, host,
                            info.as<int>(), stream_));
  KVH_RETURN_IF_ERROR(
      Sgemm(blas_, CUBLAS_OP_N, f, l, l, qp, f, b.as<float>(), l, zp, f));
  return TakeTop(zp, l, o.components, w.as<float>(), vectors_out, variances);
}

absl::StatusOr<PcaGpuResult> PcaGpu::Solve(const PcaSolveOptions& o) {
  const uint64_t f = options_.features;
  KVH_RETURN_IF_ERROR(CheckSolve(f, o));
  const auto t0 = std::chrono::steady_clock::now();
  KVH_CUBLAS_RETURN_IF_ERROR(cublasSetStream(blas_, stream_));
  KVH_CUSOLVER_RETURN_IF_ERROR(cusolverDnSetStream(solver_, stream_));
  KVH_RETURN_IF_ERROR(FinishCovariance());
  PcaGpuResult r;
  r.rows = rows_;
  DeviceBlock out;
  KVH_RETURN_IF_ERROR(out.Allocate(f * o.components * sizeof(float)));
  if (o.solver == PcaSolver::kSyevd) {
    KVH_RETURN_IF_ERROR(
        SolveSyevd(o.components, out.as<float>(), &r.variances));
  } else {
    KVH_RETURN_IF_ERROR(SolveSubspace(o, out.as<float>(), &r.variances));
  }
  for (double v : r.variances) {
    if (!std::isfinite(v)) {
      return Bad("rows",
                 "the covariance overflowed FP32 (values too large for a "
                 "float scatter matrix)");
    }
  }
  KvtcBasis& b = r.basis;
  b.features = f;
  b.components = o.components;
  b.mean.resize(f);
  for (uint64_t i = 0; i < f; ++i) b.mean[i] = static_cast<float>(mean_[i]);
  b.projection.resize(f * o.components);
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.projection.data(), out.as<float>(),
                                           b.projection.size() * sizeof(float),
                                           cudaMemcpyDeviceToHost, stream_));
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  r.solve_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return r;
}

absl::StatusOr<PcaGpuResult> PcaBasisGpu(
    absl::Span<const float> samples, uint64_t rows,
    const PcaGpuOptions& options, const PcaSolveOptions& solve,
    cublasHandle_t blas, cusolverDnHandle_t solver, cudaStream_t stream) {
  KVH_RETURN_IF_ERROR(CheckOptions(options));
  KVH_RETURN_IF_ERROR(CheckSolve(options.features, solve));
  if (rows < 2) return Bad("rows", absl::StrCat(rows, " rows; need >= 2"));
  if (rows > samples.size() / options.features ||
      samples.size() != rows * options.features) {
    return Bad("samples",
               absl::StrFormat("%u values, want rows * features = %u * %u",
                               samples.size(), rows, options.features));
  }
  KVH_ASSIGN_OR_RETURN(std::unique_ptr<PcaGpu> pca,
                       PcaGpu::Create(options, blas, solver, stream));
  KVH_RETURN_IF_ERROR(pca->AddHostRows(samples.data(), rows));
  return pca->Solve(solve);
}

}  // namespace gpu
}  // namespace kvharbor
