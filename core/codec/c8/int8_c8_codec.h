// Int8 KV-cache quantization with per-channel scale and offset ("C8", as
// produced by msmodelslim; loader in core/codec/c8/msmodelslim_c8.h) and the
// "int8_c8" page codec built on it.
//
// Exact arithmetic (the reference a GPU kernel must match bit for bit; all
// float32, IEEE round-to-nearest-even, no fused multiply-add):
//   quantize:   t = x / scale + offset            (a division, then an add)
//               r = nearbyint(t)                  (ties to even, as torch.round
//                                                  and __float2int_rn)
//               q = clamp(r, -128, 127)           (saturation, done in float)
//   dequantize: y = ((float)q - offset) * scale   (a subtract, then a multiply)
// scale and offset are per (K or V, layer, channel), channel = kv_head *
// head_dim + dim. For |t| within [-128.5, 127.5) the round trip error is at
// most scale / 2 (plus float rounding of a few ulps); values beyond saturate.
//
// The codec's buffer is the common envelope (core/codec/envelope.h)
// with codec id kCodecIdInt8C8 and calibration_fingerprint =
// C8Scales::Fingerprint(), then a raw payload of one int8 per page element,
// pages in batch order, each page's elements in the page's own order (layout
// and all). Optional zstd as in the envelope. Non-finite input values are
// refused (InvalidArgument naming page, K/V, layer, token and channel): an int8
// code cannot represent them.
//
// Memory: C8Scales is a plain value; the codec shares ownership of its
// (immutable) scales. Thread-safety: as Codec (const methods; one
// CodecWorkspace per thread).
#ifndef KVHARBOR_CORE_CODEC_C8_INT8_C8_CODEC_H_
#define KVHARBOR_CORE_CODEC_C8_INT8_C8_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/codec/codec.h"
#include "core/codec/fixed_payload_codec.h"
#include "types/geometry.h"

namespace kvharbor {

// Envelope codec id of "int8_c8". Pending its enumerator in core/codec/codec.h
// (CodecId::kInt8C8 = 3); the value is fixed.
inline constexpr CodecId kCodecIdInt8C8 = static_cast<CodecId>(3);
// The same name as CodecIdName(CodecId::kInt8C8), so a namespace's codec
// and its buffers' envelope agree.
inline constexpr char kInt8C8CodecName[] = "int8_c8";

inline constexpr float kC8Min = -128.0f;
inline constexpr float kC8Max = 127.0f;

// A scale must be finite and > 0; an offset finite and within [-128, 127]
// (msmodelslim's int8 is signed).
inline bool ValidC8Scale(float s) { return s > 0.0f && s <= 3.4028235e38f; }
inline bool ValidC8Offset(float o) { return o >= kC8Min && o <= kC8Max; }

struct C8Scales {
  uint32_t num_layers = 0;
  uint32_t kv_channels = 0;  // num_kv_heads * head_dim
  // [layer][channel] each.
  std::vector<float> k_scale;
  std::vector<float> k_offset;
  std::vector<float> v_scale;
  std::vector<float> v_offset;
  // From the description file; informational.
  std::string model_quant_type;

  const float* scale(int kv, uint32_t layer) const {
    return (kv == 0 ? k_scale : v_scale).data() + uint64_t{layer} * kv_channels;
  }
  const float* offset(int kv, uint32_t layer) const {
    return (kv == 0 ? k_offset : v_offset).data() +
           uint64_t{layer} * kv_channels;
  }

  // Sizes match; every scale finite and > 0; every offset finite and within
  // [-128, 127]. Messages name the array, layer and channel.
  absl::Status Validate() const;
  // Same layers and kv_channels as `g`; messages name the field.
  absl::Status CheckGeometry(const Geometry& g) const;
  // XXH3-64 over the dimensions and the four arrays (not the quant type).
  uint64_t Fingerprint() const;
};

// The reference arithmetic above, one element and one run of channels.
int8_t QuantizeC8(float x, float scale, float offset);
float DequantizeC8(int8_t q, float scale, float offset);
void QuantizeC8Run(const float* x, const float* scale, const float* offset,
                   size_t n, int8_t* out);
void DequantizeC8Run(const int8_t* q, const float* scale, const float* offset,
                     size_t n, float* out);

class Int8C8Codec final : public FixedPayloadCodec {
 public:
  // Checks the geometry and the scales against it; computes the
  // fingerprint once. All page dtypes and layouts are supported.
  static absl::StatusOr<std::unique_ptr<Int8C8Codec>> Create(
      const CodecParams& params, std::shared_ptr<const C8Scales> scales);

  CodecId id() const override { return kCodecIdInt8C8; }
  absl::string_view name() const override { return kInt8C8CodecName; }
  const C8Scales& scales() const { return *scales_; }
  uint64_t calibration_fingerprint() const override { return fingerprint_; }
  uint64_t PagePayloadBytes() const override {
    return geometry().ElementsPerPage();
  }

 private:
  Int8C8Codec(const CodecParams& params, std::shared_ptr<const C8Scales> s);

  absl::Status EncodePayload(absl::Span<const PageRef> pages, uint8_t* payload,
                             CodecWorkspace* ws) const override;
  absl::Status DecodePayload(absl::Span<const uint8_t> raw,
                             absl::Span<const MutablePageRef> pages,
                             CodecWorkspace* ws) const override;
  const char* FingerprintSubject() const override { return "C8 scales"; }

  std::shared_ptr<const C8Scales> scales_;
  uint64_t fingerprint_;
};

// A registry factory bound to `scales` (tests, tools). The default registry
// instead parses CodecParams::calibration_bytes
// (core/codec/codec_calibrations.h).
CodecRegistry::Factory Int8C8CodecFactory(
    std::shared_ptr<const C8Scales> scales);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_C8_INT8_C8_CODEC_H_
