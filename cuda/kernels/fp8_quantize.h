// Kernel launchers: FP8 E4M3 quantization of a column range of a coefficient
// matrix and its inverse (QuantizeFp8Range / DequantizeFp8Range in
// core/codec/kvtc/kvtc_stages.h, bit for bit on either conversion path); the
// inverse also reports NaN codes through an optional error word.
//
// coeffs is [rows][ld] float32 row-major in device memory; the packed bytes
// are [rows][end - start], in device memory or mapped pinned host memory
// (any alignment: kernels use aligned 32-bit accesses inside the run and byte
// accesses at its ends, and touch no byte outside it). Caller-owned memory.
// Thread-safe.
#ifndef KVHARBOR_CUDA_KERNELS_FP8_QUANTIZE_H_
#define KVHARBOR_CUDA_KERNELS_FP8_QUANTIZE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace kvharbor {
namespace gpu {

struct QuantizeFp8Args {
  const float* coeffs = nullptr;
  uint64_t rows = 0;
  uint64_t ld = 0;
  uint64_t start = 0;
  uint64_t end = 0;
  uint8_t* out = nullptr;  // [rows][end - start]
  bool native_fp8 = false;
};

struct DequantizeFp8Args {
  const uint8_t* in = nullptr;  // [rows][end - start]
  uint64_t rows = 0;
  uint64_t ld = 0;
  uint64_t start = 0;
  uint64_t end = 0;
  float* coeffs = nullptr;  // columns [start, end) of [rows][ld] written
  bool native_fp8 = false;
  // Optional error word: a row holding an FP8 NaN code (0x7F / 0xFF, which
  // the encoder never writes) raises KvtcDataErrorCode(section, range,
  // first_row + row), so a decoder needs no host pass over the bytes.
  unsigned long long* error = nullptr;
  unsigned section = 0;
  unsigned range = 0;
  uint64_t first_row = 0;
};

inline size_t QuantizeFp8WorkspaceBytes(const QuantizeFp8Args&) { return 0; }
inline size_t DequantizeFp8WorkspaceBytes(const DequantizeFp8Args&) {
  return 0;
}
absl::Status LaunchQuantizeFp8(const QuantizeFp8Args& args,
                               cudaStream_t stream);
absl::Status LaunchDequantizeFp8(const DequantizeFp8Args& args,
                                 cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_FP8_QUANTIZE_H_
