// StagingRegion: memory of this process from which a daemon on the same host
// reads an Insert's pages (Client::InsertStaged; docs/operations.md "Same-host
// Insert"), so that the page bytes do not travel through the gRPC stream.
//
// Create makes a memfd of `bytes` bytes (sealed against shrinking, so the
// daemon's read-only mapping of it can never lose its pages), maps it
// read-write here, writes each of its pages once (on up to 8 threads: the
// kernel allocates them to this process, and the daemon maps only pages
// that exist), and registers it on the daemon's staging socket
// (NamespaceInfo.staging_socket): the daemon answers with the region's id and
// a random key that only this process knows. The region stays registered
// while this object lives; destroying it (or the process's exit) closes the
// connection, which unregisters it. Only this process and that daemon can
// reach the memory: the daemon never writes it, and no other client can name
// it without the key. The region serves one tenant: the first Insert that
// uses it binds it to that caller's tenant.
//
// Memory: the region is owned by this object; data() is valid until it is
// destroyed. Thread-compatible: one Insert at a time may read a region (a
// second one gets FAILED_PRECONDITION from the daemon); writing the bytes of
// an Insert while it runs changes what is stored (the page checksums, when
// sent, catch it).
#ifndef KVHARBOR_CLIENT_STAGING_REGION_H_
#define KVHARBOR_CLIENT_STAGING_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvharbor {
namespace client {

class StagingRegion {
 public:
  // A region of `bytes` bytes registered on `socket_path`. UNAVAILABLE when
  // nothing answers there (the daemon is on another host, or serves no
  // staging socket); the daemon's own error (INVALID_ARGUMENT,
  // RESOURCE_EXHAUSTED: too many regions) when it refuses; INVALID_ARGUMENT
  // naming `bytes` for 0.
  static absl::StatusOr<std::unique_ptr<StagingRegion>> Create(
      absl::string_view socket_path, uint64_t bytes);
  ~StagingRegion();
  StagingRegion(const StagingRegion&) = delete;
  StagingRegion& operator=(const StagingRegion&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return bytes_; }
  // The registering daemon's identity (NamespaceInfo.daemon_id): a region
  // serves Inserts to that daemon only.
  uint64_t daemon_id() const { return daemon_id_; }
  uint64_t id() const { return id_; }
  // The 16-byte key (InsertHeader.staging.key).
  const std::string& key() const { return key_; }
  const std::string& socket_path() const { return socket_path_; }

 private:
  StagingRegion(uint8_t* data, uint64_t bytes, int memfd, int conn,
                std::string socket_path);

  uint8_t* const data_;
  const uint64_t bytes_;
  const int memfd_;
  int conn_;
  const std::string socket_path_;
  uint64_t daemon_id_ = 0;
  uint64_t id_ = 0;
  std::string key_;
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_STAGING_REGION_H_
