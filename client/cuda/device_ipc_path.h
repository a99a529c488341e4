// DeviceIpcPath, the "device_ipc" fetch path (client/cuda/layout_transfer.h):
// the daemon's device tier on this host. GetDeviceHandles (with
// ClientOptions::stage_cold, the daemon first decodes the lease's cold
// pages on its GPU into its device tier, the "stage" stage) + the arena
// mapped once with CUDA IPC (client/cuda/device_ipc.h) + ONE scatter
// launch reading the layout's layers of the pages where they lie; no
// staging copy. Serves raw pages when Client::device_ipc_allowed(), cold
// ones only with stage_cold too; a daemon that does not offer it is not
// asked again for kHostFetchRetry.
//
// UnmappableArenas: the daemons' arenas that did not map in this process
// (another host, a hidden GPU), and why; the fetch and the insert
// (client/cuda/transfer_insert.cc) do not try them again.
//
// Memory: the mapping is DeviceArenaMapper's (process-wide). Thread-safe
// (mu_).
#ifndef KVHARBOR_CLIENT_CUDA_DEVICE_IPC_PATH_H_
#define KVHARBOR_CLIENT_CUDA_DEVICE_IPC_PATH_H_

#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cuda/transfer_path.h"

namespace kvharbor {
namespace client {

class UnmappableArenas {
 public:
  // Why the arena of IPC handle `handle` did not map, if it did not.
  std::optional<std::string> Find(const std::string& handle)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Note(const std::string& handle, const std::string& why)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> reasons_ ABSL_GUARDED_BY(mu_);
};

class DeviceIpcPath final : public TransferPath {
 public:
  // `unmappable` is shared with the insert; it must outlive this path.
  explicit DeviceIpcPath(UnmappableArenas* unmappable)
      : unmappable_(unmappable) {}
  bool Accepts(const TransferPlan& plan, const PageRange& range) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<bool> Fetch(TransferPlan& plan,
                             const PageRange& range) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  UnmappableArenas* const unmappable_;
  absl::Mutex mu_;
  // Not asked again before this time (the daemon did not offer the path).
  absl::Time retry_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_DEVICE_IPC_PATH_H_
