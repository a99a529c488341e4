// Same-host zero copy, the client's CUDA side (library
// kvharbor_client_cuda, built only with CUDA; the SDK itself stays
// CPU-only). Client::GetDeviceHandles describes where a lease's pages lie in
// the daemon's GPU arena; DeviceArenaMapper maps that arena into this
// process with cudaIpcOpenMemHandle and copies pages device-to-device into
// the caller's buffers with cudaMemcpyAsync on the caller's stream.
//
// Why one process-wide mapper: cudaIpcOpenMemHandle is slow (it maps the
// whole arena) and a handle may be opened only once per process, so the
// mapping is made on first use and kept, keyed by the handle's bytes (one
// daemon process exports the same bytes on every call); Process() returns
// the shared instance. A daemon that restarts exports a new handle; the old
// mapping stays until Unmap/UnmapAll.
//
// Memory: the mapped arena belongs to the daemon; the mapper only holds the
// mapping. Destination buffers and streams belong to the caller. The copies
// are asynchronous: the caller must synchronize its stream BEFORE releasing
// the lease (after Release the daemon may reuse the pages' bytes).
//
// Thread-safe: mu_ guards the cache; copies need no lock.
#ifndef KVHARBOR_CLIENT_CUDA_DEVICE_IPC_H_
#define KVHARBOR_CLIENT_CUDA_DEVICE_IPC_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "kvharbor/types.h"

namespace kvharbor {
namespace client {

// The local CUDA ordinal of the GPU whose cudaDeviceProp.uuid is `uuid`
// (16 bytes); NOT_FOUND when this process does not see it.
absl::StatusOr<int> LocalDeviceOfUuid(absl::string_view uuid);

class DeviceArenaMapper {
 public:
  // The process-wide mapper (never destroyed: mappings live as long as the
  // process unless unmapped).
  static DeviceArenaMapper& Process();

  struct Mapping {
    const uint8_t* base = nullptr;  // device address of arena byte 0
    int device = 0;                 // local ordinal it was opened on
    uint64_t bytes = 0;
  };
  // Maps the arena of `h` (once; later calls return the cached mapping).
  // INVALID_ARGUMENT naming ipc_handle / device_uuid for malformed fields,
  // NOT_FOUND when the GPU is not visible here, and the CUDA error of
  // cudaIpcOpenMemHandle otherwise (e.g. the daemon is on another machine).
  absl::StatusOr<Mapping> Map(const DeviceHandles& h);

  // Enqueues on `stream` a device-to-device copy of page i of `h` into
  // dsts[i] (device memory of at least h.pages[i].bytes bytes each; one
  // destination per page, INVALID_ARGUMENT naming "dsts" otherwise).
  // Maps the arena first if needed. `stream` should belong to the arena's
  // GPU (a stream of another GPU copies over peer access).
  absl::Status CopyPages(const DeviceHandles& h, absl::Span<void* const> dsts,
                         cudaStream_t stream);
  // Same into one buffer of `dst_bytes` bytes: page i at dst + i * bytes.
  absl::Status CopyPages(const DeviceHandles& h, void* dst, uint64_t dst_bytes,
                         cudaStream_t stream);

  // Closes the mapping of this handle (NOT_FOUND if not mapped). Pending
  // copies from it must have finished.
  absl::Status Unmap(absl::string_view ipc_handle);
  // Closes every mapping; returns the first error.
  absl::Status UnmapAll();
  // Mappings open now (cudaIpcOpenMemHandle calls that were not closed).
  size_t mapped() const;

 private:
  DeviceArenaMapper() = default;
  mutable absl::Mutex mu_;
  std::map<std::string, Mapping> maps_ ABSL_GUARDED_BY(mu_);  // by handle
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_DEVICE_IPC_H_
