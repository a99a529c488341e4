#include "client/layer_copies.h"

#include <algorithm>
#include <cstring>

namespace kvharbor {
namespace client {

namespace {

// A run of a page that holds some of the range (bytes at `src` of a whole
// page go to `dst` of its layer page).
struct Run {
  uint64_t src = 0, dst = 0, bytes = 0;
};

// The range's runs of one page, adjacent ones merged (every layer of a
// KV-first page is one run, like a layer-major range).
std::vector<Run> RunsOf(const Geometry& g, LayerRange r) {
  const PageRuns runs = LayerRuns(g, r);
  std::vector<Run> out;
  uint64_t dst = 0;
  for (int k = 0; k < runs.count; ++k) {
    if (!out.empty() && out.back().src + out.back().bytes == runs.offset[k]) {
      out.back().bytes += runs.bytes[k];
    } else {
      out.push_back(Run{runs.offset[k], dst, runs.bytes[k]});
    }
    dst += runs.bytes[k];
  }
  return out;
}

// A copy whose rows are contiguous on both sides is one row.
void Emit(StridedCopy c, std::vector<StridedCopy>& out) {
  if (c.height > 1 && c.width == c.src_pitch && c.width == c.dst_pitch) {
    c.width *= c.height;
    c.height = 1;
  }
  if (c.height == 1) c.src_pitch = c.dst_pitch = c.width;
  out.push_back(c);
}

// One row that crosses a multiple of `boundary`, split at each.
void SplitRow(uint64_t src, uint64_t dst, uint64_t bytes, uint64_t boundary,
              std::vector<StridedCopy>& out) {
  while (bytes > 0) {
    const uint64_t piece =
        std::min(bytes, (src / boundary + 1) * boundary - src);
    Emit(StridedCopy{src, dst, piece, 1, piece, piece}, out);
    src += piece;
    dst += piece;
    bytes -= piece;
  }
}

}  // namespace

uint64_t LayerPageBytes(const Geometry& g, LayerRange r) {
  return LayerRuns(g, r).total();
}

std::vector<StridedCopy> PlanLayerCopies(const Geometry& g, LayerRange r,
                                         absl::Span<const uint64_t> src_pages,
                                         uint64_t boundary) {
  const uint64_t pb = g.PageBytes();
  const uint64_t lpb = LayerPageBytes(g, r);
  const size_t n = src_pages.size();
  // The chunk of `boundary` that byte `at` lies in (0 without one).
  const auto chunk = [boundary](uint64_t at) {
    return boundary == 0 ? 0 : at / boundary;
  };
  std::vector<StridedCopy> out;
  for (const Run& run : RunsOf(g, r)) {
    for (size_t i = 0; i < n;) {
      const uint64_t src = src_pages[i] + run.src;
      const uint64_t dst = i * lpb + run.dst;
      const uint64_t c = chunk(src);
      if (chunk(src + run.bytes - 1) != c) {
        SplitRow(src, dst, run.bytes, boundary, out);
        ++i;
        continue;
      }
      size_t j = i + 1;
      while (j < n && src_pages[j] == src_pages[j - 1] + pb &&
             chunk(src_pages[j] + run.src + run.bytes - 1) == c) {
        ++j;
      }
      Emit(StridedCopy{src, dst, run.bytes, j - i, pb, lpb}, out);
      i = j;
    }
  }
  return out;
}

void ApplyLayerCopies(absl::Span<const StridedCopy> copies, const uint8_t* src,
                      uint8_t* dst) {
  for (const StridedCopy& c : copies) {
    for (uint64_t row = 0; row < c.height; ++row) {
      std::memcpy(dst + c.dst + row * c.dst_pitch,
                  src + c.src + row * c.src_pitch, c.width);
    }
  }
}

}  // namespace client
}  // namespace kvharbor
