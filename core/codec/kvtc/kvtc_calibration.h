// KVTC calibration: the per-model data that KVTC's transform needs (mean,
// PCA projection, quantization ranges for keys and for values, row kind,
// attention-sink count, RoPE settings), its fingerprint, its binary file
// format, and builders used by tests and calibration tools.
//
// A calibration is a plain value (copyable; thread-compatible). Codecs hold it
// through std::shared_ptr<const KvtcCalibration> and never modify it, so one
// calibration may back any number of codecs on any threads.
//
// Row kinds (see docs/kvtc_format.md for the element order):
//   kPerToken: one row per token; features = num_layers * num_kv_heads *
//     head_dim, ordered [layer][kv_head][head_dim]; keys and values are
//     separate rows with their own basis (the paper's choice).
//   kPerPage: one row per (page, layer); features = page_size * num_kv_heads
//     * head_dim, ordered [token][kv_head][head_dim]; ONE basis for keys and
//     one for values is shared by all layers (a per-layer basis would
//     multiply calibration size by num_layers; a later format version may add
//     it).
//
// Block-diagonal projections (file version 2): a basis may split its
// features into consecutive blocks, each projected onto its own consecutive
// components (e.g. per-token rows in groups of layers, so that a CPU codec
// does 1/groups of the arithmetic). The coefficient vector is the blocks'
// components one after the other; ranges index it as usual.
//
// Attention sinks: tokens at positions < sink_tokens are not projected; they
// are stored as FP8 E4M3 of their raw values. (In kPerPage rows the sink
// tokens are replaced by the mean before projection so they do not disturb
// the page's other tokens.)
//
// RoPE: with rope_style != kNone, keys are un-rotated (angle -pos * inv_freq)
// before the mean is subtracted and re-rotated after decoding, so the basis
// sees position-free keys. inv_freq[i] = rope_theta^(-2i / head_dim) for
// i in [0, head_dim/2); angles are computed in double.
#ifndef KVHARBOR_CORE_CODEC_KVTC_KVTC_CALIBRATION_H_
#define KVHARBOR_CORE_CODEC_KVTC_KVTC_CALIBRATION_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "types/geometry.h"
#include "types/online_calibration.h"  // KvtcRowKind, RopeStyle

namespace kvharbor {

// Values match the seed's KvtcQuantType and the range header's quant_type.
enum class KvtcQuantType : int32_t {
  kFp8 = 0,
  kIntX = 1,
};

// A half-open range [start_idx, end_idx) of PCA components quantized one way.
struct KvtcRange {
  KvtcQuantType quant_type = KvtcQuantType::kFp8;
  int32_t int_bits = 0;  // 1, 2, 4 or 8 for kIntX; 0 for kFp8
  uint64_t start_idx = 0;
  uint64_t end_idx = 0;

  bool operator==(const KvtcRange& o) const {
    return quant_type == o.quant_type && int_bits == o.int_bits &&
           start_idx == o.start_idx && end_idx == o.end_idx;
  }
};

// One diagonal block of a block-diagonal basis.
struct KvtcBlock {
  uint64_t features = 0;    // consecutive features, after the previous block's
  uint64_t components = 0;  // consecutive components, likewise
  bool operator==(const KvtcBlock& o) const {
    return features == o.features && components == o.components;
  }
};
inline constexpr uint32_t kMaxCalibrationBlocks = 4096;

// The transform for one of keys or values.
struct KvtcBasis {
  uint64_t features = 0;
  uint64_t components = 0;
  std::vector<float> mean;  // [features]
  // Without blocks: [features][components], row-major. With blocks: each
  // block's [block features][block components] matrix, row-major, in block
  // order (the dense matrix's off-diagonal blocks are zero and not stored).
  std::vector<float> projection;
  // Empty: one dense block. Otherwise >= 2 blocks whose features and
  // components sum to `features` and `components`, each with 1 <=
  // components <= features.
  std::vector<KvtcBlock> blocks;
  // Sorted by start_idx, non-overlapping, within [0, components). Components
  // covered by no range are dropped (decoded as 0: a zero-bit allocation).
  std::vector<KvtcRange> ranges;

  // Floats `projection` holds for this shape.
  uint64_t ProjectionElements() const;
  // Checks sizes, blocks, range order/overlap/bounds, bit widths and that
  // mean and projection are finite. Messages start with `prefix`.
  absl::Status Validate(absl::string_view prefix) const;
};

// The dense [features][components] projection of `b` (blocks expanded with
// zeros), e.g. for a GPU GEMM over the whole row.
std::vector<float> DenseProjection(const KvtcBasis& b);

// What the calibration expected when it was made (file version 2; all zero
// when unknown, e.g. a version 1 file). Relative errors are
// sqrt(expected squared error / total variance) of the calibration rows.
struct KvtcCalibrationEstimate {
  float target_ratio = 0;    // the ratio asked for
  float expected_ratio = 0;  // raw / stored over a stream of page buffers
  float keys_rel_error = 0;
  float values_rel_error = 0;
  bool known() const {
    return target_ratio != 0 || expected_ratio != 0 || keys_rel_error != 0 ||
           values_rel_error != 0;
  }
};

struct KvtcCalibration {
  KvtcRowKind row_kind = KvtcRowKind::kPerToken;
  // The geometry this calibration was made for (dtype and layout are free).
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t page_size = 0;
  uint32_t sink_tokens = 4;
  RopeStyle rope_style = RopeStyle::kNone;
  float rope_theta = 0.0f;
  KvtcBasis keys;
  KvtcBasis values;
  KvtcCalibrationEstimate estimate;

  // Features a row has for this row kind and geometry.
  uint64_t ExpectedFeatures() const;
  // Full check; messages name the field ("calibration.keys.ranges[2]...").
  absl::Status Validate() const;
  // Whether this calibration may encode pages of `geometry` (same
  // layers/heads/head_dim/page_size, and rope_theta consistent when the
  // geometry states one). Messages name the field.
  absl::Status CheckGeometry(const Geometry& geometry) const;
  // XXH3-64 of the canonical serialization (the calibration file's bytes
  // before its checksum). Equal content <=> equal fingerprint (up to hash
  // collisions). Costs one pass over mean and projection.
  uint64_t Fingerprint() const;
};

// ---- Calibration file (versions 1 and 2), little-endian; see
// docs/kvtc_format.md. A calibration without blocks and without an estimate
// is written as version 1 (byte for byte what earlier builds wrote, so its
// fingerprint is unchanged); otherwise as version 2.
inline constexpr char kKvtcCalibrationMagic[8] = {'K', 'V', 'T', 'C',
                                                  'C', 'A', 'L', '1'};
inline constexpr uint32_t kKvtcCalibrationVersion = 2;  // the newest read
// Refuse absurd files before allocating: 2^31 floats (8 GiB) per matrix.
inline constexpr uint64_t kMaxCalibrationMatrixElements = uint64_t{1} << 31;
inline constexpr uint32_t kMaxCalibrationRanges = 4096;

// Serializes `cal` (which must Validate()) to bytes ending in an XXH3-64
// checksum of everything before it.
absl::StatusOr<std::string> SerializeKvtcCalibration(
    const KvtcCalibration& cal);
// Parses and fully validates (magic, version, every size against the length,
// checksum, then KvtcCalibration::Validate). Never reads out of bounds.
absl::StatusOr<KvtcCalibration> ParseKvtcCalibration(
    absl::Span<const uint8_t> bytes);
absl::Status WriteKvtcCalibrationFile(const KvtcCalibration& cal,
                                      const std::string& path);
absl::StatusOr<KvtcCalibration> ReadKvtcCalibrationFile(
    const std::string& path);

// ---- Builders (tests, benchmarks, calibration tools).

// Identity basis: mean 0, projection = first `components` columns of I.
KvtcBasis IdentityBasis(uint64_t features, uint64_t components,
                        std::vector<KvtcRange> ranges);
// Random orthonormal columns (Gram-Schmidt on Gaussian vectors, double
// precision), mean 0. Deterministic in `seed`. components <= features.
KvtcBasis RandomOrthonormalBasis(uint64_t features, uint64_t components,
                                 uint64_t seed, std::vector<KvtcRange> ranges);
// PCA of `samples` ([rows][features], row-major): mean and the top
// `components` eigenvectors of the sample covariance (LAPACK dsyev through
// the linked OpenBLAS), ordered by decreasing eigenvalue. Meant for small
// feature counts (the covariance is features^2 doubles).
absl::StatusOr<KvtcBasis> PcaBasis(absl::Span<const float> samples,
                                   uint64_t rows, uint64_t features,
                                   uint64_t components,
                                   std::vector<KvtcRange> ranges);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_KVTC_KVTC_CALIBRATION_H_
