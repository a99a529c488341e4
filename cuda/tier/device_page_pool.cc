#include "cuda/tier/device_page_pool.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "absl/strings/str_format.h"
#include "cuda/kernels/cuda_check.h"

namespace kvharbor {
namespace gpu {

namespace {
constexpr uint64_t kRangeAlign = 256;
}  // namespace

absl::StatusOr<std::shared_ptr<DeviceArena>> DeviceArena::Create(
    int device, uint64_t bytes) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "store.device: GPU %d does not exist (%d CUDA device(s) found)", device,
        count));
  }
  if (bytes == 0) {
    return absl::InvalidArgumentError("store.device_pool_bytes: must be > 0");
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "store.device_pool_bytes: cudaMalloc of %u bytes on GPU %d failed "
        "(%s); %u of %u bytes free",
        bytes, device, cudaGetErrorString(err), free_b, total_b));
  }
  return std::shared_ptr<DeviceArena>(
      new DeviceArena(device, static_cast<uint8_t*>(p), bytes));
}

DeviceArena::DeviceArena(int device, uint8_t* base, uint64_t bytes)
    : device_(device),
      base_(base),
      bytes_(bytes),
      ranges_(bytes, kRangeAlign, absl::StrFormat("the GPU %d arena", device)) {
}

DeviceArena::~DeviceArena() {
  cudaSetDevice(device_);
  cudaFree(base_);
}

absl::StatusOr<std::unique_ptr<DevicePagePool>> DevicePagePool::Create(
    std::shared_ptr<DeviceArena> arena, size_t slot_bytes, uint32_t capacity) {
  absl::StatusOr<size_t> bytes =
      RangeBytes("device page pool", slot_bytes, capacity);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<uint64_t> off = arena->Take(*bytes);
  if (!off.ok()) return off.status();
  return std::unique_ptr<DevicePagePool>(
      new DevicePagePool(std::move(arena), *off, slot_bytes, capacity));
}

DevicePagePool::DevicePagePool(std::shared_ptr<DeviceArena> arena,
                               uint64_t offset, size_t slot_bytes,
                               uint32_t capacity)
    : SlotPagePool("device page pool", arena->base() + offset, slot_bytes,
                   capacity),
      arena_(std::move(arena)),
      offset_(offset) {}

DevicePagePool::~DevicePagePool() {
  arena_->Give(offset_, uint64_t{slot_bytes()} * capacity());
}

absl::Status DevicePagePool::Write(uint32_t slot, size_t offset,
                                   const uint8_t* src, size_t n) {
  if (slot >= capacity() || offset > slot_bytes() ||
      n > slot_bytes() - offset) {
    return absl::OutOfRangeError(absl::StrFormat(
        "device page pool: write of %u bytes at %u into slot %u", n, offset,
        slot));
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(arena_->device()));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(Data(slot) + offset, src, n, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status DevicePagePool::Read(uint32_t slot, uint8_t* dst) {
  if (slot >= capacity()) {
    return absl::OutOfRangeError(
        absl::StrFormat("device page pool: read of slot %u", slot));
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(arena_->device()));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(dst, Data(slot), slot_bytes(), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status DevicePagePool::ReadMany(const std::vector<uint32_t>& slots,
                                      const std::vector<uint8_t*>& dst) {
  if (slots.size() != dst.size()) {
    return absl::InvalidArgumentError("dst: one destination per slot");
  }
  std::vector<const uint8_t*> src(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] >= capacity()) {
      return absl::OutOfRangeError(
          absl::StrFormat("device page pool: read of slot %u", slots[i]));
    }
    src[i] = Data(slots[i]);
  }
  absl::MutexLock l(&bounce_mu_);
  if (bounce_ == nullptr) {
    // Made on first use: a pool that is never read in bulk pins nothing.
    constexpr size_t kChunk = size_t{32} << 20;
    absl::StatusOr<std::unique_ptr<PinnedBounce>> b = PinnedBounce::Create(
        arena_->device(),
        std::max(kChunk / slot_bytes(), size_t{1}) * slot_bytes());
    if (!b.ok()) return b.status();
    bounce_ = *std::move(b);
  }
  return bounce_->CopyToHost(src, dst, slot_bytes());
}

}  // namespace gpu
}  // namespace kvharbor
