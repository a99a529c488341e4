// Kernels of the GPU PCA (cuda/calibration/pca_gpu.h).
#include <cstdint>

#include "absl/strings/str_format.h"
#include "cuda/calibration/pca_gpu.h"
#include "cuda/kernels/cuda_check.h"

namespace kvharbor {
namespace gpu {
namespace {

constexpr unsigned kThreads = 256;
// Rows one CenterRows block walks: enough work per thread to amortize the
// double atomics, enough blocks to fill the GPU at 64K-row chunks.
constexpr uint64_t kCenterRowsPerBlock = 64;

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void GaussianFillKernel(GaussianFillArgs a) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
       i < a.count; i += stride) {
    const uint64_t h = SplitMix64(a.seed * 0xD1B54A32D192ED03ull ^ i);
    // Two 24-bit uniforms in (0, 1] and [0, 1): Box-Muller's cosine branch.
    const float u1 =
        (static_cast<float>(h >> 40) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 =
        static_cast<float>((h >> 8) & 0xFFFFFFu) * (1.0f / 16777216.0f);
    const float n = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    float s = a.scale;
    if (a.decay != 1.0f) {
      s *= powf(a.decay, static_cast<float>(i / a.row_len));
    }
    a.out[i] = s * n;
  }
}

// Thread = feature, block = (feature tile, slab of rows): coalesced reads
// along a row, one double atomic per thread per slab.
__global__ void CenterRowsKernel(CenterRowsArgs a) {
  const uint64_t f = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (f >= a.features) return;
  const uint64_t r0 = uint64_t{blockIdx.y} * kCenterRowsPerBlock;
  const uint64_t r1 =
      r0 + kCenterRowsPerBlock < a.rows ? r0 + kCenterRowsPerBlock : a.rows;
  const float s = a.shift[f];
  double sum = 0;
  for (uint64_t r = r0; r < r1; ++r) {
    const float v = a.in[r * a.features + f] - s;
    a.out[r * a.features + f] = v;
    sum += v;
  }
  atomicAdd(&a.col_sums[f], sum);
}

__global__ void FinishCovarianceKernel(FinishCovarianceArgs a) {
  const uint64_t n = a.features;
  const uint64_t total = n * n;
  const double inv = 1.0 / static_cast<double>(a.rows);
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const uint64_t r = i % n;
    const uint64_t c = i / n;
    const double dr = a.col_sums[r] * inv;
    const double dc = a.col_sums[c] * inv;
    a.cov[i] =
        static_cast<float>(static_cast<double>(a.cov[i]) * inv - dr * dc);
  }
}

struct Pick {
  float v;  // |value|
  uint64_t i;
};
__device__ __forceinline__ Pick MaxPick(Pick a, Pick b) {
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}

// One block per output component: the sign that makes its largest-|v|
// entry positive.
__global__ void ComponentSignKernel(OrientVectorsArgs a, float* signs) {
  const uint64_t c = blockIdx.x;
  const float* v = a.vectors + (a.cols - 1 - c) * a.features;
  Pick best{fabsf(v[0]), 0};
  for (uint64_t i = threadIdx.x; i < a.features; i += blockDim.x) {
    best = MaxPick(best, Pick{fabsf(v[i]), i});
  }
  for (int off = 16; off > 0; off >>= 1) {
    const Pick o{__shfl_down_sync(0xFFFFFFFFu, best.v, off),
                 __shfl_down_sync(0xFFFFFFFFu, best.i, off)};
    best = MaxPick(best, o);
  }
  __shared__ Pick warps[kThreads / 32];
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < blockDim.x / 32; ++w)
      best = MaxPick(best, warps[w]);
    signs[c] = v[best.i] < 0 ? -1.0f : 1.0f;
  }
}

constexpr unsigned kTile = 32;

// Tiled transpose: tile (feature block x, component block y).
__global__ void OrientTransposeKernel(OrientVectorsArgs a, const float* signs) {
  __shared__ float tile[kTile][kTile + 1];
  const uint64_t f0 = uint64_t{blockIdx.x} * kTile;
  const uint64_t c0 = uint64_t{blockIdx.y} * kTile;
  // Read: column (component) c is contiguous along features.
  for (unsigned y = threadIdx.y; y < kTile; y += blockDim.y) {
    const uint64_t c = c0 + y;
    const uint64_t f = f0 + threadIdx.x;
    if (c < a.components && f < a.features) {
      tile[y][threadIdx.x] =
          signs[c] * a.vectors[(a.cols - 1 - c) * a.features + f];
    }
  }
  __syncthreads();
  // Write: out row f is contiguous along components.
  for (unsigned y = threadIdx.y; y < kTile; y += blockDim.y) {
    const uint64_t f = f0 + y;
    const uint64_t c = c0 + threadIdx.x;
    if (c < a.components && f < a.features) {
      a.out[f * a.components + c] = tile[threadIdx.x][y];
    }
  }
}

unsigned GridFor(uint64_t count) {
  const uint64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 * 4 ? blocks : 65536 * 4);
}

}  // namespace

absl::Status LaunchGaussianFill(const GaussianFillArgs& a,
                                cudaStream_t stream) {
  if (a.count == 0) return absl::OkStatus();
  if (a.out == nullptr || a.row_len == 0) {
    return absl::InvalidArgumentError(
        "gaussian_fill: out must be set and row_len >= 1");
  }
  GaussianFillKernel<<<GridFor(a.count), kThreads, 0, stream>>>(a);
  KVH_CUDA_CHECK_LAUNCH("GaussianFillKernel<<<grid, 256, 0, stream>>>");
  return absl::OkStatus();
}

absl::Status LaunchCenterRows(const CenterRowsArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return absl::OkStatus();
  if (a.in == nullptr || a.shift == nullptr || a.out == nullptr ||
      a.col_sums == nullptr) {
    return absl::InvalidArgumentError(
        "center_rows: in, shift, out and col_sums must be set");
  }
  const uint64_t gx = (a.features + kThreads - 1) / kThreads;
  const uint64_t gy = (a.rows + kCenterRowsPerBlock - 1) / kCenterRowsPerBlock;
  if (a.features == 0 || gx > 0x7FFFFFFFu || gy > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("center_rows: %u rows x %u features is out of range",
                        a.rows, a.features));
  }
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  CenterRowsKernel<<<grid, kThreads, 0, stream>>>(a);
  KVH_CUDA_CHECK_LAUNCH("CenterRowsKernel<<<(features/256, rows/64), 256>>>");
  return absl::OkStatus();
}

absl::Status LaunchFinishCovariance(const FinishCovarianceArgs& a,
                                    cudaStream_t stream) {
  if (a.cov == nullptr || a.col_sums == nullptr || a.rows == 0 ||
      a.features == 0) {
    return absl::InvalidArgumentError(
        "finish_covariance: cov, col_sums, rows and features must be set");
  }
  FinishCovarianceKernel<<<GridFor(a.features * a.features), kThreads, 0,
                           stream>>>(a);
  KVH_CUDA_CHECK_LAUNCH("FinishCovarianceKernel<<<grid, 256, 0, stream>>>");
  return absl::OkStatus();
}

absl::Status LaunchOrientVectors(const OrientVectorsArgs& a, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream) {
  if (a.vectors == nullptr || a.out == nullptr || workspace == nullptr) {
    return absl::InvalidArgumentError(
        "orient_vectors: vectors, out and workspace must be set");
  }
  if (a.features == 0 || a.components == 0 || a.components > a.cols ||
      workspace_bytes < OrientVectorsWorkspaceBytes(a) ||
      a.components > 0x7FFFFFFFu) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "orient_vectors: features=%u cols=%u components=%u workspace=%u "
        "is inconsistent",
        a.features, a.cols, a.components, workspace_bytes));
  }
  float* signs = static_cast<float*>(workspace);
  ComponentSignKernel<<<static_cast<unsigned>(a.components), kThreads, 0,
                        stream>>>(a, signs);
  KVH_CUDA_CHECK_LAUNCH("ComponentSignKernel<<<components, 256, 0, stream>>>");
  const uint64_t gx = (a.features + kTile - 1) / kTile;
  const uint64_t gy = (a.components + kTile - 1) / kTile;
  if (gy > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "orient_vectors: %u components is out of range", a.components));
  }
  OrientTransposeKernel<<<dim3(static_cast<unsigned>(gx),
                               static_cast<unsigned>(gy)),
                          dim3(kTile, 8), 0, stream>>>(a, signs);
  KVH_CUDA_CHECK_LAUNCH("OrientTransposeKernel<<<(f/32, k/32), (32, 8)>>>");
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace kvharbor
