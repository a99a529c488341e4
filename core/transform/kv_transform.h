// Length-changing KV transforms: operations that turn a sequence's K and V
// into a DIFFERENT number of tokens (e.g. the KVCM compressor of
// core/transform/kvcm_compressor.h merges every f tokens into one). They are
// not page codecs: a Codec (core/codec/codec.h) reproduces the pages it was
// given, while a KvTransform's output is a new, shorter cache that attention
// must be run on as it is. Callers must treat the result as lossy and must
// store and match it by the length OutputTokens reports, never by the input's
// length.
//
// Tensors are float32, layout [2 (K then V)][layer][token][kv_head]
// [head_dim], contiguous, caller-owned (a transform owns only its
// configuration and weights). Transforms are immutable after creation;
// OutputTokens and Apply are const and may run concurrently.
#ifndef KVHARBOR_CORE_TRANSFORM_KV_TRANSFORM_H_
#define KVHARBOR_CORE_TRANSFORM_KV_TRANSFORM_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvharbor {

struct KvSequenceShape {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint64_t num_tokens = 0;

  uint64_t TokenElements() const { return uint64_t{num_kv_heads} * head_dim; }
  // Elements of the whole tensor (K and V).
  uint64_t Elements() const {
    return 2 * uint64_t{num_layers} * num_tokens * TokenElements();
  }
  // Offset of token 0 of layer `layer`'s K (kv = 0) or V (kv = 1).
  uint64_t BlockOffset(int kv, uint32_t layer) const {
    return (uint64_t(kv) * num_layers + layer) * num_tokens * TokenElements();
  }
};

struct KvSequenceView {
  KvSequenceShape shape;
  const float* data = nullptr;  // shape.Elements() floats
};

struct MutableKvSequenceView {
  KvSequenceShape shape;
  float* data = nullptr;  // shape.Elements() floats
};

class KvTransform {
 public:
  virtual ~KvTransform() = default;

  virtual absl::string_view name() const = 0;
  // Whether the output loses information (every transform so far does).
  virtual bool lossy() const = 0;
  // Whether the output may have fewer (or more) tokens than the input.
  virtual bool changes_length() const = 0;

  // Tokens Apply produces for `input_tokens` input tokens.
  virtual absl::StatusOr<uint64_t> OutputTokens(
      uint64_t input_tokens) const = 0;

  // Transforms `in` into `out`. out.shape must equal in.shape except
  // num_tokens, which must be OutputTokens(in.shape.num_tokens);
  // InvalidArgument (naming the field) otherwise. `in` and `out` must not
  // overlap.
  virtual absl::Status Apply(const KvSequenceView& in,
                             const MutableKvSequenceView& out) const = 0;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_TRANSFORM_KV_TRANSFORM_H_
