// The "raw_remote" fetch path (client/cuda/raw_stream_path.h).
#include "client/cuda/raw_stream_path.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cuda/kernels/cuda_check.h"

namespace kvharbor {
namespace client {

absl::Status FetchStreamError(const std::string& what) {
  return absl::InternalError(absl::StrCat("fetch stream: ", what));
}

absl::StatusOr<bool> RawStreamPath::Fetch(TransferPlan& plan,
                                          const PageRange& range) {
  const uint32_t first = range.first, n = range.n;
  if (absl::Status s =
          EnsureLayerStaging(plan.where, *plan.options, /*pinned=*/true);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = UploadTables(plan.where); !s.ok()) return s;
  const uint64_t pb = plan.where.layer_page_bytes();
  const uint32_t sp = plan.where.dev->slot_pages();
  struct Filling {
    int64_t chunk = -1;
    uint32_t done = 0, size = 0;
  };
  std::vector<Filling> filling(plan.options->staging_slots);
  auto state = [&](uint32_t index) -> Filling& {
    return filling[(index / sp) % filling.size()];
  };
  const PageDestination destination =
      [&](uint32_t index, uint64_t page_bytes) -> absl::StatusOr<uint8_t*> {
    if (page_bytes != pb || index >= n) {
      return FetchStreamError(absl::StrFormat(
          "page %u of %u bytes; the call asked for %u pages of %u bytes", index,
          page_bytes, n, pb));
    }
    const int64_t chunk = index / sp;
    Filling& f = state(index);
    TransferDevice::Slot& slot = plan.where.dev->slot(chunk);
    if (f.chunk != chunk) {
      if (f.chunk > chunk || (f.chunk >= 0 && f.done != f.size)) {
        return FetchStreamError(absl::StrFormat(
            "page %u arrived while chunk %d was incomplete", index, f.chunk));
      }
      // The H2D of the chunk that used this pinned slot before.
      KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.drained));
      f = Filling{
          chunk, 0,
          std::min<uint32_t>(sp, n - static_cast<uint32_t>(chunk) * sp)};
    }
    return slot.pinned + uint64_t{index % sp} * pb;
  };
  const PageDone done = [&](uint32_t index) -> absl::Status {
    Filling& f = state(index);
    if (++f.done < f.size) return absl::OkStatus();
    return DispatchPinned(plan.where, f.chunk,
                          first + static_cast<uint32_t>(f.chunk) * sp, f.size);
  };
  plan.clock->Lap("prepare");
  FetchSource source = FetchSource::FromLease(plan.what.lease_id,
                                              plan.what.start_page + first, n);
  if (plan.where.layer_subset())
    source = source.Layers(plan.where.layers.begin, plan.where.layers.end);
  absl::StatusOr<FetchResult> r = plan.what.client->FetchStreaming(
      plan.what.ns, source, destination, done, plan.what.call);
  if (!r.ok()) return r.status();
  if (r->num_pages != n) {
    return FetchStreamError(absl::StrFormat(
        "%u pages arrived, %u were asked for", r->num_pages, n));
  }
  plan.clock->Lap("stream");
  AddPath(*plan.result, "raw_remote");
  plan.result->bytes_moved += uint64_t{n} * pb;
  return true;
}

}  // namespace client
}  // namespace kvharbor
