// Measuring KV-cache codecs on a real model's cache (tools/llama2c_model.h):
// round trips of whole sequences' caches through page codecs (identity,
// int8-c8, KVTC, CommVQ: every page its own buffer, as the store evicts
// them, bytes counted from the encoded buffers), through a KIVI-style 2-bit
// quantizer and through an NVFP4-style 4-bit one, then the metrics of
// docs/kv_quality.md: bytes per token, K and V relative error,
// attention-output relative error, teacher-forced loss with the history
// replaced by the decoded cache, and top-1 agreement with the clean model.
//
// Memory: everything is owned by the returned values. Thread-compatible.
#ifndef KVHARBOR_TOOLS_KV_QUALITY_H_
#define KVHARBOR_TOOLS_KV_QUALITY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/calibration/commvq_train.h"
#include "core/calibration/kv_samples.h"
#include "core/codec/c8/int8_c8_codec.h"
#include "core/codec/codec.h"
#include "core/codec/commvq/commvq_codebooks.h"
#include "tools/llama2c_model.h"

namespace kvharbor {

// One sequence: its tokens and its clean trace (cache [T][L][kv_dim]).
struct KvSequence {
  std::vector<int> tokens;
  Llama2cTrace clean;
};

// Decoded caches (same layout as the clean ones) and the bytes they cost.
struct DecodedCaches {
  std::vector<std::vector<float>> k, v;
  uint64_t bytes = 0;
};

struct QualityRow {
  std::string codec;
  double bytes_per_token = 0;
  double ratio_vs_bf16 = 0;
  double k_rel_error = 0;
  double v_rel_error = 0;
  double attn_rel_error = 0;
  double loss = 0;  // nats per predicted token
  // Fraction of predicted positions whose most likely next token is the
  // clean model's.
  double top1_agreement = 0;
};

// Geometry of the model's cache as pages.
Geometry ModelGeometry(const Llama2cConfig& c, uint32_t page_size, DType dtype);

// Encodes every page of `seqs` as its own buffer with `codec` (the store's
// eviction) and decodes it; bytes are the buffers' sizes. A last partial
// page is padded by repeating the sequence's last token (the padding's
// bytes are counted).
absl::StatusOr<DecodedCaches> RoundTripPages(
    const Codec& codec, const std::vector<const KvSequence*>& seqs);

// KIVI-style 2-bit: keys per channel over groups of `group` tokens, values
// per token over groups of `group` channels, min and scale stored as fp16
// (4 bytes per group), 2-bit codes packed per group. No full-precision
// residual window.
DecodedCaches KiviRoundTrip(const std::vector<const KvSequence*>& seqs,
                            const Llama2cConfig& c, int group);

// NVFP4-style 4-bit (TensorRT-LLM's FP4 KV cache): FP4 E2M1 values, one
// FP8 E4M3 scale per 16 consecutive elements of a token's head vectors,
// and one float32 scale per (sequence, layer, K or V) tensor that maps the
// tensor's largest magnitude to 448 * 6. Bytes: 4 bits per element, 1 per
// 16 elements, 4 per tensor.
DecodedCaches Nvfp4RoundTrip(const std::vector<const KvSequence*>& seqs,
                             const Llama2cConfig& c);
// Rounds to the nearest FP4 E2M1 value (+-{0, 0.5, 1, 1.5, 2, 3, 4, 6},
// saturating; ties to the even code).
float RoundToE2M1(float v);

// Per-channel int8 scales covering each channel's range (and 0) over `seqs`.
std::shared_ptr<const C8Scales> FitC8Scales(
    const std::vector<const KvSequence*>& seqs, const Llama2cConfig& c);

// A CommVQ setting at `bits` bits per element for K and for V on the
// model's cache (paper's choices where the shape allows): keys g = head_dim
// / 2 pairs per code (one code pair per head and stage), Nc' = 16 levels,
// R = bits * g / 4 stages; values Nc = bits * kv_dim rows in stages of
// `value_stage_rows` (residual k-means, core/calibration/commvq_train.h).
// InvalidArgument when bits * g is not a multiple of 4 or Nc of
// value_stage_rows.
absl::StatusOr<CommVqConfig> CommVqSetting(const Llama2cConfig& c,
                                           uint32_t bits,
                                           uint32_t value_stage_rows);

// Trains CommVQ codebooks on `seqs`' clean caches with the core's training
// (keys with RoPE removed at their positions; interleaved RoPE, theta
// 10000, as llama2.c).
absl::StatusOr<std::shared_ptr<const CommVqCodebooks>> TrainCommVq(
    const std::vector<const KvSequence*>& seqs, const CommVqConfig& config,
    const CommVqTrainOptions& options);

// Every metric of one codec on `seqs` (bytes per token over real tokens).
absl::StatusOr<QualityRow> Evaluate(const std::string& name,
                                    const Llama2cModel& model,
                                    const std::vector<const KvSequence*>& seqs,
                                    const DecodedCaches& decoded);

// Samples (format of core/calibration/kv_samples.h) from the sequences' clean
// caches.
KvSamples SamplesFrom(const std::vector<const KvSequence*>& seqs,
                      const Llama2cConfig& c);

}  // namespace kvharbor

#endif  // KVHARBOR_TOOLS_KV_QUALITY_H_
