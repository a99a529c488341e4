#include "core/calibration/kvtc_calibrate.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/codec/kvtc/kvtc_format.h"
#include "core/codec/kvtc/kvtc_stages.h"

namespace kvharbor {
namespace {

constexpr const char* kKvName[2] = {"keys", "values"};

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status CheckOptions(const KvSamples& s, const CalibrateOptions& o) {
  if (o.row_kind != KvtcRowKind::kPerToken &&
      o.row_kind != KvtcRowKind::kPerPage) {
    return Invalid("options.row_kind", "unknown value");
  }
  if (o.page_size == 0 || o.page_size > kMaxPageSize) {
    return Invalid(
        "options.page_size",
        absl::StrCat(o.page_size, " is out of range [1, ", kMaxPageSize, "]"));
  }
  if (o.group_sizes.empty()) {
    return Invalid("options.group_sizes", "no group size given");
  }
  for (size_t i = 0; i < o.group_sizes.size(); ++i) {
    if (o.group_sizes[i] == 0) {
      return Invalid(absl::StrCat("options.group_sizes[", i, "]"),
                     "must be >= 1");
    }
  }
  if (o.ratios.empty()) return Invalid("options.ratios", "no ratio given");
  for (size_t i = 0; i < o.ratios.size(); ++i) {
    if (!std::isfinite(o.ratios[i]) || o.ratios[i] < 1.0) {
      return Invalid(absl::StrCat("options.ratios[", i, "]"),
                     absl::StrCat(o.ratios[i], " must be finite and >= 1"));
    }
  }
  if (DTypeSize(o.raw_dtype) == 0) {
    return Invalid("options.raw_dtype", "unknown dtype");
  }
  if (o.max_rows < 2) return Invalid("options.max_rows", "must be >= 2");
  if (s.rope_style != RopeStyle::kNone && !s.keys_roped && !o.undo_rope) {
    return Invalid("options.undo_rope",
                   "the samples hold keys with RoPE already removed "
                   "(keys_roped=false), so the codec must undo RoPE too");
  }
  return absl::OkStatus();
}

// Whether rows of keys must be un-rotated here.
bool UnropeHere(const KvSamples& s, const CalibrateOptions& o) {
  return s.rope_style != RopeStyle::kNone && s.keys_roped && o.undo_rope;
}

// Copies one token's K or V for `layer` ([kv_head][head_dim]) into dst,
// un-rotating keys when asked.
void CopyTokenLayer(const KvSamples& s, int kv, uint64_t token, uint32_t layer,
                    bool unrope, float* dst) {
  const uint64_t hd = uint64_t{s.num_kv_heads} * s.head_dim;
  const float* src = (kv == 0 ? s.k : s.v).data() +
                     token * s.FeaturesPerToken() + uint64_t{layer} * hd;
  std::copy(src, src + hd, dst);
  if (!unrope) return;
  std::vector<float> cos(s.head_dim / 2), sin(s.head_dim / 2);
  RopeCosSin(static_cast<uint64_t>(s.positions[token]), s.head_dim,
             s.rope_theta, cos.data(), sin.data());
  for (uint32_t h = 0; h < s.num_kv_heads; ++h) {
    RotateRope(dst + uint64_t{h} * s.head_dim, s.head_dim, s.rope_style,
               cos.data(), sin.data(), /*inverse=*/true);
  }
}

// Variance of every column of Y ([rows][cols], zero-mean by construction).
std::vector<double> ColumnVariances(const std::vector<float>& y, uint64_t rows,
                                    uint64_t cols) {
  std::vector<double> var(cols, 0.0);
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t c = 0; c < cols; ++c) {
      const double v = y[r * cols + c];
      var[c] += v * v;
    }
  }
  for (double& v : var) v /= static_cast<double>(rows);
  return var;
}

// Error per row of each choice for each group, measured by running the
// codec's own quantizers over the coefficients.
std::vector<KvtcGroupErrors> MeasureGroupErrors(const std::vector<float>& y,
                                                uint64_t rows, uint64_t cols,
                                                const std::vector<double>& var,
                                                uint64_t group_size) {
  std::vector<KvtcGroupErrors> out;
  std::vector<float> deq(rows * cols), mins(rows), maxs(rows);
  std::vector<uint8_t> packed;
  for (uint64_t start = 0; start < cols; start += group_size) {
    const uint64_t end = std::min(cols, start + group_size);
    KvtcGroupErrors g;
    g.width = end - start;
    double none = 0;
    for (uint64_t c = start; c < end; ++c) none += var[c];
    auto error = [&]() {
      double e = 0;
      for (uint64_t r = 0; r < rows; ++r) {
        for (uint64_t c = start; c < end; ++c) {
          const double d = double(deq[r * cols + c]) - y[r * cols + c];
          e += d * d;
        }
      }
      return e / static_cast<double>(rows);
    };
    g.error[static_cast<int>(KvtcGroupChoice::kNone)] = none;
    packed.resize(rows * g.width);
    QuantizeFp8Range(y.data(), rows, cols, start, end, packed.data());
    DequantizeFp8Range(packed.data(), rows, cols, start, end, deq.data());
    g.error[static_cast<int>(KvtcGroupChoice::kFp8)] = error();
    MinMaxRange(y.data(), rows, cols, start, end, mins.data(), maxs.data());
    for (int bits : {2, 4}) {
      packed.resize(rows * IntXBytesPerRow(g.width, bits));
      QuantizeIntXRange(y.data(), rows, cols, start, end, bits, mins.data(),
                        maxs.data(), packed.data());
      DequantizeIntXRange(packed.data(), rows, cols, start, end, bits,
                          mins.data(), maxs.data(), deq.data());
      g.error[static_cast<int>(bits == 2 ? KvtcGroupChoice::kInt2
                                         : KvtcGroupChoice::kInt4)] = error();
    }
    out.push_back(g);
  }
  return out;
}

struct FullBasis {
  KvtcBasis basis;  // all components
  // Error tables, one per options.group_sizes entry.
  std::vector<std::vector<KvtcGroupErrors>> groups;
  double total_variance = 0;
};

// How many components any of the ratios could give bits to: int2, the
// cheapest choice, costs at least 2 bits per component and row.
uint64_t UsefulComponents(const CalibrateOptions& o, uint64_t features) {
  double min_ratio = o.ratios.empty() ? 1.0 : o.ratios[0];
  for (double r : o.ratios) min_ratio = std::min(min_ratio, r);
  const double raw = static_cast<double>(features) * 8 * DTypeSize(o.raw_dtype);
  const double budget = std::floor(raw / std::max(min_ratio, 1.0));
  return std::max<uint64_t>(
      1, std::min<uint64_t>(features,
                            static_cast<uint64_t>(std::ceil(budget / 2))));
}

// The basis of `x` from options.pca, or from the CPU PCA (all components).
absl::StatusOr<KvtcBasis> RunPca(
    const std::vector<float>& x, uint64_t rows, uint64_t f,
    const CalibrateOptions& o, int kv,
    const std::function<void(absl::string_view)>& say) {
  const uint64_t max_f =
      o.pca != nullptr ? o.pca->max_features() : kCpuPcaMaxFeatures;
  const std::string engine = o.pca != nullptr ? o.pca->name() : "CPU";
  if (f > max_f) {
    return Invalid("samples", absl::StrFormat("%u features per row; the %s "
                                              "PCA handles at most %u",
                                              f, engine, max_f));
  }
  say(absl::StrFormat("%s: PCA of %u rows x %u features (%s)", kKvName[kv],
                      rows, f, engine));
  if (o.pca == nullptr) return PcaBasis(x, rows, f, f, {});
  KVH_ASSIGN_OR_RETURN(PcaOutcome p,
                       o.pca->Compute(x, rows, f, UsefulComponents(o, f), say));
  const KvtcBasis& b = p.basis;
  if (b.features != f || b.components == 0 || b.components > f ||
      b.mean.size() != f || b.projection.size() != f * b.components) {
    return absl::InternalError(
        absl::StrFormat("%s PCA returned a basis of %u x %u for %u features",
                        engine, b.features, b.components, f));
  }
  return std::move(p.basis);
}

absl::StatusOr<FullBasis> ComputeBasis(
    const KvSamples& s, const CalibrateOptions& o, int kv,
    const std::function<void(absl::string_view)>& say) {
  uint64_t rows = 0, f = 0;
  KVH_ASSIGN_OR_RETURN(std::vector<float> x,
                       BuildCalibrationRows(s, o, kv, &rows, &f));
  if (rows < 2) {
    return Invalid("samples",
                   absl::StrFormat("only %u %s rows remain after leaving out "
                                   "sinks (and partial pages); need >= 2",
                                   rows, kKvName[kv]));
  }
  FullBasis out;
  KVH_ASSIGN_OR_RETURN(out.basis, RunPca(x, rows, f, o, kv, say));
  const uint64_t k = out.basis.components;  // < f from a top-k engine
  // Y = (X - mean) P, in place of a second copy of X.
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t c = 0; c < f; ++c) x[r * f + c] -= out.basis.mean[c];
  }
  say(absl::StrFormat("%s: projecting onto %u components", kKvName[kv], k));
  std::vector<float> y(rows * k);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
              static_cast<int>(k), static_cast<int>(f), 1.0f, x.data(),
              static_cast<int>(f), out.basis.projection.data(),
              static_cast<int>(k), 0.0f, y.data(), static_cast<int>(k));
  const std::vector<double> var = ColumnVariances(y, rows, k);
  // The total includes the variance outside the components kept.
  for (double v : k == f ? var : ColumnVariances(x, rows, f)) {
    out.total_variance += v;
  }
  for (uint64_t gs : o.group_sizes) {
    say(absl::StrFormat(
        "%s: %s errors of %u groups of %u components", kKvName[kv],
        o.measured_errors ? "measuring" : "modelling", (k + gs - 1) / gs, gs));
    if (o.measured_errors) {
      out.groups.push_back(MeasureGroupErrors(y, rows, k, var, gs));
    } else {
      KVH_ASSIGN_OR_RETURN(auto g, ModelGroupErrors(var, gs));
      out.groups.push_back(std::move(g));
    }
  }
  return out;
}

// The least-error allocation over the group sizes (ties: the first size).
absl::Status BestAllocation(const FullBasis& full, const CalibrateOptions& o,
                            const BitAllocationOptions& bo, BitAllocation* best,
                            uint64_t* best_size) {
  for (size_t i = 0; i < o.group_sizes.size(); ++i) {
    KVH_ASSIGN_OR_RETURN(BitAllocation a, AllocateKvtcBits(full.groups[i], bo));
    if (i == 0 || a.expected_error < best->expected_error) {
      *best = std::move(a);
      *best_size = o.group_sizes[i];
    }
  }
  return absl::OkStatus();
}

// The basis cut to the allocation's components (at least 1: a basis with
// no range decodes every row as the mean).
KvtcBasis CutBasis(const KvtcBasis& full, const BitAllocation& a) {
  KvtcBasis b;
  b.features = full.features;
  b.components = std::max<uint64_t>(1, a.components);
  b.mean = full.mean;
  b.projection.resize(b.features * b.components);
  for (uint64_t i = 0; i < b.features; ++i) {
    for (uint64_t c = 0; c < b.components; ++c) {
      b.projection[i * b.components + c] =
          full.projection[i * full.components + c];
    }
  }
  b.ranges = a.ranges;
  return b;
}

std::string DescribeRanges(const std::vector<KvtcRange>& ranges) {
  std::string out;
  for (const KvtcRange& r : ranges) {
    absl::StrAppendFormat(&out, "%s%s[%u,%u)", out.empty() ? "" : " ",
                          r.quant_type == KvtcQuantType::kFp8
                              ? std::string("fp8")
                              : absl::StrCat("int", r.int_bits),
                          r.start_idx, r.end_idx);
  }
  return out.empty() ? "(none)" : out;
}

}  // namespace

absl::StatusOr<std::vector<float>> BuildCalibrationRows(
    const KvSamples& s, const CalibrateOptions& o, int kv, uint64_t* rows,
    uint64_t* features) {
  const bool unrope = kv == 0 && UnropeHere(s, o);
  const uint64_t hd = uint64_t{s.num_kv_heads} * s.head_dim;
  // Row sources: (first token, layer) pairs.
  std::vector<std::pair<uint64_t, uint32_t>> src;
  if (o.row_kind == KvtcRowKind::kPerToken) {
    *features = s.FeaturesPerToken();
    for (uint64_t t = 0; t < s.tokens; ++t) {
      if (s.positions[t] >= static_cast<int64_t>(o.sink_tokens)) {
        src.push_back({t, 0});
      }
    }
  } else {
    *features = hd * o.page_size;
    const int64_t ps = o.page_size;
    for (uint64_t t = 0; t + o.page_size <= s.tokens; ++t) {
      const int64_t p0 = s.positions[t];
      if (p0 % ps != 0 || p0 < static_cast<int64_t>(o.sink_tokens)) continue;
      bool run = true;
      for (uint64_t i = 1; i < o.page_size && run; ++i) {
        run = s.positions[t + i] == p0 + static_cast<int64_t>(i);
      }
      if (!run) continue;
      for (uint32_t l = 0; l < s.num_layers; ++l) src.push_back({t, l});
    }
  }
  // Even subsampling keeps the spread over positions and sequences.
  const uint64_t n = std::min<uint64_t>(src.size(), o.max_rows);
  if (*features > kMaxKvSampleElements / std::max<uint64_t>(n, 1)) {
    return Invalid("options.max_rows", "rows x features is over the limit");
  }
  std::vector<float> x(n * *features);
  for (uint64_t r = 0; r < n; ++r) {
    const auto [t, layer] = src[r * src.size() / n];
    float* dst = x.data() + r * *features;
    if (o.row_kind == KvtcRowKind::kPerToken) {
      for (uint32_t l = 0; l < s.num_layers; ++l) {
        CopyTokenLayer(s, kv, t, l, unrope, dst + uint64_t{l} * hd);
      }
    } else {
      for (uint32_t i = 0; i < o.page_size; ++i) {
        CopyTokenLayer(s, kv, t + i, layer, unrope, dst + uint64_t{i} * hd);
      }
    }
  }
  *rows = n;
  return x;
}

absl::StatusOr<std::vector<CalibrationOutcome>> CalibrateKvtc(
    const KvSamples& samples, const CalibrateOptions& options) {
  KVH_RETURN_IF_ERROR(samples.Validate());
  KVH_RETURN_IF_ERROR(CheckOptions(samples, options));
  const auto t0 = std::chrono::steady_clock::now();
  auto say = [&](absl::string_view what) {
    if (!options.progress) return;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    options.progress(absl::StrFormat("[%7.2fs] %s", s, what));
  };
  auto check_cancelled = [&]() {
    return options.cancelled && options.cancelled()
               ? absl::CancelledError("calibration: cancelled")
               : absl::OkStatus();
  };
  FullBasis full[2];
  for (int kv = 0; kv < 2; ++kv) {
    KVH_RETURN_IF_ERROR(check_cancelled());
    KVH_ASSIGN_OR_RETURN(full[kv], ComputeBasis(samples, options, kv, say));
  }
  std::vector<CalibrationOutcome> out;
  for (double ratio : options.ratios) {
    KVH_RETURN_IF_ERROR(check_cancelled());
    CalibrationOutcome o;
    o.ratio = ratio;
    o.raw_bits_per_row =
        full[0].basis.features * 8 * DTypeSize(options.raw_dtype);
    o.budget_bits_per_row = static_cast<uint64_t>(
        std::floor(static_cast<double>(o.raw_bits_per_row) / ratio));
    say(absl::StrFormat("ratio %gx: allocating %u bits per row", ratio,
                        o.budget_bits_per_row));
    BitAllocationOptions bo;
    bo.budget_bits_per_row = o.budget_bits_per_row;
    bo.merge_intx = options.merge_intx;
    KVH_RETURN_IF_ERROR(
        BestAllocation(full[0], options, bo, &o.keys, &o.keys_group_size));
    KVH_RETURN_IF_ERROR(
        BestAllocation(full[1], options, bo, &o.values, &o.values_group_size));
    o.keys_variance = full[0].total_variance;
    o.values_variance = full[1].total_variance;
    KvtcCalibration& cal = o.calibration;
    cal.row_kind = options.row_kind;
    cal.num_layers = samples.num_layers;
    cal.num_kv_heads = samples.num_kv_heads;
    cal.head_dim = samples.head_dim;
    cal.page_size = options.page_size;
    cal.sink_tokens = options.sink_tokens;
    const bool rope = samples.rope_style != RopeStyle::kNone &&
                      (options.undo_rope || !samples.keys_roped);
    cal.rope_style = rope ? samples.rope_style : RopeStyle::kNone;
    cal.rope_theta = rope ? samples.rope_theta : 0.0f;
    cal.keys = CutBasis(full[0].basis, o.keys);
    cal.values = CutBasis(full[1].basis, o.values);
    KVH_RETURN_IF_ERROR(cal.Validate());
    out.push_back(std::move(o));
  }
  say("done");
  return out;
}

std::string DescribeOutcome(const CalibrationOutcome& o) {
  std::string s =
      absl::StrFormat("ratio %gx: %u of %u raw bits per row (%s rows)\n",
                      o.ratio, o.budget_bits_per_row, o.raw_bits_per_row,
                      KvtcRowKindName(o.calibration.row_kind));
  const BitAllocation* alloc[2] = {&o.keys, &o.values};
  const double variance[2] = {o.keys_variance, o.values_variance};
  const uint64_t group[2] = {o.keys_group_size, o.values_group_size};
  for (int kv = 0; kv < 2; ++kv) {
    const BitAllocation& a = *alloc[kv];
    const double var = variance[kv];
    absl::StrAppendFormat(
        &s,
        "  %-6s %4u bits/row, groups of %u, %u components kept, expected "
        "relative error %.4f: %s\n",
        kKvName[kv], a.used_bits_per_row, group[kv], a.components,
        var > 0 ? std::sqrt(a.expected_error / var) : 0.0,
        DescribeRanges(a.ranges));
  }
  return s;
}

}  // namespace kvharbor
