#include "core/calibration/online_calibration.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/calibration/kvtc_calibrate.h"
#include "core/calibration/pca_cpu.h"
#include "core/codec/kvtc/kvtc_bit_allocation.h"
#include "core/codec/page_elements.h"

namespace kvharbor {
namespace {

absl::Status Invalid(absl::string_view prefix, absl::string_view field,
                     absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(prefix, ".", field, ": ", what));
}

}  // namespace

uint64_t DefaultOnlineSampleTokens(const Geometry& g) {
  const uint64_t per_token = 8 * g.ElementsPerTokenPerKv();
  const uint64_t page = std::max(1u, g.page_size);
  uint64_t tokens = std::min<uint64_t>(
      kDefaultOnlineSampleTokens,
      kDefaultOnlineSampleBytes / std::max<uint64_t>(1, per_token));
  tokens = tokens / page * page;
  return std::max<uint64_t>({tokens, page, 2});
}

OnlineCalibrationOptions ResolveOnlineCalibration(OnlineCalibrationOptions o,
                                                  const Geometry& g) {
  if (o.max_sample_tokens == 0)
    o.max_sample_tokens = DefaultOnlineSampleTokens(g);
  return o;
}

uint64_t OnlineRowFeatures(KvtcRowKind kind, const Geometry& g) {
  return kind == KvtcRowKind::kPerPage
             ? uint64_t{g.page_size} * g.num_kv_heads * g.head_dim
             : g.ElementsPerTokenPerKv();
}

uint64_t OnlineCalibrationMemoryBytes(const OnlineCalibrationOptions& o,
                                      const Geometry& g) {
  const OnlineCalibrationOptions r = ResolveOnlineCalibration(o, g);
  const uint64_t reservoir =
      r.max_sample_tokens * 8 * g.ElementsPerTokenPerKv();
  const uint64_t f = OnlineRowFeatures(r.row_kind, g);
  const uint64_t rows =
      r.row_kind == KvtcRowKind::kPerPage
          ? r.max_sample_tokens / std::max(1u, g.page_size) * g.num_layers
          : r.max_sample_tokens;
  PcaRequest req;
  const double raw_bits = static_cast<double>(f) * 8 * DTypeSize(g.dtype);
  req.useful_components = std::max<uint64_t>(
      1,
      std::min<uint64_t>({f, std::max<uint64_t>(rows, 2) - 1,
                          static_cast<uint64_t>(std::ceil(
                              raw_bits / std::max(1.0, r.target_ratio) / 2))}));
  const CpuPcaOptions cpu;
  const CpuPcaSolver solver =
      ResolveCpuPcaSolver(cpu.solver, f, req.useful_components);
  const uint64_t k = CpuPcaComponents(solver, f, req);
  const uint64_t error_rows =
      std::min(rows, std::max<uint64_t>(4096, kErrorRowsBytes / (4 * k)));
  return 2 * reservoir + CpuPcaWorkingBytes(solver, f, k, cpu) +
         4 * error_rows * k + 16 * f * k;
}

absl::Status ValidateOnlineCalibration(const OnlineCalibrationOptions& given,
                                       const Geometry& g,
                                       absl::string_view prefix) {
  const OnlineCalibrationOptions o = ResolveOnlineCalibration(given, g);
  if (o.min_tokens == 0) return Invalid(prefix, "min_tokens", "must be >= 1");
  if (o.max_sample_tokens < 2 || o.max_sample_tokens < g.page_size) {
    return Invalid(prefix, "max_sample_tokens",
                   absl::StrFormat("%u must be >= 2 and hold at least one "
                                   "page of %u tokens",
                                   o.max_sample_tokens, g.page_size));
  }
  const uint64_t token_features = g.ElementsPerTokenPerKv();
  if (o.max_sample_tokens > kMaxOnlineSampleBytes / (8 * token_features)) {
    return Invalid(
        prefix, "max_sample_tokens",
        absl::StrFormat("%u tokens of %u K and V floats each exceed the "
                        "sample limit of %u bytes (at most %u tokens for "
                        "this geometry; 0 picks %u)",
                        o.max_sample_tokens, 2 * token_features,
                        kMaxOnlineSampleBytes,
                        kMaxOnlineSampleBytes / (8 * token_features),
                        DefaultOnlineSampleTokens(g)));
  }
  if (!std::isfinite(o.target_ratio) || o.target_ratio < 1.0) {
    return Invalid(prefix, "target_ratio",
                   absl::StrCat(o.target_ratio, " must be finite and >= 1"));
  }
  if (o.row_kind != KvtcRowKind::kPerToken &&
      o.row_kind != KvtcRowKind::kPerPage) {
    return Invalid(prefix, "row_kind", "unknown value");
  }
  const uint64_t features = OnlineRowFeatures(o.row_kind, g);
  if (features > kCpuPcaMaxFeatures) {
    return Invalid(prefix, "row_kind",
                   absl::StrFormat("%s rows of this geometry have %u "
                                   "features; online calibration handles at "
                                   "most %u",
                                   KvtcRowKindName(o.row_kind), features,
                                   kCpuPcaMaxFeatures));
  }
  // The ratio must be reachable with one page per buffer even before the
  // attention sinks take their share.
  KvtcStreamShape shape;
  shape.row_kind = o.row_kind;
  shape.page_size = g.page_size;
  shape.num_layers = g.num_layers;
  shape.token_features = token_features;
  shape.row_features = features;
  shape.raw_dtype = g.dtype;
  if (absl::StatusOr<KvtcRowBudget> b = KvtcRowBudgetFor(shape, o.target_ratio);
      !b.ok()) {
    return Invalid(prefix, "target_ratio", b.status().message());
  }
  if (o.rope_style != RopeStyle::kNone &&
      o.rope_style != RopeStyle::kInterleaved &&
      o.rope_style != RopeStyle::kHalfSplit) {
    return Invalid(prefix, "rope_style", "unknown value");
  }
  if (o.rope_style != RopeStyle::kNone &&
      (!(g.rope_theta > 1.0f) || g.head_dim % 2 != 0)) {
    return Invalid(prefix, "rope_style",
                   "undoing RoPE needs geometry.rope_theta > 1 and an even "
                   "geometry.head_dim");
  }
  return absl::OkStatus();
}

PageSampler::PageSampler(const Geometry& geometry,
                         const OnlineCalibrationOptions& o)
    : geometry_(geometry),
      rope_style_(o.rope_style),
      capacity_pages_(std::max<size_t>(
          1, ResolveOnlineCalibration(o, geometry).max_sample_tokens /
                 std::max(1u, geometry.page_size))),
      token_features_(geometry.ElementsPerTokenPerKv()) {}

void PageSampler::Offer(const uint8_t* page, uint64_t first_position) {
  absl::MutexLock l(&mu_);
  ++pages_offered_;
  if (pages_kept_ < capacity_pages_) {
    Store(page, first_position, pages_kept_++);
    return;
  }
  // Algorithm R: page n (1-based) replaces a random kept one w.p. k/n.
  const uint64_t j = absl::Uniform<uint64_t>(rng_, 0, pages_offered_);
  if (j < capacity_pages_) Store(page, first_position, static_cast<size_t>(j));
}

void PageSampler::Store(const uint8_t* page, uint64_t first_position,
                        size_t index) {
  const uint64_t page_floats = token_features_ * geometry_.page_size;
  if (k_.size() < (index + 1) * page_floats) {
    k_.resize((index + 1) * page_floats);
    v_.resize((index + 1) * page_floats);
    first_positions_.resize(index + 1);
  }
  first_positions_[index] = first_position;
  PageToTokenRows(geometry_, page, k_.data() + index * page_floats,
                  v_.data() + index * page_floats);
}

uint64_t PageSampler::tokens_offered() const {
  absl::MutexLock l(&mu_);
  return pages_offered_ * geometry_.page_size;
}

uint64_t PageSampler::tokens_sampled() const {
  absl::MutexLock l(&mu_);
  return uint64_t{pages_kept_} * geometry_.page_size;
}

KvSamples PageSampler::Snapshot() const {
  KvSamples s;
  s.num_layers = geometry_.num_layers;
  s.num_kv_heads = geometry_.num_kv_heads;
  s.head_dim = geometry_.head_dim;
  s.rope_style = rope_style_;
  s.rope_theta = rope_style_ == RopeStyle::kNone ? 0.0f : geometry_.rope_theta;
  s.keys_roped = rope_style_ != RopeStyle::kNone;
  absl::MutexLock l(&mu_);
  const uint64_t page_floats = token_features_ * geometry_.page_size;
  s.tokens = uint64_t{pages_kept_} * geometry_.page_size;
  s.k.assign(k_.begin(), k_.begin() + pages_kept_ * page_floats);
  s.v.assign(v_.begin(), v_.begin() + pages_kept_ * page_floats);
  s.positions.reserve(s.tokens);
  for (size_t p = 0; p < pages_kept_; ++p) {
    for (uint32_t t = 0; t < geometry_.page_size; ++t) {
      s.positions.push_back(static_cast<int64_t>(first_positions_[p] + t));
    }
  }
  return s;
}

namespace {

absl::StatusOr<std::string> CalibrateOnline(
    const KvSamples& samples, const OnlineCalibrationOptions& given,
    const Geometry& geometry, const std::function<bool()>& cancelled,
    std::shared_ptr<const CalibrationPca> pca) {
  const OnlineCalibrationOptions options =
      ResolveOnlineCalibration(given, geometry);
  CalibrateOptions o;
  o.row_kind = options.row_kind;
  o.page_size = geometry.page_size;
  o.sink_tokens = options.sink_tokens;
  o.undo_rope = options.rope_style != RopeStyle::kNone;
  o.ratios = {options.target_ratio};
  o.raw_dtype = geometry.dtype;
  o.max_rows =
      std::max<uint64_t>(2, options.max_sample_tokens) *
      (options.row_kind == KvtcRowKind::kPerPage ? geometry.num_layers : 1);
  o.cancelled = cancelled;
  o.pca = std::move(pca);
  KVH_ASSIGN_OR_RETURN(std::vector<CalibrationOutcome> out,
                       CalibrateKvtc(samples, o));
  KVH_RETURN_IF_ERROR(out.at(0).calibration.CheckGeometry(geometry));
  return SerializeKvtcCalibration(out[0].calibration);
}

}  // namespace

absl::StatusOr<std::string> RunOnlineKvtcCalibration(
    const KvSamples& samples, const OnlineCalibrationOptions& options,
    const Geometry& geometry, const std::function<bool()>& cancelled) {
  return CalibrateOnline(samples, options, geometry, cancelled, nullptr);
}

OnlineCalibrateFn MakeOnlineKvtcCalibrateFn(
    std::shared_ptr<const CalibrationPca> pca) {
  return [pca](const KvSamples& samples, const OnlineCalibrationOptions& o,
               const Geometry& g, const std::function<bool()>& cancelled)
             -> absl::StatusOr<std::string> {
    if (pca != nullptr) {
      absl::StatusOr<std::string> r =
          CalibrateOnline(samples, o, g, cancelled, pca);
      // Input errors would fail on the CPU too; an engine failure (device
      // memory, driver) falls back to the CPU PCA.
      if (r.ok() || absl::IsInvalidArgument(r.status()) ||
          absl::IsCancelled(r.status())) {
        return r;
      }
    }
    return CalibrateOnline(samples, o, g, cancelled, nullptr);
  };
}

}  // namespace kvharbor
