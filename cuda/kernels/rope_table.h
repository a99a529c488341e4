// Kernel launcher: RoPE cos/sin tables for every token of a batch, as
// core RopeCosSin computes them (angle = position * inv_freq[i] in double,
// cos/sin in double, rounded to float). inv_freq comes from RopeInvFreq,
// computed on the host with the same std::pow expression as the CPU codec, so
// the angles are identical; CUDA's double cos/sin are within 2 ulp of glibc's,
// which changes the float result only when the double lies within 2 ulp of a
// float rounding boundary (about 1 value in 2^28).
//
// Device pointers owned by the caller. Thread-safe.
#ifndef KVHARBOR_CUDA_KERNELS_ROPE_TABLE_H_
#define KVHARBOR_CUDA_KERNELS_ROPE_TABLE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "cuda/kernels/kvtc_device_types.h"

namespace kvharbor {
namespace gpu {

struct RopeTableArgs {
  const KvtcPageInfo* pages = nullptr;  // [num_pages] (first_position used)
  uint32_t num_pages = 0;
  uint32_t page_size = 0;
  uint32_t head_dim = 0;             // even
  const double* inv_freq = nullptr;  // [head_dim / 2]
  float* cos = nullptr;              // [num_pages * page_size][head_dim / 2]
  float* sin = nullptr;              // same shape
};

// theta^(-2i / head_dim) for i in [0, head_dim / 2), as
// core/codec/kvtc/kvtc_stages.cc.
std::vector<double> RopeInvFreq(uint32_t head_dim, float theta);

inline size_t RopeTableWorkspaceBytes(const RopeTableArgs&) { return 0; }
absl::Status LaunchRopeTable(const RopeTableArgs& args, cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_ROPE_TABLE_H_
