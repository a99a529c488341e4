// LayoutTransfer: fetching a lease's pages straight into an engine's paged
// KV cache in GPU memory (types/kv_layout.h), by the fastest path there is,
// and storing pages gathered out of it (library kvharbor_client_cuda).
//
// Paths of a fetch, tried in this order; each falls back to the next and
// the result says which served (TransferResult::path) and why the faster
// ones did not (TransferResult::fallbacks):
//  * raw pages (the lease's hot prefix):
//    - "device_ipc": the daemon's device tier on this host. GetDeviceHandles
//      + the arena mapped once with CUDA IPC (client/cuda/device_ipc.h) +
//      ONE scatter launch reading the pages where they lie; no staging copy.
//    - "host_shm": the daemon's shared host arena (GetHostHandles,
//      include/kvharbor/host_ipc.h). The chunks of the read-only mapping that
//      hold the pages are registered with cudaHostRegister once
//      (client/cuda/host_registry.h; the "register" stage) and the pages'
//      contiguous runs copied H2D from there into a device staging ring,
//      each chunk's copy overlapped with the scatter of the one before (two
//      streams); when registration fails, through a pinned staging ring.
//    - "remote_bulk": the RAW pages on the daemon's bulk data plane
//      (docs/data_plane.md): ClientOptions::data_plane_connections TCP
//      connections at once, each receiving whole chunks straight into a
//      slot of the pinned ring, each chunk H2D'd and scattered as soon as
//      it is whole (client/cuda/bulk_stream_path.h). Skipped with
//      DataPlaneMode::kOff; a daemon without the plane is noted and the
//      next path serves.
//    - "raw_remote": the RAW gRPC stream into a pinned ring, each chunk
//      H2D'd and scattered while later pages arrive.
//  * cold pages (the rest; Lease::page_tiers says where they are):
//    - with ClientOptions::stage_cold, "device_ipc" as above after the
//      daemon decoded them on its GPU straight into its device tier
//      (GetDeviceHandles stage_cold, the "stage" stage); the daemon then
//      stages the cold pages for the raw range's call already, so a partly
//      cold lease takes device_ipc for all of it; without room on the
//      daemon's GPU ("stage_cold: ..."), the next candidate;
//    - with ClientOptions::gpu_decode the COMPRESSED gRPC stream, consumed
//      page by page; each group of pages is decoded on this GPU (KVTC, by
//      cuda/'s KvtcBatchDecoder, the reconstruction GEMM in
//      ClientOptions::gpu_decode_gemm's arithmetic, two groups in flight)
//      while later pages arrive: a group of KVTC pages only straight into
//      the layout (GpuPageDecoder::EnqueueToLayout, no scatter; see
//      LayoutTransferOptions::decode_into_layout), any other group into a
//      staging slot (EnqueueToDevice; other codecs on the CPU, then H2D),
//      then scattered (the pages come over up to
//      LayoutTransferOptions::compressed_streams streams at once):
//      "compressed_local" when
//      the same-host paths are enabled for this daemon, "compressed_remote"
//      otherwise. Without gpu_decode: remote_bulk, else the RAW stream (the
//      daemon decodes).
// A forced format (LayoutFetchOptions::format) takes the gRPC stream in
// that format for every page. Same-host paths are tried only when
// Client::device_ipc_allowed() / host_fetch_allowed(); one the daemon does
// not offer is not asked again for kHostFetchRetry. A daemon on another
// host cannot be mapped (its GPU is not visible here): the fetch falls back
// and says "device_ipc: FAILED_PRECONDITION: ...". The copies of the
// same-host paths are not checksummed (that would read every byte on the
// CPU); the lease keeps the pages in place, and a copy that finishes after
// the lease's expiry is discarded and fetched again over gRPC. Each fetch
// path is a TransferPath (client/cuda/transfer_path.h) in its own file:
// device_ipc_path.h, host_shm_path.h, raw_stream_path.h,
// compressed_stream_path.h; a range goes to the first that accepts it, in
// the order above (LayoutTransfer::MakeFetchPaths), so a new path is a new
// file and one line there.
//
// A layout of some of the namespace's layers [b, e) (PagedKvLayout::
// layer_begin, a layer-wise load) moves only those layers where the path
// can: device_ipc reads only them out of each page in the arena; host_shm
// copies only their bytes H2D (2-D copies out of the arena's pages,
// client/layer_copies.h) and raw_remote asks for a layer-range RAW stream
// (FetchRequest.layer_begin/layer_end), both staging "layer pages" (pages
// restricted to the range, types/layer_range.h); TransferResult::
// bytes_moved counts the range's bytes (for device_ipc, the bytes the
// scatter read). A compressed page cannot be split by layer (KVTC's
// per-token rows span every layer): the compressed paths fetch and decode
// whole pages and scatter the range, bytes_moved being the whole pages'
// compressed bytes, so a layer-wise load of cold pages moves them once per
// call (the CPU decode copies only the range H2D).
//
// Paths of an insert from a GPU layout (client/cuda/transfer_insert.cc),
// tried in this order:
//  - "device_ipc": the daemon's device tier on this host. DeviceInsert
//    (Client::BeginDeviceInsert: the daemon reserves a device slot per new
//    page), the arena mapped with CUDA IPC, ONE gather launch from the
//    layout straight into the slots, the slots' XXH3-64 computed on this
//    GPU (cuda/kernels/xxh3_checksum.h), Commit (the daemon hashes the slots on
//    its GPU): one device-to-device copy of the bytes. Tried when
//    LayoutInsertOptions::device_ipc says so (by default when
//    Client::device_ipc_allowed()); when the daemon has no device tier,
//    does not allow IPC, keeps the namespace outside its arena, or its
//    arena cannot be mapped here (another host), the insert falls back to
//    "host_shm" or "pinned" and says why in TransferResult::fallbacks,
//    unless device_ipc was forced (then FAILED_PRECONDITION naming
//    "device_ipc").
//  - "host_shm": the daemon on this host (Client::host_fetch_allowed())
//    with a staging socket (NamespaceInfo::staging_socket: host pools and
//    store.host_ipc_socket): the gather kernel into device staging, D2H into
//    this process's staging region (client/cuda/insert_staging.h, pinned
//    for CUDA), then Client::InsertStaged: the daemon copies the pages out
//    of the region into its pool; no bytes on the gRPC stream. When the
//    region cannot be registered (another host, no socket, a refusal) the
//    insert falls back to "pinned" and says why.
//  - "pinned": the gather kernel into device staging, D2H into a pinned
//    buffer (chunks overlapped), then Client::Insert: one PCIe copy plus
//    the wire. "remote_bulk" when that Insert's bytes went on the daemon's
//    bulk data plane (docs/data_plane.md "Insert": host-pool daemons that
//    serve it, ClientOptions::data_plane allowing).
//
// Bad input never writes: the layout is resolved against the namespace
// (ResolveLayout: dtype, heads, head_dim, block size, layer range, strides,
// buffer sizes), the block ids checked (range, duplicates), and every base
// address and the last byte each addresses checked with
// cudaPointerGetAttributes to be device memory of layout.device; errors are
// INVALID_ARGUMENT naming the field ("layout.k[3]", "block_ids[2]"). A
// host-memory layout (device -1) takes the CPU path of
// include/kvharbor/layout_fetch.h
// ("cpu").
//
// Memory: the layout's buffers and the Client belong to the caller (the
// Client must outlive this object). The transfer owns, per GPU, its
// streams, staging ring (LayoutTransferOptions), kernel tables, a pinned
// insert buffer as large as the largest insert, GPU decoders per
// calibration, and the shared arena's registrations. Every call returns
// only once its copies are done, so the lease may be released right after.
//
// Thread-safe: calls take turns (one mutex); run one LayoutTransfer per
// thread for parallel transfers.
#ifndef KVHARBOR_CLIENT_CUDA_LAYOUT_TRANSFER_H_
#define KVHARBOR_CLIENT_CUDA_LAYOUT_TRANSFER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/cuda/insert_staging.h"
#include "kvharbor/client.h"
#include "kvharbor/layout_fetch.h"
#include "kvharbor/types.h"
#include "types/kv_layout.h"

namespace kvharbor {
namespace gpu {
class Xxh3Checksummer;
}  // namespace gpu
namespace client {

class BulkStreamPath;
class CompressedStreamPath;
class HostArenaRegistry;
class RawStreamPath;
class TransferDevice;
class TransferPath;
class UnmappableArenas;
struct InsertCall;
struct PageRange;
struct TransferPlan;

// The most gRPC streams one compressed fetch opens at once
// (LayoutTransferOptions::compressed_streams).
inline constexpr int kMaxCompressedStreams = 16;
// The most LayoutTransferOptions::h2d_batch_bytes.
inline constexpr uint64_t kMaxH2dBatchBytes = uint64_t{1} << 30;

struct LayoutTransferOptions {
  // Device staging ring of the H2D and decode paths (and the insert's
  // gather): `staging_slots` slots of about `staging_slot_bytes` (whole
  // pages, at least one) on each GPU used.
  uint64_t staging_slot_bytes = uint64_t{64} << 20;
  int staging_slots = 3;
  // The shared host arena is registered in chunks of this size.
  uint64_t register_chunk_bytes = uint64_t{256} << 20;
  // COMPRESSED pages decoded on the GPU: a group of KVTC pages of the
  // decoder's calibration is decoded straight into the layout (the decode's
  // last kernels write the engine's blocks: no staging slot, no separate
  // scatter; GpuPageDecoder::EnqueueToLayout). false: decoded into a device
  // staging slot, then scattered (the path before; a group holding any page
  // decoded on the CPU takes it either way).
  bool decode_into_layout = true;
  // COMPRESSED pages (the compressed_local / compressed_remote paths) come
  // over up to this many gRPC Fetch streams at once, each a contiguous run
  // of at least 8 staging slots' pages, all feeding the one decoding
  // worker. One stream is bound by gRPC's copies of each message (about
  // 1.1 GB/s on loopback on the H200 machine, docs/ttft.md), well below
  // what the GPU decodes. 1: one stream. From 1 to kMaxCompressedStreams.
  int compressed_streams = 4;
  // Groups of KVTC pages decoded straight into the layout are gathered
  // until their compressed bytes reach this many: a merger thread merges
  // each group's batches into a pinned copy region as it arrives
  // (GpuPageDecoder::MergeForLayout), the region goes to the GPU in one H2D
  // copy, timed (the path's "h2d" stage and TransferResult::h2d_bytes), and
  // its batches are decoded from there (client/cuda/group_decode.h). A
  // group's own copy (about 1 MB for 32 pages of a Llama-3.1-8B-shaped KVTC
  // namespace) ran at a third of pinned H2D on the H200, copies of several
  // MB near it. The first copies of a call take one group, then two, four,
  // ... (the decode starts with the first group), and the last ones half of
  // what is left (the decode left after the last page is a group or two).
  // Three regions of this size plus one group are kept per GPU. 0: each
  // group's payload is copied range by range, overlapped with its decode
  // (not timed). At most kMaxH2dBatchBytes.
  uint64_t h2d_batch_bytes = uint64_t{16} << 20;
};

// An insert from a GPU layout.
struct LayoutInsertOptions {
  // A cudaStream_t whose earlier work the gather waits for (0: none).
  uint64_t stream = 0;
  // The "device_ipc" path: unset = when Client::device_ipc_allowed()
  // (ClientOptions::device_ipc), falling back to "pinned"; false = never;
  // true = tried whatever the address, and an insert it cannot serve fails
  // with FAILED_PRECONDITION naming "device_ipc" instead of falling back.
  std::optional<bool> device_ipc;
  // How long the daemon holds the reserved device slots before the commit
  // (0: its default lease TTL).
  absl::Duration ttl = absl::ZeroDuration();
};

class LayoutTransfer {
 public:
  static absl::StatusOr<std::unique_ptr<LayoutTransfer>> Create(
      Client* client, const LayoutTransferOptions& options = {});
  ~LayoutTransfer();
  LayoutTransfer(const LayoutTransfer&) = delete;
  LayoutTransfer& operator=(const LayoutTransfer&) = delete;

  // Lease pages [opts.start_page, + block_ids.size()) of `lease_id` into
  // blocks block_ids of `layout`; returns once they are there.
  absl::StatusOr<TransferResult> Fetch(absl::string_view ns, uint64_t lease_id,
                                       const PagedKvLayout& layout,
                                       absl::Span<const int64_t> block_ids,
                                       const LayoutFetchOptions& opts = {},
                                       const CallOptions& call = {});

  // Stores the pages of `tokens` (a whole number of pages), page i gathered
  // from blocks block_ids[i] of `layout` (all the namespace's layers), by
  // the paths above (a host layout: the CPU, "cpu"; opts.device_ipc true is
  // then INVALID_ARGUMENT naming "device_ipc").
  absl::StatusOr<std::pair<InsertResult, TransferResult>> Insert(
      absl::string_view ns, absl::Span<const Token> tokens,
      const PagedKvLayout& layout, absl::Span<const int64_t> block_ids,
      const LayoutInsertOptions& opts, const CallOptions& call = {});
  // The same with the default options and opts.stream (the others unused).
  absl::StatusOr<std::pair<InsertResult, TransferResult>> Insert(
      absl::string_view ns, absl::Span<const Token> tokens,
      const PagedKvLayout& layout, absl::Span<const int64_t> block_ids,
      const LayoutFetchOptions& opts = {}, const CallOptions& call = {});

  // Bytes of the shared host arena registered now (tests, benchmarks).
  uint64_t host_registered_bytes() const;

 private:
  LayoutTransfer(Client* client, const LayoutTransferOptions& options);
  absl::StatusOr<TransferDevice*> DeviceFor(int device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes layout.device current (the caller restores the previous one),
  // its transfer state fresh, and its streams wait for opts.stream.
  absl::StatusOr<TransferDevice*> OpenDevice(const PagedKvLayout& layout,
                                             const LayoutFetchOptions& opts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fetch paths in their fallback order (above), each in its own file
  // behind client/cuda/transfer_path.h.
  void MakeFetchPaths();
  // Serves all the call's pages as opts.format asks.
  absl::Status FetchPages(TransferPlan& plan, const LayoutFetchOptions& opts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Serves `range` by the first path that accepts and serves it.
  absl::Status FetchRange(TransferPlan& plan, const PageRange& range)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The insert's "device_ipc" path (client/cuda/transfer_insert.cc): the
  // InsertResult when it served the pages, nullopt (with a note in
  // result->fallbacks) when the caller must fall back to "pinned", an
  // error for what every path would fail on.
  absl::StatusOr<std::optional<InsertResult>> TryInsertDeviceIpc(
      const InsertCall& ic) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The insert's "host_shm" and "pinned" paths: the gather kernel into
  // device staging, D2H into `region` (registered on the daemon's staging
  // socket; then Client::InsertStaged: the daemon copies the pages out of
  // it) or, with `region` null, into the pinned insert buffer (then
  // Client::Insert streams them).
  absl::StatusOr<InsertResult> InsertThroughHost(
      absl::string_view ns, absl::Span<const Token> tokens,
      const LayoutCall& lc, absl::Span<const int64_t> block_ids, uint32_t n,
      const CallOptions& call, TransferDevice& dev, TransferClock& clock,
      StagingRegion* region) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The "host_shm" insert's region for `n` pages of `ns`, or null (with a
  // note in result->fallbacks) when the daemon cannot read this process's
  // memory.
  absl::StatusOr<StagingRegion*> InsertRegion(absl::string_view ns,
                                              uint64_t bytes,
                                              const CallOptions& call,
                                              TransferResult* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Client* const client_;
  const LayoutTransferOptions options_;
  mutable absl::Mutex mu_;
  std::map<int, std::unique_ptr<TransferDevice>> devices_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<HostArenaRegistry> registry_;
  // Arenas that did not map here (the fetch's and the insert's device_ipc).
  std::unique_ptr<UnmappableArenas> unmappable_;
  // The fetch paths, in fallback order (MakeFetchPaths); the stream paths
  // again for a forced format. Each guards its own state.
  std::vector<std::unique_ptr<TransferPath>> paths_;
  RawStreamPath* raw_ = nullptr;
  BulkStreamPath* bulk_ = nullptr;  // a forced RAW format tries it first
  CompressedStreamPath* compressed_ = nullptr;
  // The "host_shm" insert's staging region.
  std::unique_ptr<InsertStaging> insert_staging_ ABSL_GUARDED_BY(mu_);
  // The insert's checksum kernels, per GPU.
  std::map<int, std::unique_ptr<gpu::Xxh3Checksummer>> checksummers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_LAYOUT_TRANSFER_H_
