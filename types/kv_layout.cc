#include "types/kv_layout.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/strings/str_format.h"

namespace kvharbor {

namespace {

// Largest product of a count and a stride accepted: every offset then fits
// in 63 bits even after multiplying by the element size.
constexpr uint64_t kMaxElements = uint64_t{1} << 56;

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

// A field of 0 means "the namespace's"; any other value must equal it.
absl::Status ResolveDim(const char* field, uint32_t* value, uint32_t want,
                        const char* what) {
  if (*value == 0) *value = want;
  if (*value != want) {
    return Invalid(
        absl::StrFormat("layout.%s: %u, but the namespace's %s is %u", field,
                        *value, what, want));
  }
  return absl::OkStatus();
}

absl::Status CheckStrides(const PagedKvLayout& l) {
  struct Dim {
    const char* field;
    uint64_t size;
    int64_t stride;
  };
  std::array<Dim, 3> dims = {Dim{"block_stride", l.num_blocks, l.block_stride},
                             Dim{"token_stride", l.block_size, l.token_stride},
                             Dim{"head_stride", l.num_kv_heads, l.head_stride}};
  for (const Dim& d : dims) {
    if (d.stride < 1) {
      return Invalid(absl::StrFormat("layout.%s: %d must be >= 1 (elements)",
                                     d.field, d.stride));
    }
    if (d.size > kMaxElements / static_cast<uint64_t>(d.stride)) {
      return Invalid(
          absl::StrFormat("layout.%s: %d elements times %u is too large",
                          d.field, d.stride, d.size));
    }
  }
  // Injective when, in order of increasing stride, every stride is at least
  // the span of the dimensions inside it (head_dim is the innermost, stride
  // 1). Dimensions of size 1 never move.
  std::stable_sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) {
    return a.stride < b.stride;
  });
  uint64_t span = l.head_dim;
  for (const Dim& d : dims) {
    if (d.size <= 1) continue;
    const uint64_t stride = static_cast<uint64_t>(d.stride);
    if (stride < span) {
      return Invalid(absl::StrFormat(
          "layout.%s: %u elements is less than the %u elements the "
          "dimensions inside it span (two elements would share an address)",
          d.field, stride, span));
    }
    span += (d.size - 1) * stride;
  }
  return absl::OkStatus();
}

absl::Status CheckBases(const char* name, const std::vector<uint64_t>& bases,
                        const std::vector<uint64_t>& sizes, uint64_t extent,
                        size_t element) {
  if (!sizes.empty() && sizes.size() != bases.size()) {
    return Invalid(absl::StrFormat("layout.%s_bytes: %u sizes for %u layers",
                                   name, sizes.size(), bases.size()));
  }
  for (size_t i = 0; i < bases.size(); ++i) {
    if (bases[i] == 0) {
      return Invalid(absl::StrFormat("layout.%s[%u]: null address", name, i));
    }
    if (bases[i] % element != 0) {
      return Invalid(absl::StrFormat(
          "layout.%s[%u]: address 0x%x is not aligned to the %u-byte element",
          name, i, bases[i], element));
    }
    if (bases[i] > UINT64_MAX - extent) {
      return Invalid(absl::StrFormat(
          "layout.%s[%u]: address 0x%x plus the layout's %u bytes overflows",
          name, i, bases[i], extent));
    }
    if (!sizes.empty() && sizes[i] != 0 && sizes[i] < extent) {
      return Invalid(absl::StrFormat(
          "layout.%s[%u]: the layout addresses %u bytes from it, but its "
          "buffer holds %u",
          name, i, extent, sizes[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t PagedKvLayout::ExtentBytes() const {
  if (num_blocks == 0 || block_size == 0 || num_kv_heads == 0 ||
      head_dim == 0) {
    return 0;
  }
  const uint64_t last =
      ElementOffset(num_blocks - 1, block_size - 1, num_kv_heads - 1) +
      head_dim;
  return last * DTypeSize(dtype);
}

uint64_t PagedKvLayout::ContiguousRunElements() const {
  uint64_t run = head_dim;
  if (num_kv_heads > 1 && head_stride != static_cast<int64_t>(head_dim)) {
    return run;
  }
  run *= num_kv_heads;
  if (block_size > 1 && token_stride != static_cast<int64_t>(run)) return run;
  return run * block_size;
}

absl::StatusOr<PagedKvLayout> ResolveLayout(const PagedKvLayout& layout,
                                            const Geometry& geometry,
                                            bool all_layers) {
  const Geometry g = geometry.Resolved();
  PagedKvLayout l = layout;
  if (l.dtype != g.dtype) {
    return Invalid(
        absl::StrFormat("layout.dtype: %s, but the namespace's pages are %s",
                        DTypeName(l.dtype), DTypeName(g.dtype)));
  }
  if (l.device < kHostDevice) {
    return Invalid(absl::StrFormat(
        "layout.device: %d (a CUDA ordinal, or -1 for host memory)", l.device));
  }
  if (l.k.empty()) return Invalid("layout.k: no layer given");
  if (l.v.size() != l.k.size()) {
    return Invalid(
        absl::StrFormat("layout.v: %u bases for the %u layers of "
                        "layout.k",
                        l.v.size(), l.k.size()));
  }
  const uint64_t n = l.k.size();
  if (l.layer_begin >= g.num_layers) {
    return Invalid(absl::StrFormat(
        "layout.layer_begin: %u, but the namespace has %u layers",
        l.layer_begin, g.num_layers));
  }
  if (n > g.num_layers - l.layer_begin) {
    return Invalid(absl::StrFormat(
        "layout.num_layers: layers [%u, %u) exceed the namespace's %u",
        l.layer_begin, l.layer_begin + n, g.num_layers));
  }
  if (all_layers && n != g.num_layers) {
    return Invalid(absl::StrFormat(
        "layout.num_layers: storing pages needs all %u layers of the "
        "namespace; the layout holds layers [%u, %u)",
        g.num_layers, l.layer_begin, l.layer_begin + n));
  }
  absl::Status s = ResolveDim("num_kv_heads", &l.num_kv_heads, g.num_kv_heads,
                              "num_kv_heads");
  if (s.ok()) s = ResolveDim("head_dim", &l.head_dim, g.head_dim, "head_dim");
  if (s.ok()) {
    s = ResolveDim("block_size", &l.block_size, g.page_size,
                   "page_size (one page fills one block)");
  }
  if (!s.ok()) return s;
  if (l.num_blocks == 0) return Invalid("layout.num_blocks: must be >= 1");
  if (absl::Status st = CheckStrides(l); !st.ok()) return st;
  const uint64_t extent = l.ExtentBytes();
  const size_t element = DTypeSize(l.dtype);
  if (absl::Status st = CheckBases("k", l.k, l.k_bytes, extent, element);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = CheckBases("v", l.v, l.v_bytes, extent, element);
      !st.ok()) {
    return st;
  }
  return l;
}

absl::Status CheckBlockIds(const PagedKvLayout& layout,
                           absl::Span<const int64_t> block_ids,
                           size_t num_pages) {
  if (block_ids.size() != num_pages) {
    return Invalid(absl::StrFormat("block_ids: %u ids for %u pages",
                                   block_ids.size(), num_pages));
  }
  std::vector<std::pair<int64_t, size_t>> sorted;
  sorted.reserve(block_ids.size());
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const int64_t b = block_ids[i];
    if (b < 0 || static_cast<uint64_t>(b) >= layout.num_blocks) {
      return Invalid(
          absl::StrFormat("block_ids[%u]: %d is out of range [0, %u)", i, b,
                          layout.num_blocks));
    }
    sorted.emplace_back(b, i);
  }
  std::sort(sorted.begin(), sorted.end());
  for (size_t j = 1; j < sorted.size(); ++j) {
    if (sorted[j].first == sorted[j - 1].first) {
      return Invalid(absl::StrFormat(
          "block_ids[%u]: block %d is also block_ids[%u] (two pages for one "
          "block)",
          sorted[j].second, sorted[j].first, sorted[j - 1].second));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvharbor
