#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/device_math.cuh"
#include "cuda/kernels/kernel_dispatch.cuh"
#include "cuda/kernels/paged_kv_address.cuh"
#include "cuda/kernels/sink_fp8.h"

namespace kvharbor {
namespace gpu {
namespace {

// Element k of a sink row, features [kv][layer][head][dim]: index in its page.
__device__ __forceinline__ uint64_t SinkElementIndex(const KvtcPageShape& s,
                                                     uint32_t token,
                                                     uint64_t k) {
  const uint64_t hd = s.TokenElements();
  const uint64_t run = k / hd;
  const int kv = static_cast<int>(run / s.num_layers);
  const uint32_t l = static_cast<uint32_t>(run - uint64_t(kv) * s.num_layers);
  return s.RunIndex(kv, l, token) + (k - run * hd);
}

// One block per sink row.
template <int kDType, bool kNative>
__global__ void SinkEncodeKernel(SinkEncodeArgs a) {
  const KvtcTokenRef ref = a.sinks[blockIdx.x];
  const uint8_t* data = a.pages[ref.page].data;
  const uint64_t row_bytes =
      2 * uint64_t{a.shape.num_layers} * a.shape.TokenElements();
  bool bad = false;
  dev::BlockWriteBytes(a.out + blockIdx.x * row_bytes, row_bytes,
                       [&](uint64_t k) -> uint8_t {
                         const float v = dev::LoadElement<kDType, kNative>(
                             data, SinkElementIndex(a.shape, ref.token, k));
                         bad |= !dev::IsFinite(v);
                         return dev::FloatToFp8<kNative>(v);
                       });
  if (bad) {
    dev::RaiseError(
        a.error, KvtcErrorCode(KvtcErrorKind::kNonFiniteSink, 2, blockIdx.x));
  }
}

// Into pages, or into a layout (a.dest): the row's runs are located one by
// one there (features [kv][layer] in order), and every byte is still read so
// that a corrupt row is reported whatever the layout holds.
template <int kDType, bool kNative>
__global__ void SinkDecodeKernel(SinkDecodeArgs a) {
  const KvtcTokenRef ref = a.sinks[blockIdx.x];
  const uint64_t hd = a.shape.TokenElements();
  const uint64_t row_bytes = 2 * uint64_t{a.shape.num_layers} * hd;
  const uint8_t* src = a.in + blockIdx.x * row_bytes;
  uint32_t nan_codes = 0;
  for (uint64_t k = threadIdx.x; k < row_bytes; k += blockDim.x) {
    nan_codes |= dev::Fp8NanCodeBits(src[k]);
    const float v = dev::Fp8ToFloat<kNative>(src[k]);
    const uint64_t run = k / hd;
    const int kv = static_cast<int>(run / a.shape.num_layers);
    const uint32_t l =
        static_cast<uint32_t>(run - uint64_t(kv) * a.shape.num_layers);
    const dev::TokenRun dst = dev::LocateTokenRun(a.shape, a.pages, a.dest,
                                                  ref.page, kv, l, ref.token);
    if (dst.base != nullptr) {
      dst.Store<kDType, kNative>(static_cast<uint32_t>(k - run * hd), v);
    }
  }
  if (nan_codes != 0) {
    dev::RaiseError(a.error, KvtcDataErrorCode(2, 0, blockIdx.x));
  }
}

absl::Status CheckSinkArgs(const char* what, const KvtcPageShape& shape,
                           const void* pages, const void* sinks,
                           uint32_t num_sinks, const void* bytes) {
  if (pages == nullptr || sinks == nullptr || bytes == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: pages, sinks and the FP8 data pointer must be set", what));
  }
  if (num_sinks > 0x7FFFFFFFu || shape.TokenElements() == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: num_sinks %u or the shape is out of range", what, num_sinks));
  }
  return absl::OkStatus();
}

// One block per sink token of `num_sinks` (none: nothing to do), after
// CheckSinkArgs on the sinks section `section`: launch(dtype, native,
// threads) through LaunchForDType (naming `what` and `call`), with threads
// for `work` items per block.
template <typename Args, typename F>
absl::Status LaunchSinks(const char* what, const char* call, const Args& a,
                         const void* section, uint64_t work, F&& launch) {
  if (a.num_sinks == 0) return absl::OkStatus();
  KVH_RETURN_IF_ERROR(
      CheckSinkArgs(what, a.shape, a.pages, a.sinks, a.num_sinks, section));
  const unsigned threads = dev::BlockThreads(work);
  return dev::LaunchForDType(
      what, "shape.dtype", a.shape.dtype, a.native_fp8, call,
      [&](auto dt, auto nat) { launch(dt, nat, threads); });
}

}  // namespace

absl::Status LaunchSinkEncode(const SinkEncodeArgs& a, cudaStream_t stream) {
  return LaunchSinks(
      "sink_encode", "SinkEncodeKernel<<<num_sinks, threads, 0, stream>>>", a,
      a.out, 2 * uint64_t{a.shape.num_layers} * a.shape.TokenElements() / 4,
      [&](auto dt, auto nat, unsigned threads) {
        SinkEncodeKernel<decltype(dt)::value, decltype(nat)::value>
            <<<a.num_sinks, threads, 0, stream>>>(a);
      });
}

absl::Status LaunchSinkDecode(const SinkDecodeArgs& a, cudaStream_t stream) {
  if (a.dest.enabled() &&
      (a.dest.k_bases == nullptr || a.dest.v_bases == nullptr)) {
    return absl::InvalidArgumentError(
        "sink_decode: dest.k_bases and dest.v_bases must be set with "
        "dest.block_ids");
  }
  return LaunchSinks(
      "sink_decode", "SinkDecodeKernel<<<num_sinks, threads, 0, stream>>>", a,
      a.in, 2 * uint64_t{a.shape.num_layers} * a.shape.TokenElements(),
      [&](auto dt, auto nat, unsigned threads) {
        SinkDecodeKernel<decltype(dt)::value, decltype(nat)::value>
            <<<a.num_sinks, threads, 0, stream>>>(a);
      });
}

}  // namespace gpu
}  // namespace kvharbor
