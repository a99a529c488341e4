// The decoding side of a COMPRESSED fetch into an engine layout
// (CompressedStreamPath, client/cuda/compressed_stream_path.h): the call's
// streams push groups of compressed pages into a GroupQueue; DecodeQueuedGroups
// decodes them on this GPU (or on the CPU) while the streams go on.
//
// Gathered copies (LayoutTransferOptions::h2d_batch_bytes): groups of KVTC
// pages decoded straight into the layout are merged side by side into a
// pinned copy region by a merger thread, the region goes to the GPU in one
// timed H2D copy (the path's "h2d" stage), and each batch is decoded from
// there. The merge runs on its own thread so that it overlaps the decode of
// the groups before (the decode worker only copies and enqueues); three
// regions rotate: one decoding, one being enqueued, one being merged.
//
// Memory: groups own their pages' buffers until decoded; the copy regions
// are the TransferDevice's. Thread safety: GroupQueue is thread-safe;
// DecodeQueuedGroups runs on one worker thread per call (it starts and
// joins the merger itself).
#ifndef KVHARBOR_CLIENT_CUDA_GROUP_DECODE_H_
#define KVHARBOR_CLIENT_CUDA_GROUP_DECODE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/cuda/transfer_plan.h"
#include "kvharbor/types.h"

namespace kvharbor {
namespace client {

class GpuPageDecoder;

// The GPU decoder of calibration `fingerprint` of the call's namespace
// (CompressedStreamPath's; thread-safe).
using DecoderLookup =
    std::function<absl::StatusOr<GpuPageDecoder*>(uint64_t fingerprint)>;

// A group of compressed pages and where they go.
struct Group {
  uint64_t index = 0;  // slot of the staging ring (the worker's count)
  uint32_t first = 0;  // call page of pages[0]
  std::vector<CompressedPage> pages;
};

// The bytes a group's pages hold.
uint64_t GroupBytes(const Group& g);

// Hands groups from the streams' threads to the decoding side; at most
// `depth` wait, or more while they hold under `bytes` (so that the streams
// go on while the worker enqueues a gathered copy's decodes), so memory
// stays bounded when decoding is the slower side.
class GroupQueue {
 public:
  GroupQueue(size_t depth, uint64_t bytes) : depth_(depth), bytes_(bytes) {}
  // False once the queue failed (its error ends the stream).
  bool Push(Group g) ABSL_LOCKS_EXCLUDED(mu_);
  void Close() ABSL_LOCKS_EXCLUDED(mu_);
  // The next group; false when closed and empty, or failed.
  bool Pop(Group* g) ABSL_LOCKS_EXCLUDED(mu_);
  // The first error wins; waiting pushers and poppers return.
  void Fail(absl::Status s) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status error() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t depth_;
  const uint64_t bytes_;
  absl::Mutex mu_;
  std::deque<Group> q_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;  // bytes of q_'s groups
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// Decodes the groups `queue` gives (`n` pages in all) into the call's
// layout until it is closed and empty: on the GPU with `decoders` when
// `gpu` (group k+1 enqueued before group k is finished, so two steps are in
// flight; gathered copies when plan.options->h2d_batch_bytes), else on the CPU
// into the pinned ring, then H2D and scatter. Returns the first error; the
// caller fails the queue with it.
absl::Status DecodeQueuedGroups(TransferPlan& plan, uint32_t n, bool gpu,
                                const DecoderLookup& decoders,
                                GroupQueue& queue);

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_GROUP_DECODE_H_
