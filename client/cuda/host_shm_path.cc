// The "host_shm" fetch path (client/cuda/host_shm_path.h).
#include "client/cuda/host_shm_path.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/layer_copies.h"
#include "cuda/kernels/cuda_check.h"
#include "kvharbor/host_ipc.h"

namespace kvharbor {
namespace client {

namespace {

// The arena offsets of lease pages [lease_first + first, + n).
std::vector<uint64_t> HostPageOffsets(const HostHandles& h,
                                      uint64_t lease_first, uint32_t first,
                                      uint32_t n) {
  std::vector<uint64_t> at(n);
  for (uint32_t i = 0; i < n; ++i) {
    at[i] = h.pages[lease_first + first + i].offset;
  }
  return at;
}

// Enqueues the H2D of one chunk's pages straight out of the registered
// arena into the chunk's device slot, as layer pages of the layout's
// layers (client/layer_copies.h): one copy per run of pages that lie back
// to back (2-D when only some layers are taken), split where registrations
// end (a copy must not span two).
absl::Status CopyRegistered(const LayoutTarget& where,
                            const HostArenaMapping& map, const HostHandles& h,
                            uint64_t lease_first, uint64_t chunk,
                            uint32_t first, uint32_t n,
                            uint64_t register_chunk) {
  TransferDevice& d = *where.dev;
  TransferDevice::Slot& slot = d.slot(chunk);
  const cudaStream_t copy = d.copy_stream();
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy, slot.consumed, 0));
  absl::StatusOr<size_t> begin = d.Begin(copy);
  if (!begin.ok()) return begin.status();
  for (const StridedCopy& c : PlanLayerCopies(
           where.lc->geometry, where.layers,
           HostPageOffsets(h, lease_first, first, n), register_chunk)) {
    uint8_t* dst = slot.device + c.dst;
    const uint8_t* src = map.data() + c.src;
    if (c.height == 1) {
      KVH_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst, src, c.width, cudaMemcpyHostToDevice, copy));
    } else {
      KVH_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, c.dst_pitch, src,
                                                 c.src_pitch, c.width, c.height,
                                                 cudaMemcpyHostToDevice, copy));
    }
  }
  if (absl::Status s = d.End("h2d", *begin, copy); !s.ok()) return s;
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.copied, copy));
  return absl::OkStatus();
}

// The same through the pinned half of the slot (when the arena could not
// be registered): the CPU copies the layers in, then one H2D.
absl::Status CopyThroughPinned(const LayoutTarget& where,
                               const HostArenaMapping& map,
                               const HostHandles& h, uint64_t lease_first,
                               uint64_t chunk, uint32_t first, uint32_t n) {
  TransferDevice& d = *where.dev;
  TransferDevice::Slot& slot = d.slot(chunk);
  KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.drained));
  ApplyLayerCopies(PlanLayerCopies(where.lc->geometry, where.layers,
                                   HostPageOffsets(h, lease_first, first, n),
                                   /*boundary=*/0),
                   map.data(), slot.pinned);
  return CopyPinnedSlot(where, slot, n);
}

// Lease pages [lease_first, lease_first + n) of `h` must each lie in the
// mapped arena and be one whole page.
absl::Status CheckHostPages(const HostHandles& h, const HostArenaMapping& map,
                            uint64_t lease_first, uint32_t n, uint64_t pb) {
  for (uint32_t i = 0; i < n; ++i) {
    const HostPage& p = h.pages[lease_first + i];
    if (p.bytes != pb || p.offset > map.bytes() ||
        map.bytes() - p.offset < pb) {
      return absl::InternalError(absl::StrFormat(
          "host_shm: pages[%u] (%u bytes at %u) does not fit the %u-byte "
          "arena or the namespace's %u-byte pages",
          lease_first + i, p.bytes, p.offset, map.bytes(), pb));
    }
  }
  return absl::OkStatus();
}

// Registers the arena chunks holding lease pages [lease_first, lease_first
// + n); false (with a note) when the mapping cannot be registered.
bool RegisterHostPages(uint64_t page_bytes, TransferResult& result,
                       HostArenaRegistry& registry, const HostHandles& h,
                       const std::shared_ptr<const HostArenaMapping>& map,
                       uint64_t lease_first, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    const HostPage& p = h.pages[lease_first + i];
    absl::Status s = registry.Ensure(h.socket_path, map, h.arena_generation,
                                     p.offset, page_bytes, nullptr);
    if (!s.ok()) {
      NoteFallback(
          result, "host_shm registration",
          absl::Status(s.code(), absl::StrCat(s.message(),
                                              "; copying through pinned "
                                              "memory instead")));
      return false;
    }
  }
  return true;
}

// Enqueues call pages [first, first + n) a staging slot at a time: each
// chunk's H2D of the layout's layers (from the registered arena, else
// through pinned memory) overlapped with the scatter of the one before.
absl::Status CopyAndScatterHostPages(TransferPlan& plan,
                                     const HostArenaMapping& map,
                                     const HostHandles& h, bool registered,
                                     uint64_t register_chunk, uint32_t first,
                                     uint32_t n) {
  const uint64_t lease_first = uint64_t{plan.what.start_page};
  const uint32_t sp = plan.where.dev->slot_pages();
  for (uint64_t chunk = 0; uint64_t{chunk} * sp < n; ++chunk) {
    const uint32_t at = static_cast<uint32_t>(chunk * sp);
    const uint32_t m = std::min(sp, n - at);
    absl::Status s = registered
                         ? CopyRegistered(plan.where, map, h, lease_first,
                                          chunk, first + at, m, register_chunk)
                         : CopyThroughPinned(plan.where, map, h, lease_first,
                                             chunk, first + at, m);
    if (!s.ok()) return s;
    TransferDevice::Slot& slot = plan.where.dev->slot(chunk);
    const cudaStream_t compute = plan.where.dev->compute_stream();
    KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, slot.copied, 0));
    if (absl::Status st =
            ScatterLayerPages(plan.where, first + at, m, slot.device);
        !st.ok()) {
      return st;
    }
    KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.consumed, compute));
  }
  return absl::OkStatus();
}

}  // namespace

bool HostShmPath::Accepts(const TransferPlan& plan, const PageRange& range) {
  if (range.cold || !plan.what.client->host_fetch_allowed()) return false;
  absl::MutexLock l(&mu_);
  return absl::Now() >= retry_;
}

void HostShmPath::RetryLater() {
  absl::MutexLock l(&mu_);
  retry_ = absl::Now() + kHostFetchRetry;
}

absl::StatusOr<bool> HostShmPath::Fetch(TransferPlan& plan,
                                        const PageRange& range) {
  const std::string path = "host_shm";
  const uint32_t first = range.first, n = range.n;
  absl::StatusOr<HostHandles> h = plan.what.client->GetHostHandles(
      plan.what.ns, plan.what.lease_id, plan.what.call);
  plan.clock->Lap("rpc");
  if (!h.ok()) {
    if (!PathUnavailable(h.status())) return h.status();
    if (NotOffered(h.status(), "store.host_ipc_socket")) {
      RetryLater();
    }
    NoteFallback(*plan.result, path, h.status());
    return false;
  }
  const uint64_t lease_first = uint64_t{plan.what.start_page};
  if (lease_first + first + n > h->pages.size()) {
    NoteFallback(
        *plan.result, path,
        absl::OutOfRangeError(absl::StrFormat(
            "start_page: pages [%u, %u) of a %u-page lease",
            lease_first + first, lease_first + first + n, h->pages.size())));
    return false;
  }
  absl::StatusOr<std::shared_ptr<const HostArenaMapping>> map =
      HostIpc::Default().Get(*h);
  plan.clock->Lap("map");
  if (!map.ok()) {
    RetryLater();
    NoteFallback(*plan.result, path, map.status());
    return false;
  }
  const uint64_t pb = plan.where.page_bytes();
  if (absl::Status s = CheckHostPages(*h, **map, lease_first + first, n, pb);
      !s.ok()) {
    return s;
  }
  const bool registered =
      RegisterHostPages(plan.where.page_bytes(), *plan.result, *registry_, *h,
                        *map, lease_first + first, n);
  plan.clock->Lap("register");
  if (absl::Status s =
          EnsureLayerStaging(plan.where, *plan.options, /*pinned=*/!registered);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = UploadTables(plan.where); !s.ok()) return s;
  if (absl::Status s = CopyAndScatterHostPages(
          plan, **map, *h, registered, registry_->chunk_bytes(), first, n);
      !s.ok()) {
    return s;
  }
  plan.clock->Lap("enqueue");
  if (absl::Status s = plan.where.dev->Synchronize(); !s.ok()) return s;
  plan.clock->Lap("wait");
  if (LeaseRanOut(*plan.result, path, h->lease_expiry)) return false;
  AddPath(*plan.result, path);
  plan.result->bytes_moved += uint64_t{n} * plan.where.layer_page_bytes();
  return true;
}

}  // namespace client
}  // namespace kvharbor
