// KvtcCodec: the CPU reference of KV Cache Transform Coding (arXiv
// 2511.01815; spec in shared/seeds/002). Encode gathers the pages' K and V,
// undoes RoPE on keys (if the calibration says so), subtracts the calibrated
// mean, projects onto the PCA basis with cblas_sgemm (one per diagonal block
// of a block-diagonal basis), quantizes each range of
// components (FP8 E4M3 or IntX with per-row min/max), keeps attention-sink
// tokens in FP8, and optionally runs zstd over the result. Decode reverses
// every step and scatters into the caller's pages. The buffer format is in
// core/codec/kvtc/kvtc_format.h and docs/kvtc_format.md.
//
// This is also what the daemon runs where there is no GPU, and what the CUDA
// codec in cuda/ is tested against: both produce and accept the same bytes.
//
// Memory: the codec shares ownership of its (immutable) calibration; scratch
// comes from the caller's CodecWorkspace (about 2 * rows * (features +
// components) floats for a batch). Thread-safety: as Codec (const methods,
// one workspace per thread).
#ifndef KVHARBOR_CORE_CODEC_KVTC_KVTC_CODEC_H_
#define KVHARBOR_CORE_CODEC_KVTC_KVTC_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/codec/codec.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/codec/kvtc/kvtc_format.h"
#include "types/geometry.h"

namespace kvharbor {

class KvtcCodec final : public Codec {
 public:
  // Validates the calibration, checks it against the geometry (dims and
  // rope_theta), and computes its fingerprint once. dtype may be bf16, fp16,
  // fp32 or fp8_e4m3; both page layouts are supported.
  static absl::StatusOr<std::unique_ptr<KvtcCodec>> Create(
      const CodecParams& params);

  CodecId id() const override { return CodecId::kKvtc; }
  absl::string_view name() const override { return "kvtc"; }
  const Geometry& geometry() const override { return geometry_; }
  const KvtcCalibration& calibration() const { return *calibration_; }
  uint64_t calibration_fingerprint() const override { return fingerprint_; }
  CalibrationEstimate calibration_estimate() const override;

  absl::StatusOr<size_t> MaxEncodedSize(size_t num_pages) const override;
  absl::StatusOr<size_t> EncodedSize(
      absl::Span<const PageRef> pages) const override;
  // Fails with InvalidArgument when the batch holds a non-finite value (or a
  // projected coefficient overflows float): KVTC cannot represent it.
  absl::StatusOr<size_t> Encode(absl::Span<const PageRef> pages,
                                absl::Span<uint8_t> out,
                                CodecWorkspace* workspace) const override;
  absl::Status Decode(absl::Span<const uint8_t> buffer,
                      absl::Span<const MutablePageRef> pages,
                      CodecWorkspace* workspace) const override;

  // Layout of the raw payload for pages at these first positions.
  absl::StatusOr<KvtcPayloadLayout> PayloadLayout(
      absl::Span<const uint64_t> first_positions) const;

 private:
  KvtcCodec(const CodecParams& params, uint64_t fingerprint);

  Geometry geometry_;
  std::shared_ptr<const KvtcCalibration> calibration_;
  uint64_t fingerprint_;
  bool zstd_;
  int zstd_level_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_KVTC_KVTC_CODEC_H_
