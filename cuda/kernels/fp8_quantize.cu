#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/device_math.cuh"
#include "cuda/kernels/fp8_quantize.h"
#include "cuda/kernels/kernel_dispatch.cuh"

namespace kvharbor {
namespace gpu {
namespace {

// One block per row.
template <bool kNative>
__global__ void QuantizeFp8Kernel(QuantizeFp8Args a) {
  const uint64_t width = a.end - a.start;
  const float* row = a.coeffs + blockIdx.x * a.ld + a.start;
  dev::BlockWriteBytes(a.out + blockIdx.x * width, width, [&](uint64_t k) {
    return dev::FloatToFp8<kNative>(row[k]);
  });
}

template <bool kNative>
__global__ void DequantizeFp8Kernel(DequantizeFp8Args a) {
  const uint64_t width = a.end - a.start;
  const uint8_t* src = a.in + blockIdx.x * width;
  float* row = a.coeffs + blockIdx.x * a.ld + a.start;
  const uintptr_t base = reinterpret_cast<uintptr_t>(src);
  const uintptr_t lo = base & ~uintptr_t{3};
  const uint64_t words = (base + width - lo + 3) / 4;
  uint32_t nan_codes = 0;
  for (uint64_t w = threadIdx.x; w < words; w += blockDim.x) {
    // Bytes outside the run read as 0, which is no NaN code.
    const uint32_t word = dev::LoadWordOrBytes(src, width, w, lo);
    nan_codes |= dev::Fp8NanCodeBits(word);
    for (int b = 0; b < 4; ++b) {
      const uintptr_t addr = lo + 4 * w + b;
      if (addr < base || addr >= base + width) continue;
      row[addr - base] =
          dev::Fp8ToFloat<kNative>(static_cast<uint8_t>(word >> (8 * b)));
    }
  }
  if (nan_codes != 0) {
    dev::RaiseError(a.error, KvtcDataErrorCode(a.section, a.range,
                                               a.first_row + blockIdx.x));
  }
}

absl::Status CheckRange(const char* what, const void* a, const void* b,
                        uint64_t rows, uint64_t ld, uint64_t start,
                        uint64_t end) {
  if (a == nullptr || b == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: null data pointer", what));
  }
  return dev::CheckColumnRange(what, rows, ld, start, end);
}

// One block per coefficient row, after CheckRange of `in` and `out`:
// launch(native, blocks, threads), then the launch check naming `call`.
template <typename Args, typename F>
absl::Status LaunchPerRow(const char* what, const char* call, const Args& a,
                          const void* in, const void* out, cudaStream_t stream,
                          F&& launch) {
  if (a.rows == 0) return absl::OkStatus();
  KVH_RETURN_IF_ERROR(CheckRange(what, in, out, a.rows, a.ld, a.start, a.end));
  const unsigned threads = dev::BlockThreads((a.end - a.start) / 4 + 1);
  const unsigned blocks = static_cast<unsigned>(a.rows);
  dev::DispatchBool(a.native_fp8,
                    [&](auto nat) { launch(nat, blocks, threads); });
  KVH_CUDA_CHECK_LAUNCH(call);
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchQuantizeFp8(const QuantizeFp8Args& a, cudaStream_t stream) {
  return LaunchPerRow("quantize_fp8",
                      "QuantizeFp8Kernel<<<rows, threads, 0, stream>>>", a,
                      a.coeffs, a.out, stream,
                      [&](auto nat, unsigned blocks, unsigned threads) {
                        QuantizeFp8Kernel<decltype(nat)::value>
                            <<<blocks, threads, 0, stream>>>(a);
                      });
}

absl::Status LaunchDequantizeFp8(const DequantizeFp8Args& a,
                                 cudaStream_t stream) {
  return LaunchPerRow(
      "dequantize_fp8", "DequantizeFp8Kernel<<<rows, threads, 0, stream>>>", a,
      a.in, a.coeffs, stream, [&](auto nat, unsigned blocks, unsigned threads) {
        DequantizeFp8Kernel<decltype(nat)::value>
            <<<blocks, threads, 0, stream>>>(a);
      });
}

}  // namespace gpu
}  // namespace kvharbor
