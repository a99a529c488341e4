// The state of one LayoutTransfer call (client/cuda/layout_transfer.h) and
// the steps its paths share: table uploads, the scatter of a chunk, notes
// of fallbacks, and the two gRPC stream paths (client/cuda/
// transfer_stream.cc). Internal to kvharbor_client_cuda; not thread-safe
// (one call at a time, under LayoutTransfer's lock).
#ifndef KVHARBOR_CLIENT_CUDA_TRANSFER_CALL_H_
#define KVHARBOR_CLIENT_CUDA_TRANSFER_CALL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "client/cuda/transfer_device.h"
#include "client/layout_fetch.h"
#include "cuda/kernels/paged_kv_shape.h"
#include "types/layer_range.h"

namespace kvharbor {
namespace client {

class GpuPageDecoder;

struct TransferCall {
  Client* client = nullptr;
  std::string ns;
  uint64_t lease_id = 0;
  uint32_t start_page = 0;  // the lease page of call page 0
  const LayoutCall* lc = nullptr;
  absl::Span<const int64_t> block_ids;  // one per call page
  CallOptions call;
  TransferDevice* dev = nullptr;
  gpu::PagedKvShape shape;  // whole pages into the layout
  // The layout's layers, and the shape of scattering layer pages (pages
  // restricted to them, types/layer_range.h; page_layers = layers.count()):
  // what the raw staged paths (host_shm, raw_remote, the CPU decode) copy
  // H2D, so a layer-wise load moves only its layers. Equal to `shape` when
  // the layout holds every layer.
  LayerRange layers;
  gpu::PagedKvShape layer_shape;
  uint32_t layout_align = 1;
  TransferDevice::Tables tables;
  TransferClock* clock = nullptr;
  TransferResult* result = nullptr;
  uint64_t slot_bytes = 0;  // LayoutTransferOptions::staging_slot_bytes
  int slots = 0;
  bool decode_into_layout = true;  // LayoutTransferOptions::
  int compressed_streams = 1;      // LayoutTransferOptions::
  uint64_t h2d_batch_bytes = 0;    // LayoutTransferOptions::

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

// Uploads the call's block ids and K / V bases (and `page_ptrs`, the pages'
// device addresses, for a path that reads pages where they lie).
absl::Status UploadTables(TransferCall& tc,
                          absl::Span<const uint64_t> page_ptrs = {});
// Enqueues on the compute stream the scatter of call pages [first, first +
// n) of whole pages: from a batch at `base` (page pitch page_bytes), or from
// the uploaded page addresses (`ptr_align`: what they are all multiples of).
// Only the layout's layers of each page are read.
absl::Status ScatterPages(TransferCall& tc, uint32_t first, uint32_t n,
                          const uint8_t* base, uint32_t ptr_align = 1);
// The same from a batch of layer pages at `base` (pitch layer_page_bytes).
absl::Status ScatterLayerPages(TransferCall& tc, uint32_t first, uint32_t n,
                               const uint8_t* base);
// Copies the layout's layers of the whole page at `page` into the layer
// page at `dst` (host memory).
void CopyPageLayers(const TransferCall& tc, const uint8_t* page, uint8_t* dst);
// Names the path that served pages (joined with '+').
void AddPath(TransferCall& tc, const std::string& path);
// Records that `path` could not serve, and why.
void NoteFallback(TransferCall& tc, const std::string& path,
                  const absl::Status& why);
// Device slots of `tc`'s staging ring for chunks of whole pages (or, with
// EnsureLayerStaging, of layer pages: more of them per slot).
absl::Status EnsureStaging(TransferCall& tc, bool pinned);
absl::Status EnsureLayerStaging(TransferCall& tc, bool pinned);

// Enqueues the H2D of the pinned slot of `chunk` (`n` layer pages) into its
// device slot and the scatter of it as call pages [first, first + n).
absl::Status DispatchPinned(TransferCall& tc, uint64_t chunk, uint32_t first,
                            uint32_t n);

// "raw_remote": call pages [first, first + n) through the RAW stream into
// the pinned ring, each chunk H2D'd and scattered as soon as it is whole;
// for a layout of some layers a layer-range stream of only those layers.
absl::Status RawStream(TransferCall& tc, uint32_t first, uint32_t n);

// The GPU decoder of calibration `fingerprint` of the call's namespace.
using DecoderLookup =
    std::function<absl::StatusOr<GpuPageDecoder*>(uint64_t fingerprint)>;
// "compressed_local" / "compressed_remote" (`path`): call pages [first,
// first + n) through the COMPRESSED stream; a worker decodes each group of
// pages as it is complete, whichever of the call's streams
// (tc.compressed_streams, CompressedStreamRanges) it came on (on the GPU with
// `decoders` when `gpu`, else on the CPU into the pinned ring, then H2D) and
// scatters it, while the streams go on. A compressed page decodes whole (KVTC
// rows span every layer): a layout of some layers gets those layers of the
// decoded pages.
absl::Status CompressedStream(TransferCall& tc, uint32_t first, uint32_t n,
                              bool gpu, const DecoderLookup& decoders,
                              const std::string& path);

// The runs (first page, count) of a call's n pages fetched over separate
// streams: at most `streams`, each of whole groups of `group_pages` pages
// (the last run ends at n) and at least kMinGroupsPerStream groups, as even
// as that allows; one run when n is under twice that. On the H200 a
// 4K-token hit (8 groups) loaded 0.9x as fast over 4 streams of 2 groups as
// over one (docs/hit_paths.md): a stream must carry enough to pay for its
// call.
inline constexpr uint32_t kMinGroupsPerStream = 8;
std::vector<std::pair<uint32_t, uint32_t>> CompressedStreamRanges(
    uint32_t n, uint32_t group_pages, int streams);

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_TRANSFER_CALL_H_
