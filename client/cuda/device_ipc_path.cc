// The "device_ipc" fetch path (client/cuda/device_ipc_path.h).
#include "client/cuda/device_ipc_path.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/cuda/device_ipc.h"
#include "cuda/kernels/paged_kv_scatter.h"

namespace kvharbor {
namespace client {

std::optional<std::string> UnmappableArenas::Find(const std::string& handle) {
  absl::MutexLock l(&mu_);
  auto it = reasons_.find(handle);
  if (it == reasons_.end()) return std::nullopt;
  return it->second;
}

void UnmappableArenas::Note(const std::string& handle, const std::string& why) {
  absl::MutexLock l(&mu_);
  reasons_[handle] = why;
}

namespace {

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
    uint64_t page_bytes, const DeviceHandles& h,
    const DeviceArenaMapper::Mapping& m, uint64_t lease_first, uint32_t n) {
  std::vector<uint64_t> ptrs(n);
  for (uint32_t i = 0; i < n; ++i) {
    const DevicePage& p = h.pages[lease_first + i];
    if (p.bytes != page_bytes || p.offset > m.bytes ||
        m.bytes - p.offset < p.bytes) {
      return absl::InternalError(absl::StrFormat(
          "device_ipc: pages[%u] (%u bytes at %u) does not fit the %u-byte "
          "arena or the namespace's %u-byte pages",
          lease_first + i, p.bytes, p.offset, m.bytes, page_bytes));
    }
    ptrs[i] = reinterpret_cast<uint64_t>(m.base + p.offset);
  }
  return ptrs;
}

}  // namespace

bool DeviceIpcPath::Accepts(const TransferPlan& plan, const PageRange& range) {
  const Client& client = *plan.what.client;
  // Cold pages only when the daemon stages them into its device tier.
  if (!client.device_ipc_allowed() ||
      (range.cold && !client.options().stage_cold)) {
    return false;
  }
  absl::MutexLock l(&mu_);
  return absl::Now() >= retry_;
}

absl::StatusOr<bool> DeviceIpcPath::Fetch(TransferPlan& plan,
                                          const PageRange& range) {
  const std::string path = "device_ipc";
  const uint32_t first = range.first, n = range.n;
  // With stage_cold the daemon stages the lease's cold pages for the raw
  // range's call already, so that a partly cold lease's raw pages go
  // through device_ipc too.
  const bool stage = plan.what.client->options().stage_cold;
  DeviceHandlesOptions options;
  options.stage_cold = stage;
  absl::StatusOr<DeviceHandles> h = plan.what.client->GetDeviceHandles(
      plan.what.ns, plan.what.lease_id, options, plan.what.call);
  // Staging cold pages (decoded on the daemon's GPU) is this call's work.
  plan.clock->Lap(stage ? "stage" : "rpc");
  if (!h.ok()) {
    if (!PathUnavailable(h.status())) return h.status();
    if (NotOffered(h.status(), "store.device_pool_bytes") ||
        NotOffered(h.status(), "store.allow_ipc")) {
      absl::MutexLock l(&mu_);
      retry_ = absl::Now() + kHostFetchRetry;
    }
    NoteFallback(*plan.result, path, h.status());
    return false;
  }
  const uint64_t lease_first = uint64_t{plan.what.start_page} + first;
  if (lease_first + n > h->pages.size()) {
    NoteFallback(*plan.result, path,
                 absl::OutOfRangeError(absl::StrFormat(
                     "start_page: pages [%u, %u) of a %u-page lease",
                     lease_first, lease_first + n, h->pages.size())));
    return false;
  }
  if (std::optional<std::string> known = unmappable_->Find(h->ipc_handle)) {
    NoteFallback(*plan.result, path, absl::FailedPreconditionError(*known));
    return false;
  }
  absl::StatusOr<DeviceArenaMapper::Mapping> m =
      DeviceArenaMapper::Process().Map(*h);
  plan.clock->Lap("map");
  if (!m.ok()) {
    const std::string why = UnmappableReason(m.status());
    unmappable_->Note(h->ipc_handle, why);
    NoteFallback(*plan.result, path, absl::FailedPreconditionError(why));
    return false;
  }
  if (m->device != plan.where.lc->layout.device) {
    NoteFallback(*plan.result, path,
                 absl::FailedPreconditionError(absl::StrFormat(
                     "device_ipc: the daemon's arena is on GPU %d of this "
                     "process, the layout on GPU %d",
                     m->device, plan.where.lc->layout.device)));
    return false;
  }
  absl::StatusOr<std::vector<uint64_t>> ptrs =
      ArenaPagePointers(plan.where.page_bytes(), *h, *m, lease_first, n);
  if (!ptrs.ok()) return ptrs.status();
  uint64_t any = 0;
  for (uint64_t p : *ptrs) any |= p;
  if (absl::Status s = UploadTables(plan.where, *ptrs); !s.ok()) return s;
  if (absl::Status s =
          ScatterPages(plan.where, first, n, nullptr, gpu::AlignmentOf(any));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = plan.where.dev->Synchronize(); !s.ok()) return s;
  plan.clock->Lap("wait");
  if (LeaseRanOut(*plan.result, path, h->lease_expiry)) return false;
  AddPath(*plan.result, path);
  plan.result->bytes_moved +=
      uint64_t{n} * plan.where.scattered_bytes_per_page();
  return true;
}

}  // namespace client
}  // namespace kvharbor
