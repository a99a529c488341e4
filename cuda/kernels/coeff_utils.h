// Kernel launchers for the small steps between KVTC's main stages: the
// non-finite check over projected coefficients (the CPU codec refuses such
// rows), float32 -> bfloat16 conversion of coefficients for the BF16
// projection mode, and a byte copy into device or mapped pinned host memory
// at any alignment (min/max metadata into a KVTC buffer).
//
// Caller-owned memory; launchers only enqueue on `stream`. Thread-safe.
#ifndef KVHARBOR_CUDA_KERNELS_COEFF_UTILS_H_
#define KVHARBOR_CUDA_KERNELS_COEFF_UTILS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace kvharbor {
namespace gpu {

struct CheckFiniteArgs {
  const float* coeffs = nullptr;  // [rows][cols], device
  uint64_t rows = 0;
  uint64_t cols = 0;
  unsigned long long* error = nullptr;  // required
  unsigned section = 0;
  uint64_t first_row = 0;  // reported row = first_row + r
};

struct ConvertToBf16Args {
  const float* in = nullptr;  // [count], device
  uint16_t* out = nullptr;    // [count], device, bfloat16 bits (RNE)
  uint64_t count = 0;
};

struct CopyBytesArgs {
  const uint8_t* src = nullptr;  // device
  uint8_t* dst = nullptr;        // device or mapped pinned host
  uint64_t bytes = 0;
};

inline size_t CheckFiniteWorkspaceBytes(const CheckFiniteArgs&) { return 0; }
inline size_t ConvertToBf16WorkspaceBytes(const ConvertToBf16Args&) {
  return 0;
}
inline size_t CopyBytesWorkspaceBytes(const CopyBytesArgs&) { return 0; }
absl::Status LaunchCheckFinite(const CheckFiniteArgs& args,
                               cudaStream_t stream);
absl::Status LaunchConvertToBf16(const ConvertToBf16Args& args,
                                 cudaStream_t stream);
absl::Status LaunchCopyBytes(const CopyBytesArgs& args, cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_COEFF_UTILS_H_
