#include "client/cuda/layout_transfer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/cuda/bulk_stream_path.h"
#include "client/cuda/compressed_stream_path.h"
#include "client/cuda/device_ipc_path.h"
#include "client/cuda/host_registry.h"
#include "client/cuda/host_shm_path.h"
#include "client/cuda/raw_stream_path.h"
#include "client/cuda/transfer_device.h"
#include "client/cuda/transfer_insert.h"
#include "client/cuda/transfer_path.h"
#include "client/cuda/transfer_plan.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/paged_kv_gather.h"
#include "cuda/kernels/paged_kv_scatter.h"
#include "cuda/kernels/xxh3_checksum.h"

namespace kvharbor {
namespace client {

namespace {

// `address` (the first or last byte `field` addresses) must be device memory
// of GPU `device` this process can use.
absl::Status CheckDevicePointer(uint64_t address, int device,
                                const std::string& field) {
  cudaPointerAttributes a{};
  const cudaError_t e =
      cudaPointerGetAttributes(&a, reinterpret_cast<const void*>(address));
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: 0x%x is not memory this process can use (%s)",
                        field, address, cudaGetErrorString(e)));
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: 0x%x is host memory, not device memory of GPU %d (layout.device)",
        field, address, device));
  }
  if (a.device != device) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: 0x%x is memory of GPU %d, but layout.device is %d",
                        field, address, a.device, device));
  }
  return absl::OkStatus();
}

// Every base, and the last byte it addresses.
absl::Status CheckDeviceLayout(const PagedKvLayout& l) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  if (l.device >= count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layout.device: %d, but this process sees %d GPU(s)", l.device, count));
  }
  const uint64_t last = l.ExtentBytes() - 1;
  for (int kv = 0; kv < 2; ++kv) {
    const std::vector<uint64_t>& bases = kv == 0 ? l.k : l.v;
    for (size_t i = 0; i < bases.size(); ++i) {
      const std::string field =
          absl::StrFormat("layout.%s[%u]", kv == 0 ? "k" : "v", i);
      for (uint64_t at : {bases[i], bases[i] + last}) {
        absl::Status s = CheckDevicePointer(at, l.device, field);
        if (!s.ok()) return s;
      }
    }
  }
  return absl::OkStatus();
}

uint32_t LayoutAlignment(const PagedKvLayout& l) {
  uint64_t any = 0;
  for (uint64_t b : l.k) any |= b;
  for (uint64_t b : l.v) any |= b;
  return gpu::AlignmentOf(any);
}

// Puts the caller's current GPU back when the call ends.
class DeviceScope {
 public:
  DeviceScope() {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

// The first call page not in the raw tier (`n` when all are): the lease's
// raw pages come first (tiers only get colder along it).
uint32_t FirstColdPage(const LayoutFetchOptions& opts, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    const size_t at = size_t{opts.start_page} + i;
    if (at < opts.page_tiers.size() && opts.page_tiers[at] != Tier::kRaw) {
      return i;
    }
  }
  return n;
}

// The shape of scattering layer pages into lc.layout: pages of a geometry
// of the layout's layers, which the layout holds from its first.
gpu::PagedKvShape LayerPageShape(const LayoutCall& lc) {
  Geometry sub = lc.geometry;
  sub.num_layers = lc.layout.num_layers();
  PagedKvLayout from_first = lc.layout;
  from_first.layer_begin = 0;
  return gpu::MakePagedKvShape(sub, from_first);
}

// Where a fetch's pages go: blocks `block_ids` of the resolved layout on
// `dev`.
LayoutTarget MakeLayoutTarget(const LayoutCall& lc,
                              absl::Span<const int64_t> block_ids,
                              TransferDevice* dev) {
  LayoutTarget where;
  where.lc = &lc;
  where.block_ids = block_ids;
  where.dev = dev;
  where.shape = gpu::MakePagedKvShape(lc.geometry, lc.layout);
  where.layers = LayerRange{lc.layout.layer_begin,
                            lc.layout.layer_begin + lc.layout.num_layers()};
  where.layer_shape = LayerPageShape(lc);
  where.layout_align = LayoutAlignment(lc.layout);
  return where;
}

// Enqueues the insert's gather of `n` pages, a staging slot at a time, and
// each slot's D2H into `pinned` (page pitch a.page_pitch), the copy of one
// chunk overlapped with the gather of the next.
// Events recorded after each chunk's D2H of a gather (EnqueueGatherToPinned),
// destroyed with the object.
struct GatherEvents {
  GatherEvents() = default;
  GatherEvents(const GatherEvents&) = delete;
  GatherEvents& operator=(const GatherEvents&) = delete;
  ~GatherEvents() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
  std::vector<cudaEvent_t> events;
};

// Gathers pages [0, n) into `pinned`, a slot's worth at a time; with
// `chunk_done`, an event per chunk is recorded once its bytes are there.
absl::Status EnqueueGatherToPinned(TransferDevice& dev,
                                   gpu::PagedKvGatherArgs a,
                                   const TransferDevice::Tables& t, uint32_t n,
                                   uint8_t* pinned,
                                   GatherEvents* chunk_done = nullptr) {
  const uint64_t pb = a.page_pitch;
  const uint32_t slot_pages = dev.slot_pages();
  for (uint64_t chunk = 0; chunk * slot_pages < n; ++chunk) {
    const uint32_t at = static_cast<uint32_t>(chunk * slot_pages);
    const uint32_t m = std::min(slot_pages, n - at);
    TransferDevice::Slot& slot = dev.slot(chunk);
    const cudaStream_t compute = dev.compute_stream();
    const cudaStream_t copy = dev.copy_stream();
    KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, slot.consumed, 0));
    a.num_pages = m;
    a.page_base = slot.device;
    a.block_ids = t.blocks + at;
    absl::StatusOr<size_t> b = dev.Begin(compute);
    if (!b.ok()) return b.status();
    if (absl::Status s = gpu::LaunchPagedKvGather(a, compute); !s.ok()) {
      return s;
    }
    if (absl::Status s = dev.End("gather", *b, compute); !s.ok()) return s;
    KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.copied, compute));
    KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy, slot.copied, 0));
    b = dev.Begin(copy);
    if (!b.ok()) return b.status();
    KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned + uint64_t{at} * pb,
                                             slot.device, uint64_t{m} * pb,
                                             cudaMemcpyDeviceToHost, copy));
    if (absl::Status s = dev.End("d2h", *b, copy); !s.ok()) return s;
    KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.consumed, copy));
    if (chunk_done != nullptr) {
      cudaEvent_t e;
      KVH_CUDA_RETURN_IF_ERROR(
          cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      chunk_done->events.push_back(e);
      KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, copy));
    }
  }
  return absl::OkStatus();
}

// The "host_shm" insert: the pages gathered into `region`, and the daemon
// told to copy each staged chunk as soon as its bytes are there.
absl::StatusOr<InsertResult> InsertStagedOverlapped(
    Client& client, absl::string_view ns, absl::Span<const Token> tokens,
    const gpu::PagedKvGatherArgs& a, const TransferDevice::Tables& t,
    uint32_t n, const CallOptions& call, TransferDevice& dev,
    TransferClock& clock, StagingRegion& region) {
  // The whole gather is enqueued at once; each staged chunk the daemon is
  // told to copy waits only for the gather chunks it covers, so the D2H of
  // later pages overlaps the daemon's copy of earlier ones.
  const uint64_t pb = a.page_pitch;
  GatherEvents done;
  absl::Status s = EnqueueGatherToPinned(dev, a, t, n, region.data(), &done);
  const uint64_t chunk_bytes = uint64_t{dev.slot_pages()} * pb;
  const auto filled = [&](uint64_t end) -> absl::Status {
    const size_t chunk = static_cast<size_t>((end - 1) / chunk_bytes);
    if (chunk >= done.events.size()) {
      return absl::InternalError("host_shm: a staged chunk past the gather");
    }
    KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done.events[chunk]));
    return absl::OkStatus();
  };
  absl::StatusOr<InsertResult> ins =
      s.ok() ? client.InsertStaged(ns, Sequence::OfTokens(tokens), region, 0,
                                   uint64_t{n} * pb, {}, InsertOptions(), call,
                                   filled)
             : absl::StatusOr<InsertResult>(s);
  // The region is reused by the next call: no copy into it may be left.
  const absl::Status synced = dev.Synchronize();
  if (!ins.ok() || !synced.ok()) {
    dev.ResetTiming();
    return ins.ok() ? synced : ins.status();
  }
  clock.Lap("insert");
  if (absl::Status st = dev.Collect(&clock); !st.ok()) return st;
  return ins;
}

}  // namespace

LayoutTransfer::LayoutTransfer(Client* client,
                               const LayoutTransferOptions& options)
    : client_(client),
      options_(options),
      registry_(
          std::make_unique<HostArenaRegistry>(options.register_chunk_bytes)),
      unmappable_(std::make_unique<UnmappableArenas>()) {
  MakeFetchPaths();
}

void LayoutTransfer::MakeFetchPaths() {
  // The fallback order (layout_transfer.h): each range goes to the first
  // path that accepts it and serves it. A new path: one line here.
  paths_.push_back(std::make_unique<DeviceIpcPath>(unmappable_.get()));
  paths_.push_back(std::make_unique<HostShmPath>(registry_.get()));
  auto compressed = std::make_unique<CompressedStreamPath>();
  compressed_ = compressed.get();
  paths_.push_back(std::move(compressed));
  auto bulk = std::make_unique<BulkStreamPath>();
  bulk_ = bulk.get();
  paths_.push_back(std::move(bulk));
  auto raw = std::make_unique<RawStreamPath>();
  raw_ = raw.get();
  paths_.push_back(std::move(raw));
}

LayoutTransfer::~LayoutTransfer() = default;

absl::StatusOr<std::unique_ptr<LayoutTransfer>> LayoutTransfer::Create(
    Client* client, const LayoutTransferOptions& options) {
  if (client == nullptr) {
    return absl::InvalidArgumentError("client: must not be null");
  }
  if (options.staging_slots < 2 || options.staging_slot_bytes == 0) {
    return absl::InvalidArgumentError(
        "options.staging_slots: at least 2 slots of at least one byte");
  }
  if (options.compressed_streams < 1 ||
      options.compressed_streams > kMaxCompressedStreams) {
    return absl::InvalidArgumentError(
        absl::StrFormat("options.compressed_streams: %d; from 1 to %d streams",
                        options.compressed_streams, kMaxCompressedStreams));
  }
  if (options.h2d_batch_bytes > kMaxH2dBatchBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "options.h2d_batch_bytes: %u; at most %u (0: no gathering)",
        options.h2d_batch_bytes, kMaxH2dBatchBytes));
  }
  return std::unique_ptr<LayoutTransfer>(new LayoutTransfer(client, options));
}

uint64_t LayoutTransfer::host_registered_bytes() const {
  return registry_->registered_bytes();
}

absl::StatusOr<TransferDevice*> LayoutTransfer::DeviceFor(int device) {
  auto it = devices_.find(device);
  if (it != devices_.end()) return it->second.get();
  absl::StatusOr<std::unique_ptr<TransferDevice>> d =
      TransferDevice::Create(device);
  if (!d.ok()) return d.status();
  TransferDevice* out = d->get();
  devices_[device] = *std::move(d);
  return out;
}

absl::StatusOr<TransferDevice*> LayoutTransfer::OpenDevice(
    const PagedKvLayout& layout, const LayoutFetchOptions& opts) {
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(layout.device));
  absl::StatusOr<TransferDevice*> dev = DeviceFor(layout.device);
  if (!dev.ok()) return dev.status();
  (*dev)->ResetTiming();
  if (opts.stream != 0) {
    absl::Status s =
        (*dev)->WaitFor(reinterpret_cast<cudaStream_t>(opts.stream));
    if (!s.ok()) return s;
  }
  return *dev;
}

absl::Status LayoutTransfer::FetchRange(TransferPlan& plan,
                                        const PageRange& range) {
  for (const std::unique_ptr<TransferPath>& path : paths_) {
    if (!path->Accepts(plan, range)) continue;
    absl::StatusOr<bool> served = path->Fetch(plan, range);
    if (!served.ok() || *served) return served.status();
  }
  // RawStreamPath, the last, accepts every range and serves or fails.
  return absl::InternalError(
      absl::StrFormat("no transfer path served call pages [%u, %u)",
                      range.first, range.first + range.n));
}

absl::Status LayoutTransfer::FetchPages(TransferPlan& plan,
                                        const LayoutFetchOptions& opts) {
  const uint32_t n = plan.where.num_pages();
  if (opts.format == FetchFormat::kRaw) {
    // RAW asked for: the RAW bytes on the bulk plane when it serves them,
    // else the RAW stream (the daemon decodes cold pages either way).
    const PageRange all{0, n, false};
    if (bulk_->Accepts(plan, all)) {
      absl::StatusOr<bool> served = bulk_->Fetch(plan, all);
      if (!served.ok() || *served) return served.status();
    }
    return raw_->Fetch(plan, all).status();
  }
  if (opts.format == FetchFormat::kCompressed) {
    return compressed_->Stream(plan, 0, n, client_->options().gpu_decode);
  }
  const uint32_t split = FirstColdPage(opts, n);
  absl::Status s;
  if (split > 0) s = FetchRange(plan, PageRange{0, split, /*cold=*/false});
  if (s.ok() && split < n) {
    s = FetchRange(plan, PageRange{split, n - split, /*cold=*/true});
  }
  return s;
}

absl::StatusOr<TransferResult> LayoutTransfer::Fetch(
    absl::string_view ns, uint64_t lease_id, const PagedKvLayout& layout,
    absl::Span<const int64_t> block_ids, const LayoutFetchOptions& opts,
    const CallOptions& given_call) {
  if (!layout.on_device()) {
    return FetchToHostLayout(*client_, ns, lease_id, layout, block_ids, opts,
                             given_call);
  }
  if (lease_id == 0) {
    return absl::InvalidArgumentError(
        "lease_id: 0 is not a lease (Match with lock=true)");
  }
  if (block_ids.empty()) {
    return absl::InvalidArgumentError("block_ids: no page asked for");
  }
  absl::MutexLock l(&mu_);
  TransferClock clock;
  const CallOptions call = WithDeadline(*client_, given_call);
  const uint32_t n = static_cast<uint32_t>(block_ids.size());
  absl::StatusOr<LayoutCall> lc =
      PrepareLayoutCall(*client_, ns, layout, block_ids, n, false, call);
  if (!lc.ok()) return lc.status();
  if (absl::Status s = CheckDeviceLayout(lc->layout); !s.ok()) return s;
  clock.Lap("describe");
  DeviceScope scope;
  absl::StatusOr<TransferDevice*> dev = OpenDevice(lc->layout, opts);
  if (!dev.ok()) return dev.status();
  TransferResult result;
  TransferPlan plan;
  plan.what =
      LeasePages{client_, std::string(ns), lease_id, opts.start_page, call};
  plan.where = MakeLayoutTarget(*lc, block_ids, *dev);
  plan.options = &options_;
  plan.clock = &clock;
  plan.result = &result;

  const absl::Status s = FetchPages(plan, opts);
  // Nothing may still run on the caller's memory or the tables when the
  // call returns, whatever happened.
  const absl::Status synced = plan.where.dev->Synchronize();
  if (!s.ok()) {
    plan.where.dev->ResetTiming();
    return s;
  }
  if (!synced.ok()) return synced;
  if (absl::Status t = plan.where.dev->Collect(&clock); !t.ok()) return t;
  result.pages = n;
  clock.Finish(&result);
  return result;
}

absl::StatusOr<std::pair<InsertResult, TransferResult>> LayoutTransfer::Insert(
    absl::string_view ns, absl::Span<const Token> tokens,
    const PagedKvLayout& layout, absl::Span<const int64_t> block_ids,
    const LayoutFetchOptions& opts, const CallOptions& call) {
  LayoutInsertOptions o;
  o.stream = opts.stream;
  return Insert(ns, tokens, layout, block_ids, o, call);
}

absl::StatusOr<std::pair<InsertResult, TransferResult>> LayoutTransfer::Insert(
    absl::string_view ns, absl::Span<const Token> tokens,
    const PagedKvLayout& layout, absl::Span<const int64_t> block_ids,
    const LayoutInsertOptions& opts, const CallOptions& given_call) {
  if (!layout.on_device()) {
    if (opts.device_ipc.value_or(false)) {
      return absl::InvalidArgumentError(
          "device_ipc: the layout is host memory (layout.device -1); "
          "DeviceInsert by CUDA IPC gathers from a GPU layout");
    }
    return InsertFromHostLayout(*client_, ns, tokens, layout, block_ids,
                                given_call);
  }
  absl::MutexLock l(&mu_);
  TransferClock clock;
  const CallOptions call = WithDeadline(*client_, given_call);
  absl::StatusOr<uint32_t> pages = PagesOfTokens(*client_, ns, tokens, call);
  if (!pages.ok()) return pages.status();
  const uint32_t n = *pages;
  absl::StatusOr<LayoutCall> lc =
      PrepareLayoutCall(*client_, ns, layout, block_ids, n, true, call);
  if (!lc.ok()) return lc.status();
  if (absl::Status s = CheckDeviceLayout(lc->layout); !s.ok()) return s;
  clock.Lap("describe");
  DeviceScope scope;
  LayoutFetchOptions on_stream;
  on_stream.stream = opts.stream;
  absl::StatusOr<TransferDevice*> dev_or = OpenDevice(lc->layout, on_stream);
  if (!dev_or.ok()) return dev_or.status();
  TransferDevice& dev = **dev_or;
  TransferResult r;
  r.pages = n;
  const bool forced = opts.device_ipc.has_value();
  if (forced ? *opts.device_ipc : client_->device_ipc_allowed()) {
    InsertCall ic;
    ic.ns = std::string(ns);
    ic.tokens = tokens;
    ic.lc = &*lc;
    ic.block_ids = block_ids;
    ic.num_pages = n;
    ic.opts = &opts;
    ic.call = call;
    ic.dev = &dev;
    ic.layout_align = LayoutAlignment(lc->layout);
    ic.clock = &clock;
    ic.result = &r;
    absl::StatusOr<std::optional<InsertResult>> served = TryInsertDeviceIpc(ic);
    if (!served.ok()) {
      dev.ResetTiming();
      return served.status();
    }
    if (served->has_value()) {
      r.path = "device_ipc";
      if (absl::Status st = dev.Collect(&clock); !st.ok()) return st;
      clock.Finish(&r);
      return std::make_pair(**served, r);
    }
    if (forced) return absl::FailedPreconditionError(r.fallbacks.back());
  }
  // "host_shm" (same host, host pools), then "pinned".
  StagingRegion* region = nullptr;
  if (client_->host_fetch_allowed()) {
    absl::StatusOr<StagingRegion*> got =
        InsertRegion(ns, uint64_t{n} * lc->geometry.PageBytes(), call, &r);
    if (!got.ok()) return got.status();
    region = *got;
  }
  absl::StatusOr<InsertResult> ins = InsertThroughHost(
      ns, tokens, *lc, block_ids, n, call, dev, clock, region);
  if (!ins.ok()) return ins.status();
  r.path = region != nullptr ? "host_shm"
           : ins->data_plane ? "remote_bulk"
                             : "pinned";
  r.bytes_moved = uint64_t{n} * lc->geometry.PageBytes();
  clock.Finish(&r);
  return std::make_pair(*ins, r);
}

absl::StatusOr<StagingRegion*> LayoutTransfer::InsertRegion(
    absl::string_view ns, uint64_t bytes, const CallOptions& call,
    TransferResult* result) {
  absl::StatusOr<NamespaceInfo> info = client_->DescribeNamespace(ns, call);
  if (!info.ok()) return info.status();
  // Not offered (a device tier, or no store.host_ipc_socket): "pinned" is
  // this daemon's path, not a fallback.
  if (info->staging_socket.empty()) return nullptr;
  if (insert_staging_ == nullptr) {
    insert_staging_ = std::make_unique<InsertStaging>();
  }
  absl::StatusOr<StagingRegion*> region = insert_staging_->Region(*info, bytes);
  if (region.ok()) return region;
  if (!absl::IsFailedPrecondition(region.status())) return region.status();
  result->fallbacks.push_back(
      absl::StrCat("host_shm: ", region.status().message()));
  return nullptr;
}

absl::StatusOr<InsertResult> LayoutTransfer::InsertThroughHost(
    absl::string_view ns, absl::Span<const Token> tokens, const LayoutCall& lc,
    absl::Span<const int64_t> block_ids, uint32_t n, const CallOptions& call,
    TransferDevice& dev, TransferClock& clock, StagingRegion* region) {
  const uint64_t pb = lc.geometry.PageBytes();
  absl::StatusOr<uint8_t*> pinned =
      region != nullptr ? region->data() : dev.PinnedBuffer(uint64_t{n} * pb);
  if (!pinned.ok()) return pinned.status();
  const uint32_t sp = static_cast<uint32_t>(
      std::max<uint64_t>(1, options_.staging_slot_bytes / pb));
  if (absl::Status s = dev.EnsureRing(pb, sp, options_.staging_slots, false);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<TransferDevice::Tables> t =
      dev.UploadTables(block_ids, lc.layout.k, lc.layout.v, {});
  if (!t.ok()) return t.status();
  clock.Lap("prepare");
  gpu::PagedKvGatherArgs a;
  a.shape = gpu::MakePagedKvShape(lc.geometry, lc.layout);
  a.k_bases = t->k;
  a.v_bases = t->v;
  a.page_pitch = pb;
  a.layout_align = LayoutAlignment(lc.layout);
  if (region != nullptr) {
    return InsertStagedOverlapped(*client_, ns, tokens, a, *t, n, call, dev,
                                  clock, *region);
  }
  absl::Status s = EnqueueGatherToPinned(dev, a, *t, n, *pinned);
  const absl::Status synced = dev.Synchronize();
  if (!s.ok() || !synced.ok()) {
    dev.ResetTiming();
    return s.ok() ? synced : s;
  }
  clock.Lap("wait");
  absl::StatusOr<InsertResult> ins = client_->Insert(
      ns, tokens, absl::MakeConstSpan(*pinned, uint64_t{n} * pb), pb, call);
  if (!ins.ok()) return ins.status();
  clock.Lap("insert");
  if (absl::Status st = dev.Collect(&clock); !st.ok()) return st;
  return ins;
}

}  // namespace client
}  // namespace kvharbor
