// CudaDeviceTier::ExportIpc: the CUDA IPC handle of the tier's arena for
// same-host zero copy (GetDeviceHandles). Apart from device_tier.cc, which
// holds the eviction encoder.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cuda/kernels/cuda_check.h"
#include "cuda/tier/device_tier.h"

namespace kvharbor {
namespace gpu {

absl::StatusOr<DeviceIpcExport> CudaDeviceTier::ExportIpc() {
  absl::MutexLock l(&ipc_mu_);
  if (ipc_ == nullptr) {
    // The handle names the allocation, so the arena's base (the pointer
    // cudaMalloc returned) is what must be exported; one handle serves
    // every pool cut from it.
    KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(arena_->device()));
    cudaIpcMemHandle_t handle;
    KVH_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, arena_->base()));
    cudaDeviceProp prop;
    KVH_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, arena_->device()));
    auto ipc = std::make_unique<DeviceIpcExport>();
    ipc->handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
    ipc->device = arena_->device();
    ipc->device_uuid.assign(prop.uuid.bytes, sizeof(prop.uuid.bytes));
    ipc->arena_bytes = arena_->bytes();
    ipc->arena_base = reinterpret_cast<uintptr_t>(arena_->base());
    ipc_ = std::move(ipc);
  }
  return *ipc_;
}

}  // namespace gpu
}  // namespace kvharbor
