// TransferPath: one way of fetching a lease's pages into an engine layout
// (client/cuda/layout_transfer.h lists them and their fallback order).
// LayoutTransfer keeps its paths in that order and gives a range of pages
// to the first that accepts it and serves it; a path that cannot serve
// notes why (TransferResult::fallbacks) and the next one is asked. A new
// path is a class in its own file and one line of
// LayoutTransfer::MakeFetchPaths (client/cuda/layout_transfer.cc).
//
// Memory: a path holds only what it keeps between calls (retry times, GPU
// decoders); the pages and the layout are the plan's. Thread safety: a
// LayoutTransfer asks its paths one call at a time; a path's state that its
// own worker threads share is guarded by the path's mutex.
#ifndef KVHARBOR_CLIENT_CUDA_TRANSFER_PATH_H_
#define KVHARBOR_CLIENT_CUDA_TRANSFER_PATH_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "client/cuda/transfer_plan.h"

namespace kvharbor {
namespace client {

// Call pages [first, first + n): the lease's raw pages (its hot prefix) or
// its cold ones (Lease::page_tiers), which not every path serves.
struct PageRange {
  uint32_t first = 0;
  uint32_t n = 0;
  bool cold = false;
};

class TransferPath {
 public:
  virtual ~TransferPath() = default;
  // Whether to try this path for `range` now: the client's options and
  // permissions, a daemon's earlier "not offered".
  virtual bool Accepts(const TransferPlan& plan, const PageRange& range) = 0;
  // Moves `range` into the layout: true when it served the pages (named
  // in plan.result->path), false when the next path must (with a note in
  // plan.result->fallbacks), an error for what every path would fail on.
  virtual absl::StatusOr<bool> Fetch(TransferPlan& plan,
                                     const PageRange& range) = 0;
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_TRANSFER_PATH_H_
