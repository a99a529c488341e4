#include <cmath>

#include "absl/strings/str_format.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/rope_table.h"

namespace kvharbor {
namespace gpu {
namespace {

// One thread per (token of the batch, frequency), grid-stride.
__global__ void RopeTableKernel(RopeTableArgs a) {
  const uint32_t half = a.head_dim / 2;
  const uint64_t total = uint64_t{a.num_pages} * a.page_size * half;
  for (uint64_t k = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; k < total;
       k += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t g = k / half;
    const uint32_t i = static_cast<uint32_t>(k - g * half);
    const uint32_t page = static_cast<uint32_t>(g / a.page_size);
    const uint32_t t = static_cast<uint32_t>(g - uint64_t{page} * a.page_size);
    const double pos = static_cast<double>(a.pages[page].first_position + t);
    const double angle = __dmul_rn(pos, a.inv_freq[i]);
    double s, c;
    sincos(angle, &s, &c);
    a.cos[k] = static_cast<float>(c);
    a.sin[k] = static_cast<float>(s);
  }
}

}  // namespace

std::vector<double> RopeInvFreq(uint32_t head_dim, float theta) {
  std::vector<double> f(head_dim / 2);
  for (uint32_t i = 0; i < head_dim / 2; ++i) {
    f[i] =
        std::pow(static_cast<double>(theta),
                 -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  }
  return f;
}

absl::Status LaunchRopeTable(const RopeTableArgs& a, cudaStream_t stream) {
  if (a.num_pages == 0) return absl::OkStatus();
  if (a.pages == nullptr || a.inv_freq == nullptr || a.cos == nullptr ||
      a.sin == nullptr || a.head_dim < 2 || a.head_dim % 2 != 0 ||
      a.page_size == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rope_table: pages, inv_freq, cos, sin must be set, head_dim (%u) "
        "even and page_size (%u) > 0",
        a.head_dim, a.page_size));
  }
  const uint64_t total = uint64_t{a.num_pages} * a.page_size * (a.head_dim / 2);
  const unsigned threads = 256;
  const uint64_t blocks64 = (total + threads - 1) / threads;
  const unsigned blocks =
      static_cast<unsigned>(blocks64 < 65536 ? blocks64 : 65536);
  RopeTableKernel<<<blocks, threads, 0, stream>>>(a);
  KVH_CUDA_CHECK_LAUNCH("RopeTableKernel<<<blocks, 256, 0, stream>>>");
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace kvharbor
