#include "core/codec/kvtc/kvtc_bit_allocation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/codec/kvtc/kvtc_format.h"
#include "types/enum_names.h"

namespace kvharbor {

absl::string_view KvtcGroupChoiceName(KvtcGroupChoice choice) {
  return EnumName(choice, {"none", "int2", "int4", "fp8"});
}

uint64_t KvtcGroupCostBits(uint64_t width, KvtcGroupChoice choice) {
  switch (choice) {
    case KvtcGroupChoice::kNone:
      return 0;
    case KvtcGroupChoice::kInt2:
      return 64 + 8 * IntXBytesPerRow(width, 2);
    case KvtcGroupChoice::kInt4:
      return 64 + 8 * IntXBytesPerRow(width, 4);
    case KvtcGroupChoice::kFp8:
      return 8 * width;
  }
  return 0;
}

namespace {

constexpr KvtcGroupChoice kChoices[kNumKvtcGroupChoices] = {
    KvtcGroupChoice::kNone, KvtcGroupChoice::kInt2, KvtcGroupChoice::kInt4,
    KvtcGroupChoice::kFp8};

absl::Status CheckGroups(absl::Span<const KvtcGroupErrors> groups) {
  if (groups.empty()) {
    return absl::InvalidArgumentError("groups: no groups to allocate");
  }
  if (groups.size() > kMaxCalibrationRanges) {
    return absl::InvalidArgumentError(
        absl::StrFormat("groups: %u groups, over the limit of %u ranges",
                        groups.size(), kMaxCalibrationRanges));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].width == 0 || groups[g].width > (uint64_t{1} << 32)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("groups[%u].width: %u is out of range [1, 2^32]", g,
                          groups[g].width));
    }
    for (int c = 0; c < kNumKvtcGroupChoices; ++c) {
      const double e = groups[g].error[c];
      if (!std::isfinite(e) || e < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("groups[%u].error[%s]: %g must be finite and >= 0",
                            g, KvtcGroupChoiceName(kChoices[c]), e));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<KvtcRange> BuildRanges(absl::Span<const KvtcGroupErrors> groups,
                                   const std::vector<KvtcGroupChoice>& choices,
                                   bool merge_intx, uint64_t* components) {
  std::vector<KvtcRange> ranges;
  uint64_t start = 0;
  *components = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const uint64_t end = start + groups[g].width;
    const KvtcGroupChoice c = choices[g];
    if (c != KvtcGroupChoice::kNone) {
      KvtcRange r;
      r.quant_type = c == KvtcGroupChoice::kFp8 ? KvtcQuantType::kFp8
                                                : KvtcQuantType::kIntX;
      r.int_bits = c == KvtcGroupChoice::kInt2   ? 2
                   : c == KvtcGroupChoice::kInt4 ? 4
                                                 : 0;
      r.start_idx = start;
      r.end_idx = end;
      const bool mergeable = r.quant_type == KvtcQuantType::kFp8 || merge_intx;
      if (mergeable && !ranges.empty() && ranges.back().end_idx == start &&
          ranges.back().quant_type == r.quant_type &&
          ranges.back().int_bits == r.int_bits) {
        ranges.back().end_idx = end;
      } else {
        ranges.push_back(r);
      }
      *components = end;
    }
    start = end;
  }
  return ranges;
}

// The bytes per row of every group's dearest choice with its range record:
// no allocation can use more, so a larger budget changes nothing.
uint64_t MostBytes(absl::Span<const KvtcGroupErrors> groups,
                   double range_bits_per_row) {
  uint64_t most_bytes = 0;
  for (const KvtcGroupErrors& group : groups) {
    uint64_t dearest = 0;
    for (int c = 0; c < kNumKvtcGroupChoices; ++c) {
      dearest =
          std::max(dearest, KvtcGroupCostBits(group.width, kChoices[c]) / 8);
    }
    most_bytes +=
        dearest + static_cast<uint64_t>(std::ceil(range_bits_per_row / 8));
  }
  return most_bytes;
}

// The dynamic program: per group the choice that gives the least total error
// (then the least cost) within `budget` units, cost[g][k] units for choice k
// of group g.
std::vector<KvtcGroupChoice> LeastErrorChoices(
    absl::Span<const KvtcGroupErrors> groups,
    const std::vector<std::array<uint64_t, kNumKvtcGroupChoices>>& cost,
    size_t budget) {
  const size_t n = groups.size();
  const size_t width = budget + 1;
  // best[c] / used[c]: least error (then least cost) of the groups so far
  // within c units. Both are non-increasing / consistent in c by design.
  std::vector<double> best(width, 0.0), next(width);
  std::vector<uint64_t> used(width, 0), next_used(width);
  std::vector<uint8_t> back(n * width);
  for (size_t g = 0; g < n; ++g) {
    for (size_t c = 0; c < width; ++c) {
      double e_best = std::numeric_limits<double>::infinity();
      uint64_t u_best = 0;
      uint8_t pick = 0;
      for (int k = 0; k < kNumKvtcGroupChoices; ++k) {
        const uint64_t ck = cost[g][k];
        if (ck > c) continue;
        const double e = best[c - ck] + groups[g].error[k];
        const uint64_t uk = used[c - ck] + ck;
        if (e < e_best || (e == e_best && uk < u_best)) {
          e_best = e;
          u_best = uk;
          pick = static_cast<uint8_t>(k);
        }
      }
      next[c] = e_best;
      next_used[c] = u_best;
      back[g * width + c] = pick;
    }
    best.swap(next);
    used.swap(next_used);
  }
  std::vector<KvtcGroupChoice> choices(n);
  size_t c = width - 1;
  for (size_t g = n; g-- > 0;) {
    const uint8_t k = back[g * width + c];
    choices[g] = kChoices[k];
    c -= cost[g][k];
  }
  return choices;
}

}  // namespace

absl::StatusOr<BitAllocation> AllocateKvtcBits(
    absl::Span<const KvtcGroupErrors> groups,
    const BitAllocationOptions& options) {
  KVH_RETURN_IF_ERROR(CheckGroups(groups));
  if (!std::isfinite(options.range_bits_per_row) ||
      options.range_bits_per_row < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("range_bits_per_row: %g must be finite and >= 0",
                        options.range_bits_per_row));
  }
  const size_t n = groups.size();
  // Costs in units of 1/u byte: whole bytes per row for the data (times
  // u), the range record's share rounded up to a whole unit.
  const uint64_t most_bytes = MostBytes(groups, options.range_bits_per_row);
  const uint64_t budget_bytes =
      std::min<uint64_t>(options.budget_bits_per_row / 8, most_bytes);
  uint64_t u = options.range_bits_per_row > 0 ? 16 : 1;
  while (u > 1 && (budget_bytes * u + 1) > kMaxBitAllocationCells / n) u /= 2;
  if (budget_bytes * u + 1 > kMaxBitAllocationCells / n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "budget_bits_per_row: %u groups x %u budget bytes is over the DP "
        "limit of %u cells; use larger groups",
        n, budget_bytes + 1, kMaxBitAllocationCells));
  }
  const double unit_bits = 8.0 / static_cast<double>(u);
  const uint64_t range_units = static_cast<uint64_t>(
      std::ceil(options.range_bits_per_row / unit_bits - 1e-9));
  const uint64_t budget = std::min<uint64_t>(
      static_cast<uint64_t>(std::floor(
          static_cast<double>(options.budget_bits_per_row) / unit_bits)),
      most_bytes * u);
  std::vector<std::array<uint64_t, kNumKvtcGroupChoices>> cost(n);
  for (size_t g = 0; g < n; ++g) {
    for (int c = 0; c < kNumKvtcGroupChoices; ++c) {
      const uint64_t bytes =
          KvtcGroupCostBits(groups[g].width, kChoices[c]) / 8;
      cost[g][c] = bytes * u + (c == 0 ? 0 : range_units);
    }
  }
  return SummarizeKvtcAllocation(
      groups, LeastErrorChoices(groups, cost, static_cast<size_t>(budget)),
      range_units * unit_bits, options.merge_intx);
}

BitAllocation SummarizeKvtcAllocation(absl::Span<const KvtcGroupErrors> groups,
                                      std::vector<KvtcGroupChoice> choices,
                                      double range_bits_per_row,
                                      bool merge_intx) {
  BitAllocation out;
  out.choices = std::move(choices);
  uint64_t kept = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const int k = static_cast<int>(out.choices[g]);
    out.used_bits_per_row += KvtcGroupCostBits(groups[g].width, kChoices[k]);
    out.expected_error += groups[g].error[k];
    out.dropped_error += groups[g].error[0];
    if (k != 0) ++kept;
  }
  out.charged_bits_per_row = static_cast<double>(out.used_bits_per_row) +
                             static_cast<double>(kept) * range_bits_per_row;
  out.ranges = BuildRanges(groups, out.choices, merge_intx, &out.components);
  return out;
}

absl::StatusOr<std::vector<KvtcGroupErrors>> ModelGroupErrors(
    absl::Span<const double> variances, uint64_t group_size) {
  if (group_size == 0) {
    return absl::InvalidArgumentError("group_size: must be >= 1");
  }
  if (variances.empty()) {
    return absl::InvalidArgumentError("variances: empty");
  }
  for (size_t i = 0; i < variances.size(); ++i) {
    if (!std::isfinite(variances[i]) || variances[i] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "variances[%u]: %g must be finite and >= 0", i, variances[i]));
    }
  }
  std::vector<KvtcGroupErrors> out;
  for (size_t start = 0; start < variances.size(); start += group_size) {
    const size_t end = std::min<size_t>(variances.size(), start + group_size);
    KvtcGroupErrors g;
    g.width = end - start;
    double sum = 0, max = 0, fp8 = 0;
    for (size_t i = start; i < end; ++i) {
      sum += variances[i];
      max = std::max(max, variances[i]);
      fp8 += variances[i] * 7.0e-4 + 3.2e-7;
    }
    const double w = static_cast<double>(g.width);
    auto intx = [&](int bits) {
      if (g.width <= 2) return 0.0;
      const double steps = std::ldexp(1.0, bits) - 1.0;
      const double e =
          (w - 2) * 8.0 * std::log(w) * max / (12.0 * steps * steps);
      return std::min(e, sum);
    };
    g.error[static_cast<int>(KvtcGroupChoice::kNone)] = sum;
    g.error[static_cast<int>(KvtcGroupChoice::kInt2)] = intx(2);
    g.error[static_cast<int>(KvtcGroupChoice::kInt4)] = intx(4);
    g.error[static_cast<int>(KvtcGroupChoice::kFp8)] = std::min(fp8, sum);
    out.push_back(g);
  }
  return out;
}

absl::StatusOr<KvtcRowBudget> KvtcRowBudgetFor(const KvtcStreamShape& s,
                                               double ratio) {
  if (!std::isfinite(ratio) || ratio < 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(ratio, " must be finite and >= 1"));
  }
  const size_t elem = DTypeSize(s.raw_dtype);
  if (elem == 0 || s.page_size == 0 || s.num_layers == 0 ||
      s.token_features == 0 || s.row_features == 0 || s.pages_per_buffer == 0 ||
      !(s.sink_tokens_per_page >= 0) || s.sink_tokens_per_page > s.page_size) {
    return absl::InvalidArgumentError(
        "shape: raw_dtype, page_size, num_layers, features and "
        "pages_per_buffer must be set and sinks within the page");
  }
  KvtcRowBudget b;
  const double m = s.pages_per_buffer;
  b.raw_bytes_per_page =
      static_cast<double>(s.page_size) * 2.0 * s.token_features * elem;
  b.fixed_bytes_per_page =
      (kEnvelopeHeaderBytes + kKvtcNumSections * kKvtcSectionHeaderBytes +
       kKvtcRangeHeaderBytes) /
          m +
      8.0 + s.sink_tokens_per_page * 2.0 * s.token_features;
  b.rows_per_page = s.row_kind == KvtcRowKind::kPerPage
                        ? static_cast<double>(s.num_layers)
                        : s.page_size - s.sink_tokens_per_page;
  if (!(b.rows_per_page > 0)) {
    return absl::InvalidArgumentError(
        "every sampled token is an attention sink (sink_tokens); no row is "
        "left to project");
  }
  b.range_bits_per_row = 8.0 * kKvtcRangeHeaderBytes / (m * b.rows_per_page);
  // Keys and values each get half of what the page may cost.
  const double per_kv =
      (b.raw_bytes_per_page / ratio - b.fixed_bytes_per_page) / 2.0;
  if (per_kv <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%gx leaves %.0f bytes per page of %u tokens, less "
        "than the %.0f bytes every buffer holds besides its rows (envelope, "
        "headers, %.2f attention-sink tokens per page in FP8); the largest "
        "reachable ratio is %.2fx",
        ratio, b.raw_bytes_per_page / ratio, s.page_size,
        b.fixed_bytes_per_page, s.sink_tokens_per_page,
        b.raw_bytes_per_page / b.fixed_bytes_per_page));
  }
  b.budget_bits_per_row =
      static_cast<uint64_t>(std::floor(8.0 * per_kv / b.rows_per_page));
  return b;
}

double KvtcStoredBytesPerPage(const KvtcRowBudget& b, uint64_t key_bits_per_row,
                              size_t key_ranges, uint64_t value_bits_per_row,
                              size_t value_ranges) {
  const double ranges = static_cast<double>(key_ranges + value_ranges);
  return b.fixed_bytes_per_page +
         b.rows_per_page *
             (static_cast<double>(key_bits_per_row + value_bits_per_row) / 8 +
              ranges * b.range_bits_per_row / 8);
}

}  // namespace kvharbor
