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
#include "core/calibration/calibration_rows.h"
#include "core/codec/kvtc/kvtc_format.h"
#include "core/codec/kvtc/kvtc_stages.h"

namespace kvharbor {
namespace {

constexpr const char* kKvName[2] = {"keys", "values"};

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status CheckOptions(uint32_t num_layers, const CalibrateOptions& o) {
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
  if (o.pages_per_buffer == 0) {
    return Invalid("options.pages_per_buffer", "must be >= 1");
  }
  if (o.layer_groups == 0 || num_layers % o.layer_groups != 0) {
    return Invalid("options.layer_groups",
                   absl::StrFormat("%u must be >= 1 and divide the samples' "
                                   "%u layers",
                                   o.layer_groups, num_layers));
  }
  if (o.layer_groups > 1 && o.row_kind != KvtcRowKind::kPerToken) {
    return Invalid("options.layer_groups",
                   "groups of layers need per_token rows (a per_page row "
                   "holds one layer)");
  }
  return absl::OkStatus();
}

// Whether rows of keys must be un-rotated here.
bool UnropeHere(const KvSamples& s, const CalibrateOptions& o) {
  return s.rope_style != RopeStyle::kNone && s.keys_roped && o.undo_rope;
}

// Mean square of every column of Y ([rows][cols]): its variance on the fitted
// rows (zero-mean by construction), its energy on held-out ones.
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

// Errors per row of each choice for the groups of `group_size` columns in
// [begin, end) of Y ([rows][ld]), measured by running the codec's own
// quantizers over the coefficients (one group's columns at a time).
std::vector<KvtcGroupErrors> MeasureGroupErrors(const std::vector<float>& y,
                                                uint64_t rows, uint64_t ld,
                                                const std::vector<double>& var,
                                                uint64_t begin, uint64_t end,
                                                uint64_t group_size) {
  std::vector<KvtcGroupErrors> out;
  std::vector<float> g_in, deq, mins(rows), maxs(rows);
  std::vector<uint8_t> packed;
  for (uint64_t start = begin; start < end; start += group_size) {
    KvtcGroupErrors g;
    g.width = std::min(end, start + group_size) - start;
    const uint64_t w = g.width;
    g_in.resize(rows * w);
    deq.resize(rows * w);
    for (uint64_t r = 0; r < rows; ++r) {
      std::copy(y.data() + r * ld + start, y.data() + r * ld + start + w,
                g_in.data() + r * w);
    }
    double none = 0;
    for (uint64_t c = start; c < start + w; ++c) none += var[c];
    auto error = [&]() {
      double e = 0;
      for (uint64_t i = 0; i < rows * w; ++i) {
        const double d = double(deq[i]) - g_in[i];
        e += d * d;
      }
      return e / static_cast<double>(rows);
    };
    g.error[static_cast<int>(KvtcGroupChoice::kNone)] = none;
    packed.resize(rows * w);
    QuantizeFp8Range(g_in.data(), rows, w, 0, w, packed.data());
    DequantizeFp8Range(packed.data(), rows, w, 0, w, deq.data());
    g.error[static_cast<int>(KvtcGroupChoice::kFp8)] = error();
    MinMaxRange(g_in.data(), rows, w, 0, w, mins.data(), maxs.data());
    for (int bits : {2, 4}) {
      packed.resize(rows * IntXBytesPerRow(w, bits));
      QuantizeIntXRange(g_in.data(), rows, w, 0, w, bits, mins.data(),
                        maxs.data(), packed.data());
      DequantizeIntXRange(packed.data(), rows, w, 0, w, bits, mins.data(),
                          maxs.data(), deq.data());
      g.error[static_cast<int>(bits == 2 ? KvtcGroupChoice::kInt2
                                         : KvtcGroupChoice::kInt4)] = error();
    }
    out.push_back(g);
  }
  return out;
}

// Diagonal blocks of a basis as (features, components); one for a dense one.
std::vector<KvtcBlock> BlocksOf(const KvtcBasis& b) {
  if (!b.blocks.empty()) return b.blocks;
  return {KvtcBlock{b.features, b.components}};
}

// The errors of every quantization choice for every group of components
// (per options.group_sizes entry, over all blocks), measured on one set of
// rows, and the squared norm per row those rows keep outside the computed
// components (what no allocation can recover).
struct GroupErrorTable {
  std::vector<std::vector<KvtcGroupErrors>> groups;
  double total_variance = 0;  // sum ||x - mean||^2 / rows
  double outside = 0;         // total_variance - the components' share
  uint64_t rows = 0;          // rows measured
};

struct FullBasis {
  KvtcBasis basis;  // every computed component (blocks with layer_groups)
  // The bit allocation's input: errors on the rows the basis was fitted to.
  GroupErrorTable fit;
  // The calibration's expectation: errors on rows held out of the fit
  // (SplitHeldOut), so that a basis that only fits its samples shows it.
  GroupErrorTable held_out;
  // Per options.group_sizes entry: the block each group belongs to.
  std::vector<std::vector<uint32_t>> group_block;
  double total_variance = 0;  // fit.total_variance
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

// The basis of one block of rows from the engine, checked.
absl::StatusOr<KvtcBasis> RunPca(const CalibrationPca& engine,
                                 const CalibrationRows& x,
                                 const PcaRequest& req) {
  const uint64_t f = x.features();
  KVH_ASSIGN_OR_RETURN(PcaOutcome p, engine.Compute(x, req));
  const KvtcBasis& b = p.basis;
  const uint64_t most = req.components > 0 ? req.components : f;
  if (b.features != f || b.components == 0 || b.components > most ||
      b.mean.size() != f || b.projection.size() != f * b.components ||
      !b.blocks.empty()) {
    return absl::InternalError(
        absl::StrFormat("%s PCA returned a basis of %u x %u for %u features",
                        engine.name(), b.features, b.components, f));
  }
  return std::move(p.basis);
}

// The PCA of every block of `x` (layer_groups blocks of equal width).
absl::StatusOr<KvtcBasis> BlockPca(
    const CalibrationPca& engine, const CalibrationRows& x,
    const CalibrateOptions& o, int kv,
    const std::function<void(absl::string_view)>& say) {
  const uint64_t groups = o.layer_groups, f = x.features(), n = x.rows();
  const uint64_t fb = f / groups;
  if (fb > engine.max_features()) {
    return Invalid("samples",
                   absl::StrFormat("%u features per row; the %s "
                                   "PCA handles at most %u",
                                   fb, engine.name(), engine.max_features()));
  }
  if (o.components > 0 && (o.components > fb || o.components > n - 1)) {
    return Invalid(
        "options.components",
        absl::StrFormat("%u components need at most %u features per %s and "
                        "at least %u rows to fit; the samples give %u %s rows "
                        "of %u features to fit (a tenth more are held out "
                        "for the expected error)",
                        o.components, fb, groups > 1 ? "layer group" : "row",
                        o.components + 1, n, kKvName[kv], fb));
  }
  PcaRequest req;
  req.components = o.components;
  req.useful_components =
      std::max<uint64_t>(1, std::min({UsefulComponents(o, f), fb, n - 1}));
  req.say = say;
  req.cancelled = o.cancelled;
  KvtcBasis out;
  out.features = f;
  out.mean.resize(f);
  for (uint64_t g = 0; g < groups; ++g) {
    const ColumnRows block(x, g * fb, (g + 1) * fb);
    say(absl::StrFormat(
        "%s: PCA of %u rows x %u features%s (%s)", kKvName[kv], n, fb,
        groups > 1 ? absl::StrFormat(", layer group %u/%u", g + 1, groups)
                   : std::string(),
        engine.name()));
    KVH_ASSIGN_OR_RETURN(KvtcBasis b,
                         RunPca(engine, groups > 1 ? block : x, req));
    std::copy(b.mean.begin(), b.mean.end(), out.mean.begin() + g * fb);
    out.projection.insert(out.projection.end(), b.projection.begin(),
                          b.projection.end());
    out.components += b.components;
    if (groups > 1) out.blocks.push_back({fb, b.components});
  }
  return out;
}

// Rows the errors are measured on.
uint64_t ErrorRows(const CalibrateOptions& o, uint64_t rows,
                   uint64_t components) {
  const uint64_t cap =
      o.max_error_rows > 0
          ? o.max_error_rows
          : std::max<uint64_t>(4096, kErrorRowsBytes / (4 * components));
  return std::min(rows, std::max<uint64_t>(2, cap));
}

// Y = (X - mean) P over the error rows ([ne][components]), block by block;
// adds sum ||x - mean||^2 / ne to *total_variance.
std::vector<float> ProjectRows(const CalibrationRows& x, const KvtcBasis& b,
                               uint64_t ne, double* total_variance) {
  const uint64_t n = x.rows(), f = b.features, k = b.components;
  const uint64_t chunk = 256;
  std::vector<float> buf(chunk * f), y(ne * k);
  double sum2 = 0;
  for (uint64_t r0 = 0; r0 < ne; r0 += chunk) {
    const uint64_t m = std::min(chunk, ne - r0);
    for (uint64_t r = 0; r < m; ++r) {
      x.ReadRows((r0 + r) * n / ne, 1, buf.data() + r * f);
      float* row = buf.data() + r * f;
      for (uint64_t c = 0; c < f; ++c) {
        row[c] -= b.mean[c];
        sum2 += double(row[c]) * row[c];
      }
    }
    const float* p = b.projection.data();
    uint64_t f0 = 0, c0 = 0;
    for (const KvtcBlock& blk : BlocksOf(b)) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                  static_cast<int>(m), static_cast<int>(blk.components),
                  static_cast<int>(blk.features), 1.0f, buf.data() + f0,
                  static_cast<int>(f), p, static_cast<int>(blk.components),
                  0.0f, y.data() + r0 * k + c0, static_cast<int>(k));
      p += blk.features * blk.components;
      f0 += blk.features;
      c0 += blk.components;
    }
  }
  *total_variance = sum2 / static_cast<double>(ne);
  return y;
}

// The group errors of every group size on rows `x` (at most ErrorRows of
// them, evenly spaced) projected onto `basis`. Fills *group_block when
// given.
absl::StatusOr<GroupErrorTable> MeasureErrorTable(
    const CalibrationRows& x, const KvtcBasis& basis, const CalibrateOptions& o,
    std::vector<std::vector<uint32_t>>* group_block) {
  GroupErrorTable t;
  const uint64_t k = basis.components;
  t.rows = ErrorRows(o, x.rows(), k);
  const std::vector<float> y = ProjectRows(x, basis, t.rows, &t.total_variance);
  const std::vector<double> var = ColumnVariances(y, t.rows, k);
  double kept = 0;
  for (double v : var) kept += v;
  t.outside = std::max(0.0, t.total_variance - kept);
  const std::vector<KvtcBlock> blocks = BlocksOf(basis);
  for (uint64_t gs : o.group_sizes) {
    std::vector<KvtcGroupErrors> groups;
    std::vector<uint32_t> owner;
    uint64_t c0 = 0;
    for (size_t bi = 0; bi < blocks.size(); ++bi) {
      const uint64_t c1 = c0 + blocks[bi].components;
      std::vector<KvtcGroupErrors> g;
      if (o.measured_errors) {
        g = MeasureGroupErrors(y, t.rows, k, var, c0, c1, gs);
      } else {
        KVH_ASSIGN_OR_RETURN(
            g, ModelGroupErrors(absl::MakeConstSpan(var).subspan(c0, c1 - c0),
                                gs));
      }
      groups.insert(groups.end(), g.begin(), g.end());
      owner.insert(owner.end(), g.size(), static_cast<uint32_t>(bi));
      c0 = c1;
    }
    t.groups.push_back(std::move(groups));
    if (group_block != nullptr) group_block->push_back(std::move(owner));
  }
  return t;
}

// The basis is fitted to the rows SplitHeldOut keeps and kept as fitted
// (not refitted on all rows), so that the held-out errors describe the
// basis the calibration ships.
absl::StatusOr<FullBasis> ComputeBasis(
    const CalibrationRows& x, const CalibrateOptions& o, int kv,
    const CalibrationPca& engine,
    const std::function<void(absl::string_view)>& say) {
  const uint64_t rows = x.rows();
  if (rows < 3) {
    return Invalid("samples",
                   absl::StrFormat("only %u %s rows; need >= 3 (2 to fit the "
                                   "basis to, 1 held out for its expected "
                                   "error)",
                                   rows, kKvName[kv]));
  }
  const HeldOutSplit split = SplitHeldOut(rows);
  const RowRuns fit(x, split.fit), held(x, split.held_out);
  FullBasis out;
  KVH_ASSIGN_OR_RETURN(out.basis, BlockPca(engine, fit, o, kv, say));
  const uint64_t k = out.basis.components;
  const uint64_t ne = ErrorRows(o, fit.rows(), k);
  say(absl::StrFormat(
      "%s: %s errors of groups of components on %u of %u "
      "fitted rows (%.0f MiB of coefficients)",
      kKvName[kv], o.measured_errors ? "measuring" : "modelling", ne,
      fit.rows(), 4.0 * ne * k / 1048576.0));
  KVH_RETURN_IF_ERROR(o.cancelled && o.cancelled()
                          ? absl::CancelledError("calibration: cancelled")
                          : absl::OkStatus());
  KVH_ASSIGN_OR_RETURN(out.fit,
                       MeasureErrorTable(fit, out.basis, o, &out.group_block));
  out.total_variance = out.fit.total_variance;
  say(absl::StrFormat("%s: the same on %u held-out rows", kKvName[kv],
                      held.rows()));
  KVH_ASSIGN_OR_RETURN(out.held_out,
                       MeasureErrorTable(held, out.basis, o, nullptr));
  return out;
}

// sqrt(error / variance), 0 without variance.
double RelError(double error, double variance) {
  return variance > 0 ? std::sqrt(error / variance) : 0.0;
}

// The relative error the chosen groups give on `t`'s rows, with what lies
// outside the computed components.
double TableRelError(const GroupErrorTable& t, size_t gi,
                     const BitAllocation& a) {
  double e = t.outside;
  const std::vector<KvtcGroupErrors>& groups = t.groups[gi];
  for (size_t g = 0; g < groups.size() && g < a.choices.size(); ++g) {
    e += groups[g].error[static_cast<int>(a.choices[g])];
  }
  return RelError(e, t.total_variance);
}

// Keys and values share what a page may cost: one DP over both bases'
// groups (the same group size for both, each size tried; ties: the first)
// minimizes the sum of their relative squared errors (error / the basis'
// total variance), with twice the per-row budget, since a page has as many
// rows of keys as of values. The result is split back into the two bases'
// allocations (each reporting its own, unscaled errors).
absl::Status JointAllocation(const FullBasis (&full)[2],
                             const CalibrateOptions& o,
                             const BitAllocationOptions& bo,
                             BitAllocation* keys, BitAllocation* values,
                             size_t* best_index) {
  double best = 0;
  std::vector<KvtcGroupChoice> best_choices;
  BitAllocationOptions joint = bo;
  joint.budget_bits_per_row = 2 * bo.budget_bits_per_row;
  double weight[2];
  for (int kv = 0; kv < 2; ++kv) {
    weight[kv] =
        full[kv].total_variance > 0 ? 1.0 / full[kv].total_variance : 1.0;
  }
  for (size_t i = 0; i < o.group_sizes.size(); ++i) {
    std::vector<KvtcGroupErrors> groups;
    for (int kv = 0; kv < 2; ++kv) {
      for (KvtcGroupErrors g : full[kv].fit.groups[i]) {
        for (double& e : g.error) e *= weight[kv];
        groups.push_back(g);
      }
    }
    KVH_ASSIGN_OR_RETURN(BitAllocation a, AllocateKvtcBits(groups, joint));
    if (i == 0 || a.expected_error < best) {
      best = a.expected_error;
      best_choices = std::move(a.choices);
      *best_index = i;
    }
  }
  const size_t nk = full[0].fit.groups[*best_index].size();
  *keys = SummarizeKvtcAllocation(
      full[0].fit.groups[*best_index],
      std::vector<KvtcGroupChoice>(best_choices.begin(),
                                   best_choices.begin() + nk),
      bo.range_bits_per_row, o.merge_intx);
  *values = SummarizeKvtcAllocation(
      full[1].fit.groups[*best_index],
      std::vector<KvtcGroupChoice>(best_choices.begin() + nk,
                                   best_choices.end()),
      bo.range_bits_per_row, o.merge_intx);
  return absl::OkStatus();
}

// The basis cut, block by block, to the components up to the last group
// that received bits (at least 1 per block: a block with no range decodes
// as its mean), with the allocation's ranges renumbered accordingly.
KvtcBasis CutBasis(const FullBasis& full, size_t gi, const BitAllocation& a,
                   bool merge_intx) {
  const std::vector<KvtcGroupErrors>& groups = full.fit.groups[gi];
  const std::vector<uint32_t>& group_block = full.group_block[gi];
  const std::vector<KvtcBlock> blocks = BlocksOf(full.basis);
  std::vector<uint64_t> kept(blocks.size(), 0), at(blocks.size(), 0);
  for (size_t g = 0; g < groups.size(); ++g) {
    const uint32_t bi = group_block[g];
    at[bi] += groups[g].width;
    if (a.choices[g] != KvtcGroupChoice::kNone) kept[bi] = at[bi];
  }
  std::vector<uint64_t> new_start(blocks.size(), 0);
  KvtcBasis b;
  b.features = full.basis.features;
  b.mean = full.basis.mean;
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    kept[bi] = std::max<uint64_t>(1, kept[bi]);
    new_start[bi] = b.components;
    b.components += kept[bi];
  }
  std::fill(at.begin(), at.end(), 0);
  for (size_t g = 0; g < groups.size(); ++g) {
    const uint32_t bi = group_block[g];
    const uint64_t start = new_start[bi] + at[bi];
    at[bi] += groups[g].width;
    const KvtcGroupChoice c = a.choices[g];
    if (c == KvtcGroupChoice::kNone) continue;
    KvtcRange r;
    r.quant_type =
        c == KvtcGroupChoice::kFp8 ? KvtcQuantType::kFp8 : KvtcQuantType::kIntX;
    r.int_bits = c == KvtcGroupChoice::kInt2   ? 2
                 : c == KvtcGroupChoice::kInt4 ? 4
                                               : 0;
    r.start_idx = start;
    r.end_idx = start + groups[g].width;
    const bool mergeable = r.quant_type == KvtcQuantType::kFp8 || merge_intx;
    if (mergeable && !b.ranges.empty() && b.ranges.back().end_idx == start &&
        b.ranges.back().quant_type == r.quant_type &&
        b.ranges.back().int_bits == r.int_bits) {
      b.ranges.back().end_idx = r.end_idx;
    } else {
      b.ranges.push_back(r);
    }
  }
  const float* src = full.basis.projection.data();
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const KvtcBlock& blk = blocks[bi];
    for (uint64_t i = 0; i < blk.features; ++i) {
      const float* row = src + i * blk.components;
      b.projection.insert(b.projection.end(), row, row + kept[bi]);
    }
    src += blk.features * blk.components;
    if (blocks.size() > 1) b.blocks.push_back({blk.features, kept[bi]});
  }
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

KvtcStreamShape StreamShape(const CalibrationRowsInput& in,
                            const CalibrateOptions& o, uint64_t row_features) {
  KvtcStreamShape shape;
  shape.row_kind = o.row_kind;
  shape.page_size = o.page_size;
  shape.num_layers = in.num_layers;
  shape.token_features =
      uint64_t{in.num_layers} * in.num_kv_heads * in.head_dim;
  shape.row_features = row_features;
  shape.sink_tokens_per_page =
      std::min<double>(o.page_size, std::max(0.0, in.sink_tokens_per_page));
  shape.pages_per_buffer = o.pages_per_buffer;
  shape.raw_dtype = o.raw_dtype;
  return shape;
}

absl::StatusOr<CalibrationOutcome> OutcomeFor(
    const CalibrationRowsInput& samples, const CalibrateOptions& options,
    const FullBasis (&full)[2], size_t ratio_index,
    const std::function<void(absl::string_view)>& say) {
  const double ratio = options.ratios[ratio_index];
  CalibrationOutcome o;
  o.ratio = ratio;
  const KvtcStreamShape shape =
      StreamShape(samples, options, full[0].basis.features);
  absl::StatusOr<KvtcRowBudget> budget = KvtcRowBudgetFor(shape, ratio);
  if (!budget.ok()) {
    return Invalid(absl::StrCat("options.ratios[", ratio_index, "]"),
                   budget.status().message());
  }
  o.budget = *budget;
  o.raw_bits_per_row =
      full[0].basis.features * 8 * DTypeSize(options.raw_dtype);
  o.budget_bits_per_row = o.budget.budget_bits_per_row;
  say(absl::StrFormat("ratio %gx: %u bits per row (range records included)",
                      ratio, o.budget_bits_per_row));
  BitAllocationOptions bo;
  bo.budget_bits_per_row = o.budget_bits_per_row;
  bo.range_bits_per_row = o.budget.range_bits_per_row;
  bo.merge_intx = options.merge_intx;
  size_t g = 0;
  KVH_RETURN_IF_ERROR(
      JointAllocation(full, options, bo, &o.keys, &o.values, &g));
  const size_t gi[2] = {g, g};
  o.keys_group_size = options.group_sizes[gi[0]];
  o.values_group_size = options.group_sizes[gi[1]];
  o.keys_variance = full[0].total_variance;
  o.values_variance = full[1].total_variance;
  o.keys_computed = full[0].basis.components;
  o.values_computed = full[1].basis.components;
  KvtcCalibration& cal = o.calibration;
  cal.row_kind = options.row_kind;
  cal.num_layers = samples.num_layers;
  cal.num_kv_heads = samples.num_kv_heads;
  cal.head_dim = samples.head_dim;
  cal.page_size = options.page_size;
  cal.sink_tokens = options.sink_tokens;
  cal.rope_style = samples.rope_style;
  cal.rope_theta =
      samples.rope_style != RopeStyle::kNone ? samples.rope_theta : 0.0f;
  cal.keys = CutBasis(full[0], gi[0], o.keys, options.merge_intx);
  cal.values = CutBasis(full[1], gi[1], o.values, options.merge_intx);
  o.expected_ratio =
      o.budget.raw_bytes_per_page /
      KvtcStoredBytesPerPage(o.budget, o.keys.used_bits_per_row,
                             cal.keys.ranges.size(), o.values.used_bits_per_row,
                             cal.values.ranges.size());
  const BitAllocation* alloc[2] = {&o.keys, &o.values};
  for (int kv = 0; kv < 2; ++kv) {
    o.rel_error[kv] = TableRelError(full[kv].held_out, g, *alloc[kv]);
    o.fit_rel_error[kv] = TableRelError(full[kv].fit, g, *alloc[kv]);
  }
  o.fit_rows = full[0].fit.rows;
  o.held_out_rows = full[0].held_out.rows;
  cal.estimate.target_ratio = static_cast<float>(ratio);
  cal.estimate.expected_ratio = static_cast<float>(o.expected_ratio);
  cal.estimate.keys_rel_error = static_cast<float>(o.rel_error[0]);
  cal.estimate.values_rel_error = static_cast<float>(o.rel_error[1]);
  KVH_RETURN_IF_ERROR(cal.Validate());
  return o;
}

}  // namespace

absl::StatusOr<std::vector<CalibrationOutcome>> CalibrateKvtcRows(
    const CalibrationRowsInput& in, const CalibrateOptions& options) {
  if (in.keys == nullptr || in.values == nullptr) {
    return Invalid("rows", "keys and values rows are required");
  }
  KVH_RETURN_IF_ERROR(CheckOptions(in.num_layers, options));
  const uint64_t row_features =
      options.row_kind == KvtcRowKind::kPerPage
          ? uint64_t{options.page_size} * in.num_kv_heads * in.head_dim
          : uint64_t{in.num_layers} * in.num_kv_heads * in.head_dim;
  if (in.keys->features() != row_features ||
      in.values->features() != row_features) {
    return Invalid(
        "rows",
        absl::StrFormat("rows of %u / %u features; %s rows "
                        "of this geometry have %u",
                        in.keys->features(), in.values->features(),
                        KvtcRowKindName(options.row_kind), row_features));
  }
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
  // Refuse unreachable ratios before the expensive part.
  const KvtcStreamShape shape = StreamShape(in, options, row_features);
  if (options.row_kind == KvtcRowKind::kPerToken &&
      shape.sink_tokens_per_page >= options.page_size) {
    return Invalid("options.sink_tokens",
                   absl::StrFormat("every sample token is at a position "
                                   "below %u: no rows remain to project",
                                   options.sink_tokens));
  }
  for (size_t i = 0; i < options.ratios.size(); ++i) {
    absl::StatusOr<KvtcRowBudget> b =
        KvtcRowBudgetFor(shape, options.ratios[i]);
    if (!b.ok()) {
      return Invalid(absl::StrCat("options.ratios[", i, "]"),
                     b.status().message());
    }
  }
  const CpuCalibrationPca cpu(options.cpu);
  const CalibrationPca& engine = options.pca != nullptr
                                     ? *options.pca
                                     : static_cast<const CalibrationPca&>(cpu);
  FullBasis full[2];
  for (int kv = 0; kv < 2; ++kv) {
    KVH_RETURN_IF_ERROR(check_cancelled());
    KVH_ASSIGN_OR_RETURN(full[kv], ComputeBasis(kv == 0 ? *in.keys : *in.values,
                                                options, kv, engine, say));
  }
  std::vector<CalibrationOutcome> out;
  for (size_t i = 0; i < options.ratios.size(); ++i) {
    KVH_RETURN_IF_ERROR(check_cancelled());
    KVH_ASSIGN_OR_RETURN(CalibrationOutcome o,
                         OutcomeFor(in, options, full, i, say));
    out.push_back(std::move(o));
  }
  say("done");
  return out;
}

absl::StatusOr<std::vector<CalibrationOutcome>> CalibrateKvtc(
    const KvSamples& samples, const CalibrateOptions& options) {
  KVH_RETURN_IF_ERROR(samples.Validate());
  KVH_RETURN_IF_ERROR(CheckOptions(samples.num_layers, options));
  if (samples.rope_style != RopeStyle::kNone && !samples.keys_roped &&
      !options.undo_rope) {
    return Invalid("options.undo_rope",
                   "the samples hold keys with RoPE already removed "
                   "(keys_roped=false), so the codec must undo RoPE too");
  }
  SampleRowSpec spec;
  spec.row_kind = options.row_kind;
  spec.page_size = options.page_size;
  spec.sink_tokens = options.sink_tokens;
  spec.max_rows = options.max_rows;
  KVH_ASSIGN_OR_RETURN(const KvSampleRows values,
                       KvSampleRows::Create(samples, spec, 1));
  spec.unrope = UnropeHere(samples, options);
  KVH_ASSIGN_OR_RETURN(const KvSampleRows keys,
                       KvSampleRows::Create(samples, spec, 0));
  uint64_t sinks = 0;
  for (int64_t p : samples.positions) {
    if (p < static_cast<int64_t>(options.sink_tokens)) ++sinks;
  }
  if (sinks < samples.tokens && keys.rows() < 3) {
    return Invalid(
        "samples",
        absl::StrFormat("only %u rows remain after leaving out sinks%s; need "
                        ">= 3 (2 to fit, 1 held out)",
                        keys.rows(),
                        options.row_kind == KvtcRowKind::kPerPage
                            ? absl::StrFormat(" and partial pages (per_page "
                                              "rows need runs of "
                                              "options.page_size=%u "
                                              "consecutive positions from a "
                                              "multiple of it)",
                                              options.page_size)
                            : std::string()));
  }
  CalibrationRowsInput in;
  in.keys = &keys;
  in.values = &values;
  in.num_layers = samples.num_layers;
  in.num_kv_heads = samples.num_kv_heads;
  in.head_dim = samples.head_dim;
  const bool rope = samples.rope_style != RopeStyle::kNone &&
                    (options.undo_rope || !samples.keys_roped);
  in.rope_style = rope ? samples.rope_style : RopeStyle::kNone;
  in.rope_theta = rope ? samples.rope_theta : 0.0f;
  in.sink_tokens_per_page = samples.tokens == 0
                                ? 0
                                : double(options.page_size) * sinks /
                                      static_cast<double>(samples.tokens);
  return CalibrateKvtcRows(in, options);
}

std::string DescribeOutcome(const CalibrationOutcome& o) {
  std::string s = absl::StrFormat(
      "ratio %gx: expected %.2fx stored (%s rows, %u of %u raw bits per row "
      "for data and range records, %.0f fixed bytes per page)\n",
      o.ratio, o.expected_ratio, KvtcRowKindName(o.calibration.row_kind),
      o.budget_bits_per_row, o.raw_bits_per_row, o.budget.fixed_bytes_per_page);
  const BitAllocation* alloc[2] = {&o.keys, &o.values};
  const uint64_t group[2] = {o.keys_group_size, o.values_group_size};
  const uint64_t computed[2] = {o.keys_computed, o.values_computed};
  const KvtcBasis* basis[2] = {&o.calibration.keys, &o.calibration.values};
  for (int kv = 0; kv < 2; ++kv) {
    const BitAllocation& a = *alloc[kv];
    absl::StrAppendFormat(
        &s,
        "  %-6s %4u bits/row, groups of %u, %u of %u computed components "
        "kept%s, expected relative error %.4f (%u held-out rows; %.4f on the "
        "%u fitted rows): %s\n",
        kKvName[kv], a.used_bits_per_row, group[kv], basis[kv]->components,
        computed[kv],
        basis[kv]->blocks.empty()
            ? std::string()
            : absl::StrFormat(" in %u layer groups", basis[kv]->blocks.size()),
        o.rel_error[kv], o.held_out_rows, o.fit_rel_error[kv], o.fit_rows,
        DescribeRanges(basis[kv]->ranges));
    if (a.charged_bits_per_row + 64 < o.budget_bits_per_row &&
        basis[kv]->components == computed[kv]) {
      absl::StrAppendFormat(&s,
                            "         every computed component got bits and "
                            "%.0f bits per row are left: more components "
                            "(--components) could lower the error\n",
                            o.budget_bits_per_row - a.charged_bits_per_row);
    }
  }
  return s;
}

}  // namespace kvharbor
