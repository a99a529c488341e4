// Kernel launchers: attention-sink tokens to and from the sinks section's
// FP8 data (WriteSinks / ReadSinks in core/codec/kvtc/kvtc_codec.cc, bit for
// bit).
//
// Sink row j is token sinks[j]; its bytes are FP8 E4M3 of the raw page
// values, features [K, V][layer][kv_head][head_dim]. `out` / `in` may be
// device memory or mapped pinned host memory (any alignment). Pointers are
// owned by the caller. Thread-safe.
#ifndef KVHARBOR_CUDA_KERNELS_SINK_FP8_H_
#define KVHARBOR_CUDA_KERNELS_SINK_FP8_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "cuda/kernels/kvtc_device_types.h"
#include "cuda/kernels/paged_kv_dest.h"

namespace kvharbor {
namespace gpu {

// The sink tokens both directions move: sinks[i] is token `token` of page
// `page` of `pages`.
struct SinkPagesArgs {
  KvtcPageShape shape;
  const KvtcPageInfo* pages = nullptr;  // [num_pages]
  uint32_t num_pages = 0;
  const KvtcTokenRef* sinks = nullptr;  // [num_sinks]
  uint32_t num_sinks = 0;
  bool native_fp8 = false;
};

struct SinkEncodeArgs : SinkPagesArgs {
  uint8_t* out = nullptr;  // [num_sinks][2 * layers * heads * head_dim]
  // Optional error word (kNonFiniteSink, section 2, row = sink row).
  unsigned long long* error = nullptr;
};

struct SinkDecodeArgs : SinkPagesArgs {
  const uint8_t* in = nullptr;  // as SinkEncodeArgs::out
  // Optional error word: a sink row holding an FP8 NaN code raises
  // KvtcDataErrorCode(2, 0, row).
  unsigned long long* error = nullptr;
  // Enabled: the sink tokens go straight into this engine layout (page i to
  // block dest.block_ids[i], only the layout's layers), not the pages' data.
  PagedKvDest dest;
};

inline size_t SinkEncodeWorkspaceBytes(const SinkEncodeArgs&) { return 0; }
inline size_t SinkDecodeWorkspaceBytes(const SinkDecodeArgs&) { return 0; }
absl::Status LaunchSinkEncode(const SinkEncodeArgs& args, cudaStream_t stream);
absl::Status LaunchSinkDecode(const SinkDecodeArgs& args, cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_SINK_FP8_H_
