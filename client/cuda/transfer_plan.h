// TransferPlan: one LayoutTransfer fetch (client/cuda/layout_transfer.h):
// what it moves (lease pages), where to (the layout's blocks on a GPU),
// the transfer's options, and the result being built; and the steps the
// transfer paths (client/cuda/transfer_path.h) share: table uploads, the
// scatter of a chunk, the staging ring, notes of paths taken and fallbacks.
// Each step takes the part of the plan it needs.
//
// Memory: views of the caller's arguments and of LayoutTransfer's state,
// valid for the call only. Not thread-safe (one call at a time, under
// LayoutTransfer's mutex; a path's own threads only read it, except where
// a path says so).
#ifndef KVHARBOR_CLIENT_CUDA_TRANSFER_PLAN_H_
#define KVHARBOR_CLIENT_CUDA_TRANSFER_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/cuda/layout_transfer.h"
#include "client/cuda/transfer_device.h"
#include "cuda/kernels/paged_kv_shape.h"
#include "kvharbor/client.h"
#include "kvharbor/layout_fetch.h"
#include "types/layer_range.h"

namespace kvharbor {
namespace client {

// What a call moves: lease pages [start_page, start_page + the call's
// pages) of `lease_id` in namespace `ns`, over `client` with `call`.
struct LeasePages {
  Client* client = nullptr;
  std::string ns;
  uint64_t lease_id = 0;
  uint32_t start_page = 0;  // the lease page of call page 0
  CallOptions call;
};

// Where they go: blocks `block_ids` (one per call page) of the resolved
// layout, on `dev` (the layout's GPU, current on the calling thread).
struct LayoutTarget {
  const LayoutCall* lc = nullptr;  // geometry, resolved layout
  absl::Span<const int64_t> block_ids;
  TransferDevice* dev = nullptr;
  gpu::PagedKvShape shape;  // whole pages into the layout
  // The layout's layers, and the shape of scattering layer pages (pages
  // restricted to them, types/layer_range.h; page_layers = layers.count()):
  // what the raw staged paths (host_shm, raw_remote, the CPU decode) copy
  // H2D, so a layer-wise load moves only its layers. Equal to `shape` when
  // the layout holds every layer.
  LayerRange layers;
  gpu::PagedKvShape layer_shape;
  uint32_t layout_align = 1;      // of every K / V base
  TransferDevice::Tables tables;  // the last UploadTables's

  uint64_t page_bytes() const { return lc->geometry.PageBytes(); }
  // Bytes of a layer page (page_bytes() when the layout holds every layer).
  uint64_t layer_page_bytes() const {
    return LayerRuns(lc->geometry, layers).total();
  }
  bool layer_subset() const { return layers.count() < lc->geometry.num_layers; }
  // Bytes one page contributes to the layout (its layers in range).
  uint64_t scattered_bytes_per_page() const {
    return 2 * uint64_t{shape.num_layers} * shape.block_elements() *
           shape.element_bytes;
  }
  uint32_t num_pages() const { return static_cast<uint32_t>(block_ids.size()); }
};

struct TransferPlan {
  LeasePages what;
  LayoutTarget where;
  const LayoutTransferOptions* options = nullptr;  // staging, decode, streams
  // The result being built: stage times, the paths that served, fallbacks,
  // bytes moved.
  TransferClock* clock = nullptr;
  TransferResult* result = nullptr;
};

// Uploads the call's block ids and K / V bases (and `page_ptrs`, the pages'
// device addresses, for a path that reads pages where they lie).
absl::Status UploadTables(LayoutTarget& where,
                          absl::Span<const uint64_t> page_ptrs = {});
// Enqueues on the compute stream the scatter of call pages [first, first +
// n) of whole pages: from a batch at `base` (page pitch page_bytes), or from
// the uploaded page addresses (`ptr_align`: what they are all multiples of).
// Only the layout's layers of each page are read.
absl::Status ScatterPages(const LayoutTarget& where, uint32_t first, uint32_t n,
                          const uint8_t* base, uint32_t ptr_align = 1);
// The same from a batch of layer pages at `base` (pitch layer_page_bytes).
absl::Status ScatterLayerPages(const LayoutTarget& where, uint32_t first,
                               uint32_t n, const uint8_t* base);
// Copies the layout's layers of the whole page at `page` into the layer
// page at `dst` (host memory).
void CopyPageLayers(const LayoutTarget& where, const uint8_t* page,
                    uint8_t* dst);
// Names the path that served pages (joined with '+').
void AddPath(TransferResult& result, const std::string& path);
// Records that `path` could not serve, and why.
void NoteFallback(TransferResult& result, const std::string& path,
                  const absl::Status& why);
// Device slots of the staging ring (LayoutTransferOptions::staging_*) for
// chunks of whole pages (or, with EnsureLayerStaging, of layer pages: more
// of them per slot).
absl::Status EnsureStaging(const LayoutTarget& where,
                           const LayoutTransferOptions& options, bool pinned);
absl::Status EnsureLayerStaging(const LayoutTarget& where,
                                const LayoutTransferOptions& options,
                                bool pinned);
// Enqueues, on the copy stream after the slot is consumed, the timed H2D
// ("h2d" stage) of `n` layer pages from the pinned half of `slot` into its
// device half, then records the slot's drained and copied events.
absl::Status CopyPinnedSlot(const LayoutTarget& where,
                            TransferDevice::Slot& slot, uint32_t n);
// Enqueues the H2D of the pinned slot of `chunk` (`n` layer pages) into its
// device slot (CopyPinnedSlot) and the scatter of it as call pages
// [first, first + n).
absl::Status DispatchPinned(const LayoutTarget& where, uint64_t chunk,
                            uint32_t first, uint32_t n);

// The same-host paths' answers from the daemon: whether a GetDeviceHandles
// / GetHostHandles error means the path is not there for this call (fall
// back) rather than a failure every path has; and whether it is a
// daemon-wide "not offered" of `field` (not asked again soon).
bool PathUnavailable(const absl::Status& s);
bool NotOffered(const absl::Status& s, absl::string_view field);
// A copy that ended after the lease did (at `expiry`) may have read pages
// of another lease: not served (noted as `path`'s fallback; the stream then
// says what the daemon has).
bool LeaseRanOut(TransferResult& result, const std::string& path,
                 absl::Time expiry);

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_TRANSFER_PLAN_H_
