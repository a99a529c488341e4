#include "client/cuda/host_registry.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_format.h"

namespace kvharbor {
namespace client {

HostArenaRegistry::HostArenaRegistry(uint64_t chunk_bytes)
    : chunk_bytes_(std::max<uint64_t>(chunk_bytes, uint64_t{2} << 20)) {}

HostArenaRegistry::~HostArenaRegistry() {
  absl::MutexLock l(&mu_);
  for (auto& [path, a] : arenas_) Drop(a);
}

void HostArenaRegistry::Drop(Arena& a) {
  for (uint64_t c : a.chunks) {
    // Failure leaves nothing to do: the mapping goes with its last owner.
    (void)cudaHostUnregister(const_cast<uint8_t*>(a.map->data()) +
                             c * chunk_bytes_);
  }
  a.chunks.clear();
}

uint64_t HostArenaRegistry::registered_bytes() const {
  absl::MutexLock l(&mu_);
  uint64_t total = 0;
  for (const auto& [path, a] : arenas_) {
    for (uint64_t c : a.chunks) {
      total += std::min(chunk_bytes_, a.map->bytes() - c * chunk_bytes_);
    }
  }
  return total;
}

absl::Status HostArenaRegistry::Ensure(
    const std::string& socket_path,
    const std::shared_ptr<const HostArenaMapping>& map, uint64_t generation,
    uint64_t offset, uint64_t bytes, uint64_t* registered_bytes) {
  if (registered_bytes != nullptr) *registered_bytes = 0;
  if (offset > map->bytes() || bytes > map->bytes() - offset) {
    return absl::OutOfRangeError(
        absl::StrFormat("bytes [%u, %u) lie outside the %u-byte arena", offset,
                        offset + bytes, map->bytes()));
  }
  absl::MutexLock l(&mu_);
  Arena& a = arenas_[socket_path];
  if (a.map != map || a.generation != generation) {
    if (a.map != nullptr) Drop(a);
    if (a.map != map) a.failed = absl::OkStatus();
    a.map = map;
    a.generation = generation;
  }
  if (!a.failed.ok()) return a.failed;
  if (bytes == 0) return absl::OkStatus();
  const uint64_t first = offset / chunk_bytes_;
  const uint64_t last = (offset + bytes - 1) / chunk_bytes_;
  for (uint64_t c = first; c <= last; ++c) {
    if (a.chunks.count(c) != 0) continue;
    const uint64_t at = c * chunk_bytes_;
    const uint64_t n = std::min(chunk_bytes_, map->bytes() - at);
    const cudaError_t e =
        cudaHostRegister(const_cast<uint8_t*>(map->data()) + at, n,
                         cudaHostRegisterReadOnly | cudaHostRegisterPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not sticky; clear it for the caller's next call
      a.failed = absl::FailedPreconditionError(absl::StrFormat(
          "cudaHostRegister of the shared arena (read-only, %u bytes): %s", n,
          cudaGetErrorString(e)));
      return a.failed;
    }
    a.chunks.insert(c);
    if (registered_bytes != nullptr) *registered_bytes += n;
  }
  return absl::OkStatus();
}

}  // namespace client
}  // namespace kvharbor
