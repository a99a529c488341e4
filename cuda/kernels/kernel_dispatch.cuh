// Compile-time dispatch helpers for the KVTC launchers (internal to cuda/;
// include only from .cu files): turn a runtime dtype / FP8 path / flag into
// template arguments, and the row-to-page lookups that gather and scatter
// share.
#ifndef KVHARBOR_CUDA_KERNELS_KERNEL_DISPATCH_CUH_
#define KVHARBOR_CUDA_KERNELS_KERNEL_DISPATCH_CUH_

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/kvtc_device_types.h"

namespace kvharbor {
namespace gpu {
namespace dev {

template <int V>
using IntC = std::integral_constant<int, V>;
template <bool V>
using BoolC = std::integral_constant<bool, V>;

// Calls f(IntC<dtype>) for a dtype the vector path handles (bf16, fp16,
// fp32); false for the others.
template <typename F>
bool DispatchVectorDType(int dtype, F&& f) {
  switch (dtype) {
    case kDTypeBf16:
      f(IntC<kDTypeBf16>{});
      return true;
    case kDTypeFp16:
      f(IntC<kDTypeFp16>{});
      return true;
    case kDTypeFp32:
      f(IntC<kDTypeFp32>{});
      return true;
    default:
      return false;
  }
}

// Calls f(IntC<dtype>, BoolC<native_fp8>) (the FP8 path matters only for FP8
// pages, so the other dtypes get one instantiation). Returns false for an
// unknown dtype.
template <typename F>
bool DispatchDType(int dtype, bool native_fp8, F&& f) {
  if (dtype == kDTypeFp8E4M3) {
    if (native_fp8) {
      f(IntC<kDTypeFp8E4M3>{}, BoolC<true>{});
    } else {
      f(IntC<kDTypeFp8E4M3>{}, BoolC<false>{});
    }
    return true;
  }
  return DispatchVectorDType(dtype, [&](auto dt) { f(dt, BoolC<false>{}); });
}

template <typename F>
void DispatchBool(bool v, F&& f) {
  if (v) {
    f(BoolC<true>{});
  } else {
    f(BoolC<false>{});
  }
}

// Where the unit `unit` of row `row` lives. A unit is one token's run of
// num_kv_heads * head_dim elements: per token, units are layers; per page,
// units are tokens.
struct UnitPlace {
  uint32_t page;
  uint32_t layer;
  uint32_t token;
};

__device__ __forceinline__ UnitPlace LocateUnit(bool per_token,
                                                const KvtcTokenRef* rows,
                                                uint32_t num_layers,
                                                uint64_t row, uint32_t unit) {
  UnitPlace p;
  if (per_token) {
    const KvtcTokenRef ref = rows[row];
    p.page = ref.page;
    p.token = ref.token;
    p.layer = unit;
  } else {
    p.page = static_cast<uint32_t>(row / num_layers);
    p.layer = static_cast<uint32_t>(row % num_layers);
    p.token = unit;
  }
  return p;
}

// The gather / scatter kernels' place of work item `ru` = local row * units +
// unit, over the rows [first_row, first_row + num_rows) of `a` (their Args:
// shape, row_kind, rows, first_row, pages).
struct RowUnitPlace {
  bool per_token;
  uint32_t units;  // units per row: layers per token, tokens per page
  uint32_t local;  // row - first_row
  uint32_t unit;
  uint64_t row;
  UnitPlace p;
  bool sink;  // a per-page row's token in its page's sink section
};

template <typename Args>
__device__ __forceinline__ RowUnitPlace LocateRowUnit(const Args& a,
                                                      uint32_t ru) {
  RowUnitPlace r;
  r.per_token = a.row_kind == KvtcRowKind::kPerToken;
  r.units = r.per_token ? a.shape.num_layers : a.shape.page_size;
  r.local = ru / r.units;
  r.unit = ru - r.local * r.units;
  r.row = a.first_row + r.local;
  r.p = LocateUnit(r.per_token, a.rows, a.shape.num_layers, r.row, r.unit);
  r.sink = !r.per_token && r.p.token < a.pages[r.p.page].sinks;
  return r;
}

// 4 floats at a 16-byte aligned address.
__device__ __forceinline__ float4 Ld4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

// The column range [start, end) of `rows` rows of a [rows][ld] matrix, as
// the one-block-per-row coefficient kernels (quantize, dequantize, min/max)
// take it: InvalidArgument "<what>: range ..." unless start < end <= ld and
// the rows fit a grid.
inline absl::Status CheckColumnRange(const char* what, uint64_t rows,
                                     uint64_t ld, uint64_t start,
                                     uint64_t end) {
  if (start >= end || end > ld || rows > 0x7FFFFFFFu) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: range [%u, %u) with ld %u and %u rows is invalid",
                        what, start, end, ld, rows));
  }
  return absl::OkStatus();
}

// DispatchDType(dtype, native_fp8, launch), then the launch check naming
// `call`; InvalidArgument "<op>: <field>: unknown value <dtype>" when the
// dtype is none of the page dtypes.
template <typename F>
absl::Status LaunchForDType(const char* op, const char* field, int dtype,
                            bool native_fp8, const char* call, F&& launch) {
  if (!DispatchDType(dtype, native_fp8, launch)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s: unknown value %d", op, field, dtype));
  }
  KVH_CUDA_CHECK_LAUNCH(call);
  return absl::OkStatus();
}

// Threads per block for `work` items per block: a multiple of 32, <= 256.
inline unsigned BlockThreads(uint64_t work) {
  const uint64_t t = (work + 31) / 32 * 32;
  return static_cast<unsigned>(t < 32 ? 32 : (t > 256 ? 256 : t));
}

// The vector path of gather / scatter handles one "slot" per thread: 4
// consecutive elements, or for half-split RoPE 4 consecutive pairs (i, i +
// head_dim / 2) of one head. Returns 0 when the shape or alignment rules it
// out: 2- or 4-byte elements, runs of a multiple of 4 elements, heads whose
// quads of pairs do not straddle, 16-byte aligned pages and buffers.
inline uint32_t VectorSlotsPerUnit(const KvtcPageShape& s, RopeStyle rope,
                                   bool allowed, bool pages_aligned16,
                                   std::initializer_list<const void*> bufs) {
  if (!allowed || !pages_aligned16) return 0;
  if (s.dtype != kDTypeBf16 && s.dtype != kDTypeFp16 && s.dtype != kDTypeFp32) {
    return 0;
  }
  const uint64_t hd = s.TokenElements();
  if (hd % 4 != 0) return 0;
  if (rope == RopeStyle::kHalfSplit && s.head_dim % 8 != 0) return 0;
  if (rope == RopeStyle::kInterleaved && s.head_dim % 4 != 0) return 0;
  for (const void* b : bufs) {
    if (b != nullptr && reinterpret_cast<uintptr_t>(b) % 16 != 0) return 0;
  }
  return static_cast<uint32_t>(rope == RopeStyle::kHalfSplit ? hd / 8 : hd / 4);
}

// Thread blocks of one row in gather / scatter: one per layer (per-token
// rows) or one per token (per-page rows).
inline uint64_t RowUnits(KvtcRowKind kind, const KvtcPageShape& s) {
  return kind == KvtcRowKind::kPerToken ? s.num_layers : s.page_size;
}

// Slots per unit of the vector path for the gather / scatter args `a`
// (GatherMeanSubtractArgs, MeanAddScatterArgs) whose row buffer is `row_buf`;
// 0 when they take the scalar path (also when the vector grid's thread count
// would not fit 32 bits).
template <typename Args>
uint32_t VectorSlots(const Args& a, const void* row_buf) {
  const uint32_t slots =
      VectorSlotsPerUnit(a.shape, a.rope, a.allow_vector, a.pages_aligned16,
                         {row_buf, a.mean, a.rope_cos, a.rope_sin});
  const uint64_t total =
      uint64_t{a.num_rows} * RowUnits(a.row_kind, a.shape) * slots;
  return slots > 0 && total < 0xFFFFFFFFu ? slots : 0;
}

// The checks of the args the gather and scatter launchers share; `op`
// ("gather" / "scatter") and `row_field` (the row buffer's field) name them
// in the errors. *blocks: the scalar grid, one block per (row, unit).
template <typename Args>
absl::Status CheckRowArgs(const Args& a, const void* row_buf, const char* op,
                          const char* row_field, uint64_t* blocks) {
  if (a.pages == nullptr || a.mean == nullptr || row_buf == nullptr ||
      (a.row_kind == KvtcRowKind::kPerToken && a.rows == nullptr)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: pages, mean, %s (and rows for per-token rows) must be set", op,
        row_field));
  }
  if (a.rope != RopeStyle::kNone &&
      (a.rope_cos == nullptr || a.rope_sin == nullptr ||
       a.shape.head_dim % 2 != 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: rope needs rope_cos, rope_sin and an even head_dim", op));
  }
  const uint64_t units = RowUnits(a.row_kind, a.shape);
  *blocks = uint64_t{a.num_rows} * units;
  if (units == 0 || *blocks > 0x7FFFFFFFu) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: num_rows %u x %u units per row is out of range",
                        op, a.num_rows, units));
  }
  return absl::OkStatus();
}

// Calls f(IntC<rope mode>) with 0 = none, 1 = interleaved, 2 = half split.
template <typename F>
void DispatchRope(RopeStyle rope, F&& f) {
  switch (rope) {
    case RopeStyle::kInterleaved:
      f(IntC<1>{});
      return;
    case RopeStyle::kHalfSplit:
      f(IntC<2>{});
      return;
    default:
      f(IntC<0>{});
      return;
  }
}

// Grid for a grid-stride loop over `total` items: enough blocks of 256 to
// fill the device several times over.
inline unsigned StrideGrid(uint64_t total) {
  const uint64_t blocks = (total + 255) / 256;
  return static_cast<unsigned>(blocks < 4096 ? (blocks < 1 ? 1 : blocks)
                                             : 4096);
}

// The launch gather and scatter share: CheckRowArgs, then the vector kernel
// where it applies, vector(IntC<dtype>, IntC<rope mode>, slots, total
// threads), else the scalar one, scalar(IntC<dtype>, BoolC<native_fp8>,
// BoolC<rope>, blocks, threads per block). `vector_call` / `scalar_call`
// name the launches in their errors.
template <typename Args, typename Vector, typename Scalar>
absl::Status LaunchRowKernels(const Args& a, const void* row_buf,
                              const char* op, const char* row_field,
                              const char* vector_call, const char* scalar_call,
                              Vector&& vector, Scalar&& scalar) {
  if (a.num_rows == 0) return absl::OkStatus();
  uint64_t blocks = 0;
  if (absl::Status s = CheckRowArgs(a, row_buf, op, row_field, &blocks);
      !s.ok()) {
    return s;
  }
  const uint32_t slots = VectorSlots(a, row_buf);
  const uint64_t total = blocks * slots;
  const bool vectorized =
      slots > 0 && DispatchVectorDType(a.shape.dtype, [&](auto dt) {
        DispatchRope(a.rope, [&](auto r) { vector(dt, r, slots, total); });
      });
  if (vectorized) {
    KVH_CUDA_CHECK_LAUNCH(vector_call);
    return absl::OkStatus();
  }
  const bool rope = a.rope != RopeStyle::kNone;
  const uint64_t hd = a.shape.TokenElements();
  const unsigned threads = BlockThreads(rope ? hd / 2 : hd);
  const bool launched =
      DispatchDType(a.shape.dtype, a.native_fp8, [&](auto dt, auto nat) {
        DispatchBool(rope,
                     [&](auto r) { scalar(dt, nat, r, blocks, threads); });
      });
  if (!launched) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: shape.dtype %d is unknown", op, a.shape.dtype));
  }
  KVH_CUDA_CHECK_LAUNCH(scalar_call);
  return absl::OkStatus();
}

}  // namespace dev
}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNELS_KERNEL_DISPATCH_CUH_
