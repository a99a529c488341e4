// CommVqCodec: the "commvq" page codec, the CPU reference of CommVQ (codebooks
// and arithmetic: core/codec/commvq/commvq_codebooks.h; codebook file:
// docs/commvq_format.md).
//
// Buffer: the common envelope (core/codec/envelope.h) with codec id
// kCodecIdCommVq and calibration_fingerprint = CommVqCodebooks::
// Fingerprint(), then (optionally zstd-compressed) a raw payload of, for
// each page in batch order, for each layer:
//   page_size key records  of KeyRecordBytes()   bytes, token order, then
//   page_size value records of ValueRecordBytes() bytes, token order.
// A key record packs the token's key_codes() codes, [stage][group][a, b],
// each log2(key_levels) bits, LSB-first into consecutive bytes; a value
// record is the token's value_rows() bits (bit n at byte n / 8, bit n % 8).
// Unused bits of a record's last byte are 0 (Decode refuses others).
//
// Encode converts each token's K (or V) run of the page to float32, refuses
// non-finite values (InvalidArgument naming page, layer, token), removes
// RoPE from keys at their absolute positions (the codebook's rope_style and
// rope_theta; cos/sin as RopeCosSin), and codes them; Decode decodes,
// re-applies RoPE and rounds to the page dtype. Lossy.
//
// Memory: the codec shares its codebooks and owns a CommVqEncoder (tables of
// about num_layers * R * D/2/g * Nc'^2 floats). Scratch from the caller's
// CodecWorkspace. Thread-safety: as Codec.
#ifndef KVHARBOR_CORE_CODEC_COMMVQ_COMMVQ_CODEC_H_
#define KVHARBOR_CORE_CODEC_COMMVQ_COMMVQ_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/codec/codec.h"
#include "core/codec/commvq/commvq_codebooks.h"
#include "core/codec/fixed_payload_codec.h"
#include "types/geometry.h"

namespace kvharbor {

// Envelope codec id of "commvq". Pending its enumerator in core/codec/codec.h
// (CodecId::kCommVq = 4); the value is fixed.
inline constexpr CodecId kCodecIdCommVq = static_cast<CodecId>(4);
inline constexpr char kCommVqCodecName[] = "commvq";

class CommVqCodec final : public FixedPayloadCodec {
 public:
  // Validates the geometry, the codebooks and their fit (CheckGeometry),
  // and builds the encoder tables. All page dtypes and layouts.
  static absl::StatusOr<std::unique_ptr<CommVqCodec>> Create(
      const CodecParams& params,
      std::shared_ptr<const CommVqCodebooks> codebooks);

  CodecId id() const override { return kCodecIdCommVq; }
  absl::string_view name() const override { return kCommVqCodecName; }
  const CommVqCodebooks& codebooks() const { return encoder_->codebooks(); }
  uint64_t calibration_fingerprint() const override { return fingerprint_; }

  uint64_t KeyRecordBytes() const { return key_record_bytes_; }
  uint64_t ValueRecordBytes() const { return value_record_bytes_; }
  // Raw payload bytes per page.
  uint64_t PagePayloadBytes() const override;

 private:
  CommVqCodec(const CodecParams& params, std::unique_ptr<CommVqEncoder> e);
  absl::Status EncodePayload(absl::Span<const PageRef> pages, uint8_t* payload,
                             CodecWorkspace* ws) const override;
  absl::Status DecodePayload(absl::Span<const uint8_t> raw,
                             absl::Span<const MutablePageRef> pages,
                             CodecWorkspace* ws) const override;
  const char* FingerprintSubject() const override { return "codebooks"; }
  // Checks the unused bits of every record of a raw payload.
  absl::Status CheckPadding(absl::Span<const uint8_t> raw,
                            size_t num_pages) const;

  std::unique_ptr<CommVqEncoder> encoder_;
  uint64_t fingerprint_;
  uint64_t key_record_bytes_;
  uint64_t value_record_bytes_;
};

// A registry factory bound to `codebooks` (tests, tools). The default
// registry instead parses CodecParams::calibration_bytes
// (core/codec/codec_calibrations.h).
CodecRegistry::Factory CommVqCodecFactory(
    std::shared_ptr<const CommVqCodebooks> codebooks);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_COMMVQ_COMMVQ_CODEC_H_
