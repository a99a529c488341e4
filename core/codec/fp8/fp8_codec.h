// Fp8Codec ("fp8"): a calibration-free lossy page codec, the fallback a
// namespace with online calibration (core/calibration/online_calibration.h)
// stores evicted pages with until its KVTC calibration is ready. Every (kv,
// layer) block of a page is scaled by its own absolute maximum (a float32 per
// block: max|x| / 448) and stored as FP8 E4M3 (core/base/float_formats.h), so a
// page costs 1 byte per element plus 8 * num_layers bytes, whatever its
// dtype. Error bound per element: |x - x'| <= max|block| * 2^-4 (E4M3 has 3
// mantissa bits; subnormals sit below 2^-6 of the block maximum).
//
// Buffers use the common envelope (core/codec/envelope.h) with codec id
// kFp8, no row kind, no sections and calibration fingerprint 0. Payload: per
// page, the 2 * num_layers block scales (float32 LE, in page block order) and
// then the page's elements as E4M3 bytes in page order.
//
// Memory: the codec owns only its geometry; scratch comes from the caller's
// CodecWorkspace. Thread-safety: as Codec (immutable, const methods).
#ifndef KVHARBOR_CORE_CODEC_FP8_FP8_CODEC_H_
#define KVHARBOR_CORE_CODEC_FP8_FP8_CODEC_H_

#include <memory>

#include "absl/status/statusor.h"
#include "core/codec/codec.h"

namespace kvharbor {

inline constexpr char kFp8CodecName[] = "fp8";

// Registry factory; ignores any calibration in `params`.
absl::StatusOr<std::unique_ptr<Codec>> CreateFp8Codec(
    const CodecParams& params);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_FP8_FP8_CODEC_H_
