#include "core/memory/paged_kv_copy.h"

#include <cstring>

#include "absl/strings/str_format.h"

namespace kvharbor {

namespace {

enum class Direction { kScatter, kGather };

absl::Status CheckPages(size_t n, const void* const* pages) {
  for (size_t i = 0; i < n; ++i) {
    if (pages[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("pages[%u]: null", i));
    }
  }
  return absl::OkStatus();
}

// One (page, layer, K or V) block: copied run by run, each run the longest
// stretch that is contiguous on both sides.
void CopyBlock(const PagedKvLayout& l, uint8_t* page_block,
               uint8_t* layout_block, Direction dir) {
  const size_t es = DTypeSize(l.dtype);
  const uint64_t run = l.ContiguousRunElements();
  const uint64_t block_elems =
      uint64_t{l.block_size} * l.num_kv_heads * l.head_dim;
  const uint64_t run_bytes = run * es;
  for (uint64_t r = 0; r < block_elems / run; ++r) {
    uint64_t token = 0, head = 0;
    if (run == l.head_dim) {
      token = r / l.num_kv_heads;
      head = r % l.num_kv_heads;
    } else if (run == uint64_t{l.num_kv_heads} * l.head_dim) {
      token = r;
    }
    uint8_t* in_layout = layout_block + l.ElementOffset(0, token, head) * es;
    uint8_t* in_page = page_block + r * run_bytes;
    if (dir == Direction::kScatter) {
      std::memcpy(in_layout, in_page, run_bytes);
    } else {
      std::memcpy(in_page, in_layout, run_bytes);
    }
  }
}

absl::Status Copy(const Geometry& geometry, const PagedKvLayout& layout,
                  absl::Span<uint8_t* const> pages,
                  absl::Span<const int64_t> block_ids, Direction dir) {
  const Geometry g = geometry.Resolved();
  absl::StatusOr<PagedKvLayout> resolved =
      ResolveLayout(layout, g, /*all_layers=*/dir == Direction::kGather);
  if (!resolved.ok()) return resolved.status();
  const PagedKvLayout& l = *resolved;
  if (l.on_device()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layout.device: %d, but the CPU copy needs host memory (-1)",
        l.device));
  }
  if (absl::Status s = CheckBlockIds(l, block_ids, pages.size()); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckPages(pages.size(),
                                  reinterpret_cast<void* const*>(pages.data()));
      !s.ok()) {
    return s;
  }
  const size_t es = DTypeSize(l.dtype);
  for (size_t i = 0; i < pages.size(); ++i) {
    const uint64_t block_offset =
        l.ElementOffset(static_cast<uint64_t>(block_ids[i]), 0, 0) * es;
    for (uint32_t j = 0; j < l.num_layers(); ++j) {
      for (int kv = 0; kv < 2; ++kv) {
        const uint64_t base = kv == 0 ? l.k[j] : l.v[j];
        uint8_t* page_block =
            pages[i] + PageBlockElementOffset(g, kv, l.layer_begin + j) * es;
        CopyBlock(l, page_block,
                  reinterpret_cast<uint8_t*>(base) + block_offset, dir);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ScatterPagesToLayout(const Geometry& g,
                                  const PagedKvLayout& layout,
                                  absl::Span<const uint8_t* const> pages,
                                  absl::Span<const int64_t> block_ids) {
  // The page side is only read in this direction.
  return Copy(
      g, layout,
      absl::MakeSpan(const_cast<uint8_t* const*>(pages.data()), pages.size()),
      block_ids, Direction::kScatter);
}

absl::Status GatherLayoutToPages(const Geometry& g, const PagedKvLayout& layout,
                                 absl::Span<const int64_t> block_ids,
                                 absl::Span<uint8_t* const> pages) {
  return Copy(g, layout, pages, block_ids, Direction::kGather);
}

}  // namespace kvharbor
