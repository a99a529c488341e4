// Kernel launcher: gather KVTC rows from scattered pages, undo RoPE on keys,
// subtract the calibrated mean (encode stage 1; GatherRows in
// core/codec/kvtc/kvtc_codec.cc).
//
// Output X is [num_rows][features] row-major, float32 or bfloat16 (the
// latter feeds the BF16 tensor-core projection). Row kinds as in
// core/codec/kvtc/kvtc_calibration.h: per token, row = token of `rows`,
// features [layer][kv_head][head_dim]; per page, row = page * num_layers +
// layer, features [token][kv_head][head_dim], sink tokens written as 0 (the
// mean). With the float32 output the values equal the CPU reference bit for
// bit. All pointers are device pointers owned by the caller; the launcher only
// enqueues work on `stream`. Thread-safe.
#ifndef KVHARBOR_CUDA_KERNELS_GATHER_MEAN_SUBTRACT_H_
#define KVHARBOR_CUDA_KERNELS_GATHER_MEAN_SUBTRACT_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "cuda/kernels/page_rows_args.h"

namespace kvharbor {
namespace gpu {

struct GatherMeanSubtractArgs : PageRowsArgs {
  void* out = nullptr;  // [num_rows][features]
  bool out_bf16 = false;
  // Optional error word (kNonFiniteInput, section = kv, row = first_row + r).
  unsigned long long* error = nullptr;
};

// Features of one row for these args' row kind.
uint64_t GatherFeatures(const GatherMeanSubtractArgs& args);
inline size_t GatherMeanSubtractWorkspaceBytes(const GatherMeanSubtractArgs&) {
  return 0;
}
// Whether the launcher takes the vector path for these args.
bool GatherMeanSubtractVectorized(const GatherMeanSubtractArgs& args);
absl::Status LaunchGatherMeanSubtract(const GatherMeanSubtractArgs& args,
                                      cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_GATHER_MEAN_SUBTRACT_H_
