// Scalar conversions between float32 and the small floating-point formats
// that KV pages and KVTC buffers use: FP8 E4M3FN, bfloat16 and IEEE fp16.
//
// These are the bit-exact reference for the CUDA kernels in cuda/: a GPU
// implementation must produce the same bits for every input (the tests in
// tests/core/base/fp8_test.cc enumerate all FP8 codes and a table of edge
// cases). Pure functions on values; no memory is owned; thread-safe.
//
// FP8 E4M3FN (the "FN" variant used by CUDA's __nv_fp8_e4m3 and by
// torch.float8_e4m3fn): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa
// bits, no infinities, NaN only as S.1111.111 (0x7F / 0xFF), largest finite
// magnitude 448, smallest subnormal 2^-9.
//
// FloatToFp8E4M3 is a direct saturating cast, as __nv_cvt_float_to_fp8(x,
// __NV_SATFINITE, __NV_E4M3):
//   * round to nearest, ties to even, in the normal and subnormal ranges;
//   * finite values beyond 448 (after rounding) and +-infinity saturate to
//     +-448 (0x7E / 0xFE);
//   * NaN (any sign or payload) becomes 0x7F;
//   * -0.0 keeps its sign (0x80).
// Fp8E4M3ToFloat is exact (every FP8 value is a float32); 0x7F and 0xFF give a
// quiet NaN.
#ifndef KVHARBOR_CORE_BASE_FLOAT_FORMATS_H_
#define KVHARBOR_CORE_BASE_FLOAT_FORMATS_H_

#include <cstdint>

namespace kvharbor {

inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr uint8_t kFp8E4M3NaN = 0x7F;

uint8_t FloatToFp8E4M3(float value);
float Fp8E4M3ToFloat(uint8_t bits);
// True for the two NaN codes 0x7F and 0xFF.
inline bool IsFp8E4M3NaN(uint8_t bits) { return (bits & 0x7F) == 0x7F; }

// bfloat16: round to nearest even; NaN stays NaN (quiet); overflow to inf
// follows IEEE rounding (as torch / __float2bfloat16_rn).
uint16_t FloatToBf16(float value);
float Bf16ToFloat(uint16_t bits);

// IEEE binary16: round to nearest even, overflow to inf, subnormals kept,
// NaN stays NaN (as __float2half_rn).
uint16_t FloatToFp16(float value);
float Fp16ToFloat(uint16_t bits);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_BASE_FLOAT_FORMATS_H_
