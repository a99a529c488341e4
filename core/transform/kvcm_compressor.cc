#include "core/transform/kvcm_compressor.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "types/geometry.h"

namespace kvharbor {
namespace {

// y[rows][lin.rows] = x[rows][lin.cols] * W^T + b, then ReLU when `relu`.
void LinearForward(const KvcmLinear& lin, const float* x, size_t rows,
                   bool relu, float* y) {
  const int m = static_cast<int>(rows);
  const int n = static_cast<int>(lin.rows);
  const int k = static_cast<int>(lin.cols);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k,
              lin.weight.data(), k, 0.0f, y, n);
  for (size_t r = 0; r < rows; ++r) {
    float* row = y + r * lin.rows;
    if (!lin.bias.empty()) {
      for (uint32_t i = 0; i < lin.rows; ++i) row[i] += lin.bias[i];
    }
    if (relu) {
      for (uint32_t i = 0; i < lin.rows; ++i) row[i] = std::max(row[i], 0.0f);
    }
  }
}

}  // namespace

void KvcmMlpForward(const KvcmWeights& weights, uint32_t layer,
                    KvcmPrefix prefix, const float* in, size_t rows,
                    float* out) {
  const KvcmLinear& l0 = weights.linear(layer, prefix, 0);
  const KvcmLinear& l1 = weights.linear(layer, prefix, 1);
  const KvcmLinear& l2 = weights.linear(layer, prefix, 2);
  std::vector<float> h0(rows * l0.rows), h1(rows * l1.rows);
  LinearForward(l0, in, rows, true, h0.data());
  LinearForward(l1, h0.data(), rows, true, h1.data());
  LinearForward(l2, h1.data(), rows, false, out);
}

KvcmCompressor::KvcmCompressor(std::shared_ptr<const KvcmWeights> w,
                               uint32_t num_layers, uint32_t num_kv_heads,
                               uint32_t head_dim, KvcmCompressorOptions options)
    : weights_(std::move(w)),
      num_layers_(num_layers),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      options_(options) {}

absl::StatusOr<std::unique_ptr<KvcmCompressor>> KvcmCompressor::Create(
    std::shared_ptr<const KvcmWeights> weights, uint32_t num_layers,
    uint32_t num_kv_heads, uint32_t head_dim, KvcmCompressorOptions options) {
  if (weights == nullptr) {
    return absl::InvalidArgumentError("kvcm: weights: missing");
  }
  KVH_RETURN_IF_ERROR(weights->Validate());
  if (num_layers != weights->header.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kvcm: num_layers: the model has %u, the weights %u",
                        num_layers, weights->header.num_layers));
  }
  if (head_dim != weights->EffectiveHeadDim()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kvcm: head_dim: the model has %u, the weights %u",
                        head_dim, weights->EffectiveHeadDim()));
  }
  if (num_kv_heads == 0 || num_kv_heads > kMaxKvHeads) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kvcm: num_kv_heads: %u is out of range [1, %u]",
                        num_kv_heads, kMaxKvHeads));
  }
  return std::unique_ptr<KvcmCompressor>(new KvcmCompressor(
      std::move(weights), num_layers, num_kv_heads, head_dim, options));
}

uint64_t KvcmCompressor::SegmentOutput(uint64_t n, bool has_mlp) const {
  const uint64_t f = weights_->header.compression_factor;
  if (!has_mlp || n / f < weights_->header.min_seq_len) return n;
  return n / f + n % f;
}

absl::StatusOr<uint64_t> KvcmCompressor::OutputTokens(uint64_t n) const {
  const uint64_t image = std::min(options_.image_tokens, n);
  return SegmentOutput(image, weights_->has_image()) +
         SegmentOutput(n - image, true);
}

uint64_t KvcmCompressor::CompressSegment(const float* src, uint64_t n,
                                         uint32_t layer, KvcmPrefix prefix,
                                         bool has_mlp, float* dst) const {
  const uint64_t te = uint64_t{num_kv_heads_} * head_dim_;
  const uint64_t f = weights_->header.compression_factor;
  if (SegmentOutput(n, has_mlp) == n) {
    // An empty sequence may come with null pointers; memcpy must not see them.
    if (n != 0) std::memcpy(dst, src, n * te * sizeof(float));
    return n;
  }
  const uint64_t groups = n / f;
  const uint64_t row_len = f * head_dim_;
  // Rows are (group, head), group-major, so the MLP's output rows are
  // already in [token][kv_head][head_dim] order.
  const uint64_t rows = groups * num_kv_heads_;
  std::vector<float> x(std::min<uint64_t>(rows, kKvcmChunkRows) * row_len);
  for (uint64_t r0 = 0; r0 < rows; r0 += kKvcmChunkRows) {
    const uint64_t count = std::min<uint64_t>(kKvcmChunkRows, rows - r0);
    for (uint64_t r = 0; r < count; ++r) {
      const uint64_t g = (r0 + r) / num_kv_heads_;
      const uint64_t h = (r0 + r) % num_kv_heads_;
      for (uint64_t j = 0; j < f; ++j) {
        std::memcpy(x.data() + r * row_len + j * head_dim_,
                    src + (g * f + j) * te + h * head_dim_,
                    head_dim_ * sizeof(float));
      }
    }
    KvcmMlpForward(*weights_, layer, prefix, x.data(), count,
                   dst + r0 * head_dim_);
  }
  const uint64_t tail = n - groups * f;
  std::memcpy(dst + groups * te, src + groups * f * te,
              tail * te * sizeof(float));
  return groups + tail;
}

absl::Status KvcmCompressor::Apply(const KvSequenceView& in,
                                   const MutableKvSequenceView& out) const {
  const KvSequenceShape& s = in.shape;
  if (s.num_layers != num_layers_ || s.num_kv_heads != num_kv_heads_ ||
      s.head_dim != head_dim_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "in.shape: %u layers x %u kv heads x %u dims, but the compressor is "
        "for %u x %u x %u",
        s.num_layers, s.num_kv_heads, s.head_dim, num_layers_, num_kv_heads_,
        head_dim_));
  }
  const KvSequenceShape& o = out.shape;
  KVH_ASSIGN_OR_RETURN(const uint64_t want, OutputTokens(s.num_tokens));
  if (o.num_layers != s.num_layers || o.num_kv_heads != s.num_kv_heads ||
      o.head_dim != s.head_dim || o.num_tokens != want) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "out.shape: %u layers x %u kv heads x %u dims x %u tokens, want %u "
        "tokens of the input's shape",
        o.num_layers, o.num_kv_heads, o.head_dim, o.num_tokens, want));
  }
  if ((s.num_tokens > 0 && in.data == nullptr) ||
      (want > 0 && out.data == nullptr)) {
    return absl::InvalidArgumentError("in.data / out.data: is null");
  }
  const uint64_t te = s.TokenElements();
  const uint64_t image = std::min(options_.image_tokens, s.num_tokens);
  for (int kv = 0; kv < 2; ++kv) {
    const KvcmPrefix image_prefix =
        kv == 0 ? KvcmPrefix::kImageKey : KvcmPrefix::kImageValue;
    const KvcmPrefix text_prefix =
        kv == 0 ? KvcmPrefix::kTextKey : KvcmPrefix::kTextValue;
    for (uint32_t l = 0; l < num_layers_; ++l) {
      const float* src = in.data + s.BlockOffset(kv, l);
      float* dst = out.data + o.BlockOffset(kv, l);
      const uint64_t written = CompressSegment(src, image, l, image_prefix,
                                               weights_->has_image(), dst);
      CompressSegment(src + image * te, s.num_tokens - image, l, text_prefix,
                      true, dst + written * te);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvharbor
