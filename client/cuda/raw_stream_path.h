// RawStreamPath, the "raw_remote" fetch path (client/cuda/layout_transfer.h):
// the RAW gRPC stream into the pinned staging ring, each chunk H2D'd and
// scattered as soon as it is whole while later pages arrive; for a layout
// of some layers a layer-range stream of only those layers. It serves
// every range (the daemon decodes cold pages), so it is the last path.
//
// Memory: holds nothing between calls. Thread-safe (no state).
#ifndef KVHARBOR_CLIENT_CUDA_RAW_STREAM_PATH_H_
#define KVHARBOR_CLIENT_CUDA_RAW_STREAM_PATH_H_

#include <string>

#include "absl/status/status.h"
#include "client/cuda/transfer_path.h"

namespace kvharbor {
namespace client {

class RawStreamPath final : public TransferPath {
 public:
  bool Accepts(const TransferPlan& plan, const PageRange& range) override {
    return true;
  }
  // True, or an error.
  absl::StatusOr<bool> Fetch(TransferPlan& plan,
                             const PageRange& range) override;
};

// A fetch stream that broke its protocol (INTERNAL, "fetch stream: ...").
absl::Status FetchStreamError(const std::string& what);

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_RAW_STREAM_PATH_H_
