// calibrate_cpu_bench: KVTC calibration on the CPU at real model sizes
// (issue 17), in two parts.
//
// --mode=big: the whole calibration (keys and values: PCA, error
//   measurement, bit allocation) of --rows rows of --layers x 8 x 128
//   features per token (32 layers: 32768, the Llama-3-8B per-token row), on
//   the CPU PCA's randomized subspace solver (core/calibration/pca_cpu.h).
//   The rows are generated on the fly (GeneratedRows: a decaying spectrum
//   over 4096 latent directions on disjoint features, plus uniform noise),
//   so the input costs no memory and the peak RSS printed is the
//   calibration's own; the stated working set (CpuPcaWorkingBytes) is
//   printed beside it. Exact PCA is not feasible at this size (the
//   covariance alone is 8 GiB of doubles).
// --mode=agree: subspace against exact PCA where exact is feasible (<= 8192
//   features): Gaussian rows with a decaying spectrum over random dense
//   directions, and, with --samples, real KV rows (keys with RoPE undone,
//   per token) of a kv_samples file. Reports time of both, the explained
//   variance of the subspace basis relative to the exact one and the
//   cosines of the principal angles between them (smallest, and mean of the
//   squares) over all k components and over the top k/4.
//
// Both print wall seconds, which on a shared 2-core machine depend on the
// load (printed at start and end).
#include <cblas.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/base/blas_kernel_check.h"
#include "core/calibration/calibration_rows.h"
#include "core/calibration/kv_samples.h"
#include "core/calibration/kvtc_calibrate.h"
#include "core/calibration/pca_cpu.h"

ABSL_FLAG(std::string, mode, "agree", "big | agree");
ABSL_FLAG(uint32_t, layers, 32, "big: layers (x 8 heads x 128 dims)");
ABSL_FLAG(uint64_t, rows, 65536, "big: sample tokens (rows per basis)");
ABSL_FLAG(std::string, ratios, "16", "big: target ratios");
ABSL_FLAG(uint64_t, components, 0, "big: components (0: the default)");
ABSL_FLAG(uint32_t, iterations, 2, "subspace power passes");
ABSL_FLAG(std::string, agree_features, "1024,4096,8192",
          "agree: feature counts of the synthetic rows");
ABSL_FLAG(uint64_t, agree_rows, 16384, "agree: synthetic rows");
ABSL_FLAG(uint64_t, agree_components, 256, "agree: components compared");
ABSL_FLAG(std::string, samples, "", "agree: a kv_samples file (real KV)");

extern "C" void dsyev_(const char* jobz, const char* uplo, const int* n,
                       double* a, const int* lda, double* w, double* work,
                       const int* lwork, int* info, size_t, size_t);

namespace kvharbor {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double PeakRssMiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

std::string Load() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

void Die(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, std::string(s.message()).c_str());
  std::exit(1);
}

uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1) from a counter.
float Uniform(uint64_t counter) {
  return static_cast<float>(Mix(counter) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// Rows generated from their index: latent direction j (of `latent`) covers
// features j, j + latent, ... with random signs; row r's coordinate on it is
// s_j * (sum of two uniforms), s_j = 1 / (1 + j / 16); plus uniform noise
// of amplitude 0.02 on every feature. Deterministic in (seed, r, feature).
class GeneratedRows final : public CalibrationRows {
 public:
  GeneratedRows(uint64_t rows, uint64_t features, uint64_t latent,
                uint64_t seed)
      : rows_(rows), features_(features), latent_(latent), seed_(seed) {
    sign_.resize(features);
    mean_.resize(features);
    const float norm = 1.0f / std::sqrt(float(features) / float(latent));
    for (uint64_t i = 0; i < features; ++i) {
      sign_[i] = (Mix(seed * 7919 + i) & 1 ? 1.0f : -1.0f) * norm;
      mean_[i] = 0.5f * Uniform(seed * 104729 + i);
    }
  }
  uint64_t rows() const override { return rows_; }
  uint64_t features() const override { return features_; }
  void Read(uint64_t first, uint64_t count, uint64_t col_begin,
            uint64_t col_end, float* out) const override {
    const uint64_t w = col_end - col_begin;
    std::vector<float> a(latent_);
    for (uint64_t r = 0; r < count; ++r) {
      const uint64_t row = first + r;
      const uint64_t base = (seed_ << 48) ^ (row * 0x9E3779B97F4A7C15ull);
      for (uint64_t j = 0; j < latent_; ++j) {
        a[j] = (Uniform(base + 2 * j) + Uniform(base + 2 * j + 1)) /
               (1.0f + j / 16.0f);
      }
      float* dst = out + r * w;
      const uint64_t nb = base ^ 0xD1B54A32D192ED03ull;
      for (uint64_t i = col_begin; i < col_end; ++i) {
        dst[i - col_begin] =
            mean_[i] + a[i % latent_] * sign_[i] + 0.02f * Uniform(nb + i);
      }
    }
  }

 private:
  uint64_t rows_, features_, latent_, seed_;
  std::vector<float> sign_, mean_;
};

// OpenBLAS's kernels, and the warning when they are its generic ones on a
// CPU with AVX2 or AVX-512 (core/base/blas_kernel_check.h): they set the
// seconds below.
void PrintBlasKernels() {
  const BlasKernelFacts f = DetectBlasKernels();
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  absl::PrintF("openblas kernels: %s (OPENBLAS_CORETYPE %s)\n",
               f.library_core.empty() ? "not OpenBLAS" : f.library_core,
               coretype != nullptr ? coretype : "unset");
  if (const std::string w = BlasKernelWarning(f); !w.empty()) {
    absl::PrintF("warning: %s\n", w);
  }
}

std::vector<double> ParseDoubles(const std::string& s) {
  std::vector<double> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    double d;
    if (absl::SimpleAtod(p, &d)) out.push_back(d);
  }
  return out;
}

void Big() {
  const uint32_t layers = absl::GetFlag(FLAGS_layers);
  const uint64_t rows = absl::GetFlag(FLAGS_rows);
  const uint64_t f = uint64_t{layers} * 8 * 128;
  CalibrateOptions o;
  o.ratios = ParseDoubles(absl::GetFlag(FLAGS_ratios));
  o.components = absl::GetFlag(FLAGS_components);
  o.cpu.solver = CpuPcaSolver::kSubspace;
  o.cpu.iterations = absl::GetFlag(FLAGS_iterations);
  o.progress = [](absl::string_view line) {
    std::fprintf(stderr, "  %s (peak RSS %.0f MiB)\n",
                 std::string(line).c_str(), PeakRssMiB());
  };
  const GeneratedRows keys(rows, f, 4096, 1), values(rows, f, 4096, 2);
  CalibrationRowsInput in;
  in.keys = &keys;
  in.values = &values;
  in.num_layers = layers;
  in.num_kv_heads = 8;
  in.head_dim = 128;
  in.sink_tokens_per_page = 16.0 * 4 / 4096;  // 4 sinks per 4096 tokens
  PcaRequest req;
  req.useful_components = f;
  req.components = o.components;
  const uint64_t k = CpuPcaComponents(CpuPcaSolver::kSubspace, f, req);
  absl::PrintF(
      "calibrate_cpu_bench big: %u rows x %u features (%u layers x 8 x 128) "
      "per basis, keys and values, subspace PCA of %u components, %u power "
      "passes, openblas threads %d\n",
      rows, f, layers, k, o.cpu.iterations, openblas_get_num_threads());
  absl::PrintF("load average at start: %s\n", Load().c_str());
  PrintBlasKernels();
  absl::PrintF(
      "stated PCA working set: %.0f MiB; error coefficients <= %.0f "
      "MiB\n",
      CpuPcaWorkingBytes(CpuPcaSolver::kSubspace, f, k, o.cpu) / 1048576.0,
      kErrorRowsBytes / 1048576.0);
  std::fflush(stdout);
  const auto t0 = Clock::now();
  auto out = CalibrateKvtcRows(in, o);
  Die(out.status(), "calibrate");
  const double secs = Since(t0);
  for (const CalibrationOutcome& c : *out) {
    absl::PrintF("%s", DescribeOutcome(c).c_str());
  }
  absl::PrintF("total %.1f s (%.1f min), peak RSS %.0f MiB (%.2f GiB)\n", secs,
               secs / 60, PeakRssMiB(), PeakRssMiB() / 1024);
  absl::PrintF("load average at end: %s\n", Load().c_str());
}

// Variance of rows along each basis column, summed.
double Explained(const CalibrationRows& x, const KvtcBasis& b) {
  const uint64_t n = x.rows(), f = b.features, k = b.components;
  const uint64_t chunk = 512;
  std::vector<float> buf(chunk * f), y(chunk * k);
  std::vector<double> s(k, 0.0), s2(k, 0.0);
  for (uint64_t r0 = 0; r0 < n; r0 += chunk) {
    const uint64_t m = std::min(chunk, n - r0);
    x.ReadRows(r0, m, buf.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(k),
                int(f), 1.0f, buf.data(), int(f), b.projection.data(), int(k),
                0.0f, y.data(), int(k));
    for (uint64_t r = 0; r < m; ++r) {
      for (uint64_t c = 0; c < k; ++c) {
        s[c] += y[r * k + c];
        s2[c] += double(y[r * k + c]) * y[r * k + c];
      }
    }
  }
  double total = 0;
  for (uint64_t c = 0; c < k; ++c) total += s2[c] / n - (s[c] / n) * (s[c] / n);
  return total;
}

// Cosines of the principal angles between the first `k` columns of a and
// b: the singular values of A_k^T B_k. Returns (smallest, mean square).
std::pair<double, double> Angles(const KvtcBasis& a, const KvtcBasis& b,
                                 uint64_t k) {
  const uint64_t f = a.features;
  std::vector<double> m(k * k, 0.0);
  for (uint64_t i = 0; i < f; ++i) {
    for (uint64_t p = 0; p < k; ++p) {
      const double ap = a.projection[i * a.components + p];
      for (uint64_t q = 0; q < k; ++q) {
        m[p * k + q] += ap * b.projection[i * b.components + q];
      }
    }
  }
  std::vector<double> mtm(k * k, 0.0), w(k);
  for (uint64_t p = 0; p < k; ++p) {
    for (uint64_t q = 0; q < k; ++q) {
      double d = 0;
      for (uint64_t r = 0; r < k; ++r) d += m[r * k + p] * m[r * k + q];
      mtm[p * k + q] = d;
    }
  }
  const int n = int(k);
  int info = 0, lwork = -1;
  double ws = 0;
  dsyev_("N", "L", &n, mtm.data(), &n, w.data(), &ws, &lwork, &info, 1, 1);
  lwork = std::max(1, int(ws));
  std::vector<double> work(lwork);
  dsyev_("N", "L", &n, mtm.data(), &n, w.data(), work.data(), &lwork, &info, 1,
         1);
  double mean = 0;
  for (double v : w) mean += std::min(1.0, std::max(0.0, v));
  return {std::sqrt(std::max(0.0, std::min(1.0, w[0]))), mean / k};
}

void Compare(const std::string& label, const CalibrationRows& x, uint64_t k,
             uint32_t iterations) {
  PcaRequest req;
  req.components = std::min(k, x.features());
  k = req.components;
  CpuPcaOptions eo;
  eo.solver = CpuPcaSolver::kExact;
  auto t0 = Clock::now();
  auto exact = CpuCalibrationPca(eo).Compute(x, req);
  Die(exact.status(), "exact PCA");
  const double te = Since(t0);
  CpuPcaOptions so;
  so.solver = CpuPcaSolver::kSubspace;
  so.iterations = iterations;
  t0 = Clock::now();
  auto sub = CpuCalibrationPca(so).Compute(x, req);
  Die(sub.status(), "subspace PCA");
  const double ts = Since(t0);
  const double ee = Explained(x, exact->basis);
  const double es = Explained(x, sub->basis);
  const auto all = Angles(exact->basis, sub->basis, k);
  const auto top =
      Angles(exact->basis, sub->basis, std::max<uint64_t>(1, k / 4));
  absl::PrintF(
      "| %s | %u | %u | %u | %.1f | %.1f | %.5f | %.4f | %.4f | %.5f | %.5f "
      "|\n",
      label.c_str(), x.rows(), x.features(), k, te, ts, es / ee, all.first,
      all.second, top.first, top.second);
  std::fflush(stdout);
}

void Agree() {
  const uint64_t k = absl::GetFlag(FLAGS_agree_components);
  const uint64_t rows = absl::GetFlag(FLAGS_agree_rows);
  const uint32_t it = absl::GetFlag(FLAGS_iterations);
  absl::PrintF(
      "calibrate_cpu_bench agree: exact (dsyevr) vs subspace (%u "
      "power passes, 64 oversample), openblas threads %d\n",
      it, openblas_get_num_threads());
  absl::PrintF("load average at start: %s\n", Load().c_str());
  PrintBlasKernels();
  absl::PrintF("\n");
  absl::PrintF(
      "| rows | n | features | k | exact s | subspace s | explained "
      "(sub/exact) | min cos (k) | mean cos^2 (k) | min cos (k/4) | "
      "mean cos^2 (k/4) |\n|---|---:|---:|---:|---:|---:|---:|---:|"
      "---:|---:|---:|\n");
  std::fflush(stdout);
  for (double fd : ParseDoubles(absl::GetFlag(FLAGS_agree_features))) {
    const uint64_t f = static_cast<uint64_t>(fd);
    const uint64_t latent = std::min<uint64_t>(f, 1024);
    // X = Z diag(s) U^T + noise: U random orthonormal [f][latent].
    std::mt19937_64 rng(f);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> u(f * latent), z(rows * latent), x(rows * f);
    for (float& v : u) v = n01(rng);
    for (uint64_t r = 0; r < rows; ++r) {
      for (uint64_t j = 0; j < latent; ++j) {
        z[r * latent + j] = n01(rng) / (1.0f + j / 8.0f) / std::sqrt(float(f));
      }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(f),
                int(latent), 1.0f, z.data(), int(latent), u.data(), int(latent),
                0.0f, x.data(), int(f));
    for (float& v : x) v += 0.01f * n01(rng);
    Compare("synthetic", MemoryRows(x, rows, f), k, it);
  }
  const std::string path = absl::GetFlag(FLAGS_samples);
  if (path.empty()) return;
  auto s = ReadKvSamples(path);
  Die(s.status(), "--samples");
  SampleRowSpec spec;
  spec.unrope = true;
  for (int kv = 0; kv < 2; ++kv) {
    auto rows_kv = KvSampleRows::Create(*s, spec, kv);
    Die(rows_kv.status(), "rows");
    Compare(kv == 0 ? "real keys" : "real values", *rows_kv, k, it);
  }
  absl::PrintF("\nload average at end: %s\n", Load().c_str());
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "big") {
    kvharbor::Big();
  } else if (mode == "agree") {
    kvharbor::Agree();
  } else {
    std::fprintf(stderr, "--mode: '%s' is not big or agree\n", mode.c_str());
    return 2;
  }
  return 0;
}
