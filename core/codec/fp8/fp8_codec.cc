#include "core/codec/fp8/fp8_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "core/base/float_formats.h"
#include "core/base/status_macros.h"
#include "core/codec/envelope.h"
#include "core/codec/fixed_payload_codec.h"
#include "core/codec/page_elements.h"

namespace kvharbor {
namespace {

class Fp8Codec final : public FixedPayloadCodec {
 public:
  explicit Fp8Codec(const CodecParams& p) : FixedPayloadCodec(p) {}

  CodecId id() const override { return CodecId::kFp8; }
  absl::string_view name() const override { return kFp8CodecName; }
  uint64_t PagePayloadBytes() const override {
    return Blocks() * (4 + BlockElements());
  }

 private:
  absl::Status EncodePayload(absl::Span<const PageRef> pages, uint8_t* payload,
                             CodecWorkspace* ws) const override {
    for (size_t i = 0; i < pages.size(); ++i) {
      KVH_RETURN_IF_ERROR(
          EncodePage(pages[i].data, i, ws, payload + i * PagePayloadBytes()));
    }
    return absl::OkStatus();
  }

  absl::Status DecodePayload(absl::Span<const uint8_t> raw,
                             absl::Span<const MutablePageRef> pages,
                             CodecWorkspace* ws) const override {
    // Check every scale before writing any page (a corrupt buffer leaves
    // the pages untouched).
    const size_t blocks = Blocks();
    for (size_t i = 0; i < pages.size(); ++i) {
      const uint8_t* p = raw.data() + i * PagePayloadBytes();
      for (size_t b = 0; b < blocks; ++b) {
        float scale;
        std::memcpy(&scale, p + 4 * b, 4);
        if (!std::isfinite(scale) || scale <= 0) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "buffer: page %u block %u has scale %g (must be finite, > 0)", i,
              b, scale));
        }
      }
    }
    for (size_t i = 0; i < pages.size(); ++i) {
      DecodePage(raw.data() + i * PagePayloadBytes(), ws, pages[i].data);
    }
    return absl::OkStatus();
  }

  size_t Blocks() const { return size_t{2} * geometry().num_layers; }
  size_t BlockElements() const {
    return size_t{geometry().page_size} * geometry().num_kv_heads *
           geometry().head_dim;
  }
  // Element offset of block b (kv-major numbering) in the page.
  uint64_t BlockOffset(size_t b) const {
    return PageBlockElementOffset(geometry(), static_cast<int>(b % 2),
                                  static_cast<uint32_t>(b / 2));
  }

  absl::Status EncodePage(const uint8_t* page, size_t index, CodecWorkspace* ws,
                          uint8_t* dst) const {
    const size_t n = BlockElements();
    const size_t es = DTypeSize(geometry().dtype);
    float* x = ws->Floats(0, n);
    uint8_t* elems = dst + 4 * Blocks();
    for (size_t b = 0; b < Blocks(); ++b) {
      LoadElements(geometry().dtype, page + BlockOffset(b) * es, n, x);
      const size_t bad = FirstNonFinite(x, n);
      if (bad != n) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "pages[%u]: element %u of block %u is not finite; fp8 cannot "
            "store it",
            index, bad, b));
      }
      float amax = 0;
      for (size_t e = 0; e < n; ++e) amax = std::max(amax, std::fabs(x[e]));
      const float scale = amax > 0 ? amax / kFp8E4M3Max : 1.0f;
      std::memcpy(dst + 4 * b, &scale, 4);
      uint8_t* q = elems + BlockOffset(b);
      for (size_t e = 0; e < n; ++e) q[e] = FloatToFp8E4M3(x[e] / scale);
    }
    return absl::OkStatus();
  }

  void DecodePage(const uint8_t* src, CodecWorkspace* ws, uint8_t* page) const {
    const size_t n = BlockElements();
    const size_t es = DTypeSize(geometry().dtype);
    float* x = ws->Floats(0, n);
    const uint8_t* elems = src + 4 * Blocks();
    for (size_t b = 0; b < Blocks(); ++b) {
      float scale;
      std::memcpy(&scale, src + 4 * b, 4);
      const uint8_t* q = elems + BlockOffset(b);
      for (size_t e = 0; e < n; ++e) x[e] = Fp8E4M3ToFloat(q[e]) * scale;
      StoreElements(geometry().dtype, x, n, page + BlockOffset(b) * es);
    }
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> CreateFp8Codec(
    const CodecParams& params) {
  KVH_RETURN_IF_ERROR(params.geometry.Validate());
  return std::unique_ptr<Codec>(new Fp8Codec(params));
}

}  // namespace kvharbor
