// Calibrations of the calibrated page codecs: what a namespace's
// calibration_path names, the canonical bytes a namespace stores (and
// GetCalibration serves, and CodecParams::calibration_bytes carries), and the
// registry factories that build each codec from those bytes.
//
//   codec    calibration_path                canonical bytes
//   kvtc     a KVTC calibration file         the same file format
//            (docs/kvtc_format.md) (core/codec/kvtc/kvtc_calibration.h)
//   int8_c8  an msmodelslim export directory a safetensors file holding the
//            (quant_model_description.json   four KV tensors of every layer
//            + quant_model_weight.           (F32, separate k_proj/v_proj
//            safetensors; core/              names) with the description JSON
//            msmodelslim_c8.h)               in __metadata__ under
//                                            kC8CalibrationDescriptionKey
//   commvq   a CommVQ codebook file          the same file format
//            (docs/commvq_format.md)
//
// Every reader and parser checks the whole calibration and its fit to the
// namespace geometry; errors say what is wrong (file, tensor, header field)
// and leave naming the spec field to the caller.
//
// Pure functions; thread-safe. Results are owned by the caller.
#ifndef KVHARBOR_CORE_CODEC_CODEC_CALIBRATIONS_H_
#define KVHARBOR_CORE_CODEC_CODEC_CALIBRATIONS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/codec/c8/int8_c8_codec.h"
#include "core/codec/codec.h"
#include "types/geometry.h"

namespace kvharbor {

// Key of the msmodelslim description JSON in an int8_c8 calibration's
// safetensors metadata.
inline constexpr char kC8CalibrationDescriptionKey[] =
    "quant_model_description";

// int8_c8 canonical bytes of `scales` (which must Validate()).
absl::StatusOr<std::string> SerializeC8Calibration(const C8Scales& scales);
// Parses int8_c8 canonical bytes for a namespace of `geometry` (the layer
// and channel counts the tensors must have).
absl::StatusOr<C8Scales> ParseC8Calibration(absl::Span<const uint8_t> bytes,
                                            const Geometry& geometry);

// Registry factories: the codec from params.calibration_bytes (kvtc: or
// from params.calibration when set).
absl::StatusOr<std::unique_ptr<Codec>> CreateKvtcCodecFromParams(
    const CodecParams& params);
absl::StatusOr<std::unique_ptr<Codec>> CreateInt8C8CodecFromParams(
    const CodecParams& params);
absl::StatusOr<std::unique_ptr<Codec>> CreateCommVqCodecFromParams(
    const CodecParams& params);

// Registry calibration readers (CodecRegistry::CalibrationReader).
absl::StatusOr<std::string> ReadKvtcCalibrationForCodec(
    const std::string& path, const Geometry& geometry);
absl::StatusOr<std::string> ReadC8CalibrationForCodec(const std::string& path,
                                                      const Geometry& geometry);
absl::StatusOr<std::string> ReadCommVqCalibrationForCodec(
    const std::string& path, const Geometry& geometry);

// Registers kvtc, int8_c8 and commvq (factory and reader) in `registry`.
void RegisterCalibratedCodecs(CodecRegistry* registry);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_CODEC_CALIBRATIONS_H_
