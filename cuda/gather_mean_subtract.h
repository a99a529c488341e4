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
#ifndef KVHARBOR_CUDA_GATHER_MEAN_SUBTRACT_H_
#define KVHARBOR_CUDA_GATHER_MEAN_SUBTRACT_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "cuda/kvtc_device_types.h"

namespace kvharbor {
namespace gpu {

struct GatherMeanSubtractArgs {
  KvtcPageShape shape;
  KvtcRowKind row_kind = KvtcRowKind::kPerToken;
  int kv = 0;                           // 0 = keys, 1 = values
  RopeStyle rope = RopeStyle::kNone;    // kNone: no rotation
  const KvtcPageInfo* pages = nullptr;  // [num_pages]
  uint32_t num_pages = 0;
  const KvtcTokenRef* rows = nullptr;  // per token: [first_row + num_rows]
  uint64_t first_row = 0;              // rows [first_row, first_row+num_rows)
  uint32_t num_rows = 0;
  const float* mean = nullptr;  // [features]
  // [num_pages * page_size][head_dim / 2], token g = page * page_size + t;
  // needed when rope != kNone (cuda/rope_table.h).
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  void* out = nullptr;  // [num_rows][features]
  bool out_bf16 = false;
  bool native_fp8 = false;  // fp8 pages: hardware conversion
  // Every page pointer is 16-byte aligned: with bf16 / fp16 / fp32 pages and
  // a head_dim that allows it, kernels then use 8 / 16-byte vector accesses.
  bool pages_aligned16 = false;
  bool allow_vector = true;  // tests turn it off to check the scalar path
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

#endif  // KVHARBOR_CUDA_GATHER_MEAN_SUBTRACT_H_
