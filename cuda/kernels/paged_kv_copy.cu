// The paged-KV scatter (cuda/kernels/paged_kv_scatter.h) and gather
// (cuda/kernels/paged_kv_gather.h): one kernel template, the direction a
// template argument.
#include <algorithm>

#include "absl/strings/str_format.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/paged_kv_address.cuh"
#include "cuda/kernels/paged_kv_gather.h"
#include "cuda/kernels/paged_kv_scatter.h"

namespace kvharbor {
namespace gpu {
namespace {

constexpr uint32_t kThreads = 256;
constexpr uint64_t kMaxGrid = uint64_t{1} << 20;

// How a run index within a block becomes a layout offset.
enum RunKind : uint32_t {
  kHeadRuns = 0,   // run = (token, head): head_dim elements
  kTokenRuns = 1,  // run = token: heads * head_dim elements
  kBlockRun = 2,   // the whole block is one run
};

struct Params {
  uint32_t num_pages;
  uint32_t num_layers;
  uint32_t layer_begin;
  uint32_t page_layers;
  uint32_t num_kv_heads;
  bool layer_major;
  uint32_t run_kind;
  uint32_t vectors_per_block;
  uint32_t vectors_per_run;
  uint64_t num_blocks;
  uint64_t block_bytes;         // one (layer, K or V) block of a page
  uint64_t block_stride_bytes;  // layout
  uint64_t token_stride_bytes;
  uint64_t head_stride_bytes;
  const uint64_t* page_ptrs;
  uint8_t* page_base;
  uint64_t page_pitch;
  const int64_t* block_ids;
  const uint64_t* k_bases;
  const uint64_t* v_bases;
};

// One CUDA block per (page, layer, K or V) block, looping over them when
// there are more than the grid; threads stride over the block's vectors.
template <typename V, bool kScatter>
__global__ void CopyKernel(Params p) {
  const uint64_t tasks = uint64_t{p.num_pages} * p.num_layers * 2;
  for (uint64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const uint32_t kv = static_cast<uint32_t>(task & 1);
    const uint64_t page_layer = task >> 1;
    const uint32_t page = static_cast<uint32_t>(page_layer / p.num_layers);
    const uint32_t j =
        static_cast<uint32_t>(page_layer - uint64_t{page} * p.num_layers);
    const int64_t block = p.block_ids[page];
    if (block < 0 || static_cast<uint64_t>(block) >= p.num_blocks) continue;
    uint8_t* page_ptr = p.page_ptrs != nullptr
                            ? reinterpret_cast<uint8_t*>(p.page_ptrs[page])
                            : p.page_base + uint64_t{page} * p.page_pitch;
    const uint32_t layer = p.layer_begin + j;
    const uint64_t index = p.layer_major ? uint64_t{layer} * 2 + kv
                                         : uint64_t{kv} * p.page_layers + layer;
    V* in_page = reinterpret_cast<V*>(page_ptr + index * p.block_bytes);
    uint8_t* in_layout =
        dev::LayoutBlock(p.k_bases, p.v_bases, kv, j,
                         static_cast<uint64_t>(block), p.block_stride_bytes);
    for (uint32_t q = threadIdx.x; q < p.vectors_per_block; q += blockDim.x) {
      const uint32_t run = q / p.vectors_per_run;
      const uint32_t within = q - run * p.vectors_per_run;
      uint64_t offset = 0;
      if (p.run_kind == kHeadRuns) {
        const uint32_t token = run / p.num_kv_heads;
        const uint32_t head = run - token * p.num_kv_heads;
        offset = dev::LayoutTokenHead(token, head, p.token_stride_bytes,
                                      p.head_stride_bytes);
      } else if (p.run_kind == kTokenRuns) {
        offset = run * p.token_stride_bytes;
      }
      V* at = reinterpret_cast<V*>(in_layout + offset) + within;
      if constexpr (kScatter) {
        *at = in_page[q];
      } else {
        in_page[q] = *at;
      }
    }
  }
}

uint64_t Gcd(uint64_t a, uint64_t b) {
  while (b != 0) {
    const uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

absl::Status CheckArgs(const PagedKvShape& s, uint32_t num_pages,
                       bool has_pages, const void* block_ids,
                       const void* k_bases, const void* v_bases) {
  if (num_pages == 0) return absl::OkStatus();
  if (!has_pages || block_ids == nullptr || k_bases == nullptr ||
      v_bases == nullptr) {
    return absl::InvalidArgumentError(
        "paged kv copy: pages, block_ids, k_bases and v_bases must be set");
  }
  if (s.num_layers == 0 || s.page_size == 0 || s.num_kv_heads == 0 ||
      s.head_dim == 0 || s.element_bytes == 0 || s.run_elements == 0 ||
      s.block_elements() % s.run_elements != 0 ||
      uint64_t{s.layer_begin} + s.num_layers > s.page_layers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "paged kv copy: inconsistent shape (layers [%u, %u) of %u, run %u of "
        "%u elements)",
        s.layer_begin, s.layer_begin + s.num_layers, s.page_layers,
        s.run_elements, s.block_elements()));
  }
  if (s.block_elements() * s.element_bytes > UINT32_MAX) {
    return absl::InvalidArgumentError(
        "paged kv copy: a block of more than 4 GiB");
  }
  return absl::OkStatus();
}

Params MakeParams(const PagedKvShape& s, uint32_t num_pages,
                  const uint64_t* page_ptrs, uint8_t* page_base,
                  uint64_t page_pitch, const int64_t* block_ids,
                  const uint64_t* k_bases, const uint64_t* v_bases,
                  uint32_t vector_bytes) {
  const uint64_t es = s.element_bytes;
  Params p{};
  p.num_pages = num_pages;
  p.num_layers = s.num_layers;
  p.layer_begin = s.layer_begin;
  p.page_layers = s.page_layers;
  p.num_kv_heads = s.num_kv_heads;
  p.layer_major = s.layer_major;
  p.run_kind = s.run_elements == s.block_elements() ? kBlockRun
               : s.run_elements == s.head_dim       ? kHeadRuns
                                                    : kTokenRuns;
  p.block_bytes = s.block_elements() * es;
  p.vectors_per_block = static_cast<uint32_t>(p.block_bytes / vector_bytes);
  p.vectors_per_run = static_cast<uint32_t>(s.run_elements * es / vector_bytes);
  p.num_blocks = s.num_blocks;
  p.block_stride_bytes = static_cast<uint64_t>(s.block_stride) * es;
  p.token_stride_bytes = static_cast<uint64_t>(s.token_stride) * es;
  p.head_stride_bytes = static_cast<uint64_t>(s.head_stride) * es;
  p.page_ptrs = page_ptrs;
  p.page_base = page_base;
  p.page_pitch = page_pitch;
  p.block_ids = block_ids;
  p.k_bases = k_bases;
  p.v_bases = v_bases;
  return p;
}

uint32_t BatchAlignment(const uint8_t* base, uint64_t pitch) {
  return AlignmentOf(reinterpret_cast<uint64_t>(base) |
                     (pitch == 0 ? 16 : pitch));
}

template <bool kScatter>
absl::Status Launch(const Params& p, uint32_t vector_bytes,
                    cudaStream_t stream) {
  const uint64_t tasks = uint64_t{p.num_pages} * p.num_layers * 2;
  const dim3 grid(static_cast<unsigned>(std::min(tasks, kMaxGrid)));
  auto launch = [&](auto vector) {
    CopyKernel<decltype(vector), kScatter><<<grid, kThreads, 0, stream>>>(p);
  };
  if (vector_bytes == 16) {
    launch(uint4{});
  } else if (vector_bytes == 8) {
    launch(uint2{});
  } else if (vector_bytes == 4) {
    launch(uint32_t{});
  } else if (vector_bytes == 2) {
    launch(uint16_t{});
  } else {
    launch(uint8_t{});
  }
  KVH_CUDA_CHECK_LAUNCH(kScatter ? "paged kv scatter" : "paged kv gather");
  return absl::OkStatus();
}

}  // namespace

uint32_t AlignmentOf(uint64_t address) {
  uint32_t a = 16;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

uint32_t PagedKvVectorBytes(const PagedKvShape& s, uint32_t page_align,
                            uint32_t layout_align, uint32_t max_vector_bytes) {
  const uint64_t es = s.element_bytes;
  // Every address a vector touches is a sum of multiples of these.
  uint64_t g = s.run_elements * es;
  g = Gcd(g, s.block_elements() * es);
  g = Gcd(g, static_cast<uint64_t>(s.block_stride) * es);
  if (s.run_elements != s.block_elements()) {
    g = Gcd(g, static_cast<uint64_t>(s.token_stride) * es);
  }
  if (s.run_elements == s.head_dim) {
    g = Gcd(g, static_cast<uint64_t>(s.head_stride) * es);
  }
  uint32_t v = std::min<uint32_t>(
      {16, max_vector_bytes == 0 ? 1 : max_vector_bytes, AlignmentOf(g),
       AlignmentOf(page_align), AlignmentOf(layout_align)});
  // A power of two no larger than the smallest bound.
  uint32_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

namespace {

// Both directions' launchers: their Args differ only in the constness of
// page_base.
template <bool kScatter, typename Args>
absl::Status CheckAndLaunch(const Args& a, cudaStream_t stream) {
  const bool has_pages = a.page_ptrs != nullptr || a.page_base != nullptr;
  if (absl::Status s = CheckArgs(a.shape, a.num_pages, has_pages, a.block_ids,
                                 a.k_bases, a.v_bases);
      !s.ok() || a.num_pages == 0) {
    return s;
  }
  const uint32_t page_align = a.page_ptrs != nullptr
                                  ? a.page_align
                                  : BatchAlignment(a.page_base, a.page_pitch);
  const uint32_t vb = PagedKvVectorBytes(a.shape, page_align, a.layout_align,
                                         a.max_vector_bytes);
  const Params p = MakeParams(a.shape, a.num_pages, a.page_ptrs,
                              const_cast<uint8_t*>(a.page_base), a.page_pitch,
                              a.block_ids, a.k_bases, a.v_bases, vb);
  return Launch<kScatter>(p, vb, stream);
}

}  // namespace

absl::Status LaunchPagedKvScatter(const PagedKvScatterArgs& a,
                                  cudaStream_t stream) {
  return CheckAndLaunch<true>(a, stream);
}

absl::Status LaunchPagedKvGather(const PagedKvGatherArgs& a,
                                 cudaStream_t stream) {
  return CheckAndLaunch<false>(a, stream);
}

}  // namespace gpu
}  // namespace kvharbor
