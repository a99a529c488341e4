#include "client/cuda/transfer_device.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "cuda/kernels/cuda_check.h"

namespace kvharbor {
namespace client {

namespace {

uint64_t Align(uint64_t n) { return (n + 255) / 256 * 256; }

}  // namespace

absl::StatusOr<std::unique_ptr<TransferDevice>> TransferDevice::Create(
    int device) {
  std::unique_ptr<TransferDevice> d(new TransferDevice(device));
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&d->copy_, cudaStreamNonBlocking));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&d->compute_, cudaStreamNonBlocking));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&d->wait_, cudaEventDisableTiming));
  return d;
}

TransferDevice::~TransferDevice() {
  cudaSetDevice(device_);
  Synchronize().IgnoreError();
  FreeRing();
  FreeCopyRegions();
  if (tables_dev_ != nullptr) cudaFree(tables_dev_);
  if (tables_host_ != nullptr) cudaFreeHost(tables_host_);
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  if (wait_ != nullptr) cudaEventDestroy(wait_);
  if (copy_ != nullptr) cudaStreamDestroy(copy_);
  if (compute_ != nullptr) cudaStreamDestroy(compute_);
}

void TransferDevice::FreeRing() {
  for (Slot& s : slots_) {
    if (s.device != nullptr) cudaFree(s.device);
    if (s.pinned != nullptr) cudaFreeHost(s.pinned);
    for (cudaEvent_t e : {s.copied, s.consumed, s.drained}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
  slots_.clear();
  slot_bytes_ = 0;
  slot_pages_ = 0;
  pinned_ring_ = false;
}

absl::Status TransferDevice::EnsureRing(uint64_t page_bytes,
                                        uint32_t slot_pages, int slots,
                                        bool pinned) {
  const uint64_t bytes = page_bytes * slot_pages;
  if (bytes <= slot_bytes_ && static_cast<int>(slots_.size()) >= slots &&
      (pinned_ring_ || !pinned)) {
    slot_pages_ = static_cast<uint32_t>(slot_bytes_ / page_bytes);
    return absl::OkStatus();
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_));
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
  FreeRing();
  slots_.resize(slots);
  for (Slot& s : slots_) {
    void* p = nullptr;
    KVH_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
    s.device = static_cast<uint8_t*>(p);
    if (pinned) {
      KVH_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
      s.pinned = static_cast<uint8_t*>(p);
    }
    for (cudaEvent_t* e : {&s.copied, &s.consumed, &s.drained}) {
      KVH_CUDA_RETURN_IF_ERROR(
          cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    }
  }
  slot_bytes_ = bytes;
  slot_pages_ = slot_pages;
  pinned_ring_ = pinned;
  return absl::OkStatus();
}

void TransferDevice::FreeCopyRegions() {
  for (CopyRegion& r : regions_) {
    if (r.pinned != nullptr) cudaFreeHost(r.pinned);
    if (r.device != nullptr) cudaFree(r.device);
    if (r.copied != nullptr) cudaEventDestroy(r.copied);
  }
  regions_.clear();
  region_bytes_ = 0;
}

absl::Status TransferDevice::EnsureCopyRegions(int count, uint64_t bytes) {
  if (static_cast<int>(regions_.size()) >= count && region_bytes_ >= bytes) {
    return absl::OkStatus();
  }
  FreeCopyRegions();
  regions_.resize(count);
  for (CopyRegion& r : regions_) {
    void* p = nullptr;
    KVH_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
    r.pinned = static_cast<uint8_t*>(p);
    KVH_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
    r.device = static_cast<uint8_t*>(p);
    KVH_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&r.copied, cudaEventDisableTiming));
  }
  region_bytes_ = bytes;
  return absl::OkStatus();
}

absl::StatusOr<TransferDevice::Tables> TransferDevice::UploadTables(
    absl::Span<const int64_t> blocks, absl::Span<const uint64_t> k,
    absl::Span<const uint64_t> v, absl::Span<const uint64_t> pages) {
  const uint64_t sizes[4] = {Align(blocks.size() * 8), Align(k.size() * 8),
                             Align(v.size() * 8), Align(pages.size() * 8)};
  const uint64_t total = sizes[0] + sizes[1] + sizes[2] + sizes[3];
  // The previous call's upload must have left the pinned mirror.
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
  if (total > tables_bytes_) {
    if (tables_dev_ != nullptr) cudaFree(tables_dev_);
    if (tables_host_ != nullptr) cudaFreeHost(tables_host_);
    tables_dev_ = tables_host_ = nullptr;
    tables_bytes_ = 0;
    void* p = nullptr;
    KVH_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, total));
    tables_dev_ = static_cast<uint8_t*>(p);
    KVH_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, total, cudaHostAllocPortable));
    tables_host_ = static_cast<uint8_t*>(p);
    tables_bytes_ = total;
  }
  uint64_t at = 0;
  const void* src[4] = {blocks.data(), k.data(), v.data(), pages.data()};
  const size_t n[4] = {blocks.size(), k.size(), v.size(), pages.size()};
  uint8_t* dev[4];
  for (int i = 0; i < 4; ++i) {
    if (n[i] != 0) std::memcpy(tables_host_ + at, src[i], n[i] * 8);
    dev[i] = tables_dev_ + at;
    at += sizes[i];
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tables_dev_, tables_host_, total,
                                           cudaMemcpyHostToDevice, compute_));
  Tables t;
  t.blocks = reinterpret_cast<const int64_t*>(dev[0]);
  t.k = reinterpret_cast<const uint64_t*>(dev[1]);
  t.v = reinterpret_cast<const uint64_t*>(dev[2]);
  t.pages = pages.empty() ? nullptr : reinterpret_cast<const uint64_t*>(dev[3]);
  return t;
}

absl::StatusOr<uint8_t*> TransferDevice::PinnedBuffer(uint64_t bytes) {
  if (bytes <= pinned_bytes_) return pinned_;
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  pinned_ = nullptr;
  pinned_bytes_ = 0;
  void* p = nullptr;
  KVH_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  pinned_ = static_cast<uint8_t*>(p);
  pinned_bytes_ = bytes;
  return pinned_;
}

absl::StatusOr<cudaEvent_t> TransferDevice::Event(size_t i) {
  while (events_.size() <= i) {
    cudaEvent_t e = nullptr;
    KVH_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    events_.push_back(e);
  }
  return events_[i];
}

absl::StatusOr<size_t> TransferDevice::Begin(cudaStream_t stream) {
  const size_t i = events_used_;
  absl::StatusOr<cudaEvent_t> e = Event(i);
  if (!e.ok()) return e.status();
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(*e, stream));
  ++events_used_;
  return i;
}

absl::Status TransferDevice::End(const std::string& stage, size_t begin,
                                 cudaStream_t stream) {
  absl::StatusOr<size_t> end = Begin(stream);
  if (!end.ok()) return end.status();
  intervals_.push_back({stage, begin, *end});
  return absl::OkStatus();
}

absl::Status TransferDevice::Collect(TransferClock* clock) {
  absl::Status first;
  for (const Interval& in : intervals_) {
    float ms = 0;
    const cudaError_t e =
        cudaEventElapsedTime(&ms, events_[in.begin], events_[in.end]);
    if (e != cudaSuccess && first.ok()) {
      first = gpu::CudaError(e, "cudaEventElapsedTime", __FILE__, __LINE__);
    }
    clock->Add(in.stage, ms / 1e3);
  }
  intervals_.clear();
  events_used_ = 0;
  return first;
}

void TransferDevice::ResetTiming() {
  intervals_.clear();
  events_used_ = 0;
}

absl::Status TransferDevice::WaitFor(cudaStream_t stream) {
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(wait_, stream));
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, wait_, 0));
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_, wait_, 0));
  return absl::OkStatus();
}

absl::Status TransferDevice::Synchronize() {
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_));
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
  return absl::OkStatus();
}

}  // namespace client
}  // namespace kvharbor
