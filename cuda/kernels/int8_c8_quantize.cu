#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/device_math.cuh"
#include "cuda/kernels/int8_c8_quantize.h"
#include "cuda/kernels/kernel_dispatch.cuh"

namespace kvharbor {
namespace gpu {
namespace {

constexpr unsigned kThreads = 256;
constexpr uint64_t kMaxElements = uint64_t{1} << 40;

// QuantizeC8 of core/codec/c8/int8_c8_codec.cc: t = x / scale + offset, rint
// (ties to even), clamp in float.
template <int kDType, bool kNative>
__global__ void QuantizeC8Kernel(QuantizeC8Args a, uint64_t n) {
  const auto* in = static_cast<const uint8_t*>(a.values);
  const uint64_t per_layer = a.rows * a.channels;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t ch = (i / per_layer) * a.channels + i % a.channels;
    const float x = dev::LoadElement<kDType, kNative>(in, i);
    int8_t q = 0;
    if (dev::IsFinite(x)) {
      const float t = __fadd_rn(__fdiv_rn(x, a.scale[ch]), a.offset[ch]);
      float r = rintf(t);
      r = r < -128.0f ? -128.0f : (r > 127.0f ? 127.0f : r);
      q = static_cast<int8_t>(static_cast<int>(r));
    } else if (a.first_bad != nullptr) {
      atomicMin(a.first_bad, static_cast<unsigned long long>(i));
    }
    a.codes[i] = q;
  }
}

// DequantizeC8: (q - offset) * scale, then the page dtype's rounding.
template <int kDType, bool kNative>
__global__ void DequantizeC8Kernel(DequantizeC8Args a, uint64_t n) {
  auto* out = static_cast<uint8_t*>(a.values);
  const uint64_t per_layer = a.rows * a.channels;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t ch = (i / per_layer) * a.channels + i % a.channels;
    const float y = __fmul_rn(
        __fsub_rn(static_cast<float>(a.codes[i]), a.offset[ch]), a.scale[ch]);
    dev::StoreElement<kDType, kNative>(out, i, y);
  }
}

absl::Status CheckC8(const char* what, uint32_t layers, uint64_t rows,
                     uint32_t channels, const void* values, const void* scale,
                     const void* offset, const void* codes, uint64_t* n) {
  if (values == nullptr || scale == nullptr || offset == nullptr ||
      codes == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: values, scale, offset and codes must not be null", what));
  }
  if (layers == 0 || rows == 0 || channels == 0 ||
      rows > (kMaxElements - 1) / layers / channels) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: layers %u x rows %u x channels %u: each must be >= 1 and the "
        "product < 2^40",
        what, layers, rows, channels));
  }
  *n = uint64_t{layers} * rows * channels;
  return absl::OkStatus();
}

unsigned Blocks(uint64_t n) {
  const uint64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b > 65535 * 8 ? 65535 * 8 : b);
}

// CheckC8, then launch(dtype, native, n) for the n elements through
// LaunchForDType (naming `what` and `call`).
template <typename Args, typename F>
absl::Status LaunchC8(const char* what, const char* call, const Args& a,
                      F&& launch) {
  uint64_t n = 0;
  KVH_RETURN_IF_ERROR(CheckC8(what, a.layers, a.rows, a.channels, a.values,
                              a.scale, a.offset, a.codes, &n));
  return dev::LaunchForDType(what, "dtype", static_cast<int>(a.dtype), false,
                             call, [&](auto d, auto f) { launch(d, f, n); });
}

}  // namespace

absl::Status LaunchQuantizeC8(const QuantizeC8Args& a, cudaStream_t stream) {
  return LaunchC8("quantize_c8", "QuantizeC8Kernel<<<blocks, 256, 0, stream>>>",
                  a, [&](auto d, auto f, uint64_t n) {
                    QuantizeC8Kernel<decltype(d)::value, decltype(f)::value>
                        <<<Blocks(n), kThreads, 0, stream>>>(a, n);
                  });
}

absl::Status LaunchDequantizeC8(const DequantizeC8Args& a,
                                cudaStream_t stream) {
  return LaunchC8("dequantize_c8",
                  "DequantizeC8Kernel<<<blocks, 256, 0, stream>>>", a,
                  [&](auto d, auto f, uint64_t n) {
                    DequantizeC8Kernel<decltype(d)::value, decltype(f)::value>
                        <<<Blocks(n), kThreads, 0, stream>>>(a, n);
                  });
}

}  // namespace gpu
}  // namespace kvharbor
