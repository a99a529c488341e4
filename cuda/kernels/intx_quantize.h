// Kernel launchers: IntX (1, 2, 4, 8 bits) affine quantization of a column
// range with per-row min/max, LSB-first packing, and its inverse
// (QuantizeIntXRange / DequantizeIntXRange in core/codec/kvtc/kvtc_stages.h,
// with the exact arithmetic stated there, bit for bit).
//
// coeffs is [rows][ld] float32 row-major in device memory. Packed rows take
// IntXBytesPerRow(end - start, bits) bytes each, unused high bits of a row's
// last byte are 0. Packed bytes and the dequantizer's min/max arrays may be
// device memory or mapped pinned host memory at any alignment (min/max are
// little-endian float32 arrays read bytewise, as they sit unaligned in a
// KVTC buffer). Caller-owned memory. Thread-safe.
#ifndef KVHARBOR_CUDA_KERNELS_INTX_QUANTIZE_H_
#define KVHARBOR_CUDA_KERNELS_INTX_QUANTIZE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace kvharbor {
namespace gpu {

struct QuantizeIntXArgs {
  const float* coeffs = nullptr;
  uint64_t rows = 0;
  uint64_t ld = 0;
  uint64_t start = 0;
  uint64_t end = 0;
  int bits = 0;                 // 1, 2, 4 or 8
  const float* mins = nullptr;  // [rows], device
  const float* maxs = nullptr;  // [rows], device
  uint8_t* out = nullptr;       // [rows][IntXBytesPerRow]
};

struct DequantizeIntXArgs {
  const uint8_t* in = nullptr;  // [rows][IntXBytesPerRow]
  uint64_t rows = 0;
  uint64_t ld = 0;
  uint64_t start = 0;
  uint64_t end = 0;
  int bits = 0;
  const uint8_t* mins = nullptr;  // [rows] float32 LE, any alignment
  const uint8_t* maxs = nullptr;  // [rows] float32 LE, any alignment
  float* coeffs = nullptr;
  // Optional error word: a row whose min / max are not finite and ordered
  // (min <= max, max - min finite; what the encoder writes) raises
  // KvtcDataErrorCode(section, range, first_row + row).
  unsigned long long* error = nullptr;
  unsigned section = 0;
  unsigned range = 0;
  uint64_t first_row = 0;
};

inline size_t QuantizeIntXWorkspaceBytes(const QuantizeIntXArgs&) { return 0; }
inline size_t DequantizeIntXWorkspaceBytes(const DequantizeIntXArgs&) {
  return 0;
}
absl::Status LaunchQuantizeIntX(const QuantizeIntXArgs& args,
                                cudaStream_t stream);
absl::Status LaunchDequantizeIntX(const DequantizeIntXArgs& args,
                                  cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_INTX_QUANTIZE_H_
