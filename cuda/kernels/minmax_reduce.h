// Kernel launcher: per-row minimum and maximum of columns [start, end) of a
// coefficient matrix (MinMaxRange in core/codec/kvtc/kvtc_stages.h, bit for
// bit: among equal values, +0/-0 included, the first column wins, as in the
// CPU's sequential scan).
//
// coeffs is [rows][ld] float32 row-major (device); mins/maxs are device
// [rows] arrays. Optionally flags rows whose max - min overflows float
// (kCoefficientSpan), as the CPU codec refuses them. Caller-owned memory.
// Thread-safe.
#ifndef KVHARBOR_CUDA_KERNELS_MINMAX_REDUCE_H_
#define KVHARBOR_CUDA_KERNELS_MINMAX_REDUCE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace kvharbor {
namespace gpu {

struct MinMaxArgs {
  const float* coeffs = nullptr;  // [rows][ld]
  uint64_t rows = 0;
  uint64_t ld = 0;
  uint64_t start = 0;
  uint64_t end = 0;
  float* mins = nullptr;                // [rows]
  float* maxs = nullptr;                // [rows]
  unsigned long long* error = nullptr;  // optional
  unsigned section = 0;                 // for error codes
  uint64_t first_row = 0;               // row number reported = first_row + r
};

inline size_t MinMaxWorkspaceBytes(const MinMaxArgs&) { return 0; }
absl::Status LaunchMinMax(const MinMaxArgs& args, cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_MINMAX_REDUCE_H_
