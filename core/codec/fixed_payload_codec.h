// FixedPayloadCodec: the base of the codecs whose every page encodes to a
// payload of the same size (identity, fp8, int8_c8, commvq). It sizes their
// envelopes from PagePayloadBytes() and implements Encode and Decode around
// the per-codec payload hooks: checks, envelope header, fingerprint check and
// optional zstd are the same for all of them. Holds the geometry and the zstd
// options;
// thread safety as Codec's (immutable after creation).
#ifndef KVHARBOR_CORE_CODEC_FIXED_PAYLOAD_CODEC_H_
#define KVHARBOR_CORE_CODEC_FIXED_PAYLOAD_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/codec/codec.h"

namespace kvharbor {

class FixedPayloadCodec : public Codec {
 public:
  // Raw (uncompressed) payload bytes of one page.
  virtual uint64_t PagePayloadBytes() const = 0;

  const Geometry& geometry() const final { return geometry_; }

  absl::StatusOr<size_t> MaxEncodedSize(size_t num_pages) const final;
  absl::StatusOr<size_t> EncodedSize(
      absl::Span<const PageRef> pages) const final;

  // Checks `pages` and `out`, writes the payloads (EncodePayload) into a
  // flat envelope and compresses it when the codec was made with zstd.
  absl::StatusOr<size_t> Encode(absl::Span<const PageRef> pages,
                                absl::Span<uint8_t> out,
                                CodecWorkspace* workspace) const final;
  // Checks the envelope against id(), geometry() and
  // calibration_fingerprint(), then DecodePayload on its raw payload.
  absl::Status Decode(absl::Span<const uint8_t> buffer,
                      absl::Span<const MutablePageRef> pages,
                      CodecWorkspace* workspace) const final;

 protected:
  // The geometry and zstd options of `params`.
  explicit FixedPayloadCodec(const CodecParams& params);

  // Writes the payload of each page, PagePayloadBytes() each and in order,
  // to `payload` (room for all of them). `ws` is never null.
  virtual absl::Status EncodePayload(absl::Span<const PageRef> pages,
                                     uint8_t* payload,
                                     CodecWorkspace* ws) const = 0;
  // Writes `pages` from `raw`, their payloads as EncodePayload wrote them;
  // fails (leaving the pages untouched where it can) on a corrupt payload.
  virtual absl::Status DecodePayload(absl::Span<const uint8_t> raw,
                                     absl::Span<const MutablePageRef> pages,
                                     CodecWorkspace* ws) const = 0;
  // What calibration_fingerprint() identifies, for a mismatch error.
  virtual const char* FingerprintSubject() const { return "calibration"; }

 private:
  Geometry geometry_;
  bool zstd_;
  int zstd_level_;
};

// A registry factory that creates CodecT (CodecT::Create(params,
// calibration)) over one fixed calibration, whatever the params' calibration
// bytes say (tests, tools; the default registry parses the bytes instead,
// core/codec/codec_calibrations.h).
template <typename CodecT, typename Calibration>
CodecRegistry::Factory FixedCalibrationFactory(
    std::shared_ptr<const Calibration> calibration) {
  return
      [calibration = std::move(calibration)](
          const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
        return CodecT::Create(params, calibration);
      };
}

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_FIXED_PAYLOAD_CODEC_H_
