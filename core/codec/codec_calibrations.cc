#include "core/codec/codec_calibrations.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/byte_io.h"
#include "core/base/safetensors.h"
#include "core/base/status_macros.h"
#include "core/codec/c8/msmodelslim_c8.h"
#include "core/codec/commvq/commvq_codebooks.h"
#include "core/codec/commvq/commvq_codec.h"
#include "core/codec/commvq/commvq_format.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/codec/kvtc/kvtc_codec.h"

namespace kvharbor {

namespace {

absl::StatusOr<uint32_t> KvChannels(const Geometry& g) {
  const uint64_t channels = uint64_t{g.num_kv_heads} * g.head_dim;
  if (channels == 0 || channels > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "geometry: num_kv_heads * head_dim = %u is out of range", channels));
  }
  return static_cast<uint32_t>(channels);
}

absl::Status MissingBytes(absl::string_view codec) {
  return absl::InvalidArgumentError(
      absl::StrCat("calibration: the ", codec, " codec needs a calibration"));
}

}  // namespace

absl::StatusOr<std::string> SerializeC8Calibration(const C8Scales& scales) {
  KVH_RETURN_IF_ERROR(scales.Validate());
  KVH_ASSIGN_OR_RETURN(
      const MsModelSlimC8Files files,
      BuildMsModelSlimC8Files(scales, C8NameStyle::kSeparateKv, StDType::kF32));
  const std::map<std::string, std::string> metadata = {
      {kC8CalibrationDescriptionKey, files.DescriptionJson()}};
  return SerializeSafetensors(files.tensors, metadata);
}

absl::StatusOr<C8Scales> ParseC8Calibration(absl::Span<const uint8_t> bytes,
                                            const Geometry& geometry) {
  KVH_ASSIGN_OR_RETURN(const uint32_t channels, KvChannels(geometry));
  KVH_ASSIGN_OR_RETURN(
      const SafetensorsFile weights,
      SafetensorsFile::FromBytes(std::string(
          reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  const auto& metadata = weights.header().metadata;
  auto it = metadata.find(kC8CalibrationDescriptionKey);
  if (it == metadata.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("int8_c8 calibration: __metadata__ has no '",
                     kC8CalibrationDescriptionKey, "' entry"));
  }
  return ParseC8ScalesFromMsModelSlim(it->second, weights, geometry.num_layers,
                                      channels);
}

absl::StatusOr<std::unique_ptr<Codec>> CreateKvtcCodecFromParams(
    const CodecParams& params) {
  CodecParams p = params;
  if (p.calibration == nullptr && p.calibration_bytes != nullptr) {
    KVH_ASSIGN_OR_RETURN(KvtcCalibration cal,
                         ParseKvtcCalibration(AsBytes(*p.calibration_bytes)));
    p.calibration = std::make_shared<const KvtcCalibration>(std::move(cal));
  }
  return KvtcCodec::Create(p);
}

namespace {

// CodecT::Create(params, the calibration `parse` reads from
// params.calibration_bytes, shared); InvalidArgument naming `codec` when
// there are no bytes.
template <typename CodecT, typename Parse>
absl::StatusOr<std::unique_ptr<Codec>> CreateFromCalibrationBytes(
    const CodecParams& params, const char* codec, Parse&& parse) {
  if (params.calibration_bytes == nullptr) return MissingBytes(codec);
  auto cal = parse(AsBytes(*params.calibration_bytes));
  if (!cal.ok()) return cal.status();
  using Calibration = typename decltype(cal)::value_type;
  return CodecT::Create(params,
                        std::make_shared<const Calibration>(*std::move(cal)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> CreateInt8C8CodecFromParams(
    const CodecParams& params) {
  return CreateFromCalibrationBytes<Int8C8Codec>(
      params, "int8_c8", [&](absl::Span<const uint8_t> bytes) {
        return ParseC8Calibration(bytes, params.geometry);
      });
}

absl::StatusOr<std::unique_ptr<Codec>> CreateCommVqCodecFromParams(
    const CodecParams& params) {
  return CreateFromCalibrationBytes<CommVqCodec>(params, "commvq",
                                                 ParseCommVqCodebooks);
}

absl::StatusOr<std::string> ReadKvtcCalibrationForCodec(
    const std::string& path, const Geometry& geometry) {
  KVH_ASSIGN_OR_RETURN(const KvtcCalibration cal,
                       ReadKvtcCalibrationFile(path));
  KVH_RETURN_IF_ERROR(cal.CheckGeometry(geometry));
  return SerializeKvtcCalibration(cal);
}

absl::StatusOr<std::string> ReadC8CalibrationForCodec(
    const std::string& path, const Geometry& geometry) {
  KVH_ASSIGN_OR_RETURN(const C8Scales scales,
                       LoadC8ScalesFromMsModelSlim(path, geometry));
  KVH_RETURN_IF_ERROR(scales.CheckGeometry(geometry));
  return SerializeC8Calibration(scales);
}

absl::StatusOr<std::string> ReadCommVqCalibrationForCodec(
    const std::string& path, const Geometry& geometry) {
  KVH_ASSIGN_OR_RETURN(const CommVqCodebooks cb, ReadCommVqCodebooksFile(path));
  absl::Status fits = cb.CheckGeometry(geometry);
  if (!fits.ok()) {
    return absl::Status(fits.code(), absl::StrCat(path, ": ", fits.message()));
  }
  return SerializeCommVqCodebooks(cb);
}

void RegisterCalibratedCodecs(CodecRegistry* registry) {
  registry
      ->Register("kvtc", CreateKvtcCodecFromParams, ReadKvtcCalibrationForCodec)
      .IgnoreError();
  registry
      ->Register(kInt8C8CodecName, CreateInt8C8CodecFromParams,
                 ReadC8CalibrationForCodec)
      .IgnoreError();
  registry
      ->Register(kCommVqCodecName, CreateCommVqCodecFromParams,
                 ReadCommVqCalibrationForCodec)
      .IgnoreError();
}

}  // namespace kvharbor
