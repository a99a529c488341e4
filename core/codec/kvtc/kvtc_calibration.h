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

namespace kvharbor {

enum class KvtcRowKind : uint32_t {
  kPerToken = 1,
  kPerPage = 2,
};
absl::string_view KvtcRowKindName(KvtcRowKind kind);

enum class RopeStyle : uint32_t {
  kNone = 0,
  // Pairs (2i, 2i+1): llama2.c / GPT-J / Meta's original Llama.
  kInterleaved = 1,
  // Pairs (i, i + head_dim/2): Hugging Face Llama / GPT-NeoX rotate_half.
  kHalfSplit = 2,
};
absl::string_view RopeStyleName(RopeStyle style);

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

// The transform for one of keys or values.
struct KvtcBasis {
  uint64_t features = 0;
  uint64_t components = 0;
  std::vector<float> mean;        // [features]
  std::vector<float> projection;  // [features][components], row-major
  // Sorted by start_idx, non-overlapping, within [0, components). Components
  // covered by no range are dropped (decoded as 0: a zero-bit allocation).
  std::vector<KvtcRange> ranges;

  // Checks sizes, range order/overlap/bounds, bit widths and that mean and
  // projection are finite. Messages start with `prefix` (e.g. "keys").
  absl::Status Validate(absl::string_view prefix) const;
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

// ---- Calibration file (version 1), little-endian; see docs/kvtc_format.md.
inline constexpr char kKvtcCalibrationMagic[8] = {'K', 'V', 'T', 'C',
                                                  'C', 'A', 'L', '1'};
inline constexpr uint32_t kKvtcCalibrationVersion = 1;
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
