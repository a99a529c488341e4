// Reference implementation of KVTC's element-wise stages (quantization,
// bit packing, RoPE), one function per CUDA kernel, so GPU tests can compare
// a kernel's output against these bit for bit.
//
// Coefficient matrices are [rows][ld] float32 row-major; a range covers
// columns [start, end) of every row. Packed outputs follow
// docs/kvtc_format.md: FP8 is one byte per value, row-major; IntX rows each
// take IntXBytesPerRow(end - start, bits) bytes, LSB-first.
//
// Exact arithmetic (the CUDA kernels must match it):
//   IntX encode: interval = max - min; if (interval < 1e-10f) interval = 1;
//                q = roundf((v - min) / interval * (float)(2^bits - 1)),
//                clamped to [0, 2^bits - 1]  (roundf: ties away from zero).
//   IntX decode: v = (float)q * interval / (float)(2^bits - 1) + min.
//   min/max: plain float comparisons over the row's range.
// Callers own all memory; functions are pure and thread-safe.
#ifndef KVHARBOR_CORE_CODEC_KVTC_KVTC_STAGES_H_
#define KVHARBOR_CORE_CODEC_KVTC_KVTC_STAGES_H_

#include <cstddef>
#include <cstdint>

#include "core/codec/kvtc/kvtc_calibration.h"

namespace kvharbor {

void QuantizeFp8Range(const float* coeffs, size_t rows, size_t ld, size_t start,
                      size_t end, uint8_t* out);
void DequantizeFp8Range(const uint8_t* in, size_t rows, size_t ld, size_t start,
                        size_t end, float* coeffs);

// Per-row minimum and maximum of columns [start, end).
void MinMaxRange(const float* coeffs, size_t rows, size_t ld, size_t start,
                 size_t end, float* mins, float* maxs);
// bits in {1, 2, 4, 8}.
void QuantizeIntXRange(const float* coeffs, size_t rows, size_t ld,
                       size_t start, size_t end, int bits, const float* mins,
                       const float* maxs, uint8_t* out);
void DequantizeIntXRange(const uint8_t* in, size_t rows, size_t ld,
                         size_t start, size_t end, int bits, const float* mins,
                         const float* maxs, float* coeffs);

// cos/sin of position * inv_freq[i] for i in [0, head_dim / 2), with
// inv_freq[i] = theta^(-2i / head_dim), computed in double, rounded to float.
void RopeCosSin(uint64_t position, uint32_t head_dim, float theta, float* cos,
                float* sin);
// Rotates one head vector (head_dim floats, head_dim even) in place by the
// angles of RopeCosSin; `inverse` rotates by the negated angles (undoes
// RoPE). kNone leaves the vector unchanged.
void RotateRope(float* vec, uint32_t head_dim, RopeStyle style,
                const float* cos, const float* sin, bool inverse);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_KVTC_KVTC_STAGES_H_
