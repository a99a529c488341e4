#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/base/xxh3_lanes.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/xxh3_checksum.h"

namespace kvharbor {
namespace gpu {
namespace {

constexpr int kGroupsPerBlock = 32;  // 8 lanes each: 256 threads
constexpr unsigned kFullMask = 0xffffffffu;

// The default secret, passed by value (kernel parameters live in constant
// memory) and copied to shared memory, where the lanes' scattered reads of
// it do not serialise.
struct SecretBytes {
  uint8_t b[xxh3::kSecretBytes];
};

struct AlignedLoad {
  const uint8_t* in;
  __host__ __device__ uint64_t operator()(uint64_t o) const {
    return *reinterpret_cast<const uint64_t*>(in + o);
  }
};
struct ByteLoad {
  const uint8_t* in;
  __host__ __device__ uint64_t operator()(uint64_t o) const {
    return xxh3::ReadLE64(in + o);
  }
};

// Group g of 8 threads (threads 8g..8g+7 of the block) hashes input
// blockIdx.x * 32 + g; thread 8g + i runs lane i. Groups past `count` hash
// the last input again so every thread of the warp takes part in the
// shuffles, and write nothing.
__global__ void Xxh3Kernel(Xxh3ChecksumArgs a, SecretBytes secret_param) {
  __shared__ uint8_t secret[xxh3::kSecretBytes];
  for (unsigned i = threadIdx.x; i < xxh3::kSecretBytes; i += blockDim.x) {
    secret[i] = secret_param.b[i];
  }
  __syncthreads();
  const unsigned lane = threadIdx.x & 7;
  const uint64_t group =
      uint64_t{blockIdx.x} * kGroupsPerBlock + (threadIdx.x >> 3);
  const bool active = group < a.count;
  const uint8_t* in =
      reinterpret_cast<const uint8_t*>(a.inputs[active ? group : a.count - 1]);
  uint64_t h = 0;
  if (a.bytes <= xxh3::kMidsizeMax) {
    h = xxh3::Xxh3Short(in, a.bytes, secret);
  } else {
    uint64_t acc = 0;
    // 64-bit loads need every offset 8-aligned: the stripes are, and the
    // last stripe (read at len - 64) is when len is a multiple of 8.
    if ((reinterpret_cast<uintptr_t>(in) & 7) == 0 && (a.bytes & 7) == 0) {
      acc = xxh3::Xxh3LongLane(lane, a.bytes, AlignedLoad{in}, secret);
    } else {
      acc = xxh3::Xxh3LongLane(lane, a.bytes, ByteLoad{in}, secret);
    }
    uint64_t all[xxh3::kLanes];
#pragma unroll
    for (int j = 0; j < 8; ++j) all[j] = __shfl_sync(kFullMask, acc, j, 8);
    h = xxh3::Xxh3MergeLanes(all, a.bytes, secret);
  }
  if (active && lane == 0) a.out[group] = h;
}

}  // namespace

absl::Status LaunchXxh3Checksum(const Xxh3ChecksumArgs& a,
                                cudaStream_t stream) {
  if (a.count == 0) return absl::OkStatus();
  if (a.inputs == nullptr || a.out == nullptr) {
    return absl::InvalidArgumentError(
        "xxh3_checksum: null inputs or out array");
  }
  SecretBytes secret;
  std::memcpy(secret.b, xxh3::kSecret, sizeof(secret.b));
  const unsigned blocks = (a.count + kGroupsPerBlock - 1) / kGroupsPerBlock;
  Xxh3Kernel<<<blocks, kGroupsPerBlock * 8, 0, stream>>>(a, secret);
  KVH_CUDA_CHECK_LAUNCH("Xxh3Kernel<<<blocks, 256, 0, stream>>>");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Xxh3Checksummer>> Xxh3Checksummer::Create(
    int device) {
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<Xxh3Checksummer> c(new Xxh3Checksummer(device));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking));
  return c;
}

Xxh3Checksummer::~Xxh3Checksummer() {
  DrainAndDestroyStream(device_, stream_);
  absl::MutexLock l(&mu_);
  if (dev_ != nullptr) cudaFree(dev_);
  if (host_ != nullptr) cudaFreeHost(host_);
}

absl::Status Xxh3Checksummer::Reserve(size_t count) {
  if (count <= capacity_) return absl::OkStatus();
  const size_t n = std::max<size_t>(count, 2 * capacity_);
  if (dev_ != nullptr) cudaFree(dev_);
  if (host_ != nullptr) cudaFreeHost(host_);
  dev_ = nullptr;
  host_ = nullptr;
  capacity_ = 0;
  void* p = nullptr;
  KVH_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, 2 * n * sizeof(uint64_t)));
  dev_ = static_cast<uint64_t*>(p);
  KVH_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, 2 * n * sizeof(uint64_t), 0));
  host_ = static_cast<uint64_t*>(p);
  capacity_ = n;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> Xxh3Checksummer::Checksum(
    absl::Span<const uint8_t* const> inputs, uint64_t bytes,
    cudaStream_t stream) {
  std::vector<uint64_t> out(inputs.size());
  if (inputs.empty()) return out;
  if (inputs.size() > 0xFFFFFFFFu) {
    return absl::InvalidArgumentError("inputs: more than 2^32 of them");
  }
  absl::MutexLock l(&mu_);
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  KVH_RETURN_IF_ERROR(Reserve(inputs.size()));
  if (stream == nullptr) stream = stream_;
  const size_t n = inputs.size();
  for (size_t i = 0; i < n; ++i) {
    host_[i] = reinterpret_cast<uint64_t>(inputs[i]);
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_, host_, n * sizeof(uint64_t),
                                           cudaMemcpyHostToDevice, stream));
  Xxh3ChecksumArgs a;
  a.inputs = dev_;
  a.bytes = bytes;
  a.count = static_cast<uint32_t>(n);
  a.out = dev_ + capacity_;
  KVH_RETURN_IF_ERROR(LaunchXxh3Checksum(a, stream));
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_ + capacity_, a.out,
                                           n * sizeof(uint64_t),
                                           cudaMemcpyDeviceToHost, stream));
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::memcpy(out.data(), host_ + capacity_, n * sizeof(uint64_t));
  return out;
}

}  // namespace gpu
}  // namespace kvharbor
