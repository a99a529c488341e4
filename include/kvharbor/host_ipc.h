// Same-host Fetch through shared memory, client side: the read-only mapping
// of a daemon's shared host arena, and the copy of a lease's pages out of it.
//
// The daemon (store.host_ipc_socket) answers every connection to its Unix
// socket with a greeting (magic, daemon id, arena size; see
// server/local/host_ipc_server.h) and a read-only descriptor of the memfd that
// holds its host page pools. HostArenaMapping::Connect receives it, checks
// the greeting against what GetHostHandles said (same daemon id and size,
// so another daemon's arena -- e.g. a restarted daemon's -- is refused),
// maps it PROT_READ and closes the descriptor. HostIpc keeps one mapping per
// socket path for the whole process (connect once per process and daemon)
// and replaces it when the daemon id changes; whenever it connects, it also
// drops the mappings of socket paths that no longer exist (gone daemons).
// CopyHostPages copies pages into caller memory and verifies each copy's
// XXH3-64 against the daemon's checksum.
//
// Memory: a mapping unmaps itself when the last shared_ptr to it goes; the
// cache holds one per socket path (a dead daemon's until the path serves a
// new one or the next connection finds its socket file gone). Copies write
// only the destinations given.
//
// Thread-safe: HostIpc locks its map; mappings are immutable. No gRPC or
// protobuf header.
#ifndef KVHARBOR_CLIENT_HOST_IPC_H_
#define KVHARBOR_CLIENT_HOST_IPC_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kvharbor/types.h"

namespace kvharbor {
namespace client {

class HostArenaMapping {
 public:
  // Connects to `socket_path`, receives the greeting and descriptor and
  // maps it read-only. UNAVAILABLE when the socket does not answer or sends
  // no descriptor; FAILED_PRECONDITION naming daemon_id when the greeting
  // names another daemon than `daemon_id`, or arena_bytes when the size
  // differs from `arena_bytes` or the descriptor is smaller.
  static absl::StatusOr<std::shared_ptr<const HostArenaMapping>> Connect(
      const std::string& socket_path, uint64_t daemon_id, uint64_t arena_bytes);
  ~HostArenaMapping();
  HostArenaMapping(const HostArenaMapping&) = delete;
  HostArenaMapping& operator=(const HostArenaMapping&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t daemon_id() const { return daemon_id_; }

 private:
  HostArenaMapping(const uint8_t* data, uint64_t bytes, uint64_t daemon_id)
      : data_(data), bytes_(bytes), daemon_id_(daemon_id) {}
  const uint8_t* const data_;
  const uint64_t bytes_;
  const uint64_t daemon_id_;
};

// The process-wide cache of arena mappings, by socket path.
class HostIpc {
 public:
  static HostIpc& Default();

  // The mapping of `h`'s daemon: the cached one when its daemon id and size
  // match, else a new connection (which replaces the cached one). `connected`
  // (may be null) is set when a new mapping was made. Errors: Connect's.
  absl::StatusOr<std::shared_ptr<const HostArenaMapping>> Get(
      const HostHandles& h, bool* connected = nullptr);
  // Whether a mapping for `socket_path` is cached.
  bool Cached(const std::string& socket_path);

 private:
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const HostArenaMapping>> maps_
      ABSL_GUARDED_BY(mu_);
};

// Where page i (of `h.pages`) goes; an error stops the copy.
using HostPageDestination =
    std::function<absl::StatusOr<uint8_t*>(uint32_t index, uint64_t bytes)>;

// Copies pages[first, first + count) of `h` out of `map` to their
// destinations (destination index i - first) and verifies each copy against
// its checksum. DATA_LOSS naming the page when a copy does not match (the
// lease ran out and the slot was reused: do not use the bytes);
// FAILED_PRECONDITION naming pages[i] when a page lies outside the mapping;
// the destination's error as it is.
absl::Status CopyHostPages(const HostArenaMapping& map, const HostHandles& h,
                           size_t first, size_t count,
                           const HostPageDestination& destination);

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_HOST_IPC_H_
