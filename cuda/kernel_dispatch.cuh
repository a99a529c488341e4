// Compile-time dispatch helpers for the KVTC launchers (internal to cuda/;
// include only from .cu files): turn a runtime dtype / FP8 path / flag into
// template arguments, and the row-to-page lookups that gather and scatter
// share.
#ifndef KVHARBOR_CUDA_KERNEL_DISPATCH_CUH_
#define KVHARBOR_CUDA_KERNEL_DISPATCH_CUH_

#include <cstdint>
#include <type_traits>

#include "core/kvtc_calibration.h"
#include "cuda/kvtc_device_types.h"

namespace kvharbor {
namespace gpu {
namespace dev {

template <int V>
using IntC = std::integral_constant<int, V>;
template <bool V>
using BoolC = std::integral_constant<bool, V>;

// Calls f(IntC<dtype>, BoolC<native_fp8>) (the FP8 path matters only for FP8
// pages, so the other dtypes get one instantiation). Returns false for an
// unknown dtype.
template <typename F>
bool DispatchDType(int dtype, bool native_fp8, F&& f) {
  switch (dtype) {
    case kDTypeBf16:
      f(IntC<kDTypeBf16>{}, BoolC<false>{});
      return true;
    case kDTypeFp16:
      f(IntC<kDTypeFp16>{}, BoolC<false>{});
      return true;
    case kDTypeFp32:
      f(IntC<kDTypeFp32>{}, BoolC<false>{});
      return true;
    case kDTypeFp8E4M3:
      if (native_fp8) {
        f(IntC<kDTypeFp8E4M3>{}, BoolC<true>{});
      } else {
        f(IntC<kDTypeFp8E4M3>{}, BoolC<false>{});
      }
      return true;
    default:
      return false;
  }
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

// Threads per block for `work` items per block: a multiple of 32, <= 256.
inline unsigned BlockThreads(uint64_t work) {
  const uint64_t t = (work + 31) / 32 * 32;
  return static_cast<unsigned>(t < 32 ? 32 : (t > 256 ? 256 : t));
}

}  // namespace dev
}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_KERNEL_DISPATCH_CUH_
