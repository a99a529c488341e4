// The steps the transfer paths share (client/cuda/transfer_plan.h).
#include "client/cuda/transfer_plan.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/base/status_macros.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/paged_kv_scatter.h"

namespace kvharbor {
namespace client {

absl::Status UploadTables(LayoutTarget& where,
                          absl::Span<const uint64_t> page_ptrs) {
  absl::StatusOr<TransferDevice::Tables> t = where.dev->UploadTables(
      where.block_ids, where.lc->layout.k, where.lc->layout.v, page_ptrs);
  if (!t.ok()) return t.status();
  where.tables = *t;
  return absl::OkStatus();
}

namespace {

// Enqueues on the compute stream the scatter `a` (its pages and shape set)
// of call pages [first, first + n) into the layout.
absl::Status LaunchScatter(const LayoutTarget& where, gpu::PagedKvScatterArgs a,
                           uint32_t first, uint32_t n) {
  a.num_pages = n;
  a.block_ids = where.tables.blocks + first;
  a.k_bases = where.tables.k;
  a.v_bases = where.tables.v;
  a.layout_align = where.layout_align;
  const cudaStream_t s = where.dev->compute_stream();
  absl::StatusOr<size_t> begin = where.dev->Begin(s);
  if (!begin.ok()) return begin.status();
  if (absl::Status st = gpu::LaunchPagedKvScatter(a, s); !st.ok()) return st;
  return where.dev->End("scatter", *begin, s);
}

}  // namespace

absl::Status ScatterPages(const LayoutTarget& where, uint32_t first, uint32_t n,
                          const uint8_t* base, uint32_t ptr_align) {
  gpu::PagedKvScatterArgs a;
  a.shape = where.shape;
  if (base != nullptr) {
    a.page_base = base;
    a.page_pitch = where.page_bytes();
  } else {
    a.page_ptrs = where.tables.pages;
    a.page_align = ptr_align;
  }
  return LaunchScatter(where, a, first, n);
}

absl::Status ScatterLayerPages(const LayoutTarget& where, uint32_t first,
                               uint32_t n, const uint8_t* base) {
  gpu::PagedKvScatterArgs a;
  a.shape = where.layer_shape;
  a.page_base = base;
  a.page_pitch = where.layer_page_bytes();
  return LaunchScatter(where, a, first, n);
}

void CopyPageLayers(const LayoutTarget& where, const uint8_t* page,
                    uint8_t* dst) {
  const PageRuns runs = LayerRuns(where.lc->geometry, where.layers);
  for (int k = 0; k < runs.count; ++k) {
    std::memcpy(dst, page + runs.offset[k], runs.bytes[k]);
    dst += runs.bytes[k];
  }
}

void AddPath(TransferResult& result, const std::string& path) {
  std::string& p = result.path;
  p = p.empty() ? path : absl::StrCat(p, "+", path);
}

void NoteFallback(TransferResult& result, const std::string& path,
                  const absl::Status& why) {
  result.fallbacks.push_back(absl::StrCat(
      path, ": ", absl::StatusCodeToString(why.code()), ": ", why.message()));
}

absl::Status EnsureStaging(const LayoutTarget& where,
                           const LayoutTransferOptions& options, bool pinned) {
  const uint64_t pb = where.page_bytes();
  const uint32_t pages = static_cast<uint32_t>(
      std::max<uint64_t>(1, options.staging_slot_bytes / pb));
  return where.dev->EnsureRing(pb, pages, options.staging_slots, pinned);
}

absl::Status EnsureLayerStaging(const LayoutTarget& where,
                                const LayoutTransferOptions& options,
                                bool pinned) {
  const uint64_t lpb = where.layer_page_bytes();
  const uint32_t pages = static_cast<uint32_t>(
      std::max<uint64_t>(1, options.staging_slot_bytes / lpb));
  return where.dev->EnsureRing(lpb, pages, options.staging_slots, pinned);
}

absl::Status CopyPinnedSlot(const LayoutTarget& where,
                            TransferDevice::Slot& slot, uint32_t n) {
  TransferDevice& d = *where.dev;
  const cudaStream_t copy = d.copy_stream();
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy, slot.consumed, 0));
  absl::StatusOr<size_t> begin = d.Begin(copy);
  if (!begin.ok()) return begin.status();
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      slot.device, slot.pinned, uint64_t{n} * where.layer_page_bytes(),
      cudaMemcpyHostToDevice, copy));
  if (absl::Status s = d.End("h2d", *begin, copy); !s.ok()) return s;
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.drained, copy));
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.copied, copy));
  return absl::OkStatus();
}

absl::Status DispatchPinned(const LayoutTarget& where, uint64_t chunk,
                            uint32_t first, uint32_t n) {
  TransferDevice& d = *where.dev;
  TransferDevice::Slot& slot = d.slot(chunk);
  KVH_RETURN_IF_ERROR(CopyPinnedSlot(where, slot, n));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaStreamWaitEvent(d.compute_stream(), slot.copied, 0));
  if (absl::Status s = ScatterLayerPages(where, first, n, slot.device);
      !s.ok()) {
    return s;
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.consumed, d.compute_stream()));
  return absl::OkStatus();
}

bool PathUnavailable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kFailedPrecondition ||
         s.code() == absl::StatusCode::kUnimplemented;
}

bool NotOffered(const absl::Status& s, absl::string_view field) {
  return s.code() == absl::StatusCode::kUnimplemented ||
         (s.code() == absl::StatusCode::kFailedPrecondition &&
          absl::StartsWith(s.message(), field));
}

bool LeaseRanOut(TransferResult& result, const std::string& path,
                 absl::Time expiry) {
  if (absl::Now() < expiry) return false;
  NoteFallback(result, path,
               absl::FailedPreconditionError(
                   "lease_id: the lease ran out before the copy finished"));
  return true;
}

}  // namespace client
}  // namespace kvharbor
