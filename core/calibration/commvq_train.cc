#include "core/calibration/commvq_train.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/codec/kvtc/kvtc_stages.h"

namespace kvharbor {
namespace {

double SquaredNorm(const float* v, uint32_t n) {
  double s = 0.0;
  for (uint32_t i = 0; i < n; ++i) s += double{v[i]} * v[i];
  return s;
}

// Solves S X = B for symmetric positive definite S (m x m, row-major) and
// `nrhs` right-hand sides stored as rows of B ([nrhs][m]). Returns false
// when S is not positive definite (B is then unchanged).
bool CholeskySolve(std::vector<double> s, int m, double* b, int nrhs) {
  for (int j = 0; j < m; ++j) {
    double d = s[j * m + j];
    for (int k = 0; k < j; ++k) d -= s[j * m + k] * s[j * m + k];
    if (!(d > 0.0)) return false;
    d = std::sqrt(d);
    s[j * m + j] = d;
    for (int i = j + 1; i < m; ++i) {
      double v = s[i * m + j];
      for (int k = 0; k < j; ++k) v -= s[i * m + k] * s[j * m + k];
      s[i * m + j] = v / d;
    }
  }
  for (int r = 0; r < nrhs; ++r) {
    double* x = b + static_cast<size_t>(r) * m;
    for (int i = 0; i < m; ++i) {  // L y = b
      double v = x[i];
      for (int k = 0; k < i; ++k) v -= s[i * m + k] * x[k];
      x[i] = v / s[i * m + i];
    }
    for (int i = m - 1; i >= 0; --i) {  // L^T x = y
      double v = x[i];
      for (int k = i + 1; k < m; ++k) v -= s[k * m + i] * x[k];
      x[i] = v / s[i * m + i];
    }
  }
  return true;
}

// Everything one key stage's training needs.
struct KeyStage {
  CommVqCodebooks* cb;
  uint32_t layer;
  uint32_t stage;
  float* resid;  // [n][dim], updated at the end
  uint64_t n;
  const CommVqTrainOptions* opt;
};

// Soft-assignment statistics of one group: summed weights of every centre
// and, per pair of the group, the right-hand side of the normal equations.
struct EmStats {
  std::vector<double> wsum;  // [a][b]
  std::vector<double> rhs;   // [pair in group][x_0, y_0, x_1, ...]
};

// E-step for group q at temperature `temp`: fills `st` and returns the
// hard-assignment error of the current codebook.
double EStep(const KeyStage& ks, uint32_t q, float temp, EmStats* st) {
  const CommVqConfig& c = ks.cb->config;
  const uint32_t nl = c.key_levels, g = c.key_group_pairs, dim = c.dim();
  std::vector<float> na(nl), m2(size_t{nl} * nl), scratch(2 * nl), w(nl * nl),
      row(dim);
  std::vector<double> u(nl), v(nl);
  st->wsum.assign(size_t{nl} * nl, 0.0);
  st->rhs.assign(size_t{g} * 2 * nl, 0.0);
  CommVqKeyGroupTables(*ks.cb, ks.layer, ks.stage, q, na.data(), m2.data());
  double hard = 0.0;
  for (uint64_t s = 0; s < ks.n; ++s) {
    const float* r = ks.resid + s * dim;
    std::memcpy(row.data(), r, sizeof(float) * dim);
    uint16_t a, b;
    const float best =
        CommVqPickKeyCode(*ks.cb, ks.layer, ks.stage, q, na.data(), m2.data(),
                          row.data(), scratch.data(), &a, &b);
    double group_norm = 0.0;
    for (uint32_t j = q * g; j < (q + 1) * g; ++j) {
      uint32_t e0, e1;
      c.PairElements(j, &e0, &e1);
      group_norm += double{r[e0]} * r[e0] + double{r[e1]} * r[e1];
    }
    hard += group_norm + best;
    // Soft assignment; scratch holds Na - 2P and Na - 2Q (see commvq.h).
    double z = 0.0;
    for (uint32_t x = 0; x < nl; ++x) {
      for (uint32_t y = 0; y < nl; ++y) {
        const float score = (scratch[x] + scratch[nl + y]) + m2[x * nl + y];
        w[x * nl + y] = std::exp(-(score - best) / temp);
        z += w[x * nl + y];
      }
    }
    std::fill(u.begin(), u.end(), 0.0);
    std::fill(v.begin(), v.end(), 0.0);
    for (uint32_t x = 0; x < nl; ++x) {
      for (uint32_t y = 0; y < nl; ++y) {
        const double p = w[x * nl + y] / z;
        st->wsum[x * nl + y] += p;
        u[x] += p;
        v[y] += p;
      }
    }
    for (uint32_t j = 0; j < g; ++j) {
      uint32_t e0, e1;
      c.PairElements(q * g + j, &e0, &e1);
      const double r0 = r[e0], r1 = r[e1];
      double* h = st->rhs.data() + size_t{j} * 2 * nl;
      for (uint32_t l = 0; l < nl; ++l) {
        h[2 * l] += u[l] * r0 + v[l] * r1;
        h[2 * l + 1] += u[l] * r1 - v[l] * r0;
      }
    }
  }
  return hard;
}

// M-step for group q: A phi_j = rhs_j with A = sum_ab wsum[ab] T_ab^T T_ab
// (T_ab maps phi to the centre (x_a - y_b, y_a + x_b)), plus the ridge.
void MStep(const KeyStage& ks, uint32_t q, EmStats* st) {
  const CommVqConfig& c = ks.cb->config;
  const uint32_t nl = c.key_levels, g = c.key_group_pairs;
  const int m = static_cast<int>(2 * nl);
  std::vector<double> a(static_cast<size_t>(m) * m, 0.0);
  auto add = [&](int i, int k, double x) { a[i * m + k] += x; };
  for (uint32_t x = 0; x < nl; ++x) {
    for (uint32_t y = 0; y < nl; ++y) {
      const double ww = st->wsum[x * nl + y];
      const int xa = 2 * x, ya = 2 * x + 1, xb = 2 * y, yb = 2 * y + 1;
      add(xa, xa, ww), add(yb, yb, ww), add(xa, yb, -ww), add(yb, xa, -ww);
      add(ya, ya, ww), add(xb, xb, ww), add(ya, xb, ww), add(xb, ya, ww);
    }
  }
  double trace = 0.0;
  for (int i = 0; i < m; ++i) trace += a[i * m + i];
  const double lambda = ks.opt->key_ridge * trace / m + 1e-12;
  for (int i = 0; i < m; ++i) a[i * m + i] += lambda;
  for (uint32_t j = 0; j < g; ++j) {
    const float* xy = ks.cb->key_at(ks.layer, ks.stage, q * g + j);
    for (int i = 0; i < m; ++i) st->rhs[size_t{j} * m + i] += lambda * xy[i];
  }
  if (!CholeskySolve(std::move(a), m, st->rhs.data(), static_cast<int>(g))) {
    return;  // keep the previous codebook
  }
  for (uint32_t j = 0; j < g; ++j) {
    float* xy =
        const_cast<float*>(ks.cb->key_at(ks.layer, ks.stage, q * g + j));
    for (int i = 0; i < m; ++i) {
      xy[i] = static_cast<float>(st->rhs[size_t{j} * m + i]);
    }
  }
}

void TrainKeyStage(const KeyStage& ks, std::mt19937_64* rng,
                   std::vector<double>* em_mse, double* stage_mse) {
  const CommVqConfig& c = ks.cb->config;
  const uint32_t nl = c.key_levels, g = c.key_group_pairs, dim = c.dim();
  std::vector<double> energy(c.key_groups(), 0.0);
  // Initial levels: half of a random sample's pair values.
  for (uint32_t q = 0; q < c.key_groups(); ++q) {
    for (uint32_t l = 0; l < nl; ++l) {
      const float* r = ks.resid + ((*rng)() % ks.n) * dim;
      for (uint32_t j = q * g; j < (q + 1) * g; ++j) {
        uint32_t e0, e1;
        c.PairElements(j, &e0, &e1);
        float* xy = const_cast<float*>(ks.cb->key_at(ks.layer, ks.stage, j));
        xy[2 * l] = 0.5f * r[e0];
        xy[2 * l + 1] = 0.5f * r[e1];
      }
    }
    for (uint64_t s = 0; s < ks.n; ++s) {
      const float* r = ks.resid + s * dim;
      for (uint32_t j = q * g; j < (q + 1) * g; ++j) {
        uint32_t e0, e1;
        c.PairElements(j, &e0, &e1);
        energy[q] += double{r[e0]} * r[e0] + double{r[e1]} * r[e1];
      }
    }
    energy[q] = std::max(energy[q] / ks.n, 1e-30);
  }
  const uint32_t iters = ks.opt->key_iterations;
  const double t0 = ks.opt->key_temperature_start;
  const double t1 = ks.opt->key_temperature_end;
  for (uint32_t t = 0; t < iters; ++t) {
    const double frac = iters > 1 ? double(t) / (iters - 1) : 1.0;
    const double tau = t0 * std::pow(t1 / t0, frac);
    double hard = 0.0;
    for (uint32_t q = 0; q < c.key_groups(); ++q) {
      EmStats st;
      hard += EStep(ks, q, static_cast<float>(tau * energy[q]), &st);
      MStep(ks, q, &st);
    }
    em_mse->push_back(hard / (double(ks.n) * dim));
  }
  // Final hard assignment with the encoder's scoring.
  std::vector<float> na(nl), m2(size_t{nl} * nl), scratch(2 * nl);
  double err = 0.0;
  for (uint32_t q = 0; q < c.key_groups(); ++q) {
    CommVqKeyGroupTables(*ks.cb, ks.layer, ks.stage, q, na.data(), m2.data());
    for (uint64_t s = 0; s < ks.n; ++s) {
      uint16_t a, b;
      CommVqPickKeyCode(*ks.cb, ks.layer, ks.stage, q, na.data(), m2.data(),
                        ks.resid + s * dim, scratch.data(), &a, &b);
    }
  }
  for (uint64_t s = 0; s < ks.n; ++s)
    err += SquaredNorm(ks.resid + s * dim, dim);
  *stage_mse = err / (double(ks.n) * dim);
  em_mse->push_back(*stage_mse);
}

// k-means++ seeding with the zero centroid already present.
void SeedValueStage(const float* resid, uint64_t n, uint32_t dim, uint32_t k,
                    float* rows, std::mt19937_64* rng) {
  std::vector<double> dist(n);
  for (uint64_t s = 0; s < n; ++s) dist[s] = SquaredNorm(resid + s * dim, dim);
  for (uint32_t i = 0; i < k; ++i) {
    double total = 0.0;
    for (double d : dist) total += d;
    uint64_t pick = (*rng)() % n;
    if (total > 0.0) {
      double target = std::uniform_real_distribution<double>(0.0, total)(*rng);
      for (uint64_t s = 0; s < n; ++s) {
        target -= dist[s];
        if (target <= 0.0) {
          pick = s;
          break;
        }
      }
    }
    float* c = rows + uint64_t{i} * dim;
    std::memcpy(c, resid + pick * dim, sizeof(float) * dim);
    for (uint64_t s = 0; s < n; ++s) {
      double d = 0.0;
      for (uint32_t e = 0; e < dim; ++e) {
        const double x = double{resid[s * dim + e]} - c[e];
        d += x * x;
      }
      dist[s] = std::min(dist[s], d);
    }
  }
}

void TrainValueStage(CommVqCodebooks* cb, uint32_t layer, uint32_t stage,
                     float* resid, uint64_t n, uint32_t iterations,
                     std::mt19937_64* rng, std::vector<double>* kmeans_mse,
                     double* stage_mse) {
  const CommVqConfig& c = cb->config;
  const uint32_t k = c.value_stage_rows, dim = c.dim();
  float* rows = const_cast<float*>(cb->value_at(layer, stage * k));
  SeedValueStage(resid, n, dim, k, rows, rng);
  std::vector<float> norms(k), row(dim);
  std::vector<double> sums(uint64_t{k} * dim);
  std::vector<uint64_t> counts(k);
  auto compute_norms = [&] {
    for (uint32_t i = 0; i < k; ++i) {
      float s = 0.0f;
      for (uint32_t e = 0; e < dim; ++e)
        s += rows[i * dim + e] * rows[i * dim + e];
      norms[i] = s;
    }
  };
  for (uint32_t it = 0; it <= iterations; ++it) {
    compute_norms();
    std::fill(sums.begin(), sums.end(), 0.0);
    std::fill(counts.begin(), counts.end(), 0);
    double err = 0.0;
    for (uint64_t s = 0; s < n; ++s) {
      const float* r = resid + s * dim;
      std::memcpy(row.data(), r, sizeof(float) * dim);
      const int64_t pick =
          CommVqPickValueRow(rows, norms.data(), k, dim, row.data());
      err += SquaredNorm(row.data(), dim);
      if (pick < 0) continue;
      ++counts[pick];
      for (uint32_t e = 0; e < dim; ++e) sums[pick * dim + e] += r[e];
    }
    kmeans_mse->push_back(err / (double(n) * dim));
    if (it == iterations) break;
    for (uint32_t i = 0; i < k; ++i) {
      if (counts[i] == 0) continue;  // unused: stays where it is
      for (uint32_t e = 0; e < dim; ++e) {
        rows[i * dim + e] = static_cast<float>(sums[i * dim + e] / counts[i]);
      }
    }
  }
  compute_norms();
  double err = 0.0;
  for (uint64_t s = 0; s < n; ++s) {
    CommVqPickValueRow(rows, norms.data(), k, dim, resid + s * dim);
    err += SquaredNorm(resid + s * dim, dim);
  }
  *stage_mse = err / (double(n) * dim);
}

}  // namespace

absl::StatusOr<CommVqCodebooks> TrainCommVqCodebooks(
    const CommVqConfig& config, absl::Span<const float> keys,
    absl::Span<const float> values, uint64_t samples,
    const CommVqTrainOptions& options, CommVqTrainReport* report) {
  KVH_RETURN_IF_ERROR(config.Validate());
  const uint64_t dim = config.dim();
  const uint64_t want = uint64_t{config.num_layers} * samples * dim;
  if (samples == 0 || samples > (uint64_t{1} << 40) / dim / config.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("samples: %u is out of range", samples));
  }
  if (keys.size() != want || values.size() != want) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "keys / values: %u and %u floats, want layers * samples * dim = %u",
        keys.size(), values.size(), want));
  }
  if (options.key_iterations == 0 || !(options.key_temperature_start > 0) ||
      !(options.key_temperature_end > 0) || !(options.key_ridge >= 0)) {
    return absl::InvalidArgumentError(
        "options: key_iterations must be >= 1, temperatures > 0, ridge >= 0");
  }
  for (float x : keys) {
    if (!std::isfinite(x))
      return absl::InvalidArgumentError("keys: non-finite value");
  }
  for (float x : values) {
    if (!std::isfinite(x))
      return absl::InvalidArgumentError("values: non-finite value");
  }
  CommVqCodebooks cb;
  cb.config = config;
  cb.key.assign(config.key_floats(), 0.0f);
  cb.value.assign(config.value_floats(), 0.0f);
  CommVqTrainReport local;
  CommVqTrainReport* rep = report != nullptr ? report : &local;
  *rep = CommVqTrainReport();
  std::mt19937_64 rng(options.seed);
  const uint64_t per_layer = samples * dim;
  std::vector<float> resid(per_layer);
  for (uint32_t l = 0; l < config.num_layers; ++l) {
    std::memcpy(resid.data(), keys.data() + l * per_layer, per_layer * 4);
    double e = 0.0;
    for (float x : resid) e += double{x} * x;
    rep->key_energy.push_back(e / per_layer);
    rep->key_stage_mse.emplace_back();
    rep->key_em_mse.emplace_back();
    for (uint32_t s = 0; s < config.key_stages; ++s) {
      const KeyStage ks{&cb, l, s, resid.data(), samples, &options};
      rep->key_em_mse.back().emplace_back();
      double mse = 0.0;
      TrainKeyStage(ks, &rng, &rep->key_em_mse.back().back(), &mse);
      rep->key_stage_mse.back().push_back(mse);
    }
    std::memcpy(resid.data(), values.data() + l * per_layer, per_layer * 4);
    e = 0.0;
    for (float x : resid) e += double{x} * x;
    rep->value_energy.push_back(e / per_layer);
    rep->value_stage_mse.emplace_back();
    rep->value_kmeans_mse.emplace_back();
    for (uint32_t m = 0; m < config.value_stages; ++m) {
      rep->value_kmeans_mse.back().emplace_back();
      double mse = 0.0;
      TrainValueStage(&cb, l, m, resid.data(), samples,
                      options.value_iterations, &rng,
                      &rep->value_kmeans_mse.back().back(), &mse);
      rep->value_stage_mse.back().push_back(mse);
    }
  }
  KVH_RETURN_IF_ERROR(cb.Validate());
  return cb;
}

void RemoveRope(const CommVqConfig& config, float* keys,
                const uint64_t* positions, uint64_t n) {
  if (config.rope_style == RopeStyle::kNone) return;
  const uint32_t hd = config.head_dim;
  std::vector<float> cos(hd / 2), sin(hd / 2);
  for (uint64_t s = 0; s < n; ++s) {
    RopeCosSin(positions[s], hd, config.rope_theta, cos.data(), sin.data());
    for (uint32_t h = 0; h < config.num_kv_heads; ++h) {
      RotateRope(keys + s * config.dim() + uint64_t{h} * hd, hd,
                 config.rope_style, cos.data(), sin.data(), true);
    }
  }
}

}  // namespace kvharbor
