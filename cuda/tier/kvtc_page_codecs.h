// KvtcPageCodecs: the one factory of KVTC's GPU page encoders and decoders.
//
// The daemon's device tier (cuda/tier/device_tier.h: eviction's batch encoder
// and the decoder of RAW fetches of cold pages) and the SDK's GpuPageDecoder
// (client/cuda/gpu_decode.h: COMPRESSED fetches decoded on the client's GPU)
// both build theirs here, so both read the same per-page codec buffers the
// same way. From a kvtc calibration's canonical bytes it builds the
// KvtcGpuCodec for one geometry and GEMM mode on one GPU without the zstd
// stage: batches are split into per-page buffers (encode) or merged from
// them (decode) on the host, where each page's buffer gets its zstd stage
// exactly as the CPU codec's does (core/codec/kvtc/kvtc_split.h).
//
// Memory: codecs are shared by the encoders and decoders made from them and
// remembered weakly by calibration fingerprint and GEMM mode, so a
// calibration's device copy lives as long as its last encoder or decoder.
// Thread-safe (mu_ guards the remembered codecs; a codec is built under it, so
// one calibration is uploaded once).
#ifndef KVHARBOR_CUDA_TIER_KVTC_PAGE_CODECS_H_
#define KVHARBOR_CUDA_TIER_KVTC_PAGE_CODECS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cuda/codec/kvtc_gpu_codec.h"
#include "cuda/tier/device_tier.h"
#include "types/geometry.h"

namespace kvharbor {
namespace gpu {

class KvtcPageCodecs {
 public:
  explicit KvtcPageCodecs(int device) : device_(device) {}
  int device() const { return device_; }

  // The GPU codec of the kvtc calibration `calibration_bytes` for
  // `geometry`. With `expected_fingerprint` != 0 the bytes must have that
  // fingerprint. Errors: InvalidArgument "calibration: not a kvtc
  // calibration: ..." or "calibration: its bytes have fingerprint ..., not
  // ..."; FailedPrecondition "device: cudaSetDevice(N): ..."; "calibration:
  // no GPU codec for it: ..." with the GPU codec's own code. `gemm_mode`:
  // the projection GEMM's arithmetic (cuda/codec/projection_gemm.h); one codec
  // per calibration and mode.
  absl::StatusOr<std::shared_ptr<const KvtcGpuCodec>> Codec(
      const Geometry& geometry,
      std::shared_ptr<const std::string> calibration_bytes,
      uint64_t expected_fingerprint = 0,
      KvtcGemmMode gemm_mode = KvtcGemmMode::kFp32) ABSL_LOCKS_EXCLUDED(mu_);
  // A batch decoder of per-page buffers (KvtcBatchDecoder::Create's
  // `batch_pages`) over Codec(...); the daemon's decoders reconstruct in
  // FP32, the SDK's in the mode its ClientOptions name.
  absl::StatusOr<std::unique_ptr<KvtcBatchDecoder>> CreateDecoder(
      const Geometry& geometry,
      std::shared_ptr<const std::string> calibration_bytes,
      uint64_t expected_fingerprint = 0, size_t batch_pages = 0,
      KvtcGemmMode gemm_mode = KvtcGemmMode::kFp32);
  // A batch encoder into per-page buffers with the CPU codec's zstd stage
  // (CodecParams' defaults) over Codec(...).
  absl::StatusOr<std::unique_ptr<KvtcBatchEncoder>> CreateEncoder(
      const Geometry& geometry,
      std::shared_ptr<const std::string> calibration_bytes);

 private:
  const int device_;
  absl::Mutex mu_;
  // By calibration fingerprint and GEMM mode; weak (see the header
  // comment).
  absl::flat_hash_map<std::pair<uint64_t, KvtcGemmMode>,
                      std::weak_ptr<const KvtcGpuCodec>>
      codecs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_TIER_KVTC_PAGE_CODECS_H_
