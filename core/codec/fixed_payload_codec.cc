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

FixedPayloadCodec::FixedPayloadCodec(const CodecParams& params)
    : geometry_(params.geometry),
      zstd_(params.zstd),
      zstd_level_(params.zstd_level) {}

absl::StatusOr<size_t> FixedPayloadCodec::Encode(
    absl::Span<const PageRef> pages, absl::Span<uint8_t> out,
    CodecWorkspace* workspace) const {
  KVH_ASSIGN_OR_RETURN(const size_t need, EncodedSize(pages));
  if (out.size() < need) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("out: %u bytes, encoding needs %u", out.size(), need));
  }
  CodecWorkspace local;
  CodecWorkspace* ws = workspace != nullptr ? workspace : &local;
  KVH_RETURN_IF_ERROR(EncodePayload(
      pages, out.data() + kEnvelopeHeaderBytes + 8 * pages.size(), ws));
  EnvelopeHeader h;
  h.codec_id = id();
  h.geometry = geometry();
  h.calibration_fingerprint = calibration_fingerprint();
  return FinishEnvelope(h, pages, pages.size() * PagePayloadBytes(), zstd_,
                        zstd_level_, out, ws);
}

absl::Status FixedPayloadCodec::Decode(absl::Span<const uint8_t> buffer,
                                       absl::Span<const MutablePageRef> pages,
                                       CodecWorkspace* workspace) const {
  KVH_ASSIGN_OR_RETURN(
      const ParsedEnvelope env,
      ParseFlatEnvelope(buffer, id(), geometry(), pages,
                        calibration_fingerprint(), FingerprintSubject()));
  CodecWorkspace local;
  CodecWorkspace* ws = workspace != nullptr ? workspace : &local;
  KVH_ASSIGN_OR_RETURN(const absl::Span<const uint8_t> raw,
                       RawPayload(env, pages.size() * PagePayloadBytes(), ws));
  return DecodePayload(raw, pages, ws);
}

}  // namespace kvharbor
