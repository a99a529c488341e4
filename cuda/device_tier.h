// CudaDeviceTier: the core DeviceTier (core/device_tier.h) on one GPU.
//
// Opens one DeviceArena (cuda/device_page_pool.h) of the configured size,
// cuts namespace pools from it, and builds for KVTC namespaces a
// KvtcBatchEncoder: eviction's batch encoder. It encodes many device pages
// as one KVTC batch (one projection GEMM per section) on a CUDA stream
// straight into pinned host memory (the codec's fused device-to-host
// write), then cuts the batch buffer into the per-page buffers the host tier
// stores (core/kvtc_split.h), which copies only compressed bytes.
// Other codecs get no GPU encoder (the namespace encodes host copies on the
// CPU).
//
// Memory: the tier shares the arena with its pools; an encoder owns its
// codec's device calibration, its workspaces, stream and pinned ring.
//
// Thread-safety: CudaDeviceTier is thread-safe; a KvtcBatchEncoder serves
// one EncodeEach at a time (the namespace's move_mu_ serialises them).
#ifndef KVHARBOR_CUDA_DEVICE_TIER_H_
#define KVHARBOR_CUDA_DEVICE_TIER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/device_tier.h"
#include "cuda/device_page_pool.h"
#include "cuda/kvtc_gpu_codec.h"

namespace kvharbor {
namespace gpu {

class KvtcBatchEncoder final : public PageBatchEncoder {
 public:
  // Batches of up to `batch_pages` pages (0: 4096 tokens' worth), two
  // workspaces and two pinned outputs so that one batch's host work (wait,
  // envelope, split into per-page buffers) overlaps the next batch's GPU
  // work. `params.zstd` applies per page.
  static absl::StatusOr<std::unique_ptr<KvtcBatchEncoder>> Create(
      int device, const CodecParams& params, size_t batch_pages = 0);
  ~KvtcBatchEncoder() override;

  std::vector<absl::StatusOr<std::string>> EncodeEach(
      absl::Span<const PageRef> pages) override;
  const KvtcGpuCodec& codec() const { return *codec_; }
  size_t batch_pages() const { return batch_pages_; }

 private:
  KvtcBatchEncoder() = default;
  // Waits for the batch `pages` enqueued on workspace `w` and stores its
  // per-page buffers at out[first...]. A refused batch (e.g. a non-finite
  // value) is encoded again page by page so only the bad pages fail.
  void Finish(int w, absl::Span<const PageRef> pages, size_t first,
              std::vector<absl::StatusOr<std::string>>* out);
  // One page through workspace `w`, synchronously.
  absl::StatusOr<std::string> EncodeOne(int w, const PageRef& page);

  int device_ = 0;
  bool zstd_ = false;
  int zstd_level_ = 1;
  size_t batch_pages_ = 0;
  std::unique_ptr<KvtcGpuCodec> codec_;  // no zstd: batches are split first
  std::unique_ptr<KvtcGpuWorkspaceHolder> ws_[2];
  cudaStream_t stream_ = nullptr;
  uint8_t* pinned_[2] = {nullptr, nullptr};  // out_bytes_ each, mapped
  size_t out_bytes_ = 0;
  CodecWorkspace scratch_;
};

class CudaDeviceTier final : public DeviceTier {
 public:
  // Errors name store.device / store.device_pool_bytes.
  static absl::StatusOr<std::shared_ptr<CudaDeviceTier>> Create(
      int device, uint64_t arena_bytes);

  std::string Describe() const override;
  uint64_t arena_bytes() const override { return arena_->bytes(); }
  absl::StatusOr<std::unique_ptr<PagePool>> CreatePool(
      size_t slot_bytes, uint32_t capacity) override;
  absl::StatusOr<std::unique_ptr<PageBatchEncoder>> CreateEncoder(
      const DeviceEncoderParams& params) override;
  // The arena's cudaIpcGetMemHandle, made once (cuda/device_ipc.cc).
  absl::StatusOr<DeviceIpcExport> ExportIpc() override;
  DeviceArena& arena() { return *arena_; }

 private:
  CudaDeviceTier(std::shared_ptr<DeviceArena> arena, std::string gpu_name)
      : arena_(std::move(arena)), gpu_name_(std::move(gpu_name)) {}
  const std::shared_ptr<DeviceArena> arena_;
  const std::string gpu_name_;
  absl::Mutex ipc_mu_;
  // Made on the first ExportIpc: every caller gets the same handle bytes.
  std::unique_ptr<DeviceIpcExport> ipc_ ABSL_GUARDED_BY(ipc_mu_);
};

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_DEVICE_TIER_H_
