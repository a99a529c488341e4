// FixedPayloadCodec: the base of the codecs whose every page encodes to a
// payload of the same size (identity, fp8, int8_c8, commvq). It sizes their
// envelopes from PagePayloadBytes() and holds the checks their Encode
// begins with. No state of its own; thread safety as Codec's (immutable
// after creation).
#ifndef KVHARBOR_CORE_CODEC_FIXED_PAYLOAD_CODEC_H_
#define KVHARBOR_CORE_CODEC_FIXED_PAYLOAD_CODEC_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/codec/codec.h"

namespace kvharbor {

class FixedPayloadCodec : public Codec {
 public:
  // Raw (uncompressed) payload bytes of one page.
  virtual uint64_t PagePayloadBytes() const = 0;

  absl::StatusOr<size_t> MaxEncodedSize(size_t num_pages) const final;
  absl::StatusOr<size_t> EncodedSize(
      absl::Span<const PageRef> pages) const final;

 protected:
  // Checks `pages` (CheckPagesToEncode) and that `out` holds their encoding;
  // returns its size without compression. RESOURCE_EXHAUSTED naming `out`.
  absl::StatusOr<size_t> CheckEncodeOut(absl::Span<const PageRef> pages,
                                        absl::Span<const uint8_t> out) const;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_FIXED_PAYLOAD_CODEC_H_
