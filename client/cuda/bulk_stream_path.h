// BulkStreamPath, the "remote_bulk" fetch path (client/cuda/layout_transfer.h):
// the lease's RAW pages on the daemon's bulk data plane (docs/data_plane.md),
// received on several TCP connections at once straight into the pinned
// staging ring, each chunk H2D'd and scattered as soon as it is whole.
// A chunk is one stripe of the plane (stripe_pages = the ring's slot
// pages), so one connection fills one slot at a time; a connection waits
// for its slot's previous chunk to be copied out before it writes into it.
// It serves every range, cold pages too (the daemon decodes them), when
// the client may use the plane (ClientOptions::data_plane) and the daemon
// offers it; otherwise it notes why and RawStreamPath serves.
//
// Memory: holds nothing between calls. Thread-safe (no state); during a
// call the receiving threads share the call's chunk state under its mutex.
#ifndef KVHARBOR_CLIENT_CUDA_BULK_STREAM_PATH_H_
#define KVHARBOR_CLIENT_CUDA_BULK_STREAM_PATH_H_

#include "absl/status/statusor.h"
#include "client/cuda/transfer_path.h"

namespace kvharbor {
namespace client {

class BulkStreamPath final : public TransferPath {
 public:
  bool Accepts(const TransferPlan& plan, const PageRange& range) override;
  absl::StatusOr<bool> Fetch(TransferPlan& plan,
                             const PageRange& range) override;
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_BULK_STREAM_PATH_H_
