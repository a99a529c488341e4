#include "core/calibration/pca_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "types/enum_names.h"

// LAPACK of the linked OpenBLAS (Fortran symbols; the trailing size_t are
// gfortran's hidden CHARACTER lengths).
extern "C" {
void dsyev_(const char* jobz, const char* uplo, const int* n, double* a,
            const int* lda, double* w, double* work, const int* lwork,
            int* info, size_t jobz_len, size_t uplo_len);
void dsyevr_(const char* jobz, const char* range, const char* uplo,
             const int* n, double* a, const int* lda, const double* vl,
             const double* vu, const int* il, const int* iu,
             const double* abstol, int* m, double* w, double* z, const int* ldz,
             int* isuppz, double* work, const int* lwork, int* iwork,
             const int* liwork, int* info, size_t jobz_len, size_t range_len,
             size_t uplo_len);
void sgeqrf_(const int* m, const int* n, float* a, const int* lda, float* tau,
             float* work, const int* lwork, int* info);
void sorgqr_(const int* m, const int* n, const int* k, float* a, const int* lda,
             const float* tau, float* work, const int* lwork, int* info);
}

namespace kvharbor {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void Say(const PcaRequest& r, const std::string& line) {
  if (r.say) r.say(line);
}

absl::Status CheckCancelled(const PcaRequest& r) {
  if (r.cancelled && r.cancelled()) {
    return absl::CancelledError("calibration: cancelled");
  }
  return absl::OkStatus();
}

uint64_t ChunkRows(const CpuPcaOptions& o, uint64_t rows) {
  return std::max<uint64_t>(1, std::min(o.chunk_rows, rows));
}

// Column means, in double, from rows shifted by the first one (no
// cancellation when the mean is large against the spread).
absl::StatusOr<std::vector<double>> Means(const CalibrationRows& x,
                                          uint64_t chunk,
                                          const PcaRequest& req) {
  const uint64_t n = x.rows(), f = x.features();
  std::vector<float> buf(chunk * f), shift(f);
  x.ReadRows(0, 1, shift.data());
  std::vector<double> sums(f, 0.0);
  for (uint64_t r0 = 0; r0 < n; r0 += chunk) {
    KVH_RETURN_IF_ERROR(CheckCancelled(req));
    const uint64_t b = std::min(chunk, n - r0);
    x.ReadRows(r0, b, buf.data());
    for (uint64_t r = 0; r < b; ++r) {
      const float* row = buf.data() + r * f;
      for (uint64_t c = 0; c < f; ++c) sums[c] += double(row[c]) - shift[c];
    }
  }
  for (uint64_t c = 0; c < f; ++c) {
    sums[c] = shift[c] + sums[c] / static_cast<double>(n);
  }
  return sums;
}

// Makes each column of p ([f][k] row-major) have its largest-magnitude
// entry (the first on ties) positive.
void Orient(std::vector<float>& p, uint64_t f, uint64_t k) {
  for (uint64_t c = 0; c < k; ++c) {
    uint64_t arg = 0;
    for (uint64_t i = 1; i < f; ++i) {
      if (std::fabs(p[i * k + c]) > std::fabs(p[arg * k + c])) arg = i;
    }
    if (p[arg * k + c] < 0) {
      for (uint64_t i = 0; i < f; ++i) p[i * k + c] = -p[i * k + c];
    }
  }
}

absl::StatusOr<PcaOutcome> ExactPca(const CalibrationRows& x, uint64_t k,
                                    const CpuPcaOptions& o,
                                    const PcaRequest& req) {
  const auto t0 = Clock::now();
  const uint64_t n = x.rows(), f = x.features();
  const uint64_t chunk = ChunkRows(o, n);
  std::vector<float> buf(chunk * f), shift(f);
  std::vector<double> dbuf(chunk * f), sums(f, 0.0), cov(f * f, 0.0);
  x.ReadRows(0, 1, shift.data());
  for (uint64_t r0 = 0; r0 < n; r0 += chunk) {
    KVH_RETURN_IF_ERROR(CheckCancelled(req));
    const uint64_t b = std::min(chunk, n - r0);
    x.ReadRows(r0, b, buf.data());
    for (uint64_t r = 0; r < b; ++r) {
      for (uint64_t c = 0; c < f; ++c) {
        const double d = double(buf[r * f + c]) - shift[c];
        dbuf[r * f + c] = d;
        sums[c] += d;
      }
    }
    // Upper triangle of cov += D^T D.
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(f),
                static_cast<int>(b), 1.0, dbuf.data(), static_cast<int>(f), 1.0,
                cov.data(), static_cast<int>(f));
  }
  std::vector<double>().swap(dbuf);
  const double dn = static_cast<double>(n);
  for (uint64_t i = 0; i < f; ++i) {
    const double di = sums[i] / dn;
    for (uint64_t j = i; j < f; ++j) {
      cov[i * f + j] = cov[i * f + j] / dn - di * (sums[j] / dn);
    }
  }
  Say(req, absl::StrFormat("  cpu covariance of %u rows: %.2fs", n, Since(t0)));
  // Row-major upper triangle == column-major lower triangle.
  const int fn = static_cast<int>(f), il = static_cast<int>(f - k + 1),
            iu = static_cast<int>(f);
  const double vl = 0, vu = 0, abstol = 0;
  int m = 0, info = 0, lwork = -1, liwork = -1, iwork_size = 0;
  double work_size = 0;
  std::vector<double> w(f), z(f * k);
  std::vector<int> isuppz(2 * k);
  dsyevr_("V", "I", "L", &fn, cov.data(), &fn, &vl, &vu, &il, &iu, &abstol, &m,
          w.data(), z.data(), &fn, isuppz.data(), &work_size, &lwork,
          &iwork_size, &liwork, &info, 1, 1, 1);
  lwork = std::max(1, static_cast<int>(work_size));
  liwork = std::max(1, iwork_size);
  std::vector<double> work(lwork);
  std::vector<int> iwork(liwork);
  dsyevr_("V", "I", "L", &fn, cov.data(), &fn, &vl, &vu, &il, &iu, &abstol, &m,
          w.data(), z.data(), &fn, isuppz.data(), work.data(), &lwork,
          iwork.data(), &liwork, &info, 1, 1, 1);
  if (info != 0 || m != static_cast<int>(k)) {
    return absl::InternalError(absl::StrFormat(
        "cpu PCA: dsyevr failed (info %d, %d of %u eigenpairs)", info, m, k));
  }
  PcaOutcome out;
  KvtcBasis& b = out.basis;
  b.features = f;
  b.components = k;
  b.mean.resize(f);
  for (uint64_t c = 0; c < f; ++c) b.mean[c] = float(shift[c] + sums[c] / dn);
  b.projection.resize(f * k);
  for (uint64_t c = 0; c < k; ++c) {
    const double* v = &z[(k - 1 - c) * f];  // ascending eigenvalues
    for (uint64_t i = 0; i < f; ++i) b.projection[i * k + c] = float(v[i]);
  }
  Orient(b.projection, f, k);
  Say(req, absl::StrFormat("  cpu exact PCA (dsyevr, top %u of %u): %.2fs", k,
                           f, Since(t0)));
  return out;
}

uint64_t SplitMix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Orthonormalizes the columns of the column-major f x l matrix `a` in place
// (Householder QR, explicit Q).
absl::Status Orthonormalize(std::vector<float>& a, uint64_t f, uint64_t l) {
  const int m = static_cast<int>(f), n = static_cast<int>(l);
  std::vector<float> tau(l);
  int info = 0, lwork = -1;
  float q1 = 0, q2 = 0;
  sgeqrf_(&m, &n, a.data(), &m, tau.data(), &q1, &lwork, &info);
  sorgqr_(&m, &n, &n, a.data(), &m, tau.data(), &q2, &lwork, &info);
  lwork = std::max(1, static_cast<int>(std::max(q1, q2)));
  std::vector<float> work(lwork);
  sgeqrf_(&m, &n, a.data(), &m, tau.data(), work.data(), &lwork, &info);
  if (info != 0) return absl::InternalError("cpu PCA: sgeqrf failed");
  sorgqr_(&m, &n, &n, a.data(), &m, tau.data(), work.data(), &lwork, &info);
  if (info != 0) return absl::InternalError("cpu PCA: sorgqr failed");
  return absl::OkStatus();
}

// One pass over the centered rows: with Y = X Q (q is [l][f] row-major,
// i.e. Q column-major), z += Y^T X ([l][f]) when z is given, and
// bt += Y^T Y ([l][l], upper triangle) when bt is given.
absl::Status SubspacePass(const CalibrationRows& x,
                          const std::vector<float>& mean, uint64_t chunk,
                          const std::vector<float>& q, uint64_t l, float* z,
                          float* bt, const PcaRequest& req) {
  const uint64_t n = x.rows(), f = x.features();
  std::vector<float> buf(chunk * f), y(chunk * l);
  const int fi = static_cast<int>(f), li = static_cast<int>(l);
  for (uint64_t r0 = 0; r0 < n; r0 += chunk) {
    KVH_RETURN_IF_ERROR(CheckCancelled(req));
    const uint64_t b = std::min(chunk, n - r0);
    const int bi = static_cast<int>(b);
    x.ReadRows(r0, b, buf.data());
    for (uint64_t r = 0; r < b; ++r) {
      float* row = buf.data() + r * f;
      for (uint64_t c = 0; c < f; ++c) row[c] -= mean[c];
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bi, li, fi, 1.0f,
                buf.data(), fi, q.data(), fi, 0.0f, y.data(), li);
    if (z != nullptr) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, li, fi, bi, 1.0f,
                  y.data(), li, buf.data(), fi, 1.0f, z, fi);
    }
    if (bt != nullptr) {
      cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, li, bi, 1.0f, y.data(),
                  li, 1.0f, bt, li);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PcaOutcome> SubspacePca(const CalibrationRows& x, uint64_t k,
                                       const CpuPcaOptions& o,
                                       const PcaRequest& req) {
  const auto t0 = Clock::now();
  const uint64_t n = x.rows(), f = x.features();
  const uint64_t chunk = ChunkRows(o, n);
  const uint64_t l = std::min(f, k + o.oversample);
  KVH_ASSIGN_OR_RETURN(const std::vector<double> mean_d, Means(x, chunk, req));
  std::vector<float> mean(mean_d.begin(), mean_d.end());
  // Q0: orthonormalized Gaussian block (column-major f x l == [l][f]).
  std::vector<float> q(l * f), z(l * f);
  uint64_t s = o.seed;
  for (uint64_t i = 0; i < q.size(); i += 2) {
    const double u1 = (double(SplitMix64(s) >> 11) + 0.5) / 9007199254740992.0;
    const double u2 = double(SplitMix64(s) >> 11) / 9007199254740992.0;
    const double r = std::sqrt(-2.0 * std::log(u1));
    q[i] = float(r * std::cos(6.283185307179586 * u2));
    if (i + 1 < q.size())
      q[i + 1] = float(r * std::sin(6.283185307179586 * u2));
  }
  KVH_RETURN_IF_ERROR(Orthonormalize(q, f, l));
  for (uint32_t it = 0; it < o.iterations; ++it) {
    std::fill(z.begin(), z.end(), 0.0f);
    KVH_RETURN_IF_ERROR(
        SubspacePass(x, mean, chunk, q, l, z.data(), nullptr, req));
    KVH_RETURN_IF_ERROR(Orthonormalize(z, f, l));
    q.swap(z);
    Say(req, absl::StrFormat("  cpu subspace pass %u/%u (%u rows x %u "
                             "features x %u directions): %.2fs",
                             it + 1, o.iterations, n, f, l, Since(t0)));
  }
  std::vector<float>().swap(z);
  // Rayleigh-Ritz: B = Q^T C Q = (X Q)^T (X Q) / n.
  std::vector<float> bt(l * l, 0.0f);
  KVH_RETURN_IF_ERROR(
      SubspacePass(x, mean, chunk, q, l, nullptr, bt.data(), req));
  std::vector<double> bd(l * l), w(l);
  for (uint64_t i = 0; i < l * l; ++i) bd[i] = bt[i] / static_cast<double>(n);
  const int li = static_cast<int>(l);
  int info = 0, lwork = -1;
  double work_size = 0;
  dsyev_("V", "L", &li, bd.data(), &li, w.data(), &work_size, &lwork, &info, 1,
         1);
  lwork = std::max(1, static_cast<int>(work_size));
  std::vector<double> work(lwork);
  dsyev_("V", "L", &li, bd.data(), &li, w.data(), work.data(), &lwork, &info, 1,
         1);
  if (info != 0) {
    return absl::InternalError(
        absl::StrCat("cpu PCA: dsyev of the Rayleigh-Ritz matrix failed, "
                     "info=",
                     info));
  }
  // V_k [l][k]: column c = eigenvector l-1-c (ascending eigenvalues).
  std::vector<float> vk(l * k);
  for (uint64_t c = 0; c < k; ++c) {
    const double* v = &bd[(l - 1 - c) * l];
    for (uint64_t i = 0; i < l; ++i) vk[i * k + c] = float(v[i]);
  }
  PcaOutcome out;
  KvtcBasis& b = out.basis;
  b.features = f;
  b.components = k;
  b.mean = std::move(mean);
  b.projection.resize(f * k);
  // P [f][k] = Q [f][l] V_k, Q being q^T.
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(f),
              static_cast<int>(k), li, 1.0f, q.data(), static_cast<int>(f),
              vk.data(), static_cast<int>(k), 0.0f, b.projection.data(),
              static_cast<int>(k));
  Orient(b.projection, f, k);
  Say(req, absl::StrFormat("  cpu subspace PCA (top %u of %u, %u passes): "
                           "%.2fs",
                           k, f, o.iterations + 2, Since(t0)));
  return out;
}

}  // namespace

absl::string_view CpuPcaSolverName(CpuPcaSolver s) {
  return EnumName(s, {"auto", "exact", "subspace"});
}

CpuPcaSolver ResolveCpuPcaSolver(CpuPcaSolver s, uint64_t features,
                                 uint64_t components) {
  if (s != CpuPcaSolver::kAuto) return s;
  if (features <= kCpuExactPcaAutoFeatures) return CpuPcaSolver::kExact;
  if (features <= kCpuExactPcaMaxFeatures && components * 4 > features) {
    return CpuPcaSolver::kExact;
  }
  return CpuPcaSolver::kSubspace;
}

uint64_t CpuPcaComponents(CpuPcaSolver resolved, uint64_t features,
                          const PcaRequest& request) {
  if (request.components > 0) return std::min(features, request.components);
  uint64_t k =
      std::min(features, std::max<uint64_t>(1, request.useful_components));
  if (resolved == CpuPcaSolver::kSubspace) {
    k = std::min(k, kCpuSubspaceDefaultComponents);
  }
  return k;
}

uint64_t CpuPcaWorkingBytes(CpuPcaSolver resolved, uint64_t features,
                            uint64_t components, const CpuPcaOptions& o) {
  const uint64_t f = features, k = components, b = o.chunk_rows;
  if (resolved == CpuPcaSolver::kExact) {
    return 8 * f * f + 8 * f * (k + b) + 4 * f * (b + k) + 8 * 36 * f;
  }
  const uint64_t l = std::min(f, k + o.oversample);
  return 12 * f * l + 4 * b * (f + l) + 16 * l * l + 4 * f * k;
}

std::string CpuCalibrationPca::name() const {
  return absl::StrCat("CPU (", CpuPcaSolverName(options_.solver), ")");
}

uint64_t CpuCalibrationPca::max_features() const {
  return options_.solver == CpuPcaSolver::kExact ? kCpuExactPcaMaxFeatures
                                                 : kCpuPcaMaxFeatures;
}

absl::StatusOr<PcaOutcome> CpuCalibrationPca::Compute(
    const CalibrationRows& rows, const PcaRequest& request) const {
  const uint64_t f = rows.features();
  if (rows.rows() < 2 || f == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "samples: %u rows of %u features; the PCA needs >= 2 rows", rows.rows(),
        f));
  }
  if (options_.iterations > 16) {
    return absl::InvalidArgumentError("iterations: must be at most 16");
  }
  CpuPcaSolver solver = ResolveCpuPcaSolver(
      options_.solver, f,
      request.components > 0 ? request.components : request.useful_components);
  if (solver == CpuPcaSolver::kExact && f > kCpuExactPcaMaxFeatures) {
    return absl::InvalidArgumentError(
        absl::StrFormat("samples: %u features per row; the exact CPU PCA "
                        "handles at most %u (use the subspace solver)",
                        f, kCpuExactPcaMaxFeatures));
  }
  if (f > kCpuPcaMaxFeatures) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "samples: %u features per row; the CPU PCA handles at most %u", f,
        kCpuPcaMaxFeatures));
  }
  const uint64_t k = CpuPcaComponents(solver, f, request);
  Say(request,
      absl::StrFormat("  cpu %s PCA: %u components, working set "
                      "%.0f MiB",
                      CpuPcaSolverName(solver), k,
                      CpuPcaWorkingBytes(solver, f, k, options_) / 1048576.0));
  return solver == CpuPcaSolver::kExact
             ? ExactPca(rows, k, options_, request)
             : SubspacePca(rows, k, options_, request);
}

}  // namespace kvharbor
