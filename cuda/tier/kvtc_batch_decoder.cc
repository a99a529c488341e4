// KvtcBatchDecoder (declared in cuda/tier/device_tier.h): RAW fetches of cold
// KVTC pages, decoded on the GPU in batches.
#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/codec/kvtc/kvtc_split.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/tier/device_tier.h"

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
  KVH_ASSIGN_OR_RETURN(d->staging_bytes_,
                       d->codec_->MaxEncodedSize(batch_pages));
  absl::MutexLock l(&d->mu_);
  KVH_RETURN_IF_ERROR(d->MakeLane(d->lanes_[0]));
  return d;
}

absl::Status KvtcBatchDecoder::MakeLane(Lane& lane) {
  // The stream and staging first (the destructor frees what was made), the
  // workspace last: a lane with a workspace is complete.
  if (lane.stream == nullptr) {
    KVH_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking));
  }
  if (lane.staging == nullptr) {
    void* p = nullptr;
    KVH_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, staging_bytes_, 0));
    lane.staging = static_cast<uint8_t*>(p);
  }
  KVH_ASSIGN_OR_RETURN(lane.ws,
                       KvtcGpuWorkspaceHolder::Create(*codec_, batch_pages_));
  return absl::OkStatus();
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
  absl::MutexLock l(&mu_);
  // Pending batches still read their staging and write their pages.
  while (!pending_.empty()) FinishOldest();
  for (Lane& lane : lanes_) {
    DrainAndDestroyStream(device_, lane.stream);
    if (lane.staging != nullptr) cudaFreeHost(lane.staging);
    lane.ws.reset();
  }
  if (dev_pages_ != nullptr) cudaFree(dev_pages_);
}

absl::Status KvtcBatchDecoder::NothingPending() const {
  if (pending_.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "KvtcBatchDecoder: %u pipelined batches pending; FinishToDevice first",
      pending_.size()));
}

absl::Status KvtcBatchDecoder::DecodeMerged(
    absl::Span<const absl::Span<const uint8_t>> buffers,
    absl::Span<const MutablePageRef> device_pages) {
  KVH_RETURN_IF_ERROR(NothingPending());
  Lane& lane = lanes_[0];
  // Pinned staging: DecodeAsync copies it to the device chunk by chunk on
  // the workspace's copy stream, overlapped with the decoding.
  KVH_ASSIGN_OR_RETURN(
      const size_t size,
      MergeKvtcPages(codec_->calibration(), fingerprint_, codec_->geometry(),
                     buffers, absl::MakeSpan(lane.staging, staging_bytes_)));
  const auto merged = absl::MakeConstSpan(lane.staging, size);
  KVH_RETURN_IF_ERROR(codec_->DecodeAsync(merged, device_pages, lane.ws->get(),
                                          lane.stream, &scratch_));
  // Waits for the decode: the pages are complete once this is OK.
  return codec_->FinishDecode(merged, lane.ws->get());
}

absl::Status KvtcBatchDecoder::CheckBatch(size_t buffers, size_t pages) const {
  if (buffers != pages || pages > batch_pages_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("buffers: %u buffers for %u pages (at most %u a batch)",
                        buffers, pages, batch_pages_));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> KvtcBatchDecoder::EnqueueToDevice(
    absl::Span<const absl::Span<const uint8_t>> buffers,
    absl::Span<const MutablePageRef> pages, const PagedKvDest& dest) {
  absl::MutexLock l(&mu_);
  return EnqueueLocked(buffers, pages, dest);
}

absl::StatusOr<uint64_t> KvtcBatchDecoder::EnqueueLocked(
    absl::Span<const absl::Span<const uint8_t>> buffers,
    absl::Span<const MutablePageRef> pages, const PagedKvDest& dest) {
  KVH_RETURN_IF_ERROR(CheckBatch(buffers.size(), pages.size()));
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (pages.empty()) {
    finished_[next_ticket_] = absl::OkStatus();
    return next_ticket_++;
  }
  KVH_ASSIGN_OR_RETURN(const int k, TakeLane());
  Lane& lane = lanes_[k];
  KVH_ASSIGN_OR_RETURN(
      const size_t size,
      MergeKvtcPages(codec_->calibration(), fingerprint_, codec_->geometry(),
                     buffers, absl::MakeSpan(lane.staging, staging_bytes_)));
  return StartDecode(k, absl::MakeConstSpan(lane.staging, size), pages, dest,
                     KvtcDeviceInput{});
}

uint64_t KvtcBatchDecoder::StartDecode(int k, absl::Span<const uint8_t> merged,
                                       absl::Span<const MutablePageRef> pages,
                                       const PagedKvDest& dest,
                                       const KvtcDeviceInput& input) {
  Lane& lane = lanes_[k];
  lane.merged = merged;
  const uint64_t ticket = next_ticket_++;
  // The zstd stage is never in a merged buffer: no scratch is used.
  absl::Status s = codec_->DecodeAsync(lane.merged, pages, lane.ws->get(),
                                       lane.stream, nullptr, dest, input);
  if (!s.ok()) {
    finished_[ticket] = std::move(s);
    return ticket;
  }
  lane.ticket = ticket;
  pending_.push_back(k);
  return ticket;
}

absl::StatusOr<int> KvtcBatchDecoder::TakeLane() {
  if (pending_.size() == 2) FinishOldest();
  // The idle lane (lane 0 first when both are).
  const int k = lanes_[0].ticket == 0 ? 0 : 1;
  if (lanes_[k].ws == nullptr) KVH_RETURN_IF_ERROR(MakeLane(lanes_[k]));
  return k;
}

absl::StatusOr<size_t> KvtcBatchDecoder::Merge(
    absl::Span<const absl::Span<const uint8_t>> buffers,
    absl::Span<uint8_t> out) const {
  KVH_RETURN_IF_ERROR(CheckBatch(buffers.size(), buffers.size()));
  return MergeKvtcPages(codec_->calibration(), fingerprint_, codec_->geometry(),
                        buffers, out);
}

absl::StatusOr<uint64_t> KvtcBatchDecoder::EnqueueMerged(
    absl::Span<const uint8_t> merged, absl::Span<const MutablePageRef> pages,
    const PagedKvDest& dest, const KvtcDeviceInput& input) {
  if (input.data == nullptr) {
    return absl::InvalidArgumentError("input: the device copy must be set");
  }
  KVH_RETURN_IF_ERROR(CheckBatch(pages.size(), pages.size()));
  absl::MutexLock l(&mu_);
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  KVH_ASSIGN_OR_RETURN(const int k, TakeLane());
  return StartDecode(k, merged, pages, dest, input);
}

void KvtcBatchDecoder::FinishOldest() {
  const int k = pending_.front();
  pending_.pop_front();
  Lane& lane = lanes_[k];
  finished_[lane.ticket] = codec_->FinishDecode(lane.merged, lane.ws->get());
  lane.ticket = 0;
}

absl::Status KvtcBatchDecoder::FinishToDevice(uint64_t ticket) {
  absl::MutexLock l(&mu_);
  return FinishLocked(ticket);
}

absl::Status KvtcBatchDecoder::FinishLocked(uint64_t ticket) {
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    return CudaError(e, "cudaSetDevice", __FILE__, __LINE__);
  }
  while (!pending_.empty() && lanes_[pending_.front()].ticket <= ticket) {
    FinishOldest();
  }
  absl::Status first;
  for (auto it = finished_.begin();
       it != finished_.end() && it->first <= ticket;) {
    if (first.ok()) first = it->second;
    it = finished_.erase(it);
  }
  return first;
}

absl::Status KvtcBatchDecoder::DecodeToDevice(
    absl::Span<const absl::Span<const uint8_t>> buffers,
    absl::Span<const MutablePageRef> pages) {
  KVH_RETURN_IF_ERROR(CheckBatch(buffers.size(), pages.size()));
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

std::vector<absl::Status> KvtcBatchDecoder::InBatches(
    size_t pages, absl::FunctionRef<absl::Status(size_t, size_t)> batch) {
  std::vector<absl::Status> out(pages);
  const cudaError_t err = cudaSetDevice(device_);
  for (size_t first = 0; first < pages; first += batch_pages_) {
    const size_t n = std::min(batch_pages_, pages - first);
    absl::Status s = err == cudaSuccess
                         ? batch(first, n)
                         : CudaError(err, "cudaSetDevice", __FILE__, __LINE__);
    if (s.ok() || n == 1 || err != cudaSuccess) {
      for (size_t i = first; i < first + n; ++i) out[i] = s;
      continue;
    }
    // A refused batch (a corrupt page, say) again page by page, so only the
    // bad pages fail.
    for (size_t i = first; i < first + n; ++i) out[i] = batch(i, 1);
  }
  return out;
}

namespace {

// The answer to a call whose buffers do not pair up with its pages.
std::vector<absl::Status> UnpairedBuffers(size_t num_pages) {
  return std::vector<absl::Status>(
      num_pages, absl::InvalidArgumentError("buffers: one per page"));
}

}  // namespace

std::vector<absl::Status> KvtcBatchDecoder::DecodeEach(
    absl::Span<const absl::Span<const uint8_t>> buffers,
    absl::Span<const MutablePageRef> pages) {
  if (buffers.size() != pages.size()) return UnpairedBuffers(pages.size());
  absl::MutexLock l(&mu_);
  return InBatches(pages.size(), [&](size_t first, size_t n) {
    mu_.AssertHeld();  // InBatches calls it on this thread, under l
    return DecodeBatch(buffers.subspan(first, n), pages.subspan(first, n));
  });
}

std::vector<absl::Status> KvtcBatchDecoder::DecodeEachToDevice(
    absl::Span<const absl::Span<const uint8_t>> buffers,
    absl::Span<const MutablePageRef> pages) {
  if (buffers.size() != pages.size()) return UnpairedBuffers(pages.size());
  // Straight into the caller's device pages: no device batch, no bounce;
  // each batch enqueued while the one before decodes.
  struct Batch {
    size_t first, n;
    uint64_t ticket;
  };
  std::vector<Batch> batches, refused;
  // One caller's batches at a time: concurrent calls (the daemon's fetches
  // and stagings) wait here rather than see each other's batches.
  absl::MutexLock l(&mu_);
  if (absl::Status s = NothingPending(); !s.ok()) {
    return std::vector<absl::Status>(pages.size(), s);
  }
  std::vector<absl::Status> out(pages.size());
  for (size_t first = 0; first < pages.size(); first += batch_pages_) {
    const size_t n = std::min(batch_pages_, pages.size() - first);
    absl::StatusOr<uint64_t> t =
        EnqueueLocked(buffers.subspan(first, n), pages.subspan(first, n));
    if (!t.ok()) {
      for (size_t i = first; i < first + n; ++i) out[i] = t.status();
      if (n > 1) refused.push_back({first, n, 0});
      continue;
    }
    batches.push_back({first, n, *t});
  }
  for (const Batch& b : batches) {
    absl::Status s = FinishLocked(b.ticket);
    for (size_t i = b.first; i < b.first + b.n; ++i) out[i] = s;
    if (!s.ok() && b.n > 1) refused.push_back(b);
  }
  // A refused batch (a corrupt page, say) again page by page, so only the
  // bad pages fail.
  for (const Batch& b : refused) {
    for (size_t i = b.first; i < b.first + b.n; ++i) {
      out[i] = DecodeMerged(buffers.subspan(i, 1), pages.subspan(i, 1));
    }
  }
  return out;
}

}  // namespace gpu
}  // namespace kvharbor
