#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/device_math.cuh"
#include "cuda/kernels/intx_quantize.h"
#include "cuda/kernels/kernel_dispatch.cuh"

namespace kvharbor {
namespace gpu {
namespace {

__device__ __forceinline__ uint64_t BytesPerRow(uint64_t width, int bits) {
  const uint64_t per_byte = 8 / bits;
  return (width + per_byte - 1) / per_byte;
}

// interval as the CPU computes it: max - min, 1 when below 1e-10.
__device__ __forceinline__ float Interval(float mn, float mx) {
  const float interval = __fsub_rn(mx, mn);
  return interval < 1e-10f ? 1.0f : interval;
}

// One block per row; each output byte packs 8 / bits values LSB-first.
__global__ void QuantizeIntXKernel(QuantizeIntXArgs a) {
  const uint64_t width = a.end - a.start;
  const int per_byte = 8 / a.bits;
  const uint64_t row_bytes = BytesPerRow(width, a.bits);
  const float* row = a.coeffs + blockIdx.x * a.ld + a.start;
  const float mn = a.mins[blockIdx.x];
  const float interval = Interval(mn, a.maxs[blockIdx.x]);
  const float max_q = static_cast<float>((1 << a.bits) - 1);
  dev::BlockWriteBytes(
      a.out + blockIdx.x * row_bytes, row_bytes, [&](uint64_t k) -> uint8_t {
        uint32_t byte = 0;
        for (int j = 0; j < per_byte; ++j) {
          const uint64_t c = k * per_byte + j;
          if (c >= width) break;
          float q = roundf(
              __fmul_rn(__fdiv_rn(__fsub_rn(row[c], mn), interval), max_q));
          q = q < 0.0f ? 0.0f : (q > max_q ? max_q : q);
          if (q != q) q = 0.0f;  // NaN: only for rows the codec refuses
          byte |= static_cast<uint32_t>(q) << (j * a.bits);
        }
        return static_cast<uint8_t>(byte);
      });
}

__device__ __forceinline__ float LoadFloatBytes(const uint8_t* p) {
  const uint32_t u =
      static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
      (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  return __uint_as_float(u);
}

__global__ void DequantizeIntXKernel(DequantizeIntXArgs a) {
  __shared__ float s_minmax[2];
  if (threadIdx.x == 0) {
    const float mn = LoadFloatBytes(a.mins + 4 * uint64_t{blockIdx.x});
    const float mx = LoadFloatBytes(a.maxs + 4 * uint64_t{blockIdx.x});
    s_minmax[0] = mn;
    s_minmax[1] = mx;
    // The CPU decoder's metadata check; NaN fails mn <= mx.
    if (!dev::IsFinite(mn) || !dev::IsFinite(mx) || !(mn <= mx) ||
        !dev::IsFinite(__fsub_rn(mx, mn))) {
      dev::RaiseError(a.error, KvtcDataErrorCode(a.section, a.range,
                                                 a.first_row + blockIdx.x));
    }
  }
  __syncthreads();
  const float mn = s_minmax[0];
  const float interval = Interval(mn, s_minmax[1]);
  const float max_q = static_cast<float>((1 << a.bits) - 1);
  const uint32_t mask = (1u << a.bits) - 1;
  const uint64_t width = a.end - a.start;
  const int per_byte = 8 / a.bits;
  const uint64_t row_bytes = BytesPerRow(width, a.bits);
  const uint8_t* src = a.in + blockIdx.x * row_bytes;
  float* row = a.coeffs + blockIdx.x * a.ld + a.start;
  const uintptr_t base = reinterpret_cast<uintptr_t>(src);
  const uintptr_t lo = base & ~uintptr_t{3};
  const uint64_t words = (base + row_bytes - lo + 3) / 4;
  for (uint64_t w = threadIdx.x; w < words; w += blockDim.x) {
    const uint32_t word = dev::LoadWordOrBytes(src, row_bytes, w, lo);
    for (int b = 0; b < 4; ++b) {
      const uintptr_t addr = lo + 4 * w + b;
      if (addr < base || addr >= base + row_bytes) continue;
      const uint32_t byte = (word >> (8 * b)) & 0xFFu;
      const uint64_t k = addr - base;
      for (int j = 0; j < per_byte; ++j) {
        const uint64_t c = k * per_byte + j;
        if (c >= width) break;
        const uint32_t q = (byte >> (j * a.bits)) & mask;
        row[c] = __fadd_rn(
            __fdiv_rn(__fmul_rn(static_cast<float>(q), interval), max_q), mn);
      }
    }
  }
}

absl::Status CheckIntX(const char* what, const void* a, const void* b,
                       const void* mins, const void* maxs, uint64_t rows,
                       uint64_t ld, uint64_t start, uint64_t end, int bits) {
  if (a == nullptr || b == nullptr || mins == nullptr || maxs == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: null data pointer", what));
  }
  if (bits != 1 && bits != 2 && bits != 4 && bits != 8) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: bits %d is not 1, 2, 4 or 8", what, bits));
  }
  return dev::CheckColumnRange(what, rows, ld, start, end);
}

unsigned ThreadsFor(uint64_t width, int bits) {
  const uint64_t per_byte = 8 / bits;
  const uint64_t words = ((width + per_byte - 1) / per_byte) / 4 + 1;
  const uint64_t t = (words + 31) / 32 * 32;
  return static_cast<unsigned>(t > 256 ? 256 : t);
}

// One block per coefficient row, after CheckIntX of `in` and `out`:
// launch(blocks, threads), then the launch check naming `call`.
template <typename Args, typename F>
absl::Status LaunchPerRow(const char* what, const char* call, const Args& a,
                          const void* in, const void* out, cudaStream_t stream,
                          F&& launch) {
  if (a.rows == 0) return absl::OkStatus();
  KVH_RETURN_IF_ERROR(CheckIntX(what, in, out, a.mins, a.maxs, a.rows, a.ld,
                                a.start, a.end, a.bits));
  launch(static_cast<unsigned>(a.rows), ThreadsFor(a.end - a.start, a.bits));
  KVH_CUDA_CHECK_LAUNCH(call);
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchQuantizeIntX(const QuantizeIntXArgs& a,
                                cudaStream_t stream) {
  return LaunchPerRow(
      "quantize_intx", "QuantizeIntXKernel<<<rows, threads, 0, stream>>>", a,
      a.coeffs, a.out, stream, [&](unsigned blocks, unsigned threads) {
        QuantizeIntXKernel<<<blocks, threads, 0, stream>>>(a);
      });
}

absl::Status LaunchDequantizeIntX(const DequantizeIntXArgs& a,
                                  cudaStream_t stream) {
  return LaunchPerRow(
      "dequantize_intx", "DequantizeIntXKernel<<<rows, threads, 0, stream>>>",
      a, a.in, a.coeffs, stream, [&](unsigned blocks, unsigned threads) {
        DequantizeIntXKernel<<<blocks, threads, 0, stream>>>(a);
      });
}

}  // namespace gpu
}  // namespace kvharbor
