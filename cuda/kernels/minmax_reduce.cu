#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/device_math.cuh"
#include "cuda/kernels/kernel_dispatch.cuh"
#include "cuda/kernels/minmax_reduce.h"

namespace kvharbor {
namespace gpu {
namespace {

constexpr unsigned kThreads = 256;

// Value and the column it came from; ties (== compares, so +0 and -0 too)
// go to the lower column, which is what the CPU's strict-compare scan keeps.
struct Pick {
  float v;
  uint64_t c;
};
__device__ __forceinline__ Pick MinPick(Pick a, Pick b) {
  return (b.v < a.v || (b.v == a.v && b.c < a.c)) ? b : a;
}
__device__ __forceinline__ Pick MaxPick(Pick a, Pick b) {
  return (b.v > a.v || (b.v == a.v && b.c < a.c)) ? b : a;
}

// One block per row.
__global__ void MinMaxKernel(MinMaxArgs a) {
  const float* row = a.coeffs + blockIdx.x * a.ld;
  Pick mn{row[a.start], a.start};
  Pick mx = mn;
  for (uint64_t c = a.start + threadIdx.x; c < a.end; c += blockDim.x) {
    const Pick p{row[c], c};
    mn = MinPick(mn, p);
    mx = MaxPick(mx, p);
  }
  for (int off = 16; off > 0; off >>= 1) {
    const Pick omn{__shfl_down_sync(0xFFFFFFFFu, mn.v, off),
                   __shfl_down_sync(0xFFFFFFFFu, mn.c, off)};
    const Pick omx{__shfl_down_sync(0xFFFFFFFFu, mx.v, off),
                   __shfl_down_sync(0xFFFFFFFFu, mx.c, off)};
    mn = MinPick(mn, omn);
    mx = MaxPick(mx, omx);
  }
  __shared__ Pick smn[kThreads / 32];
  __shared__ Pick smx[kThreads / 32];
  const unsigned warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    smn[warp] = mn;
    smx[warp] = mx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < blockDim.x / 32; ++w) {
      mn = MinPick(mn, smn[w]);
      mx = MaxPick(mx, smx[w]);
    }
    a.mins[blockIdx.x] = mn.v;
    a.maxs[blockIdx.x] = mx.v;
    if (!dev::IsFinite(__fsub_rn(mx.v, mn.v))) {
      dev::RaiseError(a.error,
                      KvtcErrorCode(KvtcErrorKind::kCoefficientSpan, a.section,
                                    a.first_row + blockIdx.x));
    }
  }
}

}  // namespace

absl::Status LaunchMinMax(const MinMaxArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return absl::OkStatus();
  if (a.coeffs == nullptr || a.mins == nullptr || a.maxs == nullptr) {
    return absl::InvalidArgumentError("minmax: coeffs, mins, maxs must be set");
  }
  KVH_RETURN_IF_ERROR(
      dev::CheckColumnRange("minmax", a.rows, a.ld, a.start, a.end));
  MinMaxKernel<<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a);
  KVH_CUDA_CHECK_LAUNCH("MinMaxKernel<<<rows, 256, 0, stream>>>");
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace kvharbor
