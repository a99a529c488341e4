#include "cuda/tier/device_tier.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/codec/kvtc/kvtc_split.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/tier/kvtc_page_codecs.h"

namespace kvharbor {
namespace gpu {

absl::StatusOr<std::unique_ptr<KvtcBatchEncoder>> KvtcBatchEncoder::Create(
    int device, std::shared_ptr<const KvtcGpuCodec> codec, bool zstd,
    int zstd_level, size_t batch_pages) {
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<KvtcBatchEncoder> e(new KvtcBatchEncoder());
  e->device_ = device;
  e->zstd_ = zstd;
  e->zstd_level_ = zstd_level;
  e->codec_ = std::move(codec);
  if (batch_pages == 0) {
    batch_pages = std::max<size_t>(1, 4096 / e->codec_->geometry().page_size);
  }
  e->batch_pages_ = batch_pages;
  absl::StatusOr<size_t> max = e->codec_->MaxEncodedSize(batch_pages);
  if (!max.ok()) return max.status();
  e->out_bytes_ = *max;
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<std::unique_ptr<KvtcGpuWorkspaceHolder>> ws =
        KvtcGpuWorkspaceHolder::Create(*e->codec_, batch_pages);
    if (!ws.ok()) return ws.status();
    e->ws_[w] = *std::move(ws);
    void* pinned = nullptr;
    KVH_CUDA_RETURN_IF_ERROR(
        cudaHostAlloc(&pinned, e->out_bytes_, cudaHostAllocMapped));
    e->pinned_[w] = static_cast<uint8_t*>(pinned);
  }
  KVH_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&e->stream_, cudaStreamNonBlocking));
  return e;
}

KvtcBatchEncoder::~KvtcBatchEncoder() {
  DrainAndDestroyStream(device_, stream_);
  for (uint8_t* p : pinned_) {
    if (p != nullptr) cudaFreeHost(p);
  }
}

absl::StatusOr<std::string> KvtcBatchEncoder::EncodeOne(int w,
                                                        const PageRef& page) {
  const auto one = absl::MakeConstSpan(&page, 1);
  const KvtcGpuWorkspace& ws = ws_[w]->get();
  absl::StatusOr<size_t> n =
      codec_->EncodeAsync(one, pinned_[w], out_bytes_, ws, stream_);
  if (!n.ok()) return n.status();
  absl::StatusOr<size_t> size = codec_->FinishEncode(
      one, absl::MakeSpan(pinned_[w], out_bytes_), ws, &scratch_);
  if (!size.ok()) return size.status();
  // Re-split so the zstd stage applies exactly as to batched pages.
  absl::StatusOr<std::vector<std::string>> split = SplitKvtcBatch(
      codec_->calibration(), codec_->geometry(),
      absl::MakeConstSpan(pinned_[w], *size), zstd_, zstd_level_);
  if (!split.ok()) return split.status();
  return std::move((*split)[0]);
}

void KvtcBatchEncoder::Finish(int w, absl::Span<const PageRef> pages,
                              size_t first,
                              std::vector<absl::StatusOr<std::string>>* out) {
  absl::StatusOr<size_t> size = codec_->FinishEncode(
      pages, absl::MakeSpan(pinned_[w], out_bytes_), ws_[w]->get(), &scratch_);
  absl::StatusOr<std::vector<std::string>> split =
      absl::InternalError("batch not encoded");
  if (size.ok()) {
    split = SplitKvtcBatch(codec_->calibration(), codec_->geometry(),
                           absl::MakeConstSpan(pinned_[w], *size), zstd_,
                           zstd_level_);
  }
  if (split.ok() && split->size() == pages.size()) {
    for (size_t i = 0; i < pages.size(); ++i) {
      (*out)[first + i] = std::move((*split)[i]);
    }
    return;
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    (*out)[first + i] = EncodeOne(w, pages[i]);
  }
}

std::vector<absl::StatusOr<std::string>> KvtcBatchEncoder::EncodeEach(
    absl::Span<const PageRef> pages) {
  std::vector<absl::StatusOr<std::string>> out(
      pages.size(), absl::InternalError("not encoded"));
  const cudaError_t err = cudaSetDevice(device_);
  if (err != cudaSuccess) {
    for (auto& o : out) {
      o = CudaError(err, "cudaSetDevice", __FILE__, __LINE__);
    }
    return out;
  }
  // Batch k runs on workspace k % 2; batch k-1 is finished on the host
  // while batch k computes on the GPU.
  size_t pending_first = 0, pending_n = 0;
  int pending_w = -1;
  for (size_t first = 0, k = 0; first < pages.size(); first += batch_pages_) {
    const size_t n = std::min(batch_pages_, pages.size() - first);
    const int w = static_cast<int>(k++ % 2);
    absl::StatusOr<size_t> queued =
        codec_->EncodeAsync(pages.subspan(first, n), pinned_[w], out_bytes_,
                            ws_[w]->get(), stream_);
    if (pending_w >= 0) {
      Finish(pending_w, pages.subspan(pending_first, pending_n), pending_first,
             &out);
      pending_w = -1;
    }
    if (!queued.ok()) {  // input refused before anything ran: page by page
      for (size_t i = first; i < first + n; ++i)
        out[i] = EncodeOne(w, pages[i]);
      continue;
    }
    pending_first = first;
    pending_n = n;
    pending_w = w;
  }
  if (pending_w >= 0) {
    Finish(pending_w, pages.subspan(pending_first, pending_n), pending_first,
           &out);
  }
  return out;
}

CudaDeviceTier::CudaDeviceTier(std::shared_ptr<DeviceArena> arena,
                               std::string gpu_name,
                               std::unique_ptr<Xxh3Checksummer> checksummer)
    : arena_(std::move(arena)),
      gpu_name_(std::move(gpu_name)),
      checksummer_(std::move(checksummer)),
      kvtc_(std::make_unique<KvtcPageCodecs>(arena_->device())) {}

CudaDeviceTier::~CudaDeviceTier() = default;

absl::StatusOr<std::shared_ptr<CudaDeviceTier>> CudaDeviceTier::Create(
    int device, uint64_t arena_bytes) {
  absl::StatusOr<std::shared_ptr<DeviceArena>> arena =
      DeviceArena::Create(device, arena_bytes);
  if (!arena.ok()) return arena.status();
  cudaDeviceProp prop;
  KVH_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  absl::StatusOr<std::unique_ptr<Xxh3Checksummer>> checksummer =
      Xxh3Checksummer::Create(device);
  if (!checksummer.ok()) return checksummer.status();
  return std::shared_ptr<CudaDeviceTier>(new CudaDeviceTier(
      *std::move(arena), prop.name, *std::move(checksummer)));
}

absl::StatusOr<std::vector<uint64_t>> CudaDeviceTier::ChecksumPages(
    absl::Span<const uint8_t* const> pages, uint64_t bytes) {
  return checksummer_->Checksum(pages, bytes);
}

std::string CudaDeviceTier::Describe() const {
  return absl::StrFormat("GPU %d (%s), device arena %.2f GiB", arena_->device(),
                         gpu_name_,
                         arena_->bytes() / double(uint64_t{1} << 30));
}

absl::StatusOr<std::unique_ptr<PagePool>> CudaDeviceTier::CreatePool(
    size_t slot_bytes, uint32_t capacity) {
  return DevicePagePool::Create(arena_, slot_bytes, capacity);
}

absl::StatusOr<std::unique_ptr<PageBatchEncoder>> CudaDeviceTier::CreateEncoder(
    const DeviceEncoderParams& params) {
  if (params.codec != "kvtc") return std::unique_ptr<PageBatchEncoder>();
  return kvtc_->CreateEncoder(params.geometry, params.calibration_bytes);
}

absl::StatusOr<std::unique_ptr<PageBatchDecoder>> CudaDeviceTier::CreateDecoder(
    const DeviceEncoderParams& params) {
  if (params.codec != "kvtc") return std::unique_ptr<PageBatchDecoder>();
  return kvtc_->CreateDecoder(params.geometry, params.calibration_bytes);
}

}  // namespace gpu
}  // namespace kvharbor
