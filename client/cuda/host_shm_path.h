// HostShmPath, the "host_shm" fetch path (client/cuda/layout_transfer.h):
// the daemon's shared host arena (GetHostHandles, include/kvharbor/host_ipc.h).
// The chunks of the read-only mapping that hold the pages are registered with
// cudaHostRegister once (client/cuda/host_registry.h; the "register"
// stage) and the layout's layers of the pages copied H2D from there into
// the device staging ring, each chunk's copy overlapped with the scatter of
// the one before (two streams); when registration fails, through the
// pinned staging ring. Serves raw pages when Client::host_fetch_allowed();
// a daemon that does not offer it is not asked again for kHostFetchRetry.
//
// Memory: the registrations are the HostArenaRegistry's (LayoutTransfer's,
// which must outlive this path). Thread-safe (mu_).
#ifndef KVHARBOR_CLIENT_CUDA_HOST_SHM_PATH_H_
#define KVHARBOR_CLIENT_CUDA_HOST_SHM_PATH_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cuda/host_registry.h"
#include "client/cuda/transfer_path.h"

namespace kvharbor {
namespace client {

class HostShmPath final : public TransferPath {
 public:
  explicit HostShmPath(HostArenaRegistry* registry) : registry_(registry) {}
  bool Accepts(const TransferPlan& plan, const PageRange& range) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<bool> Fetch(TransferPlan& plan,
                             const PageRange& range) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The daemon did not offer the path, or its arena did not map.
  void RetryLater() ABSL_LOCKS_EXCLUDED(mu_);

  HostArenaRegistry* const registry_;
  absl::Mutex mu_;
  absl::Time retry_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_HOST_SHM_PATH_H_
