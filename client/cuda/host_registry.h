// HostArenaRegistry: the parts of a daemon's shared host arena (the
// read-only mapping include/kvharbor/host_ipc.h makes) registered with
// cudaHostRegister, so that the GPU copies leased pages straight out of it
// (client/cuda/layout_transfer.h, the host_shm path) without a bounce
// through a pinned buffer.
//
// Why chunks: registering pins pages, and the arena is the daemon's whole
// pool budget, mostly unused; the registry pins only the chunks
// (`chunk_bytes` each, aligned) that leased pages lie in, once, and keeps
// them for later fetches. Registering costs time (reported as the
// "register" stage), so it is done once per chunk, not per call.
//
// Why a generation: cudaHostRegister pins the physical pages the mapping
// had at that moment. When the daemon gives a range back (a deleted
// namespace) it punches it out of the memfd; if the range is then reused,
// the file has new pages there that the pinned registration does not see.
// GetHostHandles reports how many ranges were given back
// (HostHandles::arena_generation); the registry unregisters everything when
// that number or the mapping changes, and registers again.
//
// Memory: holds a reference to each mapping it registered (so it is not
// unmapped while registered) until that mapping is replaced or the registry
// is destroyed. Thread-safe (mu_).
#ifndef KVHARBOR_CLIENT_CUDA_HOST_REGISTRY_H_
#define KVHARBOR_CLIENT_CUDA_HOST_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "kvharbor/host_ipc.h"

namespace kvharbor {
namespace client {

class HostArenaRegistry {
 public:
  explicit HostArenaRegistry(uint64_t chunk_bytes);
  ~HostArenaRegistry();
  HostArenaRegistry(const HostArenaRegistry&) = delete;
  HostArenaRegistry& operator=(const HostArenaRegistry&) = delete;

  // Makes bytes [offset, offset + bytes) of `map` (from `socket_path`, at
  // arena generation `generation`) registered. OK: they are; an error
  // (cudaHostRegister's): this mapping cannot be registered, and later
  // calls for it fail at once (the caller copies through pinned memory).
  // `registered_bytes` (may be null) gets what this call newly registered.
  absl::Status Ensure(const std::string& socket_path,
                      const std::shared_ptr<const HostArenaMapping>& map,
                      uint64_t generation, uint64_t offset, uint64_t bytes,
                      uint64_t* registered_bytes);
  // Where registrations end: copies must not cross a multiple of this.
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  // Bytes registered now (tests).
  uint64_t registered_bytes() const;

 private:
  struct Arena {
    std::shared_ptr<const HostArenaMapping> map;
    uint64_t generation = 0;
    std::set<uint64_t> chunks;  // registered chunk indexes
    absl::Status failed;        // a registration of this mapping failed
  };
  void Drop(Arena& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t chunk_bytes_;
  mutable absl::Mutex mu_;
  std::map<std::string, Arena> arenas_ ABSL_GUARDED_BY(mu_);
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_HOST_REGISTRY_H_
