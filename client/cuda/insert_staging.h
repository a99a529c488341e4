// InsertStaging: the staging region of LayoutTransfer's "host_shm" insert
// path: a client::StagingRegion registered on the daemon's staging socket
// (include/kvharbor/staging_region.h) and registered with CUDA
// (cudaHostRegister, portable), so that the insert's D2H copies write it at
// the pinned rate and the daemon then copies the pages out of it
// (Client::InsertStaged) instead of receiving them on the gRPC stream.
//
// The region grows to the largest insert seen (like the "pinned" path's
// buffer) and is kept between calls. A daemon that cannot be reached this
// way (another host, no staging socket, a refusal) is remembered by socket
// path and daemon id, so that later inserts fall back at once.
//
// Memory: owns the region and its CUDA registration. Thread-compatible:
// LayoutTransfer calls it under its mutex.
#ifndef KVHARBOR_CLIENT_CUDA_INSERT_STAGING_H_
#define KVHARBOR_CLIENT_CUDA_INSERT_STAGING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvharbor/staging_region.h"
#include "kvharbor/types.h"

namespace kvharbor {
namespace client {

class InsertStaging {
 public:
  InsertStaging() = default;
  ~InsertStaging();
  InsertStaging(const InsertStaging&) = delete;
  InsertStaging& operator=(const InsertStaging&) = delete;

  // A region of at least `bytes` registered on the daemon `info` describes
  // (its staging_socket and daemon_id), pinned for CUDA. FailedPrecondition
  // saying why when that daemon cannot read this process's memory; other
  // errors (CUDA's) as they are.
  absl::StatusOr<StagingRegion*> Region(const NamespaceInfo& info,
                                        uint64_t bytes);

 private:
  void Drop();

  std::unique_ptr<StagingRegion> region_;
  bool cuda_registered_ = false;
  // The last daemon that could not be used, and why.
  std::string refused_socket_;
  uint64_t refused_daemon_ = 0;
  std::string refused_why_;
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_INSERT_STAGING_H_
