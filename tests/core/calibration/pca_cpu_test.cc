#include "core/calibration/pca_cpu.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "core/calibration/calibration_rows.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"

namespace kvharbor {
namespace {

// rows x f samples: mean + sum_j sqrt(s_j) z_j u_j + noise, s_j decaying
// as 1 / (1 + j / 4)^2 over `rank` random orthonormal directions u.
std::vector<float> Decaying(uint64_t rows, uint64_t f, uint64_t rank,
                            uint64_t seed) {
  const KvtcBasis u = RandomOrthonormalBasis(f, rank, seed, {});
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::vector<float> x(rows * f);
  std::vector<double> z(rank);
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t j = 0; j < rank; ++j) {
      z[j] = n01(rng) / (1.0 + j / 4.0);
    }
    for (uint64_t i = 0; i < f; ++i) {
      double v = 3.0 + 0.01 * i + 0.01 * n01(rng);
      for (uint64_t j = 0; j < rank; ++j)
        v += z[j] * u.projection[i * rank + j];
      x[r * f + i] = static_cast<float>(v);
    }
  }
  return x;
}

// Variance of the rows along the basis' components (the explained
// variance).
double Explained(const std::vector<float>& x, uint64_t rows, uint64_t f,
                 const KvtcBasis& b) {
  double total = 0;
  for (uint64_t c = 0; c < b.components; ++c) {
    double s = 0, s2 = 0;
    for (uint64_t r = 0; r < rows; ++r) {
      double y = 0;
      for (uint64_t i = 0; i < f; ++i) {
        y += double(x[r * f + i]) * b.projection[i * b.components + c];
      }
      s += y;
      s2 += y * y;
    }
    total += s2 / rows - (s / rows) * (s / rows);
  }
  return total;
}

PcaRequest Want(uint64_t k) {
  PcaRequest r;
  r.components = k;
  return r;
}

TEST_CASE("cpu pca: exact matches the dense LAPACK PCA", "[pca_cpu]") {
  const uint64_t rows = 600, f = 48;
  const std::vector<float> x = Decaying(rows, f, 12, 3);
  auto ref = PcaBasis(x, rows, f, 8, {});
  REQUIRE(ref.ok());
  for (uint64_t chunk : {uint64_t{7}, uint64_t{1024}}) {
    CpuPcaOptions o;
    o.solver = CpuPcaSolver::kExact;
    o.chunk_rows = chunk;
    auto got = CpuCalibrationPca(o).Compute(MemoryRows(x, rows, f), Want(8));
    REQUIRE(got.ok());
    const KvtcBasis& b = got->basis;
    REQUIRE(b.components == 8);
    for (uint64_t i = 0; i < f; ++i) {
      CHECK(b.mean[i] == Approx(ref->mean[i]).margin(1e-5));
    }
    // Same vectors, same signs (distinct eigenvalues).
    for (uint64_t i = 0; i < f * 8; ++i) {
      CHECK(b.projection[i] == Approx(ref->projection[i]).margin(2e-4));
    }
  }
}

TEST_CASE("cpu pca: subspace iteration agrees with exact on the top",
          "[pca_cpu]") {
  const uint64_t rows = 3000, f = 256, k = 24;
  const std::vector<float> x = Decaying(rows, f, 64, 11);
  const MemoryRows src(x, rows, f);
  CpuPcaOptions eo;
  eo.solver = CpuPcaSolver::kExact;
  auto exact = CpuCalibrationPca(eo).Compute(src, Want(k));
  REQUIRE(exact.ok());
  CpuPcaOptions so;
  so.solver = CpuPcaSolver::kSubspace;
  so.chunk_rows = 500;
  auto sub = CpuCalibrationPca(so).Compute(src, Want(k));
  REQUIRE(sub.ok());
  REQUIRE(sub->basis.components == k);
  // The leading directions are the same (principal angles near 0) and the
  // whole set explains as much variance.
  CHECK(testing::SubspaceMinCos2(exact->basis, sub->basis, 8) > 0.999);
  const double e = Explained(x, rows, f, exact->basis);
  const double s = Explained(x, rows, f, sub->basis);
  CHECK(s <= e * (1 + 1e-6));
  CHECK(s >= 0.999 * e);
  for (uint64_t i = 0; i < f; ++i) {
    CHECK(sub->basis.mean[i] == Approx(exact->basis.mean[i]).margin(1e-5));
  }
  // Columns are orthonormal.
  for (uint64_t a = 0; a < k; ++a) {
    double n2 = 0;
    for (uint64_t i = 0; i < f; ++i) {
      n2 += double(sub->basis.projection[i * k + a]) *
            sub->basis.projection[i * k + a];
    }
    CHECK(n2 == Approx(1.0).margin(1e-4));
  }
}

TEST_CASE("cpu pca: solver choice, component cap, memory and cancellation",
          "[pca_cpu]") {
  CHECK(ResolveCpuPcaSolver(CpuPcaSolver::kAuto, 2048, 2048) ==
        CpuPcaSolver::kExact);
  CHECK(ResolveCpuPcaSolver(CpuPcaSolver::kAuto, 8192, 4096) ==
        CpuPcaSolver::kExact);
  CHECK(ResolveCpuPcaSolver(CpuPcaSolver::kAuto, 8192, 512) ==
        CpuPcaSolver::kSubspace);
  CHECK(ResolveCpuPcaSolver(CpuPcaSolver::kAuto, 32768, 16384) ==
        CpuPcaSolver::kSubspace);
  PcaRequest open;
  open.useful_components = 16384;
  CHECK(CpuPcaComponents(CpuPcaSolver::kSubspace, 32768, open) ==
        kCpuSubspaceDefaultComponents);
  CHECK(CpuPcaComponents(CpuPcaSolver::kSubspace, 32768, Want(3000)) == 3000);
  // The stated bound at the Llama-3-8B row: under 1 GiB.
  CpuPcaOptions o;
  CHECK(CpuPcaWorkingBytes(CpuPcaSolver::kSubspace, 32768, 1024, o) <
        (uint64_t{1} << 30));

  const std::vector<float> x = Decaying(64, 9000, 4, 5);
  const MemoryRows src(x, 64, 9000);
  o.solver = CpuPcaSolver::kExact;
  auto too_wide = CpuCalibrationPca(o).Compute(src, Want(4));
  REQUIRE(!too_wide.ok());
  CHECK_THAT(std::string(too_wide.status().message()),
             Catch::StartsWith("samples: 9000 features per row; the exact"));
  o.solver = CpuPcaSolver::kSubspace;
  PcaRequest cancel = Want(4);
  cancel.cancelled = [] { return true; };
  CHECK(CpuCalibrationPca(o).Compute(src, cancel).status().code() ==
        absl::StatusCode::kCancelled);
  // Fewer rows than directions still gives an orthonormal basis.
  auto wide = CpuCalibrationPca(o).Compute(src, Want(40));
  REQUIRE(wide.ok());
  CHECK(wide->basis.Validate("b").ok());
}

}  // namespace
}  // namespace kvharbor
