// KVTC calibration PCA on the GPU (cuda/calibration/pca_gpu.h) for a
// Llama-3.1-8B-like per-token geometry: 32 layers x 8 KV heads x 128 dims =
// 32768 features, 160K (163840) rows, as the KVTC paper reports (86 s for PCA
// on an H100).
//
// Rows are synthetic and made on the GPU chunk by chunk (never all resident):
// X = G W + noise, G Gaussian [rows][latent], W Gaussian [latent][features]
// with row j scaled by decay^j (a decaying spectrum), noise 3e-3.
// Stages, each beside its baseline in the same run:
//   covariance (FP32 and TF32): PcaGpu::AddDeviceRows over all chunks,
//     CUDA events; the floor is the bare cuBLAS GEMM of the same shapes and
//     precision on the same chunks (what is left is centering + column sums);
//   eigensolver: randomized subspace iteration for the top-k, and the exact
//     cuSOLVER syevd of all 32768 components, on the FP32 covariance; the
//     subspace result is checked against syevd's (|dot| of matched
//     components, variance error), TF32's covariance against FP32's;
//   CPU: core PcaBasis (double covariance + LAPACK dsyev) and the GPU on a
//     small size, their ratio, and the CPU's covariance term extrapolated to
//     the full size (a lower bound: PcaBasis refuses > 8192 features).
// Progress lines go to stderr, the table to stdout.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "cuda/calibration/pca_gpu.h"

ABSL_FLAG(uint64_t, features, 32768, "features per row");
ABSL_FLAG(uint64_t, rows, 163840, "rows (tokens)");
ABSL_FLAG(uint64_t, chunk_rows, 8192, "rows per covariance GEMM");
ABSL_FLAG(uint64_t, latent, 2048, "rank of the synthetic signal");
ABSL_FLAG(double, decay, 0.998, "per-latent-dimension scale decay");
ABSL_FLAG(uint64_t, subspace_k, 4096, "components for subspace iteration");
ABSL_FLAG(uint32_t, subspace_iterations, 4, "subspace power rounds");
ABSL_FLAG(bool, full_syevd, true, "also run syevd on all components");
ABSL_FLAG(uint64_t, cpu_features, 1024, "CPU baseline features");
ABSL_FLAG(uint64_t, cpu_rows, 8192, "CPU baseline rows");

namespace kvharbor {
namespace gpu {
namespace {

#define BENCH_CHECK(expr)                                                \
  do {                                                                   \
    const absl::Status s_ = (expr);                                      \
    if (!s_.ok()) {                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   s_.ToString().c_str());                               \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)
#define BENCH_CUDA(expr)                                                 \
  do {                                                                   \
    const cudaError_t e_ = (expr);                                       \
    if (e_ != cudaSuccess) {                                             \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(e_));                              \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)
#define BENCH_LIB(expr, ok)                                                  \
  do {                                                                       \
    if ((expr) != (ok)) {                                                    \
      std::fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #expr); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

template <typename T>
T Unwrap(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(v);
}

const auto kStart = std::chrono::steady_clock::now();
void Progress(const std::string& line) {
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - kStart)
          .count();
  std::fprintf(stderr, "[%7.2fs] %s\n", s, line.c_str());
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

struct Gpu {
  cublasHandle_t blas = nullptr;
  cusolverDnHandle_t solver = nullptr;
  cudaStream_t stream = nullptr;
};

// Accumulates the milliseconds between two events around each call.
class Timer {
 public:
  explicit Timer(cudaStream_t s) : s_(s) {
    BENCH_CUDA(cudaEventCreate(&a_));
    BENCH_CUDA(cudaEventCreate(&b_));
  }
  ~Timer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  template <typename F>
  void Time(F&& f) {
    BENCH_CUDA(cudaEventRecord(a_, s_));
    f();
    BENCH_CUDA(cudaEventRecord(b_, s_));
    BENCH_CUDA(cudaEventSynchronize(b_));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, a_, b_));
    total_s_ += ms / 1e3;
  }
  double seconds() const { return total_s_; }

 private:
  cudaStream_t s_;
  cudaEvent_t a_ = nullptr, b_ = nullptr;
  double total_s_ = 0;
};

struct CovarianceRun {
  std::unique_ptr<PcaGpu> pca;
  double seconds = 0;
  double floor_seconds = 0;
};

// One pass of generated chunks through the FP32 and TF32 accumulators and
// their bare-GEMM floors.
void Covariances(const Gpu& g, CovarianceRun* fp32, CovarianceRun* tf32,
                 double* gen_seconds) {
  const uint64_t f = absl::GetFlag(FLAGS_features);
  const uint64_t rows = absl::GetFlag(FLAGS_rows);
  const uint64_t chunk = absl::GetFlag(FLAGS_chunk_rows);
  const uint64_t latent = absl::GetFlag(FLAGS_latent);
  float *w = nullptr, *gz = nullptr, *x = nullptr, *floor_c = nullptr;
  BENCH_CUDA(
      cudaMalloc(reinterpret_cast<void**>(&w), latent * f * sizeof(float)));
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&gz),
                        chunk * latent * sizeof(float)));
  BENCH_CUDA(
      cudaMalloc(reinterpret_cast<void**>(&x), chunk * f * sizeof(float)));
  BENCH_CUDA(
      cudaMalloc(reinterpret_cast<void**>(&floor_c), f * f * sizeof(float)));
  GaussianFillArgs wa;
  wa.out = w;
  wa.count = latent * f;
  wa.row_len = f;
  wa.decay = static_cast<float>(absl::GetFlag(FLAGS_decay));
  wa.seed = 11;
  BENCH_CHECK(LaunchGaussianFill(wa, g.stream));
  Timer gen(g.stream), t32(g.stream), tt(g.stream), f32(g.stream), ft(g.stream);
  const float one = 1.0f;
  const int n = static_cast<int>(f);
  for (uint64_t r = 0; r < rows; r += chunk) {
    const uint64_t m = std::min(chunk, rows - r);
    gen.Time([&] {
      GaussianFillArgs ga;
      ga.out = gz;
      ga.count = m * latent;
      ga.seed = 1000 + r;
      BENCH_CHECK(LaunchGaussianFill(ga, g.stream));
      GaussianFillArgs na;
      na.out = x;
      na.count = m * f;
      na.scale = 3e-3f;
      na.seed = 5000 + r;
      BENCH_CHECK(LaunchGaussianFill(na, g.stream));
      // Column-major X^T [f][m] += W^T [f][latent] * G^T [latent][m].
      BENCH_LIB(cublasSetStream(g.blas, g.stream), CUBLAS_STATUS_SUCCESS);
      BENCH_LIB(cublasSgemm(g.blas, CUBLAS_OP_N, CUBLAS_OP_N, n,
                            static_cast<int>(m), static_cast<int>(latent), &one,
                            w, n, gz, static_cast<int>(latent), &one, x, n),
                CUBLAS_STATUS_SUCCESS);
    });
    t32.Time([&] { BENCH_CHECK(fp32->pca->AddDeviceRows(x, m)); });
    tt.Time([&] { BENCH_CHECK(tf32->pca->AddDeviceRows(x, m)); });
    for (auto [timer, compute] :
         {std::pair<Timer*, cublasComputeType_t>{&f32, CUBLAS_COMPUTE_32F},
          {&ft, CUBLAS_COMPUTE_32F_FAST_TF32}}) {
      timer->Time([&, compute = compute] {
        BENCH_LIB(cublasGemmEx(g.blas, CUBLAS_OP_N, CUBLAS_OP_T, n, n,
                               static_cast<int>(m), &one, x, CUDA_R_32F, n, x,
                               CUDA_R_32F, n, &one, floor_c, CUDA_R_32F, n,
                               compute, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_SUCCESS);
      });
    }
    if ((r / chunk) % 5 == 0) {
      Progress(absl::StrFormat("covariance: %u / %u rows", r + m, rows));
    }
  }
  fp32->seconds = t32.seconds();
  tf32->seconds = tt.seconds();
  fp32->floor_seconds = f32.seconds();
  tf32->floor_seconds = ft.seconds();
  *gen_seconds = gen.seconds();
  for (float* p : {w, gz, x, floor_c}) BENCH_CUDA(cudaFree(p));
}

// ||C_tf32 - C_fp32||_F / ||C_fp32||_F.
double RelativeDifference(const Gpu& g, CovarianceRun* a, CovarianceRun* b) {
  BENCH_CHECK(a->pca->FinishCovariance());
  BENCH_CHECK(b->pca->FinishCovariance());
  const uint64_t f = absl::GetFlag(FLAGS_features);
  float* d = nullptr;
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&d), f * f * sizeof(float)));
  BENCH_CUDA(cudaMemcpyAsync(d, b->pca->covariance(), f * f * sizeof(float),
                             cudaMemcpyDeviceToDevice, g.stream));
  const float minus = -1.0f;
  const int64_t count = static_cast<int64_t>(f * f);
  float ref = 0, diff = 0;
  BENCH_LIB(
      cublasSaxpy_64(g.blas, count, &minus, a->pca->covariance(), 1, d, 1),
      CUBLAS_STATUS_SUCCESS);
  BENCH_LIB(cublasSnrm2_64(g.blas, count, d, 1, &diff), CUBLAS_STATUS_SUCCESS);
  BENCH_LIB(cublasSnrm2_64(g.blas, count, a->pca->covariance(), 1, &ref),
            CUBLAS_STATUS_SUCCESS);
  BENCH_CUDA(cudaFree(d));
  return ref > 0 ? diff / ref : 0;
}

struct Agreement {
  double min_dot = 1, median_dot = 1, max_var_err = 0;
};

Agreement Compare(const PcaGpuResult& a, const PcaGpuResult& b, uint64_t k) {
  Agreement out;
  // Row-major projections: walk features outermost for contiguous reads.
  std::vector<double> dots(k, 0.0);
  const uint64_t f = a.basis.features;
  for (uint64_t i = 0; i < f; ++i) {
    const float* pa = &a.basis.projection[i * a.basis.components];
    const float* pb = &b.basis.projection[i * b.basis.components];
    for (uint64_t c = 0; c < k; ++c) dots[c] += double(pa[c]) * pb[c];
  }
  for (uint64_t c = 0; c < k; ++c) {
    dots[c] = std::fabs(dots[c]);
    out.max_var_err =
        std::max(out.max_var_err,
                 std::fabs(a.variances[c] - b.variances[c]) / b.variances[c]);
  }
  std::sort(dots.begin(), dots.end());
  out.min_dot = dots.front();
  out.median_dot = dots[dots.size() / 2];
  return out;
}

// CPU PcaBasis and the GPU on the same small rows.
void CpuBaseline(const Gpu& g, double* cpu_s, double* gpu_s) {
  const uint64_t f = absl::GetFlag(FLAGS_cpu_features);
  const uint64_t rows = absl::GetFlag(FLAGS_cpu_rows);
  const uint64_t latent = std::min<uint64_t>(64, f);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> w(latent * f), x(rows * f), z(latent);
  for (uint64_t j = 0; j < latent; ++j) {
    for (uint64_t i = 0; i < f; ++i) {
      w[j * f + i] = n01(rng) * std::pow(0.95f, float(j));
    }
  }
  for (uint64_t r = 0; r < rows; ++r) {
    for (float& v : z) v = n01(rng);
    for (uint64_t i = 0; i < f; ++i) {
      float v = 3e-3f * n01(rng);
      for (uint64_t j = 0; j < latent; ++j) v += z[j] * w[j * f + i];
      x[r * f + i] = v;
    }
  }
  Progress(
      absl::StrFormat("cpu baseline: PcaBasis %u rows x %u features", rows, f));
  auto t0 = std::chrono::steady_clock::now();
  const KvtcBasis cpu = Unwrap(PcaBasis(x, rows, f, f, {}), "PcaBasis");
  *cpu_s = Seconds(t0);
  PcaGpuOptions o;
  o.features = f;
  PcaSolveOptions so;
  so.components = f;
  // Warm-up (handles, kernels), then the timed run.
  Unwrap(PcaBasisGpu(x, rows, o, so, g.blas, g.solver, g.stream), "warm-up");
  t0 = std::chrono::steady_clock::now();
  const PcaGpuResult gpu = Unwrap(
      PcaBasisGpu(x, rows, o, so, g.blas, g.solver, g.stream), "PcaBasisGpu");
  *gpu_s = Seconds(t0);
  double min_dot = 1;
  for (uint64_t c = 0; c < 16; ++c) {
    double d = 0;
    for (uint64_t i = 0; i < f; ++i) {
      d += double(cpu.projection[i * f + c]) * gpu.basis.projection[i * f + c];
    }
    min_dot = std::min(min_dot, std::fabs(d));
  }
  Progress(
      absl::StrFormat("cpu baseline: min |dot| of the top 16 = %.6f", min_dot));
}

int Main() {
  Gpu g;
  BENCH_CUDA(cudaStreamCreate(&g.stream));
  BENCH_LIB(cublasCreate(&g.blas), CUBLAS_STATUS_SUCCESS);
  BENCH_LIB(cusolverDnCreate(&g.solver), CUSOLVER_STATUS_SUCCESS);
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  const uint64_t f = absl::GetFlag(FLAGS_features);
  const uint64_t rows = absl::GetFlag(FLAGS_rows);
  std::printf(
      "calibrate_gpu_bench on %s: %u rows x %u features, chunks of "
      "%u rows\n",
      prop.name, static_cast<unsigned>(rows), static_cast<unsigned>(f),
      static_cast<unsigned>(absl::GetFlag(FLAGS_chunk_rows)));
  std::fflush(stdout);

  double cpu_s = 0, gpu_small_s = 0;
  CpuBaseline(g, &cpu_s, &gpu_small_s);

  PcaGpuOptions o;
  o.features = f;
  o.chunk_rows = absl::GetFlag(FLAGS_chunk_rows);
  CovarianceRun fp32, tf32;
  fp32.pca = Unwrap(PcaGpu::Create(o, g.blas, g.solver, g.stream), "fp32");
  o.precision = PcaPrecision::kTf32;
  tf32.pca = Unwrap(PcaGpu::Create(o, g.blas, g.solver, g.stream), "tf32");
  double gen_s = 0;
  Covariances(g, &fp32, &tf32, &gen_s);
  const double rel = RelativeDifference(g, &fp32, &tf32);
  tf32.pca.reset();
  const double flops = 2.0 * double(f) * double(f) * double(rows);

  std::printf("\n%-34s %9s %9s %8s\n", "stage", "seconds", "baseline", "ratio");
  auto row = [](const std::string& name, double s, double base) {
    std::printf("%-34s %9.3f %9.3f %8.2f\n", name.c_str(), s, base,
                base > 0 ? s / base : 0.0);
    std::fflush(stdout);
  };
  std::printf("(covariance baseline: bare cuBLAS GEMM of the same shapes)\n");
  row("covariance fp32", fp32.seconds, fp32.floor_seconds);
  row("covariance tf32", tf32.seconds, tf32.floor_seconds);
  std::printf(
      "  GEMM TFLOP/s: fp32 %.1f, tf32 %.1f; tf32 vs fp32 "
      "covariance: rel. Frobenius diff %.2e; row generation %.3f s "
      "(not counted)\n",
      flops / fp32.floor_seconds / 1e12, flops / tf32.floor_seconds / 1e12, rel,
      gen_s);
  std::fflush(stdout);

  PcaSolveOptions sub;
  sub.components = std::min(absl::GetFlag(FLAGS_subspace_k), f);
  sub.solver = PcaSolver::kSubspace;
  sub.iterations = absl::GetFlag(FLAGS_subspace_iterations);
  Progress(absl::StrFormat("subspace iteration: top %u, %u rounds",
                           sub.components, sub.iterations));
  const PcaGpuResult rs = Unwrap(fp32.pca->Solve(sub), "subspace");
  row(absl::StrFormat("eigen subspace top-%u", sub.components),
      rs.solve_seconds, 0);
  row("total fp32 cov + subspace", fp32.seconds + rs.solve_seconds, 0);

  if (absl::GetFlag(FLAGS_full_syevd)) {
    PcaSolveOptions full;
    full.components = f;
    auto bytes = PcaGpuSolveBytes(f, full, g.solver);
    Progress(absl::StrFormat(
        "syevd of all %u components (%s)", f,
        bytes.ok() ? absl::StrFormat("%.1f GiB device", *bytes / 1073741824.0)
                   : bytes.status().ToString()));
    const PcaGpuResult rf = Unwrap(fp32.pca->Solve(full), "syevd");
    row(absl::StrFormat("eigen syevd all %u", f), rf.solve_seconds, 0);
    row("total fp32 cov + syevd", fp32.seconds + rf.solve_seconds, 86.0);
    std::printf(
        "  (baseline of the syevd total: the paper's 86 s on an "
        "H100)\n");
    for (uint64_t k : {uint64_t{256}, uint64_t{1024}}) {
      if (k > sub.components) continue;
      const Agreement a = Compare(rs, rf, k);
      std::printf(
          "  subspace vs syevd, top %4u: min |dot| %.6f, median "
          "%.6f, max variance rel. err %.2e\n",
          static_cast<unsigned>(k), a.min_dot, a.median_dot, a.max_var_err);
    }
  }
  const uint64_t cf = absl::GetFlag(FLAGS_cpu_features);
  const uint64_t cr = absl::GetFlag(FLAGS_cpu_rows);
  std::printf(
      "\nCPU PcaBasis vs GPU (fp32 cov + syevd, all components) at "
      "%u rows x %u features:\n",
      static_cast<unsigned>(cr), static_cast<unsigned>(cf));
  row("cpu PcaBasis (gpu = baseline)", cpu_s, gpu_small_s);
  const double scale = double(rows) / cr * (double(f) / cf) * (double(f) / cf);
  std::printf(
      "  CPU extrapolated to %u x %u (covariance term rows*F^2 "
      "only, a lower bound): %.0f s\n",
      static_cast<unsigned>(rows), static_cast<unsigned>(f), cpu_s * scale);
  cusolverDnDestroy(g.solver);
  cublasDestroy(g.blas);
  cudaStreamDestroy(g.stream);
  return 0;
}

}  // namespace
}  // namespace gpu
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvharbor::gpu::Main();
}
