#include "absl/strings/str_format.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/device_math.cuh"
#include "cuda/kernels/gather_mean_subtract.h"
#include "cuda/kernels/kernel_dispatch.cuh"

namespace kvharbor {
namespace gpu {
namespace {

using dev::IsFinite;
using dev::Ld4;
using dev::LoadElement;

template <bool kBf16Out>
__device__ __forceinline__ void StoreOut(void* out, uint64_t i, float v) {
  if constexpr (kBf16Out) {
    static_cast<uint16_t*>(out)[i] = dev::FloatToBf16(v);
  } else {
    static_cast<float*>(out)[i] = v;
  }
}

// One block per (row, unit); threads over the unit's elements (or element
// pairs when rotating).
template <int kDType, bool kNative, bool kRope, bool kBf16Out>
__global__ void GatherKernel(GatherMeanSubtractArgs a) {
  const KvtcPageShape& s = a.shape;
  const dev::RowUnitPlace r = dev::LocateRowUnit(a, blockIdx.x);
  const dev::UnitPlace& p = r.p;
  const uint8_t* data = a.pages[p.page].data;
  const uint32_t hd = static_cast<uint32_t>(s.TokenElements());
  const uint64_t col = uint64_t{r.unit} * hd;
  const uint64_t out_base = uint64_t{r.local} * r.units * hd + col;
  const float* mean = a.mean + col;
  if (r.sink) {
    for (uint32_t e = threadIdx.x; e < hd; e += blockDim.x) {
      StoreOut<kBf16Out>(a.out, out_base + e, 0.0f);
    }
    return;
  }
  const uint64_t src = s.RunIndex(a.kv, p.layer, p.token);
  bool bad = false;
  if constexpr (kRope) {
    const uint32_t half = s.head_dim / 2;
    const uint64_t table = (uint64_t{p.page} * s.page_size + p.token) * half;
    const bool split = a.rope == RopeStyle::kHalfSplit;
    for (uint32_t j = threadIdx.x; j < hd / 2; j += blockDim.x) {
      const uint32_t h = j / half;
      const uint32_t i = j - h * half;
      const uint32_t e0 = h * s.head_dim + (split ? i : 2 * i);
      const uint32_t e1 = e0 + (split ? half : 1);
      const float x = LoadElement<kDType, kNative>(data, src + e0);
      const float y = LoadElement<kDType, kNative>(data, src + e1);
      bad |= !IsFinite(x) || !IsFinite(y);
      const float c = a.rope_cos[table + i];
      const float sn = -a.rope_sin[table + i];  // inverse rotation
      const float r0 = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, sn));
      const float r1 = __fadd_rn(__fmul_rn(x, sn), __fmul_rn(y, c));
      StoreOut<kBf16Out>(a.out, out_base + e0, __fsub_rn(r0, mean[e0]));
      StoreOut<kBf16Out>(a.out, out_base + e1, __fsub_rn(r1, mean[e1]));
    }
  } else {
    for (uint32_t e = threadIdx.x; e < hd; e += blockDim.x) {
      const float x = LoadElement<kDType, kNative>(data, src + e);
      bad |= !IsFinite(x);
      StoreOut<kBf16Out>(a.out, out_base + e, __fsub_rn(x, mean[e]));
    }
  }
  if (bad) {
    dev::RaiseError(a.error, KvtcErrorCode(KvtcErrorKind::kNonFiniteInput,
                                           static_cast<unsigned>(a.kv), r.row));
  }
}

template <bool kBf16Out>
__device__ __forceinline__ void StoreOut4(void* out, uint64_t i, float4 v) {
  if constexpr (kBf16Out) {
    dev::Store4<kDTypeBf16>(static_cast<uint8_t*>(out), i, v);
  } else {
    *reinterpret_cast<float4*>(static_cast<float*>(out) + i) = v;
  }
}

// One slot of GatherVecKernel: loads its quad (two for half split), undoes
// RoPE (kRope), subtracts the mean and stores. False when an input element
// is not finite.
template <int kDType, int kRope, bool kBf16Out>
__device__ __forceinline__ bool GatherVecSlot(const GatherMeanSubtractArgs& a,
                                              const KvtcPageInfo& info,
                                              const dev::UnitPlace& p,
                                              uint64_t src, uint32_t e0,
                                              uint32_t e1, const float* mean,
                                              uint64_t out_base) {
  const KvtcPageShape& s = a.shape;
  const uint32_t half = s.head_dim / 2;
  const float4 x = dev::Load4<kDType>(info.data, src + e0);
  if constexpr (kRope == 0) {
    StoreOut4<kBf16Out>(a.out, out_base + e0, dev::Sub4(x, Ld4(mean + e0)));
    return dev::IsFinite4(x);
  }
  const uint64_t table = (uint64_t{p.page} * s.page_size + p.token) * half;
  float4 r0, r1;
  if constexpr (kRope == 2) {
    const uint32_t i0 = e0 % s.head_dim;
    const float4 y = dev::Load4<kDType>(info.data, src + e1);
    const float4 c = Ld4(a.rope_cos + table + i0);
    const float4 sn = Ld4(a.rope_sin + table + i0);
    dev::Rotate(x.x, y.x, c.x, -sn.x, &r0.x, &r1.x);
    dev::Rotate(x.y, y.y, c.y, -sn.y, &r0.y, &r1.y);
    dev::Rotate(x.z, y.z, c.z, -sn.z, &r0.z, &r1.z);
    dev::Rotate(x.w, y.w, c.w, -sn.w, &r0.w, &r1.w);
    StoreOut4<kBf16Out>(a.out, out_base + e0, dev::Sub4(r0, Ld4(mean + e0)));
    StoreOut4<kBf16Out>(a.out, out_base + e1, dev::Sub4(r1, Ld4(mean + e1)));
    return dev::IsFinite4(x) && dev::IsFinite4(y);
  } else {
    const uint32_t i0 = (e0 % s.head_dim) / 2;
    const float2 c = *reinterpret_cast<const float2*>(a.rope_cos + table + i0);
    const float2 sn = *reinterpret_cast<const float2*>(a.rope_sin + table + i0);
    dev::Rotate(x.x, x.y, c.x, -sn.x, &r0.x, &r0.y);
    dev::Rotate(x.z, x.w, c.y, -sn.y, &r0.z, &r0.w);
    StoreOut4<kBf16Out>(a.out, out_base + e0, dev::Sub4(r0, Ld4(mean + e0)));
    return dev::IsFinite4(x);
  }
}

// Vector path: grid-stride over (row, unit, slot); a slot is 4 elements, or
// 4 RoPE pairs for half-split (kRope: 0 none, 1 interleaved, 2 half split).
template <int kDType, int kRope, bool kBf16Out>
__global__ void GatherVecKernel(GatherMeanSubtractArgs a, uint32_t slots,
                                uint32_t total) {
  const KvtcPageShape& s = a.shape;
  const uint32_t hd = static_cast<uint32_t>(s.TokenElements());
  const uint32_t half = s.head_dim / 2;
  bool bad = false;
  uint64_t bad_row = 0;
  for (uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += gridDim.x * blockDim.x) {
    const uint32_t slot = idx % slots;
    const dev::RowUnitPlace r = dev::LocateRowUnit(a, idx / slots);
    const dev::UnitPlace& p = r.p;
    const KvtcPageInfo& info = a.pages[p.page];
    const uint64_t col = uint64_t{r.unit} * hd;
    const uint64_t out_base = uint64_t{r.local} * r.units * hd + col;
    uint32_t e0, e1;  // first element of each quad (e1: half split only)
    if constexpr (kRope == 2) {
      const uint32_t per_head = half / 4;
      const uint32_t h = slot / per_head;
      e0 = h * s.head_dim + 4 * (slot - h * per_head);
      e1 = e0 + half;
    } else {
      e0 = 4 * slot;
      e1 = e0;
    }
    if (r.sink) {
      const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      StoreOut4<kBf16Out>(a.out, out_base + e0, zero);
      if constexpr (kRope == 2) StoreOut4<kBf16Out>(a.out, out_base + e1, zero);
      continue;
    }
    const uint64_t src = s.RunIndex(a.kv, p.layer, p.token);
    if (!GatherVecSlot<kDType, kRope, kBf16Out>(a, info, p, src, e0, e1,
                                                a.mean + col, out_base)) {
      if (!bad) bad_row = r.row;  // this thread's first (smallest) bad row
      bad = true;
    }
  }
  if (bad) {
    dev::RaiseError(a.error,
                    KvtcErrorCode(KvtcErrorKind::kNonFiniteInput,
                                  static_cast<unsigned>(a.kv), bad_row));
  }
}

}  // namespace

uint64_t GatherFeatures(const GatherMeanSubtractArgs& a) {
  return dev::RowUnits(a.row_kind, a.shape) * a.shape.TokenElements();
}

bool GatherMeanSubtractVectorized(const GatherMeanSubtractArgs& a) {
  return dev::VectorSlots(a, a.out) > 0;
}

absl::Status LaunchGatherMeanSubtract(const GatherMeanSubtractArgs& a,
                                      cudaStream_t stream) {
  return dev::LaunchRowKernels(
      a, a.out, "gather", "out", "GatherVecKernel<<<grid, 256, 0, stream>>>",
      "GatherKernel<<<rows * units, threads, 0, stream>>>",
      [&](auto dt, auto r, uint32_t slots, uint64_t total) {
        dev::DispatchBool(a.out_bf16, [&](auto bf) {
          GatherVecKernel<decltype(dt)::value, decltype(r)::value,
                          decltype(bf)::value>
              <<<dev::StrideGrid(total), 256, 0, stream>>>(
                  a, slots, static_cast<uint32_t>(total));
        });
      },
      [&](auto dt, auto nat, auto r, uint64_t blocks, unsigned threads) {
        dev::DispatchBool(a.out_bf16, [&](auto bf) {
          GatherKernel<decltype(dt)::value, decltype(nat)::value,
                       decltype(r)::value, decltype(bf)::value>
              <<<static_cast<unsigned>(blocks), threads, 0, stream>>>(a);
        });
      });
}

}  // namespace gpu
}  // namespace kvharbor
