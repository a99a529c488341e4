// Kernel launcher: add the calibrated mean to reconstructed KVTC rows, redo
// RoPE on keys, convert to the page dtype and scatter into pages (decode's
// last stage; ScatterRows in core/codec/kvtc/kvtc_codec.cc, bit for bit given
// the same X).
//
// X is [num_rows][features] float32 row-major, indexed as in
// cuda/kernels/gather_mean_subtract.h. Per-page rows skip sink tokens (written
// by cuda/kernels/sink_fp8.h). All pointers are device pointers owned by the
// caller; pages are written through KvtcPageInfo::data, or into an engine
// layout (MeanAddScatterArgs::dest, cuda/kernels/paged_kv_dest.h). Thread-safe.
#ifndef KVHARBOR_CUDA_KERNELS_MEAN_ADD_SCATTER_H_
#define KVHARBOR_CUDA_KERNELS_MEAN_ADD_SCATTER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "cuda/kernels/page_rows_args.h"
#include "cuda/kernels/paged_kv_dest.h"

namespace kvharbor {
namespace gpu {

struct MeanAddScatterArgs : PageRowsArgs {
  const float* in = nullptr;  // [num_rows][features]
  // Enabled: the rows go straight into this engine layout (page i to block
  // dest.block_ids[i], only the layout's layers) instead of the pages'
  // data; bit for bit what writing the pages and scattering them gives.
  PagedKvDest dest;
};

inline size_t MeanAddScatterWorkspaceBytes(const MeanAddScatterArgs&) {
  return 0;
}
// Whether the launcher takes the vector path for these args.
bool MeanAddScatterVectorized(const MeanAddScatterArgs& args);
absl::Status LaunchMeanAddScatter(const MeanAddScatterArgs& args,
                                  cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_MEAN_ADD_SCATTER_H_
