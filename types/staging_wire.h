// The wire messages of the daemon's staging socket (same-host Insert through
// shared memory, docs/operations.md "Same-host Insert"): a client registers a
// memory region of its own (a sealed memfd) once, and then names it in Insert
// calls (InsertHeader.staging) instead of streaming the page bytes; the daemon
// copies the pages out of that region into its own pool.
//
// One connection registers one region and stays open while the region is
// registered: closing it (or the client's exit) unregisters it. The client
// sends a StagingRegister with the memfd attached (SCM_RIGHTS); the daemon
// answers with one StagingGrant. The daemon (server/local/staging_server.h)
// and the SDK (include/kvharbor/staging_region.h) both include this header.
//
// Native byte order: both ends run on one host. Plain structs; no state.
#ifndef KVHARBOR_TYPES_STAGING_WIRE_H_
#define KVHARBOR_TYPES_STAGING_WIRE_H_

#include <cstdint>

namespace kvharbor {

inline constexpr char kStagingMagic[8] = {'K', 'V', 'H', 'S',
                                          'T', 'A', 'G', 'E'};
inline constexpr uint32_t kStagingVersion = 1;
// The staging socket's path: the host IPC socket's (store.host_ipc_socket)
// with this suffix.
inline constexpr char kStagingSocketSuffix[] = ".stage";
// Bytes of a registration key (InsertHeader.staging.key).
inline constexpr uint32_t kStagingKeyBytes = 16;

// Client -> daemon, with the region's memfd attached. The memfd must carry
// F_SEAL_SHRINK (so that the daemon's mapping can never lose its pages under
// it) and hold at least `bytes` bytes.
struct StagingRegister {
  char magic[8];
  uint32_t version;
  uint32_t reserved;
  uint64_t bytes;  // bytes of the region, from offset 0 of the memfd
};
static_assert(sizeof(StagingRegister) == 24, "StagingRegister is 24 bytes");

// Daemon -> client. code 0: registered as `id` with `key`; otherwise an
// absl::StatusCode and why in `error` (NUL-terminated), and the daemon
// closes the connection.
struct StagingGrant {
  char magic[8];
  uint32_t version;
  int32_t code;
  uint64_t daemon_id;  // the daemon's random identity (NamespaceInfo.daemon_id)
  uint64_t id;
  uint8_t key[kStagingKeyBytes];
  uint64_t bytes;
  char error[200];
};
static_assert(sizeof(StagingGrant) == 256, "StagingGrant is 256 bytes");

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_STAGING_WIRE_H_
