// CudaDeviceTier: the core DeviceTier (core/store/device_tier.h) on one GPU.
//
// Opens one DeviceArena (cuda/tier/device_page_pool.h) of the configured size,
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
// pages through a pinned bounce buffer; cold pages staged for
// GetDeviceHandles are decoded the same way straight into device slots
// (DecodeEachToDevice). Other codecs get neither (the namespace encodes
// host copies and decodes on the CPU). ChecksumPages hashes device pages
// with the GPU XXH3 kernel (cuda/kernels/xxh3_checksum.h).
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
#ifndef KVHARBOR_CUDA_TIER_DEVICE_TIER_H_
#define KVHARBOR_CUDA_TIER_DEVICE_TIER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/store/device_tier.h"
#include "cuda/codec/kvtc_gpu_codec.h"
#include "cuda/kernels/xxh3_checksum.h"
#include "cuda/tier/device_page_pool.h"
#include "cuda/tier/pinned_bounce.h"

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
  // Into device pages of this decoder's GPU (device slots of the arena),
  // batch after batch straight from the pinned staging: no host copy; two
  // batches in flight (EnqueueToDevice), a refused batch again page by page.
  std::vector<absl::Status> DecodeEachToDevice(
      absl::Span<const absl::Span<const uint8_t>> buffers,
      absl::Span<const MutablePageRef> pages) override;

  // Pipelined decoding into device pages: two lanes, each with its own
  // workspace, pinned staging and stream, so that one batch's merge (CPU)
  // and H2D copy run while the other batch decodes on the GPU.
  // EnqueueToDevice checks and merges `buffers` (at most batch_pages()) and
  // enqueues their decode into `pages` (device memory of this GPU), then
  // returns a ticket (1, 2, ...); when both lanes are busy it first finishes
  // the older batch (its result is kept for its ticket). FinishToDevice
  // waits for every batch up to `ticket` and returns the first failure
  // among them (each batch's result is returned once); the pages of those
  // batches hold their values once it is OK, unspecified otherwise. The
  // synchronous calls above refuse to run while batches are pending
  // (FAILED_PRECONDITION): finish them first. The pipeline is for one
  // caller at a time (tickets are not per caller): the SDK's decoder of one
  // LayoutTransfer; DecodeEachToDevice holds it for its whole call.
  // `dest` enabled: the batch is decoded straight into that engine layout
  // (KvtcGpuCodec::DecodeAsync; pages[i] then gives only the position).
  absl::StatusOr<uint64_t> EnqueueToDevice(
      absl::Span<const absl::Span<const uint8_t>> buffers,
      absl::Span<const MutablePageRef> pages,
      const PagedKvDest& dest = PagedKvDest{});
  absl::Status FinishToDevice(uint64_t ticket);

  // EnqueueToDevice in two steps, for a caller that moves several batches
  // to the GPU in one H2D copy: a batch's payload copied range by range
  // (EnqueueToDevice) is hundreds of small copies, and even one copy of a
  // 1 MB batch ran at a third of the link on the H200, where copies of
  // several MB run near it. Merge checks one batch's buffers (at most
  // batch_pages(), each in full) and joins them into `out` (at least
  // max_merged_bytes()), returning the merged size; it takes no lock and
  // touches no decoder state, so a caller merges the next batches on its
  // own thread while this decoder decodes. EnqueueMerged then enqueues the
  // decode of such a merged batch, read by the kernels from its device copy
  // (`input`: the caller's copy of `merged`, ready after input.ready), into
  // `pages` or `dest` as EnqueueToDevice; finished by FinishToDevice. The
  // host `merged` must stay unchanged until then (FinishDecode checksums
  // it); the device copy until the batch is finished too.
  absl::StatusOr<size_t> Merge(
      absl::Span<const absl::Span<const uint8_t>> buffers,
      absl::Span<uint8_t> out) const;
  size_t max_merged_bytes() const { return staging_bytes_; }
  absl::StatusOr<uint64_t> EnqueueMerged(absl::Span<const uint8_t> merged,
                                         absl::Span<const MutablePageRef> pages,
                                         const PagedKvDest& dest,
                                         const KvtcDeviceInput& input);

  size_t batch_pages() const { return batch_pages_; }
  KvtcGemmMode gemm_mode() const { return codec_->options().gemm_mode; }

 private:
  // One in-flight batch's resources.
  struct Lane {
    std::unique_ptr<KvtcGpuWorkspaceHolder> ws;
    cudaStream_t stream = nullptr;
    uint8_t* staging = nullptr;        // pinned, staging_bytes_: a merged batch
    absl::Span<const uint8_t> merged;  // of the pending batch
    uint64_t ticket = 0;               // 0: idle
  };
  KvtcBatchDecoder() = default;
  absl::Status MakeLane(Lane& lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The idle lane for the next batch (finishing the oldest when both are
  // busy), made on first use.
  absl::StatusOr<int> TakeLane() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues on lane `k` the decode of `merged` (kept in the lane until it
  // is finished); its ticket, whose result is the refusal if DecodeAsync
  // refuses it.
  uint64_t StartDecode(int k, absl::Span<const uint8_t> merged,
                       absl::Span<const MutablePageRef> pages,
                       const PagedKvDest& dest, const KvtcDeviceInput& input)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint64_t> EnqueueLocked(
      absl::Span<const absl::Span<const uint8_t>> buffers,
      absl::Span<const MutablePageRef> pages,
      const PagedKvDest& dest = PagedKvDest{})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FinishLocked(uint64_t ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes the oldest pending batch; its result goes to finished_.
  void FinishOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NothingPending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One batch: a buffer per page, at most batch_pages_.
  absl::Status CheckBatch(size_t buffers, size_t pages) const;
  // The device batch and pinned bounce of DecodeEach, made on first use
  // (DecodeToDevice needs neither).
  absl::Status EnsureHostPath() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `batch(first, n)` over [0, pages) in batches of batch_pages_, a
  // refused batch again page by page; one status per page.
  std::vector<absl::Status> InBatches(
      size_t pages, absl::FunctionRef<absl::Status(size_t, size_t)> batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  size_t staging_bytes_ = 0;
  absl::Mutex mu_;
  // lanes_[0] is made by Create and serves the synchronous calls;
  // lanes_[1] is made on the first pipelined use.
  Lane lanes_[2] ABSL_GUARDED_BY(mu_);
  std::deque<int> pending_ ABSL_GUARDED_BY(mu_);  // lanes, oldest first
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  // Results of batches finished early, by ticket, until FinishToDevice.
  std::map<uint64_t, absl::Status> finished_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PinnedBounce> bounce_ ABSL_GUARDED_BY(mu_);
  uint8_t* dev_pages_ ABSL_GUARDED_BY(mu_) = nullptr;  // batch_pages_ pages
  CodecWorkspace scratch_ ABSL_GUARDED_BY(mu_);
};

class KvtcPageCodecs;  // cuda/tier/kvtc_page_codecs.h

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
  // The arena's cudaIpcGetMemHandle, made once (cuda/tier/device_ipc.cc).
  absl::StatusOr<DeviceIpcExport> ExportIpc() override;
  // XXH3-64 of device pages on the GPU (cuda/kernels/xxh3_checksum.h).
  absl::StatusOr<std::vector<uint64_t>> ChecksumPages(
      absl::Span<const uint8_t* const> pages, uint64_t bytes) override;
  absl::StatusOr<std::unique_ptr<PageBatchDecoder>> CreateDecoder(
      const DeviceEncoderParams& params) override;
  DeviceArena& arena() { return *arena_; }

 private:
  CudaDeviceTier(std::shared_ptr<DeviceArena> arena, std::string gpu_name,
                 std::unique_ptr<Xxh3Checksummer> checksummer);

  const std::shared_ptr<DeviceArena> arena_;
  const std::string gpu_name_;
  const std::unique_ptr<Xxh3Checksummer> checksummer_;  // thread-safe
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

#endif  // KVHARBOR_CUDA_TIER_DEVICE_TIER_H_
