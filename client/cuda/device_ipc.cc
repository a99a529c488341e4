#include "client/cuda/device_ipc.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cuda/kernels/cuda_check.h"

namespace kvharbor {
namespace client {

namespace {

// Runs `fn` with `device` current and puts the caller's device back, so
// mapping on the arena's GPU does not move the caller's later CUDA calls.
template <typename Fn>
absl::Status OnDevice(int device, Fn&& fn) {
  int previous = 0;
  KVH_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  absl::Status status = fn();
  const cudaError_t back = cudaSetDevice(previous);
  if (status.ok() && back != cudaSuccess) {
    status =
        gpu::CudaError(back, "cudaSetDevice(previous)", __FILE__, __LINE__);
  }
  return status;
}

absl::Status CheckPages(const DeviceHandles& h) {
  for (size_t i = 0; i < h.pages.size(); ++i) {
    const DevicePage& p = h.pages[i];
    if (p.offset > h.arena_bytes || h.arena_bytes - p.offset < p.bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pages[%u]: bytes [%u, %u) run past the arena's %u bytes", i,
          p.offset, p.offset + p.bytes, h.arena_bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> LocalDeviceOfUuid(absl::string_view uuid) {
  cudaUUID_t want;
  if (uuid.size() != sizeof(want.bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_uuid: ", uuid.size(), " bytes, not ", sizeof(want.bytes)));
  }
  int count = 0;
  KVH_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    KVH_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, d));
    if (std::memcmp(prop.uuid.bytes, uuid.data(), uuid.size()) == 0) return d;
  }
  return absl::NotFoundError(
      absl::StrCat("device_uuid: the daemon's GPU is not among the ", count,
                   " GPUs this process sees (CUDA_VISIBLE_DEVICES?)"));
}

DeviceArenaMapper& DeviceArenaMapper::Process() {
  static DeviceArenaMapper* const mapper = new DeviceArenaMapper();
  return *mapper;
}

absl::StatusOr<DeviceArenaMapper::Mapping> DeviceArenaMapper::Map(
    const DeviceHandles& h) {
  cudaIpcMemHandle_t handle;
  if (h.ipc_handle.size() != sizeof(handle)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ipc_handle: ", h.ipc_handle.size(), " bytes, not ",
                     sizeof(handle), " (a cudaIpcMemHandle_t)"));
  }
  // Held across the open so that two threads never open one handle twice
  // (the second open in a process fails).
  absl::MutexLock l(&mu_);
  auto it = maps_.find(h.ipc_handle);
  if (it != maps_.end()) return it->second;
  absl::StatusOr<int> device = LocalDeviceOfUuid(h.device_uuid);
  if (!device.ok()) return device.status();
  std::memcpy(&handle, h.ipc_handle.data(), sizeof(handle));
  Mapping m;
  m.device = *device;
  m.bytes = h.arena_bytes;
  absl::Status opened = OnDevice(*device, [&]() -> absl::Status {
    void* base = nullptr;
    KVH_CUDA_RETURN_IF_ERROR(
        cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess));
    m.base = static_cast<const uint8_t*>(base);
    return absl::OkStatus();
  });
  if (!opened.ok()) return opened;
  maps_.emplace(h.ipc_handle, m);
  return m;
}

absl::Status DeviceArenaMapper::CopyPages(const DeviceHandles& h,
                                          absl::Span<void* const> dsts,
                                          cudaStream_t stream) {
  if (dsts.size() != h.pages.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dsts: ", dsts.size(), " destinations for ", h.pages.size(), " pages"));
  }
  if (absl::Status s = CheckPages(h); !s.ok()) return s;
  absl::StatusOr<Mapping> m = Map(h);
  if (!m.ok()) return m.status();
  for (size_t i = 0; i < dsts.size(); ++i) {
    KVH_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dsts[i], m->base + h.pages[i].offset, h.pages[i].bytes,
                        cudaMemcpyDeviceToDevice, stream));
  }
  return absl::OkStatus();
}

absl::Status DeviceArenaMapper::CopyPages(const DeviceHandles& h, void* dst,
                                          uint64_t dst_bytes,
                                          cudaStream_t stream) {
  std::vector<void*> dsts(h.pages.size());
  uint64_t at = 0;
  for (size_t i = 0; i < h.pages.size(); ++i) {
    if (dst_bytes < at || dst_bytes - at < h.pages[i].bytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("dst: %u bytes do not hold page %u (bytes [%u, %u))",
                          dst_bytes, i, at, at + h.pages[i].bytes));
    }
    dsts[i] = static_cast<uint8_t*>(dst) + at;
    at += h.pages[i].bytes;
  }
  return CopyPages(h, dsts, stream);
}

absl::Status DeviceArenaMapper::Unmap(absl::string_view ipc_handle) {
  absl::MutexLock l(&mu_);
  auto it = maps_.find(std::string(ipc_handle));
  if (it == maps_.end()) {
    return absl::NotFoundError("ipc_handle: not mapped in this process");
  }
  const Mapping m = it->second;
  maps_.erase(it);
  return OnDevice(m.device, [&]() -> absl::Status {
    KVH_CUDA_RETURN_IF_ERROR(
        cudaIpcCloseMemHandle(const_cast<uint8_t*>(m.base)));
    return absl::OkStatus();
  });
}

absl::Status DeviceArenaMapper::UnmapAll() {
  std::vector<std::string> handles;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [handle, m] : maps_) handles.push_back(handle);
  }
  absl::Status first;
  for (const std::string& h : handles) {
    absl::Status s = Unmap(h);
    if (first.ok() && !s.ok() && s.code() != absl::StatusCode::kNotFound) {
      first = s;
    }
  }
  return first;
}

size_t DeviceArenaMapper::mapped() const {
  absl::MutexLock l(&mu_);
  return maps_.size();
}

}  // namespace client
}  // namespace kvharbor
