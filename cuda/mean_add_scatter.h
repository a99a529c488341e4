// Kernel launcher: add the calibrated mean to reconstructed KVTC rows, redo
// RoPE on keys, convert to the page dtype and scatter into pages (decode's
// last stage; ScatterRows in core/codec/kvtc/kvtc_codec.cc, bit for bit given
// the same X).
//
// X is [num_rows][features] float32 row-major, indexed as in
// cuda/gather_mean_subtract.h. Per-page rows skip sink tokens (written by
// cuda/sink_fp8.h). All pointers are device pointers owned by the caller;
// pages are written through KvtcPageInfo::data. Thread-safe.
#ifndef KVHARBOR_CUDA_MEAN_ADD_SCATTER_H_
#define KVHARBOR_CUDA_MEAN_ADD_SCATTER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "cuda/kvtc_device_types.h"

namespace kvharbor {
namespace gpu {

struct MeanAddScatterArgs {
  KvtcPageShape shape;
  KvtcRowKind row_kind = KvtcRowKind::kPerToken;
  int kv = 0;
  RopeStyle rope = RopeStyle::kNone;
  const KvtcPageInfo* pages = nullptr;  // [num_pages]
  uint32_t num_pages = 0;
  const KvtcTokenRef* rows = nullptr;  // per token only
  uint64_t first_row = 0;
  uint32_t num_rows = 0;
  const float* mean = nullptr;  // [features]
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  const float* in = nullptr;  // [num_rows][features]
  bool native_fp8 = false;
  // Every page pointer is 16-byte aligned: with bf16 / fp16 / fp32 pages and
  // a head_dim that allows it, kernels then use 8 / 16-byte vector accesses.
  bool pages_aligned16 = false;
  bool allow_vector = true;  // tests turn it off to check the scalar path
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

#endif  // KVHARBOR_CUDA_MEAN_ADD_SCATTER_H_
