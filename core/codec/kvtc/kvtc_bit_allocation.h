// KVTC bit allocation (arXiv 2511.01815, section 3.2): given how much error
// each group of consecutive PCA components would suffer under each
// quantization choice, pick one choice per group by dynamic programming so
// that the total expected squared error is minimal and the bits one row
// costs never exceed a budget.
//
// Choices per group (KvtcGroupChoice): none (the group is dropped: 0 bits,
// decoded as 0, error = its variance), int2, int4 (the codec's IntX with a
// float32 min and max per row: 64 bits of metadata per row per range, data
// bytes rounded up per row as IntXBytesPerRow does) and fp8 (8 bits per value,
// no metadata). Every group becomes its own KvtcRange, so the bits counted
// here are exactly the bits the codec writes per row (per-batch headers
// aside); adjacent fp8 groups are merged into one range (no change in bytes
// or error). Adjacent IntX groups are NOT merged by default: one IntX range
// shares one min/max per row, so merging would change the error the DP
// optimized (the merged range's scale is set by its largest component) while
// only saving metadata; set merge_intx to merge them anyway (the budget still
// holds: merging only removes metadata).
//
// The error of each choice comes from the caller (the calibration tool
// measures it on the calibration data) or from ModelGroupErrors(), an
// analytic model of the codec's quantizers given per-component variances
// (see its comment).
//
// Pure functions on values; no state; thread-safe.
#ifndef KVHARBOR_CORE_CODEC_KVTC_KVTC_BIT_ALLOCATION_H_
#define KVHARBOR_CORE_CODEC_KVTC_KVTC_BIT_ALLOCATION_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/codec/kvtc/kvtc_calibration.h"

namespace kvharbor {

enum class KvtcGroupChoice : uint8_t {
  kNone = 0,
  kInt2 = 1,
  kInt4 = 2,
  kFp8 = 3,
};
inline constexpr int kNumKvtcGroupChoices = 4;
absl::string_view KvtcGroupChoiceName(KvtcGroupChoice choice);

// Bits one row spends on a group of `width` components with `choice`,
// metadata included (IntX: 64 + 8 * IntXBytesPerRow(width, bits)).
uint64_t KvtcGroupCostBits(uint64_t width, KvtcGroupChoice choice);

// Largest DP table (groups x budget bytes) accepted, to bound memory (one
// byte per cell for the back-pointers).
inline constexpr uint64_t kMaxBitAllocationCells = uint64_t{1} << 28;

struct KvtcGroupErrors {
  uint64_t width = 0;  // components in the group (>= 1)
  // Expected squared error per row for each choice, indexed by
  // KvtcGroupChoice. Must be finite and >= 0.
  std::array<double, kNumKvtcGroupChoices> error{};
};

struct BitAllocationOptions {
  uint64_t budget_bits_per_row = 0;
  bool merge_intx = false;
};

struct BitAllocation {
  std::vector<KvtcGroupChoice> choices;  // one per group
  std::vector<KvtcRange> ranges;  // sorted; groups with kNone are left out
  // One past the last component with a non-zero allocation (trailing
  // dropped groups are cut from the basis); 0 when everything is dropped.
  uint64_t components = 0;
  uint64_t used_bits_per_row = 0;  // <= budget; counts every group's cost
  double expected_error = 0;       // sum of the chosen groups' errors
  double dropped_error = 0;        // error if every group were dropped
};

// The optimal allocation: minimal sum of errors with cost <= budget (ties go
// to the cheaper allocation). Groups are consecutive starting at component 0
// in the given order. InvalidArgument (naming the field) for an empty group
// list, a zero width, a non-finite or negative error, or a table over
// kMaxBitAllocationCells.
absl::StatusOr<BitAllocation> AllocateKvtcBits(
    absl::Span<const KvtcGroupErrors> groups,
    const BitAllocationOptions& options);

// Analytic errors for groups of `group_size` consecutive components (the
// last group may be narrower) given per-component variances (e.g. PCA
// eigenvalues, in decreasing order). For a group of width w with variances
// s_i (max M, sum S):
//   none: S.
//   fp8:  sum_i (s_i * 7.0e-4 + 3.2e-7): E4M3 keeps 3 mantissa bits, so the
//         relative rounding error is about 2^-6 / 12 * 0.54 (log-uniform
//         mantissa); 3.2e-7 = (2^-9)^2 / 12 is the subnormal step's floor.
//         Saturation at 448 is not modelled (measure errors instead when
//         coefficients may exceed it).
//   intX: a per-row min/max quantizer with 2^b - 1 steps over the row's
//         range R. The two extremes are exact, the other w - 2 values err by
//         step^2 / 12 each, and E[R^2] ~ 8 ln(w) M (the spread of w Gaussian
//         draws, dominated by the largest variance), so
//         error = max(w - 2, 0) * 8 ln(w) M / (12 (2^b - 1)^2), capped at S.
// InvalidArgument for group_size 0, no variances, or a negative or
// non-finite variance.
absl::StatusOr<std::vector<KvtcGroupErrors>> ModelGroupErrors(
    absl::Span<const double> variances, uint64_t group_size);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_KVTC_KVTC_BIT_ALLOCATION_H_
