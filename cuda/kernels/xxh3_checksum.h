// XXH3-64 checksums on the GPU, bit-exact with libxxhash's XXH3_64bits
// (seed 0): the checksum every page of kvharbor carries. The daemon checks
// the pages a client wrote into its device slots by CUDA IPC with it, and
// the client computes the checksums it declares with the same kernel, so
// neither copies a page to the host to hash it.
//
// LaunchXxh3Checksum hashes `count` inputs of `bytes` bytes each, whose
// device addresses are in a device array; one group of 8 threads per input
// runs the eight lanes of core/base/xxh3_lanes.h (the CPU-tested arithmetic)
// over the whole input, 8-byte loads when the input is 8-byte aligned,
// byte loads otherwise. Caller-owned memory; thread-safe.
//
// Xxh3Checksummer wraps it for a caller with host-side lists of device
// pointers: it owns the device address table, the results and a pinned
// mirror, grows them as needed, and waits for the results. One call at a
// time per object (mu_); the inputs must be device memory of its GPU (or
// memory that GPU can read, e.g. an IPC mapping).
#ifndef KVHARBOR_CUDA_KERNELS_XXH3_CHECKSUM_H_
#define KVHARBOR_CUDA_KERNELS_XXH3_CHECKSUM_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace kvharbor {
namespace gpu {

struct Xxh3ChecksumArgs {
  const uint64_t* inputs = nullptr;  // device array [count]: input addresses
  uint64_t bytes = 0;                // the length of every input
  uint32_t count = 0;
  uint64_t* out = nullptr;  // device array [count]: XXH3_64bits of each
};

inline size_t Xxh3ChecksumWorkspaceBytes(const Xxh3ChecksumArgs&) { return 0; }
// InvalidArgument for null arrays with count > 0.
absl::Status LaunchXxh3Checksum(const Xxh3ChecksumArgs& args,
                                cudaStream_t stream);

class Xxh3Checksummer {
 public:
  static absl::StatusOr<std::unique_ptr<Xxh3Checksummer>> Create(int device);
  ~Xxh3Checksummer();
  Xxh3Checksummer(const Xxh3Checksummer&) = delete;
  Xxh3Checksummer& operator=(const Xxh3Checksummer&) = delete;

  // XXH3_64bits of `bytes` bytes at each of `inputs` (device addresses),
  // in order. Enqueued after the work already on `stream` (null: the
  // checksummer's own stream), then waited for.
  absl::StatusOr<std::vector<uint64_t>> Checksum(
      absl::Span<const uint8_t* const> inputs, uint64_t bytes,
      cudaStream_t stream = nullptr);

 private:
  explicit Xxh3Checksummer(int device) : device_(device) {}
  absl::Status Reserve(size_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int device_;
  absl::Mutex mu_;
  cudaStream_t stream_ = nullptr;
  size_t capacity_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t* dev_ ABSL_GUARDED_BY(mu_) = nullptr;   // [2][capacity_]
  uint64_t* host_ ABSL_GUARDED_BY(mu_) = nullptr;  // pinned [2][capacity_]
};

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_XXH3_CHECKSUM_H_
