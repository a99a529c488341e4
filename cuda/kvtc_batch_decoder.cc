// KvtcBatchDecoder (declared in cuda/device_tier.h): RAW fetches of cold
// KVTC pages, decoded on the GPU in batches.
#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/codec/kvtc/kvtc_split.h"
#include "cuda/cuda_check.h"
#include "cuda/device_tier.h"

namespace kvharbor {
namespace gpu {

absl::StatusOr<std::unique_ptr<KvtcBatchDecoder>> KvtcBatchDecoder::Create(
    int device, std::shared_ptr<const KvtcGpuCodec> codec, size_t batch_pages) {
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<KvtcBatchDecoder> d(new KvtcBatchDecoder());
  d->device_ = device;
  d->codec_ = std::move(codec);
  const Geometry& g = d->codec_->geometry();
  d->page_bytes_ = g.PageBytes();
  d->fingerprint_ = d->codec_->calibration_fingerprint();
  if (batch_pages == 0) {
    // Large enough for the reconstruction GEMM to run near its peak, small
    // enough that the device batch (outside the arena) stays modest.
    constexpr size_t kBatchBytes = size_t{64} << 20;
    batch_pages = std::clamp<size_t>(kBatchBytes / d->page_bytes_, 1,
                                     std::max<size_t>(1, 4096 / g.page_size));
  }
  d->batch_pages_ = batch_pages;
  absl::MutexLock l(&d->mu_);
  KVH_ASSIGN_OR_RETURN(d->ws_,
                       KvtcGpuWorkspaceHolder::Create(*d->codec_, batch_pages));
  KVH_ASSIGN_OR_RETURN(d->staging_bytes_,
                       d->codec_->MaxEncodedSize(batch_pages));
  void* p = nullptr;
  KVH_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, d->staging_bytes_, 0));
  d->staging_ = static_cast<uint8_t*>(p);
  KVH_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&d->stream_, cudaStreamNonBlocking));
  return d;
}

absl::Status KvtcBatchDecoder::EnsureHostPath() {
  if (dev_pages_ != nullptr) return absl::OkStatus();
  void* p = nullptr;
  KVH_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, batch_pages_ * page_bytes_));
  dev_pages_ = static_cast<uint8_t*>(p);
  KVH_ASSIGN_OR_RETURN(
      bounce_,
      PinnedBounce::Create(
          device_,
          std::max<size_t>(1, (size_t{32} << 20) / page_bytes_) * page_bytes_));
  return absl::OkStatus();
}

KvtcBatchDecoder::~KvtcBatchDecoder() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (staging_ != nullptr) cudaFreeHost(staging_);
  absl::MutexLock l(&mu_);
  if (dev_pages_ != nullptr) cudaFree(dev_pages_);
}

absl::Status KvtcBatchDecoder::DecodeMerged(
    absl::Span<const absl::Span<const uint8_t>> buffers,
    absl::Span<const MutablePageRef> device_pages) {
  // Pinned staging: DecodeAsync copies it to the device chunk by chunk on
  // the workspace's copy stream, overlapped with the decoding.
  KVH_ASSIGN_OR_RETURN(
      const size_t size,
      MergeKvtcPages(codec_->calibration(), fingerprint_, codec_->geometry(),
                     buffers, absl::MakeSpan(staging_, staging_bytes_)));
  const auto merged = absl::MakeConstSpan(staging_, size);
  KVH_RETURN_IF_ERROR(codec_->DecodeAsync(merged, device_pages, ws_->get(),
                                          stream_, &scratch_));
  // Waits for the decode: the pages are complete once this is OK.
  return codec_->FinishDecode(merged, ws_->get());
}

absl::Status KvtcBatchDecoder::DecodeToDevice(
    absl::Span<const absl::Span<const uint8_t>> buffers,
    absl::Span<const MutablePageRef> pages) {
  if (buffers.size() != pages.size() || pages.size() > batch_pages_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("buffers: %u buffers for %u pages (at most %u a batch)",
                        buffers.size(), pages.size(), batch_pages_));
  }
  if (pages.empty()) return absl::OkStatus();
  absl::MutexLock l(&mu_);
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  return DecodeMerged(buffers, pages);
}

absl::Status KvtcBatchDecoder::DecodeBatch(
    absl::Span<const absl::Span<const uint8_t>> buffers,
    absl::Span<const MutablePageRef> pages) {
  KVH_RETURN_IF_ERROR(EnsureHostPath());
  std::vector<MutablePageRef> dev(pages.size());
  std::vector<const uint8_t*> src(pages.size());
  std::vector<uint8_t*> dst(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    dev[i] =
        MutablePageRef{dev_pages_ + i * page_bytes_, pages[i].first_position};
    src[i] = dev[i].data;
    dst[i] = pages[i].data;
  }
  KVH_RETURN_IF_ERROR(DecodeMerged(buffers, dev));
  return bounce_->CopyToHost(src, dst, page_bytes_);
}

std::vector<absl::Status> KvtcBatchDecoder::DecodeEach(
    absl::Span<const absl::Span<const uint8_t>> buffers,
    absl::Span<const MutablePageRef> pages) {
  std::vector<absl::Status> out(pages.size());
  if (buffers.size() != pages.size()) {
    for (auto& s : out) {
      s = absl::InvalidArgumentError("buffers: one buffer per page");
    }
    return out;
  }
  absl::MutexLock l(&mu_);
  const cudaError_t err = cudaSetDevice(device_);
  for (size_t first = 0; first < pages.size(); first += batch_pages_) {
    const size_t n = std::min(batch_pages_, pages.size() - first);
    absl::Status s =
        err == cudaSuccess
            ? DecodeBatch(buffers.subspan(first, n), pages.subspan(first, n))
            : CudaError(err, "cudaSetDevice", __FILE__, __LINE__);
    if (s.ok() || n == 1 || err != cudaSuccess) {
      for (size_t i = first; i < first + n; ++i) out[i] = s;
      continue;
    }
    // A refused batch (a corrupt page, say) again page by page, so only the
    // bad pages fail.
    for (size_t i = first; i < first + n; ++i) {
      out[i] = DecodeBatch(buffers.subspan(i, 1), pages.subspan(i, 1));
    }
  }
  return out;
}

}  // namespace gpu
}  // namespace kvharbor
