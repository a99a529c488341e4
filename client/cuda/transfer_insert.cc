// LayoutTransfer's "device_ipc" insert (client/cuda/layout_transfer.h):
// DeviceInsert into the daemon's device tier, the pages gathered from the
// engine's layout straight into the reserved slots through this process's
// CUDA IPC mapping of the daemon's arena, checksummed there on the GPU.
#include "client/cuda/transfer_insert.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cuda/device_ipc.h"
#include "client/cuda/device_ipc_path.h"
#include "client/cuda/layout_transfer.h"
#include "cuda/kernels/paged_kv_gather.h"
#include "cuda/kernels/paged_kv_scatter.h"
#include "cuda/kernels/xxh3_checksum.h"
#include "kvharbor/device_upload.h"

namespace kvharbor {
namespace client {

namespace {

void Note(const InsertCall& ic, const absl::Status& why) {
  ic.result->fallbacks.push_back(absl::StrCat("device_ipc: ", why.ToString()));
}

// The device address of each reserved slot in the mapped arena, each
// checked to lie in it and hold one page.
absl::StatusOr<std::vector<const uint8_t*>> SlotPointers(
    const DeviceInsertSlots& s, const DeviceArenaMapper::Mapping& m,
    uint64_t page_bytes) {
  std::vector<const uint8_t*> ptrs(s.slots.size());
  for (size_t i = 0; i < s.slots.size(); ++i) {
    const DeviceSlot& slot = s.slots[i];
    if (slot.bytes != page_bytes || slot.offset > m.bytes ||
        m.bytes - slot.offset < slot.bytes) {
      return absl::InternalError(absl::StrFormat(
          "device_ipc: slots[%u] (%u bytes at %u) does not fit the %u-byte "
          "arena or the namespace's %u-byte pages",
          i, slot.bytes, slot.offset, m.bytes, page_bytes));
    }
    ptrs[i] = m.base + slot.offset;
  }
  return ptrs;
}

// Enqueues on the compute stream the gather of call pages [first, n) into
// the slots at `slots` (one launch), timed as "gather".
absl::Status GatherIntoSlots(const InsertCall& ic, uint32_t first,
                             const std::vector<const uint8_t*>& slots) {
  TransferDevice& dev = *ic.dev;
  std::vector<uint64_t> ptrs(slots.size());
  uint64_t any = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    ptrs[i] = reinterpret_cast<uint64_t>(slots[i]);
    any |= ptrs[i];
  }
  absl::StatusOr<TransferDevice::Tables> t = dev.UploadTables(
      ic.block_ids.subspan(first), ic.lc->layout.k, ic.lc->layout.v, ptrs);
  if (!t.ok()) return t.status();
  gpu::PagedKvGatherArgs a;
  a.shape = gpu::MakePagedKvShape(ic.lc->geometry, ic.lc->layout);
  a.num_pages = static_cast<uint32_t>(slots.size());
  a.page_ptrs = t->pages;
  a.block_ids = t->blocks;
  a.k_bases = t->k;
  a.v_bases = t->v;
  a.page_align = gpu::AlignmentOf(any);
  a.layout_align = ic.layout_align;
  const cudaStream_t compute = dev.compute_stream();
  absl::StatusOr<size_t> b = dev.Begin(compute);
  if (!b.ok()) return b.status();
  if (absl::Status s = gpu::LaunchPagedKvGather(a, compute); !s.ok()) return s;
  return dev.End("gather", *b, compute);
}

// The daemon's device arena holding the reserved slots `s`, mapped in this
// process on the layout's GPU; nullopt (with a note) when it cannot be.
std::optional<DeviceArenaMapper::Mapping> MapSlotsArena(
    const InsertCall& ic, const DeviceInsertSlots& s,
    UnmappableArenas& unmappable) {
  if (std::optional<std::string> known = unmappable.Find(s.ipc_handle)) {
    Note(ic, absl::FailedPreconditionError(*known));
    return std::nullopt;
  }
  DeviceHandles h;
  h.ipc_handle = s.ipc_handle;
  h.device = s.device;
  h.device_uuid = s.device_uuid;
  h.arena_bytes = s.arena_bytes;
  absl::StatusOr<DeviceArenaMapper::Mapping> m =
      DeviceArenaMapper::Process().Map(h);
  ic.clock->Lap("map");
  if (!m.ok()) {
    const std::string why = absl::StrCat(
        "the daemon's device arena cannot be mapped here: the daemon is on "
        "another host, or CUDA_VISIBLE_DEVICES hides its GPU (",
        m.status().ToString(), ")");
    unmappable.Note(s.ipc_handle, why);
    Note(ic, absl::FailedPreconditionError(why));
    return std::nullopt;
  }
  if (m->device != ic.lc->layout.device) {
    Note(ic, absl::FailedPreconditionError(absl::StrFormat(
                 "the daemon's arena is on GPU %d of this process, the "
                 "layout on GPU %d",
                 m->device, ic.lc->layout.device)));
    return std::nullopt;
  }
  return *std::move(m);
}

}  // namespace

absl::StatusOr<std::optional<InsertResult>> LayoutTransfer::TryInsertDeviceIpc(
    const InsertCall& ic) {
  absl::StatusOr<std::unique_ptr<DeviceUpload>> up =
      client_->BeginDeviceInsert(ic.ns, ic.tokens, ic.opts->ttl, ic.call);
  ic.clock->Lap("begin");
  if (!up.ok()) {
    // Asked again on every insert (unlike a fetch's DeviceIpcPath): a
    // refused begin costs one round trip, small beside the pages, and each
    // result then says why it fell back.
    if (!DeviceInsertUnavailable(up.status())) return up.status();
    Note(ic, up.status());
    return std::nullopt;
  }
  // Leaving this function without Commit aborts the insert (~DeviceUpload):
  // nothing is stored and the daemon takes the slots back.
  const DeviceInsertSlots& s = (*up)->slots();
  const uint32_t first = s.first_page;
  if (first > ic.num_pages || s.slots.size() != ic.num_pages - first) {
    return absl::InternalError(absl::StrFormat(
        "device_ipc: the daemon reserved %u slots from page %u for a %u-page "
        "insert",
        s.slots.size(), first, ic.num_pages));
  }
  std::vector<uint64_t> sums;
  if (!s.slots.empty()) {
    std::optional<DeviceArenaMapper::Mapping> m =
        MapSlotsArena(ic, s, *unmappable_);
    if (!m.has_value()) return std::nullopt;
    const uint64_t pb = ic.lc->geometry.PageBytes();
    absl::StatusOr<std::vector<const uint8_t*>> slots = SlotPointers(s, *m, pb);
    if (!slots.ok()) return slots.status();
    auto& sum = checksummers_[ic.dev->device()];
    if (sum == nullptr) {
      absl::StatusOr<std::unique_ptr<gpu::Xxh3Checksummer>> made =
          gpu::Xxh3Checksummer::Create(ic.dev->device());
      if (!made.ok()) return made.status();
      sum = *std::move(made);
    }
    absl::Status gathered = GatherIntoSlots(ic, first, *slots);
    // The checksums are enqueued after the gather and waited for.
    absl::StatusOr<std::vector<uint64_t>> h64 =
        gathered.ok() ? sum->Checksum(*slots, pb, ic.dev->compute_stream())
                      : absl::StatusOr<std::vector<uint64_t>>(gathered);
    // Nothing may still write the slots once the upload can be aborted.
    const absl::Status synced = ic.dev->Synchronize();
    if (!h64.ok()) return h64.status();
    if (!synced.ok()) return synced;
    ic.clock->Lap("wait");
    sums = *std::move(h64);
    ic.result->bytes_moved += uint64_t{s.slots.size()} * pb;
  }
  absl::StatusOr<InsertResult> committed = (*up)->Commit(sums);
  ic.clock->Lap("commit");
  if (!committed.ok()) return committed.status();
  return std::optional<InsertResult>(*std::move(committed));
}

}  // namespace client
}  // namespace kvharbor
