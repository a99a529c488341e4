#include "core/calibration/calibration_rows.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/codec/kvtc/kvtc_stages.h"

namespace kvharbor {

void MemoryRows::Read(uint64_t first, uint64_t count, uint64_t col_begin,
                      uint64_t col_end, float* out) const {
  const uint64_t w = col_end - col_begin;
  for (uint64_t r = 0; r < count; ++r) {
    const float* src = data_.data() + (first + r) * features_ + col_begin;
    std::memcpy(out + r * w, src, w * sizeof(float));
  }
}

RowRuns::RowRuns(const CalibrationRows& base, std::vector<Run> runs)
    : base_(base), runs_(std::move(runs)) {
  for (const Run& r : runs_) {
    starts_.push_back(rows_);
    rows_ += r.count;
  }
}

void RowRuns::Read(uint64_t first, uint64_t count, uint64_t col_begin,
                   uint64_t col_end, float* out) const {
  const uint64_t w = col_end - col_begin;
  size_t i = std::upper_bound(starts_.begin(), starts_.end(), first) -
             starts_.begin() - 1;
  while (count > 0) {
    const uint64_t in_run = first - starts_[i];
    const uint64_t n = std::min(count, runs_[i].count - in_run);
    base_.Read(runs_[i].first + in_run, n, col_begin, col_end, out);
    out += n * w;
    first += n;
    count -= n;
    ++i;
  }
}

HeldOutSplit SplitHeldOut(uint64_t rows) {
  HeldOutSplit s;
  if (rows < 3) {
    s.fit.push_back({0, rows});
    return s;
  }
  const uint64_t held = std::max<uint64_t>(1, rows / 10);
  const uint64_t stripes = std::min(kHeldOutStripes, held);
  uint64_t at = 0;
  for (uint64_t j = 0; j < stripes; ++j) {
    // Stripe j is centred in the j-th of `stripes` equal spans of rows.
    const uint64_t len = held / stripes + (j < held % stripes ? 1 : 0);
    const uint64_t span0 = j * rows / stripes, span1 = (j + 1) * rows / stripes;
    const uint64_t start = std::max(at, span0 + (span1 - span0 - len) / 2);
    if (start > at) s.fit.push_back({at, start - at});
    s.held_out.push_back({start, len});
    at = start + len;
  }
  if (at < rows) s.fit.push_back({at, rows - at});
  return s;
}

absl::StatusOr<KvSampleRows> KvSampleRows::Create(const KvSamples& s,
                                                  const SampleRowSpec& spec,
                                                  int kv) {
  if (spec.page_size == 0) {
    return absl::InvalidArgumentError("options.page_size: must be >= 1");
  }
  KvSampleRows out(s, spec, kv);
  const uint64_t hd = uint64_t{s.num_kv_heads} * s.head_dim;
  std::vector<std::pair<uint64_t, uint32_t>> src;
  if (spec.row_kind == KvtcRowKind::kPerToken) {
    out.features_ = s.FeaturesPerToken();
    for (uint64_t t = 0; t < s.tokens; ++t) {
      if (s.positions[t] >= static_cast<int64_t>(spec.sink_tokens)) {
        src.push_back({t, 0});
      }
    }
  } else {
    out.features_ = hd * spec.page_size;
    const int64_t ps = spec.page_size;
    for (uint64_t t = 0; t + spec.page_size <= s.tokens; ++t) {
      const int64_t p0 = s.positions[t];
      if (p0 % ps != 0 || p0 < static_cast<int64_t>(spec.sink_tokens)) {
        continue;
      }
      bool run = true;
      for (uint64_t i = 1; i < spec.page_size && run; ++i) {
        run = s.positions[t + i] == p0 + static_cast<int64_t>(i);
      }
      if (!run) continue;
      for (uint32_t l = 0; l < s.num_layers; ++l) src.push_back({t, l});
    }
  }
  if (out.features_ > kMaxKvSampleElements) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "options.page_size: rows of %u features are too large", out.features_));
  }
  // Even subsampling keeps the spread over positions and sequences.
  const uint64_t n = std::min<uint64_t>(src.size(), spec.max_rows);
  out.index_.resize(n);
  for (uint64_t r = 0; r < n; ++r) out.index_[r] = src[r * src.size() / n];
  return out;
}

void KvSampleRows::CopyRun(uint64_t token, uint32_t layer, const float* cos,
                           const float* sin, float* dst) const {
  const KvSamples& s = *samples_;
  const uint64_t hd = uint64_t{s.num_kv_heads} * s.head_dim;
  const float* src = (kv_ == 0 ? s.k : s.v).data() +
                     token * s.FeaturesPerToken() + uint64_t{layer} * hd;
  std::copy(src, src + hd, dst);
  if (cos == nullptr) return;
  for (uint32_t h = 0; h < s.num_kv_heads; ++h) {
    RotateRope(dst + uint64_t{h} * s.head_dim, s.head_dim, s.rope_style, cos,
               sin, /*inverse=*/true);
  }
}

void KvSampleRows::Read(uint64_t first, uint64_t count, uint64_t col_begin,
                        uint64_t col_end, float* out) const {
  const KvSamples& s = *samples_;
  const uint64_t hd = uint64_t{s.num_kv_heads} * s.head_dim;
  const uint64_t w = col_end - col_begin;
  const bool unrope =
      kv_ == 0 && spec_.unrope && s.rope_style != RopeStyle::kNone;
  std::vector<float> run(hd), cos(s.head_dim / 2), sin(s.head_dim / 2);
  // Runs of hd features: layer l (per token) or token i (per page).
  const uint64_t run_begin = col_begin / hd;
  const uint64_t run_end = (col_end + hd - 1) / hd;
  const bool per_token = spec_.row_kind == KvtcRowKind::kPerToken;
  for (uint64_t r = 0; r < count; ++r) {
    const auto [t, layer] = index_[first + r];
    float* dst = out + r * w;
    if (per_token && unrope) {
      RopeCosSin(static_cast<uint64_t>(s.positions[t]), s.head_dim,
                 s.rope_theta, cos.data(), sin.data());
    }
    for (uint64_t j = run_begin; j < run_end; ++j) {
      const uint64_t token = per_token ? t : t + j;
      const uint32_t l = per_token ? static_cast<uint32_t>(j) : layer;
      if (!per_token && unrope) {
        RopeCosSin(static_cast<uint64_t>(s.positions[token]), s.head_dim,
                   s.rope_theta, cos.data(), sin.data());
      }
      CopyRun(token, l, unrope ? cos.data() : nullptr, sin.data(), run.data());
      const uint64_t lo = std::max(col_begin, j * hd);
      const uint64_t hi = std::min(col_end, (j + 1) * hd);
      std::copy(run.data() + (lo - j * hd), run.data() + (hi - j * hd),
                dst + (lo - col_begin));
    }
  }
}

}  // namespace kvharbor
