// Device-side element conversions and byte-run helpers shared by the KVTC
// kernels (internal to cuda/; include only from .cu files).
//
// Every conversion here is a bit-exact port of core/base/float_formats.cc, so a
// kernel and the CPU reference agree on every input, NaN payloads included.
// Arithmetic uses explicit round-to-nearest intrinsics (__fmul_rn, ...) where
// nvcc could otherwise contract a multiply and an add into an FMA, which the
// x86-64 reference (no FMA in the baseline ISA) never does.
#ifndef KVHARBOR_CUDA_KERNELS_DEVICE_MATH_CUH_
#define KVHARBOR_CUDA_KERNELS_DEVICE_MATH_CUH_

#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/kernels/kvtc_device_types.h"

namespace kvharbor {
namespace gpu {
namespace dev {

// 2^e for e in [-126, 127], exactly.
__device__ __forceinline__ float Pow2(int e) {
  return __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
}

// Nearest integer, ties to even, for 0 <= x < 2^24 (as RoundHalfEven in
// core/base/float_formats.cc).
__device__ __forceinline__ uint32_t RoundHalfEven(float x) {
  const float fl = floorf(x);
  const float frac = __fsub_rn(x, fl);
  uint32_t n = static_cast<uint32_t>(fl);
  if (frac > 0.5f || (frac == 0.5f && (n & 1u))) ++n;
  return n;
}

__device__ __forceinline__ uint8_t SoftFloatToFp8(float value) {
  const uint32_t bits = __float_as_uint(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return 0x7F;
  if (abs_bits >= 0x43F00000u) return sign | 0x7E;
  if (abs_bits == 0) return sign;
  const float a = __uint_as_float(abs_bits);
  int exp = static_cast<int>(abs_bits >> 23) - 127;
  if (exp < -6) exp = -6;
  const float scaled = __fmul_rn(a, Pow2(3 - exp));  // exact, in [0, 16)
  uint32_t n = RoundHalfEven(scaled);
  if (n >= 16) {
    n = 8;
    ++exp;
  }
  if (n < 8) return sign | static_cast<uint8_t>(n);
  const uint32_t biased = static_cast<uint32_t>(exp + 7);
  const uint32_t mant = n - 8;
  if (biased > 15 || (biased == 15 && mant == 7)) return sign | 0x7E;
  return sign | static_cast<uint8_t>((biased << 3) | mant);
}

__device__ __forceinline__ float SoftFp8ToFloat(uint8_t bits) {
  const uint32_t e = (bits >> 3) & 0xF;
  const uint32_t m = bits & 0x7;
  float v;
  if (e == 15 && m == 7) {
    v = __uint_as_float(0x7FC00000u);  // std::numeric_limits<float>::quiet_NaN
  } else if (e == 0) {
    v = __fmul_rn(static_cast<float>(m), Pow2(-9));
  } else {
    v = __fmul_rn(static_cast<float>(8 + m), Pow2(static_cast<int>(e) - 10));
  }
  return (bits & 0x80) ? -v : v;
}

// Hardware conversions (cvt.rn.satfinite.e4m3x2.f32 and the reverse) on
// sm_89+, with NaN handled first so the bits equal the software path's.
__device__ __forceinline__ uint8_t NativeFloatToFp8(float value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (isnan(value)) return 0x7F;
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3));
#else
  return SoftFloatToFp8(value);
#endif
}

__device__ __forceinline__ float NativeFp8ToFloat(uint8_t bits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if ((bits & 0x7F) == 0x7F) {
    return __uint_as_float((bits & 0x80) ? 0xFFC00000u : 0x7FC00000u);
  }
  const __half_raw h = __nv_cvt_fp8_to_halfraw(bits, __NV_E4M3);
  return __half2float(__half(h));
#else
  return SoftFp8ToFloat(bits);
#endif
}

template <bool kNative>
__device__ __forceinline__ uint8_t FloatToFp8(float v) {
  if constexpr (kNative) {
    return NativeFloatToFp8(v);
  } else {
    return SoftFloatToFp8(v);
  }
}

template <bool kNative>
__device__ __forceinline__ float Fp8ToFloat(uint8_t b) {
  if constexpr (kNative) {
    return NativeFp8ToFloat(b);
  } else {
    return SoftFp8ToFloat(b);
  }
}

__device__ __forceinline__ uint16_t FloatToBf16(float value) {
  const uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040);
  }
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

__device__ __forceinline__ float Bf16ToFloat(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ uint16_t FloatToFp16(float value) {
  const uint32_t bits = __float_as_uint(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t x = bits & 0x7FFFFFFFu;
  if (x > 0x7F800000u) {
    return sign | 0x7E00 | static_cast<uint16_t>((x >> 13) & 0x3FF);
  }
  if (x >= 0x477FF000u) return sign | 0x7C00;
  if (x < 0x38800000u) {
    const float scaled = __fmul_rn(__uint_as_float(x), Pow2(24));
    return sign | static_cast<uint16_t>(RoundHalfEven(scaled));
  }
  const uint32_t odd = (x >> 13) & 1u;
  const uint32_t rounded = x + 0xFFFu + odd;
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

__device__ __forceinline__ float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1F;
  const uint32_t m = h & 0x3FF;
  if (e == 0) {
    const float v = __fmul_rn(static_cast<float>(m), Pow2(-24));
    return sign ? -v : v;
  }
  if (e == 31) return __uint_as_float(sign | 0x7F800000u | (m << 13));
  return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}

// Page element access by dtype (the DType values of types/geometry.h).
template <int kDType, bool kNativeFp8>
__device__ __forceinline__ float LoadElement(const uint8_t* base,
                                             uint64_t index) {
  if constexpr (kDType == kDTypeFp32) {
    return reinterpret_cast<const float*>(base)[index];
  } else if constexpr (kDType == kDTypeBf16) {
    return Bf16ToFloat(reinterpret_cast<const uint16_t*>(base)[index]);
  } else if constexpr (kDType == kDTypeFp16) {
    return Fp16ToFloat(reinterpret_cast<const uint16_t*>(base)[index]);
  } else {
    return Fp8ToFloat<kNativeFp8>(base[index]);
  }
}

template <int kDType, bool kNativeFp8>
__device__ __forceinline__ void StoreElement(uint8_t* base, uint64_t index,
                                             float v) {
  if constexpr (kDType == kDTypeFp32) {
    reinterpret_cast<float*>(base)[index] = v;
  } else if constexpr (kDType == kDTypeBf16) {
    reinterpret_cast<uint16_t*>(base)[index] = FloatToBf16(v);
  } else if constexpr (kDType == kDTypeFp16) {
    reinterpret_cast<uint16_t*>(base)[index] = FloatToFp16(v);
  } else {
    base[index] = FloatToFp8<kNativeFp8>(v);
  }
}

__device__ __forceinline__ bool IsFinite(float v) {
  return (__float_as_uint(v) & 0x7F800000u) != 0x7F800000u;
}

// Four consecutive page elements (8 bytes for bf16/fp16, 16 for fp32; the
// caller guarantees the alignment) to and from floats.
template <int kDType>
__device__ __forceinline__ float4 Load4(const uint8_t* base, uint64_t index) {
  if constexpr (kDType == kDTypeFp32) {
    return *reinterpret_cast<const float4*>(base + index * 4);
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(base + index * 2);
    const uint16_t h[4] = {
        static_cast<uint16_t>(v.x), static_cast<uint16_t>(v.x >> 16),
        static_cast<uint16_t>(v.y), static_cast<uint16_t>(v.y >> 16)};
    float4 f;
    if constexpr (kDType == kDTypeBf16) {
      f = make_float4(Bf16ToFloat(h[0]), Bf16ToFloat(h[1]), Bf16ToFloat(h[2]),
                      Bf16ToFloat(h[3]));
    } else {
      f = make_float4(Fp16ToFloat(h[0]), Fp16ToFloat(h[1]), Fp16ToFloat(h[2]),
                      Fp16ToFloat(h[3]));
    }
    return f;
  }
}

template <int kDType>
__device__ __forceinline__ void Store4(uint8_t* base, uint64_t index,
                                       float4 f) {
  if constexpr (kDType == kDTypeFp32) {
    *reinterpret_cast<float4*>(base + index * 4) = f;
  } else {
    uint16_t h[4];
    if constexpr (kDType == kDTypeBf16) {
      h[0] = FloatToBf16(f.x);
      h[1] = FloatToBf16(f.y);
      h[2] = FloatToBf16(f.z);
      h[3] = FloatToBf16(f.w);
    } else {
      h[0] = FloatToFp16(f.x);
      h[1] = FloatToFp16(f.y);
      h[2] = FloatToFp16(f.z);
      h[3] = FloatToFp16(f.w);
    }
    uint2 v;
    v.x = static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
    v.y = static_cast<uint32_t>(h[2]) | (static_cast<uint32_t>(h[3]) << 16);
    *reinterpret_cast<uint2*>(base + index * 2) = v;
  }
}

__device__ __forceinline__ bool IsFinite4(float4 f) {
  return IsFinite(f.x) && IsFinite(f.y) && IsFinite(f.z) && IsFinite(f.w);
}

// a - b and a + b lane by lane, rounded as the scalar reference.
__device__ __forceinline__ float4 Sub4(float4 a, float4 b) {
  return make_float4(__fsub_rn(a.x, b.x), __fsub_rn(a.y, b.y),
                     __fsub_rn(a.z, b.z), __fsub_rn(a.w, b.w));
}
__device__ __forceinline__ float4 Add4(float4 a, float4 b) {
  return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y),
                     __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

// One RoPE rotation step of core RotateRope: (x, y) by (c, s), where s is
// already negated for the inverse rotation.
__device__ __forceinline__ void Rotate(float x, float y, float c, float s,
                                       float* a, float* b) {
  *a = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
  *b = __fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c));
}

// Bit 7 of each byte of the result is set where that byte of `word` is an
// FP8 E4M3 NaN code (0x7F or 0xFF): (b & 0x7F) + 1 carries into bit 7 only
// for 0x7F, and no byte's sum carries into the next.
__device__ __forceinline__ uint32_t Fp8NanCodeBits(uint32_t word) {
  return ((word & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
}

// Records an error code; the smallest code of a call wins (see
// KvtcErrorCode), so the report is deterministic whatever the thread order.
__device__ __forceinline__ void RaiseError(unsigned long long* error,
                                           unsigned long long code) {
  if (error != nullptr) atomicMin(error, code);
}

// The block writes bytes [0, n) of `dst` with byte(k) giving byte k: aligned
// 32-bit stores inside the run, single bytes at its two unaligned ends, so a
// warp's stores to mapped pinned host memory coalesce into large PCIe writes
// and no byte outside the run is touched.
template <typename ByteFn>
__device__ __forceinline__ void BlockWriteBytes(uint8_t* dst, uint64_t n,
                                                ByteFn byte) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t lo = a & ~uintptr_t{3};
  const uintptr_t end = a + n;
  const uint64_t words = (end - lo + 3) / 4;
  for (uint64_t w = threadIdx.x; w < words; w += blockDim.x) {
    const uintptr_t wa = lo + 4 * w;
    if (wa >= a && wa + 4 <= end) {
      const uint64_t k = wa - a;
      const uint32_t v = static_cast<uint32_t>(byte(k)) |
                         (static_cast<uint32_t>(byte(k + 1)) << 8) |
                         (static_cast<uint32_t>(byte(k + 2)) << 16) |
                         (static_cast<uint32_t>(byte(k + 3)) << 24);
      *reinterpret_cast<uint32_t*>(wa) = v;
    } else {
      for (uintptr_t b = wa; b < wa + 4; ++b) {
        if (b >= a && b < end) *reinterpret_cast<uint8_t*>(b) = byte(b - a);
      }
    }
  }
}

// Reads byte k of a run through aligned 32-bit loads where the whole word
// lies inside [src, src + n) (cached per thread by the caller's access
// pattern), single bytes otherwise.
__device__ __forceinline__ uint32_t LoadWordOrBytes(const uint8_t* src,
                                                    uint64_t n, uint64_t w,
                                                    uintptr_t lo) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(src);
  const uintptr_t wa = lo + 4 * w;
  if (wa >= a && wa + 4 <= a + n) {
    return *reinterpret_cast<const uint32_t*>(wa);
  }
  uint32_t v = 0;
  for (uintptr_t b = wa; b < wa + 4; ++b) {
    if (b >= a && b < a + n) {
      v |= static_cast<uint32_t>(*reinterpret_cast<const uint8_t*>(b))
           << (8 * (b - wa));
    }
  }
  return v;
}

}  // namespace dev
}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_DEVICE_MATH_CUH_
