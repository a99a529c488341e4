#include "cuda/tier/kvtc_page_codecs.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_format.h"
#include "core/codec/codec.h"
#include "core/codec/kvtc/kvtc_calibration.h"

namespace kvharbor {
namespace gpu {

absl::StatusOr<std::shared_ptr<const KvtcGpuCodec>> KvtcPageCodecs::Codec(
    const Geometry& geometry,
    std::shared_ptr<const std::string> calibration_bytes,
    uint64_t expected_fingerprint, KvtcGemmMode gemm_mode) {
  if (calibration_bytes == nullptr) {
    return absl::InvalidArgumentError("calibration: the kvtc codec needs one");
  }
  absl::StatusOr<KvtcCalibration> cal =
      ParseKvtcCalibration(absl::MakeConstSpan(
          reinterpret_cast<const uint8_t*>(calibration_bytes->data()),
          calibration_bytes->size()));
  if (!cal.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "calibration: not a kvtc calibration: %s", cal.status().message()));
  }
  const uint64_t fp = cal->Fingerprint();
  if (expected_fingerprint != 0 && fp != expected_fingerprint) {
    return absl::InvalidArgumentError(
        absl::StrFormat("calibration: its bytes have fingerprint %016x, not "
                        "%016x",
                        fp, expected_fingerprint));
  }
  absl::MutexLock l(&mu_);
  const std::pair<uint64_t, KvtcGemmMode> key(fp, gemm_mode);
  if (auto it = codecs_.find(key); it != codecs_.end()) {
    std::shared_ptr<const KvtcGpuCodec> c = it->second.lock();
    if (c != nullptr && c->geometry() == geometry) return c;
  }
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "device: cudaSetDevice(%d): %s", device_, cudaGetErrorString(e)));
  }
  CodecParams cp;
  cp.geometry = geometry;
  cp.calibration = std::make_shared<const KvtcCalibration>(*std::move(cal));
  cp.calibration_bytes = std::move(calibration_bytes);
  cp.zstd = false;  // batches are split (encode) or merged (decode) first
  KvtcGpuOptions options;
  options.gemm_mode = gemm_mode;
  absl::StatusOr<std::unique_ptr<KvtcGpuCodec>> codec =
      KvtcGpuCodec::Create(cp, options);
  if (!codec.ok()) {
    return absl::Status(codec.status().code(),
                        absl::StrFormat("calibration: no GPU codec for it: %s",
                                        codec.status().message()));
  }
  std::shared_ptr<const KvtcGpuCodec> c = *std::move(codec);
  codecs_[key] = c;
  return c;
}

absl::StatusOr<std::unique_ptr<KvtcBatchDecoder>> KvtcPageCodecs::CreateDecoder(
    const Geometry& geometry,
    std::shared_ptr<const std::string> calibration_bytes,
    uint64_t expected_fingerprint, size_t batch_pages, KvtcGemmMode gemm_mode) {
  absl::StatusOr<std::shared_ptr<const KvtcGpuCodec>> codec = Codec(
      geometry, std::move(calibration_bytes), expected_fingerprint, gemm_mode);
  if (!codec.ok()) return codec.status();
  return KvtcBatchDecoder::Create(device_, *std::move(codec), batch_pages);
}

absl::StatusOr<std::unique_ptr<KvtcBatchEncoder>> KvtcPageCodecs::CreateEncoder(
    const Geometry& geometry,
    std::shared_ptr<const std::string> calibration_bytes) {
  absl::StatusOr<std::shared_ptr<const KvtcGpuCodec>> codec =
      Codec(geometry, std::move(calibration_bytes));
  if (!codec.ok()) return codec.status();
  const CodecParams defaults;
  return KvtcBatchEncoder::Create(device_, *std::move(codec), defaults.zstd,
                                  defaults.zstd_level);
}

}  // namespace gpu
}  // namespace kvharbor
