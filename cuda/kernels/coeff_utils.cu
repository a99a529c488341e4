#include "absl/strings/str_format.h"
#include "cuda/kernels/coeff_utils.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/device_math.cuh"

namespace kvharbor {
namespace gpu {
namespace {

constexpr unsigned kThreads = 256;
constexpr uint64_t kCopyChunk = 16384;  // bytes per block of CopyBytesKernel

// One block per row; one atomic per thread that saw a non-finite value.
__global__ void CheckFiniteKernel(CheckFiniteArgs a) {
  const float* row = a.coeffs + blockIdx.x * a.cols;
  bool bad = false;
  for (uint64_t c = threadIdx.x; c < a.cols; c += blockDim.x) {
    bad |= !dev::IsFinite(row[c]);
  }
  if (bad) {
    dev::RaiseError(
        a.error, KvtcErrorCode(KvtcErrorKind::kNonFiniteCoefficient, a.section,
                               a.first_row + blockIdx.x));
  }
}

__global__ void ConvertToBf16Kernel(ConvertToBf16Args a) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
       i < a.count; i += uint64_t{gridDim.x} * blockDim.x) {
    a.out[i] = dev::FloatToBf16(a.in[i]);
  }
}

__global__ void CopyBytesKernel(CopyBytesArgs a) {
  const uint64_t begin = blockIdx.x * kCopyChunk;
  const uint64_t n =
      a.bytes - begin < kCopyChunk ? a.bytes - begin : kCopyChunk;
  const uint8_t* src = a.src + begin;
  dev::BlockWriteBytes(a.dst + begin, n, [&](uint64_t k) { return src[k]; });
}

unsigned GridFor(uint64_t items) {
  const uint64_t b = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}

}  // namespace

absl::Status LaunchCheckFinite(const CheckFiniteArgs& a, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0) return absl::OkStatus();
  if (a.coeffs == nullptr || a.error == nullptr || a.rows > 0x7FFFFFFFu) {
    return absl::InvalidArgumentError(
        "check_finite: coeffs and error must be set, rows < 2^31");
  }
  CheckFiniteKernel<<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a);
  KVH_CUDA_CHECK_LAUNCH("CheckFiniteKernel<<<rows, 256, 0, stream>>>");
  return absl::OkStatus();
}

absl::Status LaunchConvertToBf16(const ConvertToBf16Args& a,
                                 cudaStream_t stream) {
  if (a.count == 0) return absl::OkStatus();
  if (a.in == nullptr || a.out == nullptr) {
    return absl::InvalidArgumentError(
        "convert_to_bf16: in and out must be set");
  }
  ConvertToBf16Kernel<<<GridFor(a.count), kThreads, 0, stream>>>(a);
  KVH_CUDA_CHECK_LAUNCH("ConvertToBf16Kernel<<<grid, 256, 0, stream>>>");
  return absl::OkStatus();
}

absl::Status LaunchCopyBytes(const CopyBytesArgs& a, cudaStream_t stream) {
  if (a.bytes == 0) return absl::OkStatus();
  if (a.src == nullptr || a.dst == nullptr) {
    return absl::InvalidArgumentError("copy_bytes: src and dst must be set");
  }
  const uint64_t blocks = (a.bytes + kCopyChunk - 1) / kCopyChunk;
  if (blocks > 0x7FFFFFFFu) {
    return absl::InvalidArgumentError(
        absl::StrFormat("copy_bytes: %u bytes is too many", a.bytes));
  }
  CopyBytesKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  KVH_CUDA_CHECK_LAUNCH("CopyBytesKernel<<<chunks, 256, 0, stream>>>");
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace kvharbor
