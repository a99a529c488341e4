// Kernel launchers: int8 KV-cache quantization with per-channel scale and
// offset ("C8", msmodelslim; CPU reference QuantizeC8 / DequantizeC8 in
// core/codec/c8/int8_c8_codec.h, matched bit for bit: IEEE division, add,
// ties-to-even rounding and saturation in float, no fused multiply-add).
//
// Layout (dimension order): values [layer][row][channel] in a page dtype
// (core DType: bf16, fp16, fp32 or fp8 e4m3; read and written as
// core/base/float_formats.h converts them), codes [layer][row][channel] int8,
// scale and offset [layer][channel] float32. One (K or V) block of a page in
// layout kKvLayerTokenHeadDim is exactly [layer][page_size][kv_channels],
// so a page's K half is one call with the K scales and its V half another.
// A channel's scale must be finite and > 0 and its offset within
// [-128, 127] (C8Scales::Validate; the kernels do not re-check them).
//
// Non-finite inputs cannot be coded (the CPU codec refuses them): the
// quantizer writes code 0 for them and, when `first_bad` is given, stores
// there the smallest flat index of such a value (it must hold
// kC8NoBadIndex before the launch). All pointers are caller-owned device
// memory (or mapped pinned host memory). Thread-safe.
#ifndef KVHARBOR_CUDA_KERNELS_INT8_C8_QUANTIZE_H_
#define KVHARBOR_CUDA_KERNELS_INT8_C8_QUANTIZE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "types/geometry.h"

namespace kvharbor {
namespace gpu {

inline constexpr unsigned long long kC8NoBadIndex = ~0ull;

struct QuantizeC8Args {
  DType dtype = DType::kBF16;
  uint32_t layers = 0;
  uint64_t rows = 0;
  uint32_t channels = 0;
  const void* values = nullptr;             // [layer][row][channel], dtype
  const float* scale = nullptr;             // [layer][channel]
  const float* offset = nullptr;            // [layer][channel]
  int8_t* codes = nullptr;                  // [layer][row][channel]
  unsigned long long* first_bad = nullptr;  // optional, see above
};

struct DequantizeC8Args {
  DType dtype = DType::kBF16;
  uint32_t layers = 0;
  uint64_t rows = 0;
  uint32_t channels = 0;
  const int8_t* codes = nullptr;  // [layer][row][channel]
  const float* scale = nullptr;   // [layer][channel]
  const float* offset = nullptr;  // [layer][channel]
  void* values = nullptr;         // [layer][row][channel], dtype
};

inline size_t QuantizeC8WorkspaceBytes(const QuantizeC8Args&) { return 0; }
inline size_t DequantizeC8WorkspaceBytes(const DequantizeC8Args&) { return 0; }

// InvalidArgument (naming the field) for null pointers, zero or oversized
// dimensions (layers * rows * channels < 2^40) or an unknown dtype.
absl::Status LaunchQuantizeC8(const QuantizeC8Args& args, cudaStream_t stream);
absl::Status LaunchDequantizeC8(const DequantizeC8Args& args,
                                cudaStream_t stream);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_INT8_C8_QUANTIZE_H_
