#include "absl/strings/str_format.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/device_math.cuh"
#include "cuda/kernels/kernel_dispatch.cuh"
#include "cuda/kernels/mean_add_scatter.h"
#include "cuda/kernels/paged_kv_address.cuh"

namespace kvharbor {
namespace gpu {
namespace {

using dev::Ld4;
using dev::StoreElement;

// One block per (row, unit), as the gather kernel; the inverse arithmetic of
// ScatterRows: v = x + mean, then RoPE forward, then the dtype conversion.
template <int kDType, bool kNative, bool kRope>
__global__ void ScatterKernel(MeanAddScatterArgs a) {
  const KvtcPageShape& s = a.shape;
  const dev::RowUnitPlace r = dev::LocateRowUnit(a, blockIdx.x);
  const dev::UnitPlace& p = r.p;
  if (r.sink) return;  // sink section
  const dev::TokenRun dst =
      dev::LocateTokenRun(s, a.pages, a.dest, p.page, a.kv, p.layer, p.token);
  if (dst.base == nullptr) return;  // a layer or block the layout lacks
  const uint32_t hd = static_cast<uint32_t>(s.TokenElements());
  const uint64_t col = uint64_t{r.unit} * hd;
  const float* in = a.in + uint64_t{r.local} * r.units * hd + col;
  const float* mean = a.mean + col;
  if constexpr (kRope) {
    const uint32_t half = s.head_dim / 2;
    const uint64_t table = (uint64_t{p.page} * s.page_size + p.token) * half;
    const bool split = a.rope == RopeStyle::kHalfSplit;
    for (uint32_t j = threadIdx.x; j < hd / 2; j += blockDim.x) {
      const uint32_t h = j / half;
      const uint32_t i = j - h * half;
      const uint32_t e0 = h * s.head_dim + (split ? i : 2 * i);
      const uint32_t e1 = e0 + (split ? half : 1);
      const float x = __fadd_rn(in[e0], mean[e0]);
      const float y = __fadd_rn(in[e1], mean[e1]);
      const float c = a.rope_cos[table + i];
      const float sn = a.rope_sin[table + i];
      const float r0 = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, sn));
      const float r1 = __fadd_rn(__fmul_rn(x, sn), __fmul_rn(y, c));
      dst.Store<kDType, kNative>(e0, r0);
      dst.Store<kDType, kNative>(e1, r1);
    }
  } else {
    for (uint32_t e = threadIdx.x; e < hd; e += blockDim.x) {
      dst.Store<kDType, kNative>(e, __fadd_rn(in[e], mean[e]));
    }
  }
}

// Vector path (see GatherVecKernel): x + mean, RoPE forward, 8 / 16-byte
// stores into the page.
template <int kDType, int kRope>
__global__ void ScatterVecKernel(MeanAddScatterArgs a, uint32_t slots,
                                 uint32_t total) {
  const KvtcPageShape& s = a.shape;
  const uint32_t hd = static_cast<uint32_t>(s.TokenElements());
  const uint32_t half = s.head_dim / 2;
  for (uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += gridDim.x * blockDim.x) {
    const uint32_t slot = idx % slots;
    const dev::RowUnitPlace r = dev::LocateRowUnit(a, idx / slots);
    const dev::UnitPlace& p = r.p;
    if (r.sink) continue;
    const dev::TokenRun dst =
        dev::LocateTokenRun(s, a.pages, a.dest, p.page, a.kv, p.layer, p.token);
    if (dst.base == nullptr) continue;
    const uint64_t col = uint64_t{r.unit} * hd;
    const float* in = a.in + uint64_t{r.local} * r.units * hd + col;
    const float* mean = a.mean + col;
    if constexpr (kRope == 0) {
      const uint32_t e = 4 * slot;
      dst.Store4<kDType>(e, dev::Add4(Ld4(in + e), Ld4(mean + e)));
      continue;
    }
    const uint64_t table = (uint64_t{p.page} * s.page_size + p.token) * half;
    if constexpr (kRope == 2) {
      const uint32_t per_head = half / 4;
      const uint32_t h = slot / per_head;
      const uint32_t i0 = 4 * (slot - h * per_head);
      const uint32_t e0 = h * s.head_dim + i0, e1 = e0 + half;
      const float4 x = dev::Add4(Ld4(in + e0), Ld4(mean + e0));
      const float4 y = dev::Add4(Ld4(in + e1), Ld4(mean + e1));
      const float4 c = Ld4(a.rope_cos + table + i0);
      const float4 sn = Ld4(a.rope_sin + table + i0);
      float4 r0, r1;
      dev::Rotate(x.x, y.x, c.x, sn.x, &r0.x, &r1.x);
      dev::Rotate(x.y, y.y, c.y, sn.y, &r0.y, &r1.y);
      dev::Rotate(x.z, y.z, c.z, sn.z, &r0.z, &r1.z);
      dev::Rotate(x.w, y.w, c.w, sn.w, &r0.w, &r1.w);
      dst.Store4<kDType>(e0, r0);
      dst.Store4<kDType>(e1, r1);
    } else {
      const uint32_t e = 4 * slot;
      const uint32_t i0 = (e % s.head_dim) / 2;
      const float4 x = dev::Add4(Ld4(in + e), Ld4(mean + e));
      const float2 c =
          *reinterpret_cast<const float2*>(a.rope_cos + table + i0);
      const float2 sn =
          *reinterpret_cast<const float2*>(a.rope_sin + table + i0);
      float4 r;
      dev::Rotate(x.x, x.y, c.x, sn.x, &r.x, &r.y);
      dev::Rotate(x.z, x.w, c.y, sn.y, &r.z, &r.w);
      dst.Store4<kDType>(e, r);
    }
  }
}

}  // namespace

namespace {

// The args the kernels run with: into a layout, the vector path (8 / 16-byte
// stores of 4 elements of one head) only where its alignment allows.
MeanAddScatterArgs Effective(const MeanAddScatterArgs& in) {
  MeanAddScatterArgs a = in;
  if (a.dest.enabled()) {
    a.pages_aligned16 = a.dest.align >= 16 && a.shape.head_dim % 4 == 0;
  }
  return a;
}

}  // namespace

bool MeanAddScatterVectorized(const MeanAddScatterArgs& args) {
  const MeanAddScatterArgs a = Effective(args);
  return dev::VectorSlots(a, a.in) > 0;
}

absl::Status LaunchMeanAddScatter(const MeanAddScatterArgs& args,
                                  cudaStream_t stream) {
  if (args.dest.enabled() &&
      (args.dest.k_bases == nullptr || args.dest.v_bases == nullptr)) {
    return absl::InvalidArgumentError(
        "scatter: dest.k_bases and dest.v_bases must be set with "
        "dest.block_ids");
  }
  const MeanAddScatterArgs a = Effective(args);
  return dev::LaunchRowKernels(
      a, a.in, "scatter", "in", "ScatterVecKernel<<<grid, 256, 0, stream>>>",
      "ScatterKernel<<<rows * units, threads, 0, stream>>>",
      [&](auto dt, auto r, uint32_t slots, uint64_t total) {
        ScatterVecKernel<decltype(dt)::value, decltype(r)::value>
            <<<dev::StrideGrid(total), 256, 0, stream>>>(
                a, slots, static_cast<uint32_t>(total));
      },
      [&](auto dt, auto nat, auto r, uint64_t blocks, unsigned threads) {
        ScatterKernel<decltype(dt)::value, decltype(nat)::value,
                      decltype(r)::value>
            <<<static_cast<unsigned>(blocks), threads, 0, stream>>>(a);
      });
}

}  // namespace gpu
}  // namespace kvharbor
