#include "core/codec/fixed_payload_codec.h"

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/codec/envelope.h"

namespace kvharbor {

absl::StatusOr<size_t> FixedPayloadCodec::MaxEncodedSize(
    size_t num_pages) const {
  return FixedPayloadEnvelopeBytes(num_pages, PagePayloadBytes());
}

absl::StatusOr<size_t> FixedPayloadCodec::EncodedSize(
    absl::Span<const PageRef> pages) const {
  KVH_RETURN_IF_ERROR(CheckPagesToEncode(pages));
  return MaxEncodedSize(pages.size());
}

absl::StatusOr<size_t> FixedPayloadCodec::CheckEncodeOut(
    absl::Span<const PageRef> pages, absl::Span<const uint8_t> out) const {
  KVH_ASSIGN_OR_RETURN(const size_t need, EncodedSize(pages));
  if (out.size() < need) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("out: %u bytes, encoding needs %u", out.size(), need));
  }
  return need;
}

}  // namespace kvharbor
