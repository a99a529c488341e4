// Kernel launcher: an engine's paged KV cache -> pages in the namespace's
// page layout (the reverse of cuda/kernels/paged_kv_scatter.h; dimension order
// in cuda/kernels/paged_kv_shape.h). Block block_ids[i] of every layer the
// layout holds fills page i; a layout of all the namespace's layers makes whole
// pages (what Insert stores). The CPU reference is GatherLayoutToPages
// (core/memory/paged_kv_copy.h), which the GPU tests compare with.
//
// Same launch shape and vector widths as the scatter. A block id outside
// [0, num_blocks) is skipped (its page is not written; callers check ids
// first with CheckBlockIds).
//
// All pointers are device addresses owned by the caller; tables in device
// memory. Asynchronous on `stream`. Thread-safe.
#ifndef KVHARBOR_CUDA_KERNELS_PAGED_KV_GATHER_H_
#define KVHARBOR_CUDA_KERNELS_PAGED_KV_GATHER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "cuda/kernels/paged_kv_shape.h"

namespace kvharbor {
namespace gpu {

using PagedKvGatherArgs = PagedKvCopyArgs<uint8_t>;

inline size_t PagedKvGatherWorkspaceBytes(const PagedKvGatherArgs&) {
  return 0;
}
absl::Status LaunchPagedKvGather(const PagedKvGatherArgs& args,
                                 cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_PAGED_KV_GATHER_H_
