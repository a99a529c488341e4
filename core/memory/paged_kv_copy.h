// The CPU reference of moving pages between the namespace's page layout and
// an engine's paged KV cache (types/kv_layout.h): scatter (fetched pages ->
// the engine's blocks) and gather (the engine's blocks -> pages to store).
//
// Page i (g.PageBytes() bytes, [2][layer][token][head][d] or
// [layer][2][token][head][d] as g.layout says) corresponds to block
// block_ids[i] of every layer the layout holds; within a (layer, K or V)
// block, token t and head h of the page land at the layout's
// ElementOffset(block, t, h). Scatter writes only the layout's layers of
// each page (a layer range); gather needs a layout of all layers, since it
// produces whole pages. These are what the SDK runs for host-memory
// layouts, and what the GPU kernels (cuda/kernels/paged_kv_scatter.h,
// cuda/kernels/paged_kv_gather.h) are tested against.
//
// Both validate everything first (ResolveLayout against `g`, CheckBlockIds)
// and write nothing when that fails; INVALID_ARGUMENT naming the field.
// Memory belongs to the caller: pages and the layout's buffers must be host
// memory (a layout with device >= 0 is refused, naming layout.device).
// Pure functions; thread-safe for disjoint destinations.
#ifndef KVHARBOR_CORE_MEMORY_PAGED_KV_COPY_H_
#define KVHARBOR_CORE_MEMORY_PAGED_KV_COPY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "types/geometry.h"
#include "types/kv_layout.h"

namespace kvharbor {

// Page i at pages[i] -> block block_ids[i] of `layout`.
absl::Status ScatterPagesToLayout(const Geometry& g,
                                  const PagedKvLayout& layout,
                                  absl::Span<const uint8_t* const> pages,
                                  absl::Span<const int64_t> block_ids);

// Block block_ids[i] of `layout` (all of g's layers) -> page i at pages[i].
absl::Status GatherLayoutToPages(const Geometry& g, const PagedKvLayout& layout,
                                 absl::Span<const int64_t> block_ids,
                                 absl::Span<uint8_t* const> pages);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_MEMORY_PAGED_KV_COPY_H_
