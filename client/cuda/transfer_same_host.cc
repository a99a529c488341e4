// LayoutTransfer's same-host paths (client/cuda/layout_transfer.h):
// "device_ipc" (the daemon's device arena mapped with CUDA IPC, one scatter
// launch reading the layout's layers of the pages where they lie) and
// "host_shm" (the daemon's shared host arena, registered for DMA, the
// layout's layers H2D into the staging ring overlapped with the scatter).
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/cuda/device_ipc.h"
#include "client/cuda/host_registry.h"
#include "client/cuda/layout_transfer.h"
#include "client/cuda/transfer_call.h"
#include "client/host_ipc.h"
#include "client/layer_copies.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/paged_kv_scatter.h"

namespace kvharbor {
namespace client {

namespace {

// Whether a GetDeviceHandles / GetHostHandles error means the path is not
// there for this call (fall back) rather than a failure every path has.
bool PathUnavailable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kFailedPrecondition ||
         s.code() == absl::StatusCode::kUnimplemented;
}

// ... and whether it is a daemon-wide "not offered" (not asked again soon).
bool NotOffered(const absl::Status& s, absl::string_view field) {
  return s.code() == absl::StatusCode::kUnimplemented ||
         (s.code() == absl::StatusCode::kFailedPrecondition &&
          absl::StartsWith(s.message(), field));
}

// A copy that ended after the lease did may have read pages of another
// lease: not served (the stream then says what the daemon has).
bool LeaseRanOut(TransferCall& tc, const std::string& path, absl::Time expiry) {
  if (absl::Now() < expiry) return false;
  NoteFallback(tc, path,
               absl::FailedPreconditionError(
                   "lease_id: the lease ran out before the copy finished"));
  return true;
}

// Why the daemon's device arena (which Map failed on with `s`) cannot be
// used from this process.
std::string UnmappableReason(const absl::Status& s) {
  return s.code() == absl::StatusCode::kNotFound
             ? absl::StrFormat(
                   "device_ipc: the daemon's GPU is not visible to this "
                   "process: the daemon is on another host, or "
                   "CUDA_VISIBLE_DEVICES hides its GPU (%s)",
                   s.message())
             : absl::StrFormat(
                   "device_ipc: the daemon's arena cannot be "
                   "mapped here: %s",
                   s.ToString());
}

// The device addresses of lease pages [lease_first, lease_first + n) in
// the mapped arena, each checked to lie in it and be one whole page.
absl::StatusOr<std::vector<uint64_t>> ArenaPagePointers(
    TransferCall& tc, const DeviceHandles& h,
    const DeviceArenaMapper::Mapping& m, uint64_t lease_first, uint32_t n) {
  std::vector<uint64_t> ptrs(n);
  for (uint32_t i = 0; i < n; ++i) {
    const DevicePage& p = h.pages[lease_first + i];
    if (p.bytes != tc.page_bytes() || p.offset > m.bytes ||
        m.bytes - p.offset < p.bytes) {
      return absl::InternalError(absl::StrFormat(
          "device_ipc: pages[%u] (%u bytes at %u) does not fit the %u-byte "
          "arena or the namespace's %u-byte pages",
          lease_first + i, p.bytes, p.offset, m.bytes, tc.page_bytes()));
    }
    ptrs[i] = reinterpret_cast<uint64_t>(m.base + p.offset);
  }
  return ptrs;
}

}  // namespace

absl::StatusOr<bool> LayoutTransfer::TryDeviceIpc(TransferCall& tc,
                                                  uint32_t first, uint32_t n,
                                                  bool stage) {
  const std::string path = "device_ipc";
  DeviceHandlesOptions options;
  options.stage_cold = stage;
  absl::StatusOr<DeviceHandles> h =
      client_->GetDeviceHandles(tc.ns, tc.lease_id, options, tc.call);
  // Staging cold pages (decoded on the daemon's GPU) is this call's work.
  tc.clock->Lap(stage ? "stage" : "rpc");
  if (!h.ok()) {
    if (!PathUnavailable(h.status())) return h.status();
    if (NotOffered(h.status(), "store.device_pool_bytes") ||
        NotOffered(h.status(), "store.allow_ipc")) {
      device_ipc_retry_ = absl::Now() + kHostFetchRetry;
    }
    NoteFallback(tc, path, h.status());
    return false;
  }
  const uint64_t lease_first = uint64_t{tc.start_page} + first;
  if (lease_first + n > h->pages.size()) {
    NoteFallback(tc, path,
                 absl::OutOfRangeError(absl::StrFormat(
                     "start_page: pages [%u, %u) of a %u-page lease",
                     lease_first, lease_first + n, h->pages.size())));
    return false;
  }
  auto known = unmappable_.find(h->ipc_handle);
  if (known != unmappable_.end()) {
    NoteFallback(tc, path, absl::FailedPreconditionError(known->second));
    return false;
  }
  absl::StatusOr<DeviceArenaMapper::Mapping> m =
      DeviceArenaMapper::Process().Map(*h);
  tc.clock->Lap("map");
  if (!m.ok()) {
    const std::string why = UnmappableReason(m.status());
    unmappable_[h->ipc_handle] = why;
    NoteFallback(tc, path, absl::FailedPreconditionError(why));
    return false;
  }
  if (m->device != tc.lc->layout.device) {
    NoteFallback(tc, path,
                 absl::FailedPreconditionError(absl::StrFormat(
                     "device_ipc: the daemon's arena is on GPU %d of this "
                     "process, the layout on GPU %d",
                     m->device, tc.lc->layout.device)));
    return false;
  }
  absl::StatusOr<std::vector<uint64_t>> ptrs =
      ArenaPagePointers(tc, *h, *m, lease_first, n);
  if (!ptrs.ok()) return ptrs.status();
  uint64_t any = 0;
  for (uint64_t p : *ptrs) any |= p;
  if (absl::Status s = UploadTables(tc, *ptrs); !s.ok()) return s;
  if (absl::Status s =
          ScatterPages(tc, first, n, nullptr, gpu::AlignmentOf(any));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = tc.dev->Synchronize(); !s.ok()) return s;
  tc.clock->Lap("wait");
  if (LeaseRanOut(tc, path, h->lease_expiry)) return false;
  AddPath(tc, path);
  tc.result->bytes_moved += uint64_t{n} * tc.scattered_bytes_per_page();
  return true;
}

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
absl::Status CopyRegistered(TransferCall& tc, const HostArenaMapping& map,
                            const HostHandles& h, uint64_t lease_first,
                            uint64_t chunk, uint32_t first, uint32_t n,
                            uint64_t register_chunk) {
  TransferDevice& d = *tc.dev;
  TransferDevice::Slot& slot = d.slot(chunk);
  const cudaStream_t copy = d.copy_stream();
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy, slot.consumed, 0));
  absl::StatusOr<size_t> begin = d.Begin(copy);
  if (!begin.ok()) return begin.status();
  for (const StridedCopy& c : PlanLayerCopies(
           tc.lc->geometry, tc.layers,
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
absl::Status CopyThroughPinned(TransferCall& tc, const HostArenaMapping& map,
                               const HostHandles& h, uint64_t lease_first,
                               uint64_t chunk, uint32_t first, uint32_t n) {
  TransferDevice& d = *tc.dev;
  TransferDevice::Slot& slot = d.slot(chunk);
  KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.drained));
  ApplyLayerCopies(PlanLayerCopies(tc.lc->geometry, tc.layers,
                                   HostPageOffsets(h, lease_first, first, n),
                                   /*boundary=*/0),
                   map.data(), slot.pinned);
  const cudaStream_t copy = d.copy_stream();
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy, slot.consumed, 0));
  absl::StatusOr<size_t> begin = d.Begin(copy);
  if (!begin.ok()) return begin.status();
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot.device, slot.pinned,
                                           uint64_t{n} * tc.layer_page_bytes(),
                                           cudaMemcpyHostToDevice, copy));
  if (absl::Status s = d.End("h2d", *begin, copy); !s.ok()) return s;
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.drained, copy));
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.copied, copy));
  return absl::OkStatus();
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
bool RegisterHostPages(TransferCall& tc, HostArenaRegistry& registry,
                       const HostHandles& h,
                       const std::shared_ptr<const HostArenaMapping>& map,
                       uint64_t lease_first, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    const HostPage& p = h.pages[lease_first + i];
    absl::Status s = registry.Ensure(h.socket_path, map, h.arena_generation,
                                     p.offset, tc.page_bytes(), nullptr);
    if (!s.ok()) {
      NoteFallback(
          tc, "host_shm registration",
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
absl::Status CopyAndScatterHostPages(TransferCall& tc,
                                     const HostArenaMapping& map,
                                     const HostHandles& h, bool registered,
                                     uint64_t register_chunk, uint32_t first,
                                     uint32_t n) {
  const uint64_t lease_first = uint64_t{tc.start_page};
  const uint32_t sp = tc.dev->slot_pages();
  for (uint64_t chunk = 0; uint64_t{chunk} * sp < n; ++chunk) {
    const uint32_t at = static_cast<uint32_t>(chunk * sp);
    const uint32_t m = std::min(sp, n - at);
    absl::Status s = registered ? CopyRegistered(tc, map, h, lease_first, chunk,
                                                 first + at, m, register_chunk)
                                : CopyThroughPinned(tc, map, h, lease_first,
                                                    chunk, first + at, m);
    if (!s.ok()) return s;
    TransferDevice::Slot& slot = tc.dev->slot(chunk);
    const cudaStream_t compute = tc.dev->compute_stream();
    KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, slot.copied, 0));
    if (absl::Status st = ScatterLayerPages(tc, first + at, m, slot.device);
        !st.ok()) {
      return st;
    }
    KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.consumed, compute));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> LayoutTransfer::TryHostShm(TransferCall& tc,
                                                uint32_t first, uint32_t n) {
  const std::string path = "host_shm";
  absl::StatusOr<HostHandles> h =
      client_->GetHostHandles(tc.ns, tc.lease_id, tc.call);
  tc.clock->Lap("rpc");
  if (!h.ok()) {
    if (!PathUnavailable(h.status())) return h.status();
    if (NotOffered(h.status(), "store.host_ipc_socket")) {
      host_shm_retry_ = absl::Now() + kHostFetchRetry;
    }
    NoteFallback(tc, path, h.status());
    return false;
  }
  const uint64_t lease_first = uint64_t{tc.start_page};
  if (lease_first + first + n > h->pages.size()) {
    NoteFallback(
        tc, path,
        absl::OutOfRangeError(absl::StrFormat(
            "start_page: pages [%u, %u) of a %u-page lease",
            lease_first + first, lease_first + first + n, h->pages.size())));
    return false;
  }
  absl::StatusOr<std::shared_ptr<const HostArenaMapping>> map =
      HostIpc::Default().Get(*h);
  tc.clock->Lap("map");
  if (!map.ok()) {
    host_shm_retry_ = absl::Now() + kHostFetchRetry;
    NoteFallback(tc, path, map.status());
    return false;
  }
  const uint64_t pb = tc.page_bytes();
  if (absl::Status s = CheckHostPages(*h, **map, lease_first + first, n, pb);
      !s.ok()) {
    return s;
  }
  const bool registered =
      RegisterHostPages(tc, *registry_, *h, *map, lease_first + first, n);
  tc.clock->Lap("register");
  if (absl::Status s = EnsureLayerStaging(tc, /*pinned=*/!registered);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = UploadTables(tc); !s.ok()) return s;
  if (absl::Status s = CopyAndScatterHostPages(
          tc, **map, *h, registered, registry_->chunk_bytes(), first, n);
      !s.ok()) {
    return s;
  }
  tc.clock->Lap("enqueue");
  if (absl::Status s = tc.dev->Synchronize(); !s.ok()) return s;
  tc.clock->Lap("wait");
  if (LeaseRanOut(tc, path, h->lease_expiry)) return false;
  AddPath(tc, path);
  tc.result->bytes_moved += uint64_t{n} * tc.layer_page_bytes();
  return true;
}

}  // namespace client
}  // namespace kvharbor
