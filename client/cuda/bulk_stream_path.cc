// The "remote_bulk" fetch path (client/cuda/bulk_stream_path.h).
#include "client/cuda/bulk_stream_path.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "client/cuda/raw_stream_path.h"
#include "cuda/kernels/cuda_check.h"

namespace kvharbor {
namespace client {

namespace {

// Chunk bytes on the plane: small enough that several connections each
// fill a slot at once, large enough that one H2D moves many pages.
constexpr uint64_t kBulkSlotBytes = uint64_t{16} << 20;

// The chunks of one call, shared by the receiving threads.
class BulkChunks {
 public:
  BulkChunks(TransferPlan& plan, uint32_t first, uint32_t n)
      : plan_(plan),
        first_(first),
        n_(n),
        sp_(plan.where.dev->slot_pages()),
        slots_(plan.where.dev->num_slots()),
        chunks_((n + sp_ - 1) / sp_),
        received_(std::make_unique<std::atomic<uint32_t>[]>(chunks_)),
        dispatched_(chunks_, false) {
    for (uint64_t c = 0; c < chunks_; ++c) received_[c] = 0;
  }

  // Where call page `index` goes; the first page of a chunk waits until
  // its slot's previous chunk left the pinned half.
  absl::StatusOr<uint8_t*> Destination(uint32_t index, uint64_t page_bytes) {
    const uint64_t lpb = plan_.where.layer_page_bytes();
    if (page_bytes != lpb || index >= n_) {
      return FetchStreamError(absl::StrFormat(
          "bulk page %u of %u bytes; the call asked for %u pages of %u bytes",
          index, page_bytes, n_, lpb));
    }
    const uint64_t chunk = index / sp_;
    TransferDevice::Slot& slot = plan_.where.dev->slot(chunk);
    if (index % sp_ == 0) {
      if (chunk >= slots_) {
        absl::MutexLock l(&mu_);
        while (!dispatched_[chunk - slots_] && !aborted_) {
          dispatched_cv_.Wait(&mu_);
        }
        if (aborted_) {
          return absl::CancelledError(
              "bulk: another connection of this fetch failed");
        }
      }
      // This thread's first CUDA call may be this one: the layout's GPU.
      KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(plan_.where.dev->device()));
      KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.drained));
    }
    return slot.pinned + uint64_t{index % sp_} * lpb;
  }

  // Page `index` is in; the chunk's last page dispatches its H2D and
  // scatter.
  absl::Status Done(uint32_t index) {
    const uint64_t chunk = index / sp_;
    const uint32_t size =
        static_cast<uint32_t>(std::min<uint64_t>(sp_, n_ - chunk * sp_));
    if (received_[chunk].fetch_add(1) + 1 < size) return absl::OkStatus();
    absl::MutexLock l(&mu_);
    KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(plan_.where.dev->device()));
    absl::Status s = DispatchPinned(
        plan_.where, chunk, first_ + static_cast<uint32_t>(chunk * sp_), size);
    dispatched_[chunk] = true;
    dispatched_cv_.SignalAll();
    return s;
  }

  // The fetch failed (BulkSink::abort): waiting destinations return.
  void Abort() {
    absl::MutexLock l(&mu_);
    aborted_ = true;
    dispatched_cv_.SignalAll();
  }

 private:
  TransferPlan& plan_;
  const uint32_t first_, n_;
  const uint64_t sp_, slots_, chunks_;
  std::unique_ptr<std::atomic<uint32_t>[]> received_;
  absl::Mutex mu_;
  // Chunks whose H2D is enqueued (their slot's drained event recorded).
  std::vector<bool> dispatched_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar dispatched_cv_;
};

}  // namespace

bool BulkStreamPath::Accepts(const TransferPlan& plan, const PageRange&) {
  return plan.what.client->options().data_plane != DataPlaneMode::kOff;
}

absl::StatusOr<bool> BulkStreamPath::Fetch(TransferPlan& plan,
                                           const PageRange& range) {
  const uint32_t first = range.first, n = range.n;
  LayoutTransferOptions options = *plan.options;
  const int connections =
      static_cast<int>(plan.what.client->options().data_plane_connections);
  options.staging_slots = std::max(options.staging_slots, 2 * connections);
  options.staging_slot_bytes =
      std::min<uint64_t>(options.staging_slot_bytes, kBulkSlotBytes);
  if (absl::Status s = EnsureLayerStaging(plan.where, options, /*pinned=*/true);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = UploadTables(plan.where); !s.ok()) return s;
  BulkChunks chunks(plan, first, n);
  BulkSink sink;
  sink.stripe_pages = plan.where.dev->slot_pages();
  sink.destination = [&chunks](uint32_t index, uint64_t page_bytes) {
    return chunks.Destination(index, page_bytes);
  };
  sink.done = [&chunks](uint32_t index) { return chunks.Done(index); };
  sink.abort = [&chunks] { chunks.Abort(); };
  plan.clock->Lap("prepare");
  FetchSource source = FetchSource::FromLease(plan.what.lease_id,
                                              plan.what.start_page + first, n);
  if (plan.where.layer_subset())
    source = source.Layers(plan.where.layers.begin, plan.where.layers.end);
  absl::StatusOr<std::optional<FetchResult>> r =
      plan.what.client->FetchBulk(plan.what.ns, source, sink, plan.what.call);
  if (!r.ok()) return r.status();
  if (!r->has_value()) {
    NoteFallback(*plan.result, "remote_bulk",
                 absl::FailedPreconditionError(
                     "data_plane: the daemon serves no bulk data plane (or "
                     "did not offer it lately)"));
    return false;
  }
  if ((*r)->num_pages != n) {
    return FetchStreamError(
        absl::StrFormat("%u pages arrived on the bulk plane, %u were asked for",
                        (*r)->num_pages, n));
  }
  plan.clock->Lap("stream");
  AddPath(*plan.result, "remote_bulk");
  plan.result->bytes_moved += uint64_t{n} * plan.where.layer_page_bytes();
  return true;
}

}  // namespace client
}  // namespace kvharbor
