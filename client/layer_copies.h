// The copies that take a range of layers out of whole pages lying in a
// source buffer (the daemon's shared host arena) and lay them down as
// layer pages (types/layer_range.h: a page restricted to layers [begin,
// end), in the namespace's layout restricted to them) back to back in a
// destination (a staging slot). LayoutTransfer's host_shm path
// (client/cuda/host_shm_path.cc) issues them as 2-D cudaMemcpy's, so
// that a layer-wise load moves only its layers' bytes over PCIe; its CPU
// fallback applies them with memcpy (ApplyLayerCopies).
//
// A copy is `height` rows of `width` bytes, row j read at src + j *
// src_pitch and written at dst + j * dst_pitch. Pages that lie back to back
// in the source share a copy per run of the page (K, V; one run when the
// range's K and V are adjacent, e.g. every layer); a copy whose rows are
// contiguous on both sides is one row. With `boundary` set, no copy reads
// across a multiple of it (the arena is registered for DMA in chunks of that
// size, and one copy must not span two registrations).
//
// Pure functions of their arguments; thread-safe.
#ifndef KVHARBOR_CLIENT_LAYER_COPIES_H_
#define KVHARBOR_CLIENT_LAYER_COPIES_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "types/geometry.h"
#include "types/layer_range.h"

namespace kvharbor {
namespace client {

struct StridedCopy {
  uint64_t src = 0;  // byte offsets in the source and destination buffers
  uint64_t dst = 0;
  uint64_t width = 0;   // bytes per row
  uint64_t height = 1;  // rows
  uint64_t src_pitch = 0;
  uint64_t dst_pitch = 0;
};

// Bytes of one page of `g` restricted to layers `r` (LayerRuns total).
uint64_t LayerPageBytes(const Geometry& g, LayerRange r);

// The copies of layers `r` of the whole pages of `g` at source offsets
// `src_pages` (page i at src_pages[i]) into layer pages at destination
// offsets i * LayerPageBytes(g, r). `boundary` 0: none.
std::vector<StridedCopy> PlanLayerCopies(const Geometry& g, LayerRange r,
                                         absl::Span<const uint64_t> src_pages,
                                         uint64_t boundary);

// Runs `copies` from `src` into `dst` on the CPU.
void ApplyLayerCopies(absl::Span<const StridedCopy> copies, const uint8_t* src,
                      uint8_t* dst);

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_LAYER_COPIES_H_
