#include "absl/strings/str_format.h"
#include "cuda/cuda_check.h"
#include "cuda/device_math.cuh"
#include "cuda/gather_mean_subtract.h"
#include "cuda/kernel_dispatch.cuh"

namespace kvharbor {
namespace gpu {
namespace {

using dev::IsFinite;
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
  const bool per_token = a.row_kind == KvtcRowKind::kPerToken;
  const uint32_t units = per_token ? s.num_layers : s.page_size;
  const uint32_t local = blockIdx.x / units;
  const uint32_t unit = blockIdx.x - local * units;
  const uint64_t row = a.first_row + local;
  const dev::UnitPlace p =
      dev::LocateUnit(per_token, a.rows, s.num_layers, row, unit);
  const uint8_t* data = a.pages[p.page].data;
  const uint32_t hd = static_cast<uint32_t>(s.TokenElements());
  const uint64_t col = uint64_t{unit} * hd;
  const uint64_t out_base = uint64_t{local} * units * hd + col;
  const float* mean = a.mean + col;
  if (!per_token && p.token < a.pages[p.page].sinks) {
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
                                           static_cast<unsigned>(a.kv), row));
  }
}

}  // namespace

uint64_t GatherFeatures(const GatherMeanSubtractArgs& a) {
  const uint64_t units = a.row_kind == KvtcRowKind::kPerToken
                             ? a.shape.num_layers
                             : a.shape.page_size;
  return units * a.shape.TokenElements();
}

absl::Status LaunchGatherMeanSubtract(const GatherMeanSubtractArgs& a,
                                      cudaStream_t stream) {
  if (a.num_rows == 0) return absl::OkStatus();
  if (a.pages == nullptr || a.mean == nullptr || a.out == nullptr ||
      (a.row_kind == KvtcRowKind::kPerToken && a.rows == nullptr)) {
    return absl::InvalidArgumentError(
        "gather: pages, mean, out (and rows for per-token rows) must be set");
  }
  const bool rope = a.rope != RopeStyle::kNone;
  if (rope && (a.rope_cos == nullptr || a.rope_sin == nullptr ||
               a.shape.head_dim % 2 != 0)) {
    return absl::InvalidArgumentError(
        "gather: rope needs rope_cos, rope_sin and an even head_dim");
  }
  const uint64_t units = a.row_kind == KvtcRowKind::kPerToken
                             ? a.shape.num_layers
                             : a.shape.page_size;
  const uint64_t blocks = uint64_t{a.num_rows} * units;
  if (units == 0 || blocks > 0x7FFFFFFFu) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gather: num_rows %u x %u units per row is out of range", a.num_rows,
        units));
  }
  const uint64_t hd = a.shape.TokenElements();
  const unsigned threads = dev::BlockThreads(rope ? hd / 2 : hd);
  bool launched =
      dev::DispatchDType(a.shape.dtype, a.native_fp8, [&](auto dt, auto nat) {
        dev::DispatchBool(rope, [&](auto r) {
          dev::DispatchBool(a.out_bf16, [&](auto bf) {
            GatherKernel<decltype(dt)::value, decltype(nat)::value,
                         decltype(r)::value, decltype(bf)::value>
                <<<static_cast<unsigned>(blocks), threads, 0, stream>>>(a);
          });
        });
      });
  if (!launched) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gather: shape.dtype %d is unknown", a.shape.dtype));
  }
  KVH_CUDA_CHECK_LAUNCH("GatherKernel<<<rows * units, threads, 0, stream>>>");
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace kvharbor
