// KvcmCompressor: the KVCM token-merging compressor (weights: core/
// kvcm_format.h, shared/seeds/000) as a CPU KvTransform. LOSSY and
// LENGTH-CHANGING: the output has fewer tokens than the input.
//
// For every layer, K and V separately, and every KV head, the sequence is
// cut into an image segment (the first `image_tokens` tokens) and a text
// segment (the rest). Within a segment of n tokens, m = n / f groups of
// f = compression_factor consecutive tokens are each concatenated into one
// f * head_dim row (token-major: row[j * head_dim + d] = token j's dim d),
// passed through Linear, ReLU, Linear, ReLU, Linear (the prefix's three
// blocks: compress_tk / compress_tv for text K / V, compress_ik /
// compress_iv for image K / V) and become one token; the n mod f tail tokens
// follow unchanged. When m < min_seq_len the segment is left as it is, and
// an image segment is left as it is when the file is text-only. The output
// is the image segment's result followed by the text segment's, so its
// length is OutputTokens(n) = out(image) + out(text), out(n) = n when left
// alone, else m + n mod f. This is InfiniLM's compress_inplace order and
// arithmetic, in float32 (InfiniLM computes in the cache dtype).
//
// Arithmetic: y = relu(W0 x + b0), z = relu(W1 y + b1), o = W2 z + b2 in
// float32, matrix products by OpenBLAS cblas_sgemm (summation order is
// BLAS's, so a GPU version matches to a relative tolerance, not bit for
// bit; tests/core/transform/kvcm_test.cc checks against plain loops at 1e-4).
//
// Memory: shares ownership of its immutable weights; Apply allocates
// scratch for at most kKvcmChunkRows rows at a time. Thread-safe (const).
#ifndef KVHARBOR_CORE_TRANSFORM_KVCM_COMPRESSOR_H_
#define KVHARBOR_CORE_TRANSFORM_KVCM_COMPRESSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/transform/kv_transform.h"
#include "core/transform/kvcm_format.h"

namespace kvharbor {

inline constexpr size_t kKvcmChunkRows = 1024;

struct KvcmCompressorOptions {
  // Leading image tokens of every sequence (0 = all text).
  uint64_t image_tokens = 0;
};

class KvcmCompressor final : public KvTransform {
 public:
  // Checks that the weights Validate() and fit the model: num_layers and
  // head_dim equal, num_kv_heads >= 1 (the header's num_heads is optional
  // and not compared: it may count attention heads).
  static absl::StatusOr<std::unique_ptr<KvcmCompressor>> Create(
      std::shared_ptr<const KvcmWeights> weights, uint32_t num_layers,
      uint32_t num_kv_heads, uint32_t head_dim,
      KvcmCompressorOptions options = {});

  absl::string_view name() const override { return "kvcm"; }
  bool lossy() const override { return true; }
  bool changes_length() const override { return true; }
  absl::StatusOr<uint64_t> OutputTokens(uint64_t input_tokens) const override;
  absl::Status Apply(const KvSequenceView& in,
                     const MutableKvSequenceView& out) const override;

  const KvcmWeights& weights() const { return *weights_; }

 private:
  KvcmCompressor(std::shared_ptr<const KvcmWeights> w, uint32_t num_layers,
                 uint32_t num_kv_heads, uint32_t head_dim,
                 KvcmCompressorOptions options);
  uint64_t SegmentOutput(uint64_t n, bool has_mlp) const;
  // Writes one segment of one (kv, layer) block; returns tokens written.
  uint64_t CompressSegment(const float* src, uint64_t n, uint32_t layer,
                           KvcmPrefix prefix, bool has_mlp, float* dst) const;

  std::shared_ptr<const KvcmWeights> weights_;
  uint32_t num_layers_;
  uint32_t num_kv_heads_;
  uint32_t head_dim_;
  KvcmCompressorOptions options_;
};

// The MLP of `prefix` in `layer` on `rows` rows: in [rows][f * head_dim],
// out [rows][head_dim] (rows < 2^31; scratch of rows * (h1 + h2) floats).
// Exposed for tests and for comparing a GPU implementation.
void KvcmMlpForward(const KvcmWeights& weights, uint32_t layer,
                    KvcmPrefix prefix, const float* in, size_t rows,
                    float* out);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_TRANSFORM_KVCM_COMPRESSOR_H_
