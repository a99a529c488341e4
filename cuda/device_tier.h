// CudaDeviceTier: the core DeviceTier (core/store/device_tier.h) on one GPU.
//
// Opens one DeviceArena (cuda/device_page_pool.h) of the configured size,
// cuts namespace pools from it, and builds for KVTC namespaces a
// KvtcBatchEncoder: eviction's batch encoder. It encodes many device pages
// as one KVTC batch (one projection GEMM per section) on a CUDA stream
// straight into pinned host memory (the codec's fused device-to-host
// write), then cuts the batch buffer into the per-page buffers the host tier
// stores (core/codec/kvtc/kvtc_split.h), which copies only compressed bytes.
// RAW fetches of cold KVTC pages get a KvtcBatchDecoder: it joins the stored
// one-page buffers into batch buffers in pinned staging memory
// (MergeKvtcPages), decodes each batch into device pages (one
// reconstruction GEMM per section) and copies them to the caller's host
// pages through a pinned bounce buffer. Other codecs get neither (the
// namespace encodes host copies and decodes on the CPU).
//
// Memory: the tier shares the arena with its pools. The encoder and decoder
// of one calibration share one KvtcGpuCodec (one device copy of the
// calibration; the tier remembers it weakly by fingerprint). Each owns its
// workspaces, stream and pinned memory; the decoder also, once it decodes
// into host pages, a device buffer of one batch of pages (outside the
// arena).
//
// Thread-safety: CudaDeviceTier is thread-safe; a KvtcBatchEncoder serves
// one EncodeEach at a time (NamespaceTiers' move_mu_ serialises them); a
// KvtcBatchDecoder is thread-safe (DecodeEach calls take turns, mu_).
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
#include "core/store/device_tier.h"
#include "cuda/device_page_pool.h"
#include "cuda/kvtc_gpu_codec.h"
#include "cuda/pinned_bounce.h"

namespace kvharbor {
namespace gpu {

class KvtcBatchEncoder final : public PageBatchEncoder {
 public:
  // Batches of up to `batch_pages` pages (0: 4096 tokens' worth), two
  // workspaces and two pinned outputs so that one batch's host work (wait,
  // envelope, split into per-page buffers) overlaps the next batch's GPU
  // work. `codec` must have no zstd stage; `zstd` / `zstd_level` apply per
  // page.
  static absl::StatusOr<std::unique_ptr<KvtcBatchEncoder>> Create(
      int device, std::shared_ptr<const KvtcGpuCodec> codec, bool zstd,
      int zstd_level, size_t batch_pages = 0);
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
  std::shared_ptr<const KvtcGpuCodec> codec_;  // no zstd: split first
  std::unique_ptr<KvtcGpuWorkspaceHolder> ws_[2];
  cudaStream_t stream_ = nullptr;
  uint8_t* pinned_[2] = {nullptr, nullptr};  // out_bytes_ each, mapped
  size_t out_bytes_ = 0;
  CodecWorkspace scratch_;
};

class KvtcBatchDecoder final : public PageBatchDecoder {
 public:
  // Batches of up to `batch_pages` pages (0: 64 MiB of raw pages, at most
  // 4096 tokens' worth).
  static absl::StatusOr<std::unique_ptr<KvtcBatchDecoder>> Create(
      int device, std::shared_ptr<const KvtcGpuCodec> codec,
      size_t batch_pages = 0);
  ~KvtcBatchDecoder() override;

  std::vector<absl::Status> DecodeEach(
      absl::Span<const absl::Span<const uint8_t>> buffers,
      absl::Span<const MutablePageRef> pages) override;
  // Decodes buffers[i] straight into DEVICE pages (pages[i].data: device
  // memory of this decoder's GPU, the page's bytes), at most batch_pages()
  // pages per call, as one batch; done when it returns OK (the pages'
  // contents are unspecified otherwise). For a consumer that works on the
  // pages on the GPU (the SDK's fetch into an engine's cache) and needs no
  // host copy.
  absl::Status DecodeToDevice(
      absl::Span<const absl::Span<const uint8_t>> buffers,
      absl::Span<const MutablePageRef> pages);
  size_t batch_pages() const { return batch_pages_; }

 private:
  KvtcBatchDecoder() = default;
  // The device batch and pinned bounce of DecodeEach, made on first use
  // (DecodeToDevice needs neither).
  absl::Status EnsureHostPath() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges `buffers` into staging_ and decodes them into device pages.
  absl::Status DecodeMerged(absl::Span<const absl::Span<const uint8_t>> buffers,
                            absl::Span<const MutablePageRef> device_pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One batch: merge into staging_, decode into dev_pages_, copy to pages.
  absl::Status DecodeBatch(absl::Span<const absl::Span<const uint8_t>> buffers,
                           absl::Span<const MutablePageRef> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  int device_ = 0;
  size_t batch_pages_ = 0;
  size_t page_bytes_ = 0;
  uint64_t fingerprint_ = 0;
  std::shared_ptr<const KvtcGpuCodec> codec_;
  absl::Mutex mu_;
  std::unique_ptr<KvtcGpuWorkspaceHolder> ws_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PinnedBounce> bounce_ ABSL_GUARDED_BY(mu_);
  cudaStream_t stream_ = nullptr;
  uint8_t* staging_ = nullptr;  // pinned, staging_bytes_: merged batches
  size_t staging_bytes_ = 0;
  uint8_t* dev_pages_ ABSL_GUARDED_BY(mu_) = nullptr;  // batch_pages_ pages
  CodecWorkspace scratch_ ABSL_GUARDED_BY(mu_);
};

class KvtcPageCodecs;  // cuda/kvtc_page_codecs.h

class CudaDeviceTier final : public DeviceTier {
 public:
  // Errors name store.device / store.device_pool_bytes.
  static absl::StatusOr<std::shared_ptr<CudaDeviceTier>> Create(
      int device, uint64_t arena_bytes);
  ~CudaDeviceTier() override;

  std::string Describe() const override;
  uint64_t arena_bytes() const override { return arena_->bytes(); }
  absl::StatusOr<std::unique_ptr<PagePool>> CreatePool(
      size_t slot_bytes, uint32_t capacity) override;
  absl::StatusOr<std::unique_ptr<PageBatchEncoder>> CreateEncoder(
      const DeviceEncoderParams& params) override;
  // The arena's cudaIpcGetMemHandle, made once (cuda/device_ipc.cc).
  absl::StatusOr<DeviceIpcExport> ExportIpc() override;
  absl::StatusOr<std::unique_ptr<PageBatchDecoder>> CreateDecoder(
      const DeviceEncoderParams& params) override;
  DeviceArena& arena() { return *arena_; }

 private:
  CudaDeviceTier(std::shared_ptr<DeviceArena> arena, std::string gpu_name);

  const std::shared_ptr<DeviceArena> arena_;
  const std::string gpu_name_;
  // The KVTC encoders and decoders of the namespaces' calibrations on this
  // GPU (one KvtcGpuCodec per calibration, shared by both).
  const std::unique_ptr<KvtcPageCodecs> kvtc_;
  // Guards the exported handle (KvtcPageCodecs has its own lock; the two
  // are never held together).
  absl::Mutex ipc_mu_;
  // Made on the first ExportIpc: every caller gets the same handle bytes.
  std::unique_ptr<DeviceIpcExport> ipc_ ABSL_GUARDED_BY(ipc_mu_);
};

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_DEVICE_TIER_H_
