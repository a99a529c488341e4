// GPU PCA (cuda/calibration/pca_gpu.h) against the CPU calibration's PcaBasis
// and against the known basis of synthetic low-rank rows.
#include "cuda/calibration/pca_gpu.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/codec/kvtc/kvtc_calibration.h"
#include "tests/cuda/cuda_test_util.h"

namespace kvharbor {
namespace gpu {
namespace {

using testing::DeviceBuf;

// cuBLAS / cuSOLVER handles and a stream for one test.
class Handles {
 public:
  Handles() {
    KVH_CUDA_REQUIRE(cudaStreamCreate(&stream_));
    REQUIRE(cublasCreate(&blas_) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cusolverDnCreate(&solver_) == CUSOLVER_STATUS_SUCCESS);
  }
  ~Handles() {
    cusolverDnDestroy(solver_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }
  cublasHandle_t blas() const { return blas_; }
  cusolverDnHandle_t solver() const { return solver_; }
  cudaStream_t stream() const { return stream_; }

 private:
  cublasHandle_t blas_ = nullptr;
  cusolverDnHandle_t solver_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// Rows = mean + sum_j g_j * scale_j * basis_j + noise, basis orthonormal
// [features][rank]; scale_j = 4 * 0.8^j keeps neighbouring variances 36%
// apart, the noise (1e-3) far below the smallest.
struct Synthetic {
  uint64_t rows = 0, features = 0, rank = 0;
  std::vector<float> x;       // [rows][features]
  KvtcBasis truth;            // projection [features][rank]
  std::vector<double> scale;  // [rank]
};

Synthetic MakeSynthetic(uint64_t rows, uint64_t features, uint64_t rank,
                        uint64_t seed) {
  Synthetic s;
  s.rows = rows;
  s.features = features;
  s.rank = rank;
  s.truth = RandomOrthonormalBasis(features, rank, seed, {});
  for (uint64_t j = 0; j < rank; ++j) s.scale.push_back(4 * std::pow(0.8, j));
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  s.x.resize(rows * features);
  std::vector<float> g(rank);
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t j = 0; j < rank; ++j) g[j] = n01(rng) * float(s.scale[j]);
    float* row = &s.x[r * features];
    for (uint64_t f = 0; f < features; ++f) {
      const float* b = &s.truth.projection[f * rank];
      float v = 3.0f + 0.5f * std::sin(0.1f * f) + 1e-3f * n01(rng);
      for (uint64_t j = 0; j < rank; ++j) v += g[j] * b[j];
      row[f] = v;
    }
  }
  return s;
}

double Dot(const KvtcBasis& a, uint64_t ca, const KvtcBasis& b, uint64_t cb) {
  double d = 0;
  for (uint64_t f = 0; f < a.features; ++f) {
    d += double(a.projection[f * a.components + ca]) *
         b.projection[f * b.components + cb];
  }
  return d;
}

uint64_t ArgMaxAbs(const KvtcBasis& b, uint64_t c) {
  uint64_t arg = 0;
  for (uint64_t f = 1; f < b.features; ++f) {
    if (std::fabs(b.projection[f * b.components + c]) >
        std::fabs(b.projection[arg * b.components + c])) {
      arg = f;
    }
  }
  return arg;
}

// Variance of the rows along component c of `b` (a Rayleigh quotient).
double VarianceAlong(const Synthetic& s, const KvtcBasis& b, uint64_t c) {
  double sum = 0;
  for (uint64_t r = 0; r < s.rows; ++r) {
    double y = 0;
    for (uint64_t f = 0; f < s.features; ++f) {
      y += (double(s.x[r * s.features + f]) - b.mean[f]) *
           b.projection[f * b.components + c];
    }
    sum += y * y;
  }
  return sum / static_cast<double>(s.rows);
}

void CheckSignRule(const KvtcBasis& b) {
  for (uint64_t c = 0; c < b.components; ++c) {
    INFO("component " << c);
    REQUIRE(b.projection[ArgMaxAbs(b, c) * b.components + c] > 0);
  }
}

PcaGpuResult RunGpu(const Handles& h, const Synthetic& s, uint64_t k,
                    PcaPrecision precision, PcaSolver solver,
                    uint64_t chunk_rows = 4096) {
  PcaGpuOptions o;
  o.features = s.features;
  o.precision = precision;
  o.chunk_rows = chunk_rows;
  PcaSolveOptions so;
  so.components = k;
  so.solver = solver;
  so.oversample = 16;
  auto r = PcaBasisGpu(s.x, s.rows, o, so, h.blas(), h.solver(), h.stream());
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  REQUIRE(r->basis.Validate("gpu").ok());
  REQUIRE(r->basis.features == s.features);
  REQUIRE(r->basis.components == k);
  REQUIRE(r->variances.size() == k);
  REQUIRE(r->rows == s.rows);
  return *std::move(r);
}

void CheckMean(const KvtcBasis& gpu, const std::vector<float>& want) {
  double scale = 1;
  for (float m : want) scale = std::max(scale, double(std::fabs(m)));
  for (uint64_t f = 0; f < gpu.features; ++f) {
    INFO("feature " << f);
    REQUIRE(std::fabs(double(gpu.mean[f]) - want[f]) <= 1e-5 * scale);
  }
}

TEST_CASE("PCA GPU matches the CPU calibration over a sweep of shapes",
          "[pca_gpu]") {
  Handles h;
  struct Case {
    uint64_t features, rows, rank, k;
  };
  for (const Case& c :
       {Case{64, 1000, 6, 6}, Case{256, 3000, 10, 8}, Case{1024, 4096, 8, 8}}) {
    const Synthetic s = MakeSynthetic(c.rows, c.features, c.rank, c.features);
    auto cpu = PcaBasis(s.x, s.rows, s.features, c.k, {});
    REQUIRE(cpu.ok());
    for (PcaPrecision p : {PcaPrecision::kFp32, PcaPrecision::kTf32}) {
      INFO("features " << c.features << " rows " << c.rows << " k " << c.k
                       << " precision " << PcaPrecisionName(p));
      // A chunk size that does not divide the rows.
      const PcaGpuResult gpu =
          RunGpu(h, s, c.k, p, PcaSolver::kSyevd, c.rows / 3 + 7);
      CheckMean(gpu.basis, cpu->mean);
      CheckSignRule(gpu.basis);
      const double dot_tol = p == PcaPrecision::kFp32 ? 1e-5 : 1e-3;
      const double var_tol = p == PcaPrecision::kFp32 ? 1e-4 : 3e-3;
      for (uint64_t j = 0; j < c.k; ++j) {
        INFO("component " << j);
        const double d = Dot(gpu.basis, j, *cpu, j);
        REQUIRE(std::fabs(d) >= 1 - dot_tol);
        if (ArgMaxAbs(gpu.basis, j) == ArgMaxAbs(*cpu, j)) REQUIRE(d > 0);
        const double want = VarianceAlong(s, *cpu, j);
        REQUIRE(std::fabs(gpu.variances[j] - want) <= var_tol * want);
        if (j > 0) REQUIRE(gpu.variances[j] <= gpu.variances[j - 1]);
      }
    }
  }
}

// Too large for the CPU path in a test: compare with the generating basis.
TEST_CASE("PCA GPU recovers a known basis at 4096 features", "[pca_gpu]") {
  Handles h;
  const Synthetic s = MakeSynthetic(6000, 4096, 8, 77);
  std::vector<double> mean(s.features, 0.0);
  for (uint64_t r = 0; r < s.rows; ++r) {
    for (uint64_t f = 0; f < s.features; ++f)
      mean[f] += s.x[r * s.features + f];
  }
  for (double& m : mean) m /= static_cast<double>(s.rows);
  for (PcaSolver solver : {PcaSolver::kSyevd, PcaSolver::kSubspace}) {
    INFO("solver " << PcaSolverName(solver));
    const PcaGpuResult gpu = RunGpu(h, s, s.rank, PcaPrecision::kFp32, solver);
    for (uint64_t f = 0; f < s.features; ++f) {
      REQUIRE(std::fabs(gpu.basis.mean[f] - mean[f]) <= 1e-5 * 4);
    }
    CheckSignRule(gpu.basis);
    for (uint64_t c = 0; c < s.rank; ++c) {
      INFO("component " << c);
      // Length of the component's projection onto the true span.
      double in_span = 0;
      for (uint64_t j = 0; j < s.rank; ++j) {
        const double d = Dot(gpu.basis, c, s.truth, j);
        in_span += d * d;
      }
      REQUIRE(std::sqrt(in_span) >= 1 - 1e-4);
      // Sampling error of a variance over 6000 rows is ~2%.
      const double want = s.scale[c] * s.scale[c];
      REQUIRE(std::fabs(gpu.variances[c] - want) <= 0.1 * want);
    }
  }
}

TEST_CASE("PCA GPU subspace iteration agrees with syevd", "[pca_gpu]") {
  Handles h;
  const Synthetic s = MakeSynthetic(4000, 512, 12, 5);
  const PcaGpuResult full =
      RunGpu(h, s, 12, PcaPrecision::kFp32, PcaSolver::kSyevd);
  const PcaGpuResult sub =
      RunGpu(h, s, 12, PcaPrecision::kFp32, PcaSolver::kSubspace);
  CheckSignRule(sub.basis);
  for (uint64_t c = 0; c < 12; ++c) {
    INFO("component " << c);
    REQUIRE(std::fabs(Dot(full.basis, c, sub.basis, c)) >= 1 - 1e-5);
    REQUIRE(std::fabs(full.variances[c] - sub.variances[c]) <=
            1e-4 * full.variances[c]);
    // Column sums use double atomics, so runs may differ in the last bit.
    REQUIRE(std::fabs(full.basis.mean[c] - sub.basis.mean[c]) <= 1e-6);
  }
}

TEST_CASE("PCA GPU device rows in pieces equal host rows", "[pca_gpu]") {
  Handles h;
  const Synthetic s = MakeSynthetic(1000, 128, 5, 9);
  PcaGpuOptions o;
  o.features = s.features;
  o.chunk_rows = 96;
  PcaSolveOptions so;
  so.components = 5;
  auto host = PcaBasisGpu(s.x, s.rows, o, so, h.blas(), h.solver(), h.stream());
  REQUIRE(host.ok());
  DeviceBuf dx(s.x.size() * sizeof(float));
  dx.Upload(s.x.data(), dx.size());
  auto pca = PcaGpu::Create(o, h.blas(), h.solver(), h.stream());
  REQUIRE(pca.ok());
  for (uint64_t r = 0; r < s.rows; r += 333) {
    const uint64_t n = std::min<uint64_t>(333, s.rows - r);
    KVH_STATUS_REQUIRE(
        (*pca)->AddDeviceRows(dx.as<float>() + r * s.features, n));
  }
  REQUIRE((*pca)->rows() == s.rows);
  auto dev = (*pca)->Solve(so);
  REQUIRE(dev.ok());
  CheckMean(dev->basis, host->basis.mean);
  for (uint64_t c = 0; c < 5; ++c) {
    REQUIRE(Dot(dev->basis, c, host->basis, c) >= 1 - 1e-6);
    REQUIRE(std::fabs(dev->variances[c] - host->variances[c]) <=
            1e-5 * host->variances[c]);
  }
  // The covariance is final now.
  const absl::Status again = (*pca)->AddHostRows(s.x.data(), 2);
  REQUIRE(again.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(std::string(again.message()).find("rows") != std::string::npos);
}

void RequireInvalid(const absl::Status& st, const std::string& field) {
  INFO(st.ToString());
  REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(st.message()).find(field) != std::string::npos);
}

TEST_CASE("PCA GPU refuses bad arguments with clear errors", "[pca_gpu]") {
  Handles h;
  PcaGpuOptions o;
  o.features = 16;
  auto create = [&](PcaGpuOptions opt) {
    return PcaGpu::Create(opt, h.blas(), h.solver(), h.stream()).status();
  };
  {
    PcaGpuOptions bad = o;
    bad.features = 1;
    RequireInvalid(create(bad), "options.features");
    bad.features = kPcaGpuMaxFeatures + 1;
    RequireInvalid(create(bad), "options.features");
    bad = o;
    bad.chunk_rows = 0;
    RequireInvalid(create(bad), "options.chunk_rows");
    bad = o;
    bad.precision = static_cast<PcaPrecision>(7);
    RequireInvalid(create(bad), "options.precision");
  }
  RequireInvalid(PcaGpu::Create(o, nullptr, h.solver(), h.stream()).status(),
                 "blas");
  RequireInvalid(PcaGpu::Create(o, h.blas(), nullptr, h.stream()).status(),
                 "solver");
  auto pca = PcaGpu::Create(o, h.blas(), h.solver(), h.stream());
  REQUIRE(pca.ok());
  RequireInvalid((*pca)->AddDeviceRows(nullptr, 3), "rows");
  RequireInvalid((*pca)->AddHostRows(nullptr, 3), "rows");
  std::vector<float> one_row(16, 1.0f);
  KVH_STATUS_REQUIRE((*pca)->AddHostRows(one_row.data(), 1));
  PcaSolveOptions so;
  so.components = 4;
  const absl::Status few = (*pca)->Solve(so).status();
  REQUIRE(few.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(std::string(few.message()).find("rows") != std::string::npos);
  {
    PcaSolveOptions bad = so;
    bad.components = 0;
    RequireInvalid((*pca)->Solve(bad).status(), "solve.components");
    bad.components = 17;
    RequireInvalid((*pca)->Solve(bad).status(), "solve.components");
    bad = so;
    bad.solver = static_cast<PcaSolver>(9);
    RequireInvalid((*pca)->Solve(bad).status(), "solve.solver");
    bad = so;
    bad.iterations = 65;
    RequireInvalid((*pca)->Solve(bad).status(), "solve.iterations");
    bad = so;
    bad.oversample = kPcaGpuMaxFeatures + 1;
    RequireInvalid((*pca)->Solve(bad).status(), "solve.oversample");
  }
  // Wrong sample count, and NaN rows.
  std::vector<float> x(10 * 16, 0.5f);
  RequireInvalid(PcaBasisGpu(absl::MakeSpan(x).subspan(1), 10, o, so, h.blas(),
                             h.solver(), h.stream())
                     .status(),
                 "samples");
  x[37] = std::numeric_limits<float>::quiet_NaN();
  RequireInvalid(
      PcaBasisGpu(x, 10, o, so, h.blas(), h.solver(), h.stream()).status(),
      "non-finite");
}

TEST_CASE("PCA GPU workspace sizes cover the buffers", "[pca_gpu]") {
  Handles h;
  PcaGpuOptions o;
  o.features = 300;
  o.chunk_rows = 50;
  auto small = PcaGpuAccumulatorBytes(o);
  REQUIRE(small.ok());
  REQUIRE(*small >= 300 * 300 * sizeof(float) + 2 * 50 * 300 * sizeof(float));
  o.chunk_rows = 500;
  auto large = PcaGpuAccumulatorBytes(o);
  REQUIRE(large.ok());
  REQUIRE(*large > *small);
  o.features = 0;
  RequireInvalid(PcaGpuAccumulatorBytes(o).status(), "options.features");
  PcaSolveOptions so;
  so.components = 20;
  auto syevd = PcaGpuSolveBytes(300, so, h.solver());
  INFO(syevd.status().ToString());
  REQUIRE(syevd.ok());
  REQUIRE(*syevd >= 300 * 300 * sizeof(float) + 300 * 20 * sizeof(float));
  so.solver = PcaSolver::kSubspace;
  auto sub = PcaGpuSolveBytes(300, so, h.solver());
  REQUIRE(sub.ok());
  REQUIRE(*sub >= 2 * 300 * (20 + so.oversample) * sizeof(float));
  RequireInvalid(PcaGpuSolveBytes(300, so, nullptr).status(), "solver");
}

}  // namespace
}  // namespace gpu
}  // namespace kvharbor
