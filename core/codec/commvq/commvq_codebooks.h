// CommVQ codebooks (shared/seeds/003, ICML 2025) and the CPU reference of
// their encoding and decoding, per layer and per token.
//
// A token's key or value in one layer is a vector of D = num_kv_heads *
// head_dim floats ([kv_head][head_dim]).
//
// Keys: the RoPE-commutative codebook of section 4.2. The D/2 "pairs" are
// RoPE's rotation pairs (element 2i, 2i+1 of a head for interleaved RoPE or
// no RoPE, element i, i + head_dim/2 for half-split), numbered head-major.
// For each stage s < R and pair j there are Nc' = key_levels 2x2 matrices
// C[s][j][l] = [[x, y], [-y, x]], which commute with every rotation. A code
// (a, b) decodes pair j to the first row of C[a] plus the second row of
// C[b] (appendix A.1): (x_a - y_b, y_a + x_b). Consecutive groups of g =
// key_group_pairs pairs share one code, and the R stages are residual: the
// key is the sum of the R stages' decodings. Bits per token: R * (D/2/g) *
// 2 * log2(Nc'); per element: R * log2(Nc') / g (the paper's R log2 Nc'
// with its g = 64 = head_dim / 2 for Llama-3.1-8B's 128-dim heads).
// Keys are coded without RoPE: the codec un-rotates them by their position
// before encoding and rotates decoded keys back, which is exact because
// rotating a decoded key equals decoding with every C rotated (tests check
// this), the property that lets attention reuse (q R) C^T across tokens.
//
// Values: additive quantization (section 4.1): a token's value is coded as
// Nc = value_stages * value_stage_rows bits s and decoded as s @ C_V
// (C_V: Nc x D). The paper's learned encoder is NOT reproduced: the
// codebook is trained by residual k-means (core/calibration/commvq_train.h) in
// value_stages stages of value_stage_rows centroids, and the encoder picks
// per stage at most one row (or none) greedily on the residual, so at most
// one bit per stage is set. The decoder accepts any bit pattern.
//
// Exact arithmetic (float32, IEEE round to nearest, no fused multiply-add;
// sums in the order written, starting from 0):
//   key decode, pair j (elements e0, e1), stages s = 0..R-1 with code (a, b):
//     out[e0] += (x[s][j][a] - y[s][j][b]); out[e1] += (y[s][j][a] +
//     x[s][j][b])
//   key encode, per stage, per group of pairs j = j0..j0+g-1, residual r:
//     Na[l] = sum_j (x_l*x_l + y_l*y_l)      M2[a][b] = 2 * sum_j (y_a*x_b -
//     x_a*y_b) P[a]  = sum_j (r0*x_a + r1*y_a)        Q[b]     = sum_j (r1*x_b
//     - r0*y_b) score(a, b) = ((Na[a] - 2*P[a]) + (Na[b] - 2*Q[b])) + M2[a][b]
//       (= |r - c_ab|^2 - |r|^2); the smallest score wins, ties to the
//       smallest a * Nc' + b; then r0 -= (x_a - y_b), r1 -= (y_a + x_b).
//   value decode: out = 0; for n = 0..Nc-1 with bit n set: out[d] += C[n][d]
//   value encode, per stage m, residual r: score(k) = |C_k|^2 - 2 * (r . C_k)
//     with both sums over d in order; the smallest score below 0 wins (ties
//     to the smaller k; none when no score is below 0), then r -= C_k.
// Encoding is not expected to be bit-identical on a GPU that sums in
// another order (near-ties may pick another code); decoding is.
//
// Memory: CommVqCodebooks is a plain value. CommVqEncoder shares ownership
// of its codebooks and owns precomputed tables (num_layers * R * D/2/g *
// Nc'^2 + num_layers * Nc floats). Thread-safety: both immutable; all
// methods const and safe to call concurrently.
#ifndef KVHARBOR_CORE_CODEC_COMMVQ_COMMVQ_CODEBOOKS_H_
#define KVHARBOR_CORE_CODEC_COMMVQ_COMMVQ_CODEBOOKS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/codec/kvtc/kvtc_calibration.h"  // RopeStyle
#include "types/geometry.h"

namespace kvharbor {

inline constexpr uint32_t kCommVqMaxKeyLevels = 256;
inline constexpr uint32_t kCommVqMaxKeyStages = 64;
inline constexpr uint32_t kCommVqMaxValueStageRows = 4096;
inline constexpr uint32_t kCommVqMaxValueRows = 1u << 16;  // Nc
inline constexpr uint64_t kCommVqMaxArrayElements = uint64_t{1} << 31;
// Limit on CommVqEncoder's key tables.
inline constexpr uint64_t kCommVqMaxEncoderTableBytes = uint64_t{1} << 30;

struct CommVqConfig {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;  // even
  RopeStyle rope_style = RopeStyle::kNone;
  float rope_theta = 0.0f;        // > 0 with RoPE, 0 without
  uint32_t key_levels = 0;        // Nc': a power of two in [2, 256]
  uint32_t key_group_pairs = 0;   // g: divides D / 2
  uint32_t key_stages = 0;        // R in [1, 64]
  uint32_t value_stage_rows = 0;  // rows per value stage, [1, 4096]
  uint32_t value_stages = 0;      // Nc = stages * rows <= 65536

  uint32_t dim() const { return num_kv_heads * head_dim; }
  uint32_t pairs() const { return dim() / 2; }
  uint32_t key_groups() const { return pairs() / key_group_pairs; }
  uint32_t key_code_bits() const;  // log2(key_levels)
  uint32_t value_rows() const { return value_stages * value_stage_rows; }
  // Codes per token per layer: R * groups * 2.
  uint32_t key_codes() const { return key_stages * key_groups() * 2; }
  uint64_t key_bits_per_token() const {
    return uint64_t{key_codes()} * key_code_bits();
  }
  uint64_t value_bits_per_token() const { return value_rows(); }
  uint64_t key_floats() const {  // L * R * D/2 * Nc' * 2
    return uint64_t{num_layers} * key_stages * pairs() * key_levels * 2;
  }
  uint64_t value_floats() const {  // L * Nc * D
    return uint64_t{num_layers} * value_rows() * dim();
  }
  // Elements of a token's vector forming pair j.
  void PairElements(uint32_t j, uint32_t* e0, uint32_t* e1) const;

  // Every field in range (messages name "commvq.<field>").
  absl::Status Validate() const;
};

struct CommVqCodebooks {
  CommVqConfig config;
  // [layer][stage][pair][level][2]: (x, y) of [[x, y], [-y, x]].
  std::vector<float> key;
  // [layer][row][dim].
  std::vector<float> value;

  const float* key_at(uint32_t layer, uint32_t stage, uint32_t pair) const {
    const CommVqConfig& c = config;
    return key.data() +
           ((uint64_t{layer} * c.key_stages + stage) * c.pairs() + pair) *
               c.key_levels * 2;
  }
  const float* value_at(uint32_t layer, uint32_t row) const {
    return value.data() +
           (uint64_t{layer} * config.value_rows() + row) * config.dim();
  }

  // Config valid, array sizes match, every value finite.
  absl::Status Validate() const;
  // Same layers, heads and head_dim as `g`, and rope_theta equal when `g`
  // states one (g.rope_theta != 0). Messages name the field.
  absl::Status CheckGeometry(const Geometry& g) const;
  // XXH3-64 of the canonical file bytes before the checksum
  // (docs/commvq_format.md), computed without building them.
  uint64_t Fingerprint() const;
};

// Decoding, one token of one layer. `codes`: key_codes() values in
// [stage][group][a, b] order; `bits`: value_bits_per_token() bits,
// bit n at byte n / 8, bit n % 8.
void DecodeCommVqKey(const CommVqCodebooks& cb, uint32_t layer,
                     const uint16_t* codes, float* key);
void DecodeCommVqValue(const CommVqCodebooks& cb, uint32_t layer,
                       const uint8_t* bits, float* value);

// Rotating a decoded key by RoPE equals decoding with a rotated codebook:
// this returns `cb` with every (x, y) of pair j replaced by its rotation by
// the angle of pair j (cos/sin as from RopeCosSin for one position; pair j
// of head h uses index j - h * head_dim / 2).
CommVqCodebooks RotateCommVqKeyCodebook(const CommVqCodebooks& cb,
                                        const float* cos, const float* sin);

// ---- Building blocks of the encoder, shared with training (core/
// commvq_train.h) so both use exactly the arithmetic above.

// Na[level] and M2[a * Nc' + b] of one (layer, stage, group).
void CommVqKeyGroupTables(const CommVqCodebooks& cb, uint32_t layer,
                          uint32_t stage, uint32_t group, float* na, float* m2);
// Picks the code (a, b) of one group for residual `r` (D floats), subtracts
// its centre from `r`, and returns its score (|r - c|^2 - |r|^2 before the
// subtraction). `scratch`: 2 * Nc' floats; on return it holds Na[a] - 2P[a]
// at [0, Nc') and Na[b] - 2Q[b] at [Nc', 2Nc') (training's soft E-step
// reuses them).
float CommVqPickKeyCode(const CommVqCodebooks& cb, uint32_t layer,
                        uint32_t stage, uint32_t group, const float* na,
                        const float* m2, float* r, float* scratch, uint16_t* a,
                        uint16_t* b);
// Picks among `k` rows ([k][d], squared norms `norms`) the one to subtract
// from `r`, or none; subtracts it and returns its index, or -1.
int64_t CommVqPickValueRow(const float* rows, const float* norms, uint32_t k,
                           uint32_t d, float* r);

class CommVqEncoder {
 public:
  // Validates the codebooks and builds the score tables (ResourceExhausted
  // when they would exceed kCommVqMaxEncoderTableBytes).
  static absl::StatusOr<std::unique_ptr<CommVqEncoder>> Create(
      std::shared_ptr<const CommVqCodebooks> codebooks);

  const CommVqCodebooks& codebooks() const { return *cb_; }
  // Floats of scratch EncodeKey / EncodeValue need.
  size_t ScratchFloats() const;

  // `key`: D floats without RoPE. Writes key_codes() codes.
  void EncodeKey(uint32_t layer, const float* key, uint16_t* codes,
                 float* scratch) const;
  // Writes value_bits_per_token() bits (whole bytes, padding bits 0).
  void EncodeValue(uint32_t layer, const float* value, uint8_t* bits,
                   float* scratch) const;

 private:
  explicit CommVqEncoder(std::shared_ptr<const CommVqCodebooks> cb);
  const float* Na(uint32_t layer, uint32_t stage, uint32_t group) const;
  const float* M2(uint32_t layer, uint32_t stage, uint32_t group) const;

  std::shared_ptr<const CommVqCodebooks> cb_;
  std::vector<float> na_;        // [layer][stage][group][level]
  std::vector<float> m2_;        // [layer][stage][group][a][b]
  std::vector<float> row_norm_;  // [layer][row]: |C_V row|^2
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_COMMVQ_COMMVQ_CODEBOOKS_H_
