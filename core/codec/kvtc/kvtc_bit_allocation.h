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
// here are exactly the bits the codec writes per row; each range's 40-byte
// record in every buffer is charged to the rows it serves
// (range_bits_per_row, from KvtcRowBudgetFor), and the buffer's fixed bytes
// and attention sinks come off the budget before the DP runs
// (KvtcRowBudgetFor), so that the stored stream meets the ratio. Adjacent
// fp8 groups are merged into one range (no change in bytes or error; one
// range record less than the DP counted). Adjacent IntX groups are NOT merged
// by default: one IntX range shares one min/max per row, so merging would
// change the error the DP optimized (the merged range's scale is set by its
// largest component) while only saving metadata; set merge_intx to merge them
// anyway (the budget still holds: merging only removes metadata).
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
#include "types/geometry.h"

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
  // Everything a row may cost: its own bits plus its share of the range
  // records of the groups it keeps.
  uint64_t budget_bits_per_row = 0;
  // One range record's bits per row (320 bits / rows per buffer); each kept
  // group pays it. 0 leaves range records out.
  double range_bits_per_row = 0;
  bool merge_intx = false;
};

struct BitAllocation {
  std::vector<KvtcGroupChoice> choices;  // one per group
  std::vector<KvtcRange> ranges;  // sorted; groups with kNone are left out
  // One past the last component with a non-zero allocation (trailing
  // dropped groups are cut from the basis); 0 when everything is dropped.
  uint64_t components = 0;
  uint64_t used_bits_per_row = 0;  // the row's own bits (every group's cost)
  // used_bits_per_row + kept groups * range_bits_per_row, <= the budget.
  double charged_bits_per_row = 0;
  double expected_error = 0;  // sum of the chosen groups' errors
  double dropped_error = 0;   // error if every group were dropped
};

// The optimal allocation: minimal sum of errors with cost <= budget (ties go
// to the cheaper allocation). Groups are consecutive starting at component 0
// in the given order. Costs are counted in units of 1/u byte (u a power of
// two up to 16, the finest the table limit allows), range records rounded
// up to whole units, so the charged bits never exceed the budget.
// InvalidArgument (naming the field) for an empty group list, a zero width,
// a non-finite or negative error or range cost, or a table over
// kMaxBitAllocationCells even at whole bytes.
absl::StatusOr<BitAllocation> AllocateKvtcBits(
    absl::Span<const KvtcGroupErrors> groups,
    const BitAllocationOptions& options);

// What `choices` (one per group) amount to, as AllocateKvtcBits reports an
// allocation: bits, charged bits (each kept group pays range_bits_per_row),
// errors, ranges and components. For splitting a joint allocation (keys and
// values in one DP) into its two bases.
BitAllocation SummarizeKvtcAllocation(absl::Span<const KvtcGroupErrors> groups,
                                      std::vector<KvtcGroupChoice> choices,
                                      double range_bits_per_row,
                                      bool merge_intx);

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

// ---- Ratio accounting over stored buffers (docs/kvtc_format.md).

// The stream of buffers a calibration's codec will write: the store encodes
// each evicted page as its own buffer (pages_per_buffer = 1).
struct KvtcStreamShape {
  KvtcRowKind row_kind = KvtcRowKind::kPerToken;
  uint32_t page_size = 16;
  uint32_t num_layers = 1;
  uint64_t token_features = 0;  // layers * kv_heads * head_dim (K or V)
  uint64_t row_features = 0;    // features of one row of this row kind
  // Average attention-sink tokens per page (stored as FP8 K and V): the
  // fraction of tokens at positions < sink_tokens, times page_size.
  double sink_tokens_per_page = 0;
  uint32_t pages_per_buffer = 1;
  DType raw_dtype = DType::kBF16;  // the ratio is against this dtype
};

struct KvtcRowBudget {
  double raw_bytes_per_page = 0;    // K and V in raw_dtype
  double fixed_bytes_per_page = 0;  // envelope, positions, section headers,
                                    // the sink range record and the sinks
  double rows_per_page = 0;         // projected rows of keys (= values)
  double range_bits_per_row = 0;    // one 40-byte range record, per row
  // Bits one row of keys (or of values) may cost, range records included:
  // with both at this, raw / stored >= ratio.
  uint64_t budget_bits_per_row = 0;
};

// The per-row budget for `ratio` (>= 1). InvalidArgument when the fixed
// bytes and sinks alone exceed raw / ratio (the message gives the largest
// reachable ratio; callers prefix the field that asked for the ratio), or
// for a malformed shape.
absl::StatusOr<KvtcRowBudget> KvtcRowBudgetFor(const KvtcStreamShape& shape,
                                               double ratio);

// Expected stored bytes per page with these allocations (every range record
// counted once, as the codec writes them).
double KvtcStoredBytesPerPage(const KvtcRowBudget& budget,
                              uint64_t key_bits_per_row, size_t key_ranges,
                              uint64_t value_bits_per_row, size_t value_ranges);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_KVTC_KVTC_BIT_ALLOCATION_H_
