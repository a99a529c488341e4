// Plain structs and constants that the KVTC kernels and their host callers
// share: the per-page table a batch uploads, the row tables, the error word
// a call's kernels report through, and the FP8 conversion path.
//
// Pure declarations (no CUDA types); the structs are PODs the host fills in
// pinned staging memory and copies to the device. Thread-safe (no state).
#ifndef KVHARBOR_CUDA_KERNELS_KVTC_DEVICE_TYPES_H_
#define KVHARBOR_CUDA_KERNELS_KVTC_DEVICE_TYPES_H_

#include <cstdint>

namespace kvharbor {
namespace gpu {

// DType values of types/geometry.h, usable as template arguments in kernels
// (checked against the enum in cuda/codec/kvtc_gpu_pipeline.cc).
inline constexpr int kDTypeBf16 = 1;
inline constexpr int kDTypeFp16 = 2;
inline constexpr int kDTypeFp32 = 3;
inline constexpr int kDTypeFp8E4M3 = 4;

// How kernels convert float <-> FP8 E4M3. Both give identical bits (see
// cuda/kernels/device_math.cuh); kNative uses the sm_89+ cvt instructions.
enum class Fp8Path : int {
  kAuto = 0,  // native when the device supports it
  kSoftware = 1,
  kNative = 2,
};

// Shape of a page and how to index it. Dimension order of a page:
// layout 1: [2 (K, V)][layer][token][kv_head][head_dim];
// layout 2: [layer][2 (K, V)][token][kv_head][head_dim].
struct KvtcPageShape {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t page_size = 0;
  int dtype = kDTypeBf16;  // core DType value
  int layout = 1;          // core PageLayout value

  // Elements of one token's run: [kv_head][head_dim].
  constexpr uint64_t TokenElements() const {
    return uint64_t{num_kv_heads} * head_dim;
  }
  // Element index in a page of token `t`, layer `l` of K (kv = 0) or V.
  constexpr uint64_t RunIndex(int kv, uint32_t l, uint32_t t) const {
    const uint64_t block = layout == 1 ? uint64_t(kv) * num_layers + l
                                       : uint64_t{l} * 2 + uint64_t(kv);
    return (block * page_size + t) * TokenElements();
  }
};

// One page of a batch, in batch order. `data` is a device-accessible pointer
// (read when encoding, written when decoding).
struct KvtcPageInfo {
  uint8_t* data = nullptr;
  uint64_t first_position = 0;
  uint32_t sinks = 0;  // its first `sinks` tokens are attention sinks
  uint32_t reserved = 0;
};

// A token of the batch: (page index in the batch, token index in the page).
// Per-token rows and sink rows are listed with these, in batch order.
struct KvtcTokenRef {
  uint32_t page = 0;
  uint32_t token = 0;
};

// Error word of a call: kernels atomicMin a code into it; kKvtcNoError when
// nothing went wrong. code = section << 56 | kind << 48 | row, so the report
// is the first error in the CPU codec's checking order (keys, values, sinks;
// inputs, then coefficients, then spans) whatever the thread order.
inline constexpr unsigned long long kKvtcNoError = ~0ull;
// Sections: 0 keys, 1 values, 2 sinks.
enum class KvtcErrorKind : unsigned {
  kNonFiniteInput = 1,        // a page value (projected token) is inf/NaN
  kNonFiniteCoefficient = 2,  // a projected coefficient is inf/NaN
  kCoefficientSpan = 3,       // IntX max - min overflows float
  kNonFiniteSink = 4,         // a sink token value is inf/NaN
  // Decoding: a payload byte the encoder never writes (an FP8 NaN code, IntX
  // min / max not finite and ordered); see KvtcDataErrorCode.
  kCorruptData = 5,
};
inline constexpr unsigned long long KvtcErrorCode(KvtcErrorKind kind,
                                                  unsigned section,
                                                  unsigned long long row) {
  return (static_cast<unsigned long long>(section & 0xFF) << 56) |
         (static_cast<unsigned long long>(kind) << 48) |
         (row & ((1ull << 48) - 1));
}

// kCorruptData codes carry the range index beside the row, so the smallest
// code is the first error in the CPU decoder's order (section, range, row):
// row = range << 36 | section row. Rows beyond 2^36 (more than any buffer
// holds) are reported as 2^36 - 1.
inline constexpr unsigned kKvtcDataRowBits = 36;
inline constexpr unsigned long long KvtcDataErrorCode(unsigned section,
                                                      unsigned range,
                                                      unsigned long long row) {
  const unsigned long long max_row = (1ull << kKvtcDataRowBits) - 1;
  return KvtcErrorCode(
      KvtcErrorKind::kCorruptData, section,
      (static_cast<unsigned long long>(range & 0xFFF) << kKvtcDataRowBits) |
          (row < max_row ? row : max_row));
}

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_KVTC_DEVICE_TYPES_H_
