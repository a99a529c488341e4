// PinnedBounce: device-to-host copies into pageable memory through a
// reusable pinned bounce buffer.
//
// A cudaMemcpy from device memory into pageable host memory is synchronous
// and goes through the driver's own small staging buffer; copying many
// pages that way (one call per page, each into freshly allocated memory) is
// what made device hits slow. PinnedBounce owns two pinned halves and a
// stream: chunk k of the pieces is copied device-to-host into one half while
// the host copies chunk k-1 out of the other, so PCIe and the host memcpy
// overlap and nothing is allocated per call.
//
// Memory: owns its pinned halves (2 x chunk_bytes), stream and events, made
// on `device` by Create and freed by the destructor. Not thread-safe: one
// CopyToHost at a time (owners serialise with a mutex).
#ifndef KVHARBOR_CUDA_TIER_PINNED_BOUNCE_H_
#define KVHARBOR_CUDA_TIER_PINNED_BOUNCE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvharbor {
namespace gpu {

class PinnedBounce {
 public:
  // Halves of at least `chunk_bytes` (InvalidArgument for 0).
  static absl::StatusOr<std::unique_ptr<PinnedBounce>> Create(
      int device, size_t chunk_bytes);
  ~PinnedBounce();
  PinnedBounce(const PinnedBounce&) = delete;
  PinnedBounce& operator=(const PinnedBounce&) = delete;

  size_t chunk_bytes() const { return chunk_bytes_; }

  // Copies `piece_bytes` from each device address src[i] to host address
  // dst[i] (pageable or not; equal lengths). `piece_bytes` must not exceed
  // chunk_bytes(). On error every copy already enqueued has finished.
  absl::Status CopyToHost(absl::Span<const uint8_t* const> src,
                          absl::Span<uint8_t* const> dst, size_t piece_bytes);

 private:
  PinnedBounce() = default;
  int device_ = 0;
  size_t chunk_bytes_ = 0;
  uint8_t* half_[2] = {nullptr, nullptr};
  cudaEvent_t copied_[2] = {nullptr, nullptr};
  cudaStream_t stream_ = nullptr;
};

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_TIER_PINNED_BOUNCE_H_
