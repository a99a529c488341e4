#include "cuda/tier/pinned_bounce.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "cuda/kernels/cuda_check.h"

namespace kvharbor {
namespace gpu {

absl::StatusOr<std::unique_ptr<PinnedBounce>> PinnedBounce::Create(
    int device, size_t chunk_bytes) {
  if (chunk_bytes == 0) {
    return absl::InvalidArgumentError("chunk_bytes: must be positive");
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<PinnedBounce> b(new PinnedBounce());
  b->device_ = device;
  b->chunk_bytes_ = chunk_bytes;
  for (int h = 0; h < 2; ++h) {
    void* p = nullptr;
    KVH_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, chunk_bytes, 0));
    b->half_[h] = static_cast<uint8_t*>(p);
    KVH_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&b->copied_[h], cudaEventDisableTiming));
  }
  KVH_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking));
  return b;
}

PinnedBounce::~PinnedBounce() {
  DrainAndDestroyStream(device_, stream_);
  for (int h = 0; h < 2; ++h) {
    if (copied_[h] != nullptr) cudaEventDestroy(copied_[h]);
    if (half_[h] != nullptr) cudaFreeHost(half_[h]);
  }
}

absl::Status PinnedBounce::CopyToHost(absl::Span<const uint8_t* const> src,
                                      absl::Span<uint8_t* const> dst,
                                      size_t piece_bytes) {
  if (src.size() != dst.size() || piece_bytes == 0 ||
      piece_bytes > chunk_bytes_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bounce copy: %u sources, %u destinations, pieces of %u bytes (chunk "
        "%u)",
        src.size(), dst.size(), piece_bytes, chunk_bytes_));
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const size_t per_chunk = chunk_bytes_ / piece_bytes;
  // Chunk k goes to half k % 2; chunk k - 1 is copied out meanwhile.
  size_t pending_first = 0, pending_n = 0;
  int pending_half = -1;
  const auto drain = [&]() -> absl::Status {
    if (pending_half < 0) return absl::OkStatus();
    KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(copied_[pending_half]));
    for (size_t j = 0; j < pending_n; ++j) {
      std::memcpy(dst[pending_first + j], half_[pending_half] + j * piece_bytes,
                  piece_bytes);
    }
    pending_half = -1;
    return absl::OkStatus();
  };
  absl::Status status;
  for (size_t first = 0, k = 0; first < src.size() && status.ok();
       first += per_chunk, ++k) {
    const size_t n = std::min(per_chunk, src.size() - first);
    const int h = static_cast<int>(k % 2);
    for (size_t j = 0; j < n && status.ok(); ++j) {
      const cudaError_t err =
          cudaMemcpyAsync(half_[h] + j * piece_bytes, src[first + j],
                          piece_bytes, cudaMemcpyDeviceToHost, stream_);
      if (err != cudaSuccess) {
        status = CudaError(err, "cudaMemcpyAsync", __FILE__, __LINE__);
      }
    }
    if (status.ok()) {
      const cudaError_t err = cudaEventRecord(copied_[h], stream_);
      if (err != cudaSuccess) {
        status = CudaError(err, "cudaEventRecord", __FILE__, __LINE__);
      }
    }
    if (status.ok()) status = drain();
    pending_first = first;
    pending_n = n;
    pending_half = h;
  }
  if (status.ok()) status = drain();
  // Nothing may still write a half when this returns (the next call reuses
  // them).
  const cudaError_t err = cudaStreamSynchronize(stream_);
  if (status.ok() && err != cudaSuccess) {
    status = CudaError(err, "cudaStreamSynchronize", __FILE__, __LINE__);
  }
  return status;
}

}  // namespace gpu
}  // namespace kvharbor
