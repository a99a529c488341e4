// Kernel launcher: pages in the namespace's page layout -> an engine's
// paged KV cache (types/kv_layout.h, dimension order in
// cuda/kernels/paged_kv_shape.h). Page i goes to block block_ids[i] of every
// layer the layout holds; the CPU reference is ScatterPagesToLayout
// (core/memory/paged_kv_copy.h), which the GPU tests compare with.
//
// One launch moves a whole batch: one CUDA block per (page, layer, K or V)
// block, copying the longest contiguous runs with the widest vector
// accesses (up to 16 bytes) the alignments allow, so that device-to-device
// batches run near memory bandwidth. The pages may lie anywhere the GPU can
// read: a device staging buffer (page_base + i * page_pitch), or a table of
// page addresses (the daemon's IPC-mapped device arena, GPU-decoded
// batches). A block id outside [0, num_blocks) is skipped (the caller has
// checked them: CheckBlockIds), so no write leaves the layout's blocks.
//
// All pointers are device addresses owned by the caller; tables in device
// memory. Asynchronous on `stream`. Thread-safe.
#ifndef KVHARBOR_CUDA_KERNELS_PAGED_KV_SCATTER_H_
#define KVHARBOR_CUDA_KERNELS_PAGED_KV_SCATTER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "cuda/kernels/paged_kv_shape.h"

namespace kvharbor {
namespace gpu {

using PagedKvScatterArgs = PagedKvCopyArgs<const uint8_t>;

inline size_t PagedKvScatterWorkspaceBytes(const PagedKvScatterArgs&) {
  return 0;
}
// Bytes per vector access a copy of `shape` uses (1, 2, 4, 8 or 16).
uint32_t PagedKvVectorBytes(const PagedKvShape& shape, uint32_t page_align,
                            uint32_t layout_align, uint32_t max_vector_bytes);
// Largest power of two (<= 16) that divides `address`.
uint32_t AlignmentOf(uint64_t address);
absl::Status LaunchPagedKvScatter(const PagedKvScatterArgs& args,
                                  cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_PAGED_KV_SCATTER_H_
