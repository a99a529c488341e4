// kvharbor::Client: the C++ SDK of the kvharbor KV-cache daemon.
//
// One Client holds one gRPC channel to one daemon and covers the whole
// kvharbor.v1.KvHarbor API with typed results: namespaces, Match (optionally
// leasing the matched pages), Insert (streams pages from caller memory in
// chunks, sending a per-page XXH3-64 checksum), Fetch (streams pages into
// caller memory, verifying every page's checksum; a mismatch is DATA_LOSS),
// leases, eviction, stats and the radix-tree dump, and the page tiers:
// Match reports each page's tier, Fetch can ask for compressed pages (the
// SDK then decodes them with the CPU codecs of core/codec/codec.h after
// fetching the namespace's calibration once), Demote moves pages to colder
// tiers, and FetchTransformed asks the daemon for a lossy, length-changing
// transform of the pages (the KVCM compressor). For engines
// (docs/engines_api.md): page-key namespaces (Sequence::OfKeys), append
// inserts that send only the pages after a cached prefix (InsertOptions),
// layer-range fetches (FetchSource::Layers) and layer-major uploads
// (BeginInsert, include/kvharbor/layer_upload.h). Every
// call takes optional CallOptions for its deadline; errors come back as
// absl::Status with the daemon's gRPC code and message.
//
// Memory: the Client owns its channel; page memory always belongs to the
// caller. Insert only reads the caller's pages during the call; Fetch writes
// only inside the memory it was given and leaves it partly written when it
// fails.
//
// Thread-safe: all methods may be called concurrently from any number of
// threads (gRPC channels and stubs are thread-safe; the only other mutable
// state, the cache of decoding calibrations, has its own lock). This header
// includes no gRPC or protobuf header.
#ifndef KVHARBOR_CLIENT_CLIENT_H_
#define KVHARBOR_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvharbor/checksum.h"
#include "kvharbor/device_upload.h"
#include "kvharbor/layer_upload.h"
#include "kvharbor/staging_region.h"
#include "kvharbor/types.h"

namespace kvharbor {

// Whether a Fetch of a lease copies its pages out of the daemon's shared
// host arena (same-host Fetch, docs/operations.md) instead of streaming them.
// kAuto: when `address` is on this host (localhost, 127.0.0.0/8, [::1] or a
// unix: socket) and the daemon offers it (store.host_ipc_socket). kOn: also
// for another address (a daemon on this host reached by a routable address;
// the daemon id check keeps a remote daemon's arena out). kOff: never. The
// path is tried per Fetch of a lease and falls back to the gRPC stream
// whenever it cannot serve the call; once the daemon said it is off, or its
// socket did not answer, it is not tried again for kHostFetchRetry.
enum class HostFetchMode { kAuto, kOn, kOff };
inline constexpr absl::Duration kHostFetchRetry = absl::Seconds(30);

// Whether a fetch into an engine's GPU cache (client/cuda/layout_transfer.h)
// maps the daemon's device arena with CUDA IPC (GetDeviceHandles) when the
// lease's pages are on its device tier. kAuto: when `address` is on this
// host (as HostFetchMode::kAuto); kOn: for any address (a daemon on another
// host then fails the mapping, and the fetch falls back, saying so); kOff:
// never.
enum class DeviceIpcMode { kAuto, kOn, kOff };

// Whether RAW fetches ask for the daemon's bulk data plane (FetchRequest.
// bulk; docs/data_plane.md): page bytes on several TCP connections beside
// gRPC, at the link's speed instead of the stream's. kAuto: when the
// channel has no TLS (the plane is plain TCP; a daemon with TLS serves it
// only when its operator allowed plaintext); kOn: with TLS too; kOff: never.
// A daemon that does not serve the plane streams as usual, and it is then
// not asked again for kBulkRetry.
enum class DataPlaneMode { kAuto, kOn, kOff };
inline constexpr absl::Duration kBulkRetry = absl::Seconds(30);

struct ClientOptions {
  std::string address = "127.0.0.1:50051";  // HOST:PORT of the daemon
  // Deadline of a call that sets none; InfiniteDuration() = no deadline.
  absl::Duration default_timeout = absl::Seconds(30);
  // Largest gRPC message either way; must exceed the chunk sizes below.
  int max_message_bytes = 16 << 20;
  // Bytes of page data per Insert message.
  uint32_t insert_chunk_bytes = 1 << 20;
  // FetchRequest.max_chunk_bytes; 0 = the daemon's default (1 MiB).
  uint32_t fetch_chunk_bytes = 0;
  // FetchRequest.max_pages_per_message: pages smaller than the chunk size
  // (compressed ones above all) come several whole pages to one message,
  // at most this many; 0 or 1 = one page per message (the stream of older
  // clients). bench/insert_fetch_bench.cc measures both side by side.
  uint32_t fetch_pages_per_message = 256;
  // Check fetched pages against the daemon's checksums (DATA_LOSS if not).
  bool verify_checksums = true;
  // Send per-page checksums with Insert so the daemon checks what arrived.
  bool send_checksums = true;
  // Wait for the daemon to come up instead of failing with UNAVAILABLE.
  bool wait_for_ready = false;

  // ---- Security (docs/operations.md "Security"). TLS is on when `tls` is
  // set or any tls_* file is given; the files are read by Create.
  bool tls = false;
  // PEM CA bundle that verifies the daemon; "" = the system's roots.
  std::string tls_ca_file;
  // PEM client certificate and key, for a daemon that requires them
  // (mutual TLS); both or neither.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Name checked against the daemon's certificate instead of the host part
  // of `address` (e.g. connecting by IP to a certificate for a DNS name).
  std::string tls_server_name;
  // Bearer token sent with every call ("authorization: Bearer <token>");
  // "" = none. Never logged or put into an error message.
  std::string token;
  // gRPC shares connections between channels to the same address; a Client
  // with its own connection does not inherit another one's reconnect
  // backoff (ClusterClient uses it to see a restarted daemon at once).
  bool own_connection = false;
  // Longest pause between reconnect attempts to a daemon that went away;
  // 0 = gRPC's default (up to 120 s).
  absl::Duration max_reconnect_backoff = absl::ZeroDuration();
  // Same-host Fetch through shared memory (see HostFetchMode). Its copies
  // are always checked against the daemon's checksums, whatever
  // verify_checksums says: a mismatch means the lease ran out while
  // copying, and the Fetch then streams the pages over gRPC instead.
  HostFetchMode host_fetch = HostFetchMode::kAuto;
  // Fetches into GPU memory (client/cuda/layout_transfer.h): CUDA IPC of
  // the daemon's device arena (see DeviceIpcMode), and whether cold pages
  // come COMPRESSED and are decoded on this process's GPU (false: they come
  // RAW, decoded by the daemon). The CPU-only SDK does not use them.
  DeviceIpcMode device_ipc = DeviceIpcMode::kAuto;
  bool gpu_decode = true;
  // The reconstruction GEMM of that GPU decode (see GpuDecodeGemm). TF32 by
  // default: bench/hit_path_bench.cc measures the modes side by side, and
  // tests/cuda/gpu_tier_e2e.cc bounds each one's error against the CPU
  // decode.
  client::GpuDecodeGemm gpu_decode_gemm = client::GpuDecodeGemm::kTf32;
  // Fetches into GPU memory through device_ipc, when the lease has pages in
  // a cold tier (host-compressed, disk): ask the daemon to decode them on
  // its GPU straight into its device tier first (GetDeviceHandles
  // stage_cold), so that device_ipc serves the whole lease with one
  // scatter, and the pages stay hot there for the next hit (the daemon may
  // demote least-recently-used raw pages for the room). When it has no room
  // ("stage_cold: ..."), the fetch falls back to the paths above. Off by
  // default: it moves pages between the daemon's tiers.
  bool stage_cold = false;
  // The bulk data plane (see DataPlaneMode) and the TCP connections one
  // fetch opens on it (1 to 16).
  DataPlaneMode data_plane = DataPlaneMode::kAuto;
  uint32_t data_plane_connections = 4;
};

struct CallOptions {
  // Absolute deadline; takes precedence over `timeout`.
  std::optional<absl::Time> deadline;
  // Relative deadline; neither set = ClientOptions::default_timeout.
  std::optional<absl::Duration> timeout;

  static CallOptions Timeout(absl::Duration t) {
    CallOptions o;
    o.timeout = t;
    return o;
  }
  static CallOptions Deadline(absl::Time d) {
    CallOptions o;
    o.deadline = d;
    return o;
  }
};

class Client {
 public:
  // Checks the options (INVALID_ARGUMENT naming the field) and creates the
  // channel. Does not connect: the first call does.
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientOptions& options() const;

  // Waits until the channel is connected; DEADLINE_EXCEEDED otherwise.
  absl::Status WaitForConnected(absl::Time deadline);

  // ---- Namespaces ----
  absl::StatusOr<client::CreateNamespaceResult> CreateNamespace(
      const client::NamespaceSpec& spec, bool if_not_exists = false,
      const CallOptions& call = {});
  absl::StatusOr<client::NamespaceInfo> DescribeNamespace(
      absl::string_view name, const CallOptions& call = {});
  absl::StatusOr<std::vector<client::NamespaceInfo>> ListNamespaces(
      const CallOptions& call = {});
  absl::Status DeleteNamespace(absl::string_view name, bool force = false,
                               const CallOptions& call = {});

  // ---- Match and leases ----
  // Longest cached prefix of `tokens`. With `lock`, the matched pages are
  // leased for `ttl` (0 = the daemon's default; capped by the daemon).
  absl::StatusOr<client::Lease> Match(absl::string_view ns,
                                      absl::Span<const client::Token> tokens,
                                      bool lock = false,
                                      absl::Duration ttl = absl::ZeroDuration(),
                                      const CallOptions& call = {});
  // The same for a sequence of either kind (page keys in a page-key
  // namespace); matched_tokens counts page_size tokens per page.
  absl::StatusOr<client::Lease> Match(absl::string_view ns,
                                      const client::Sequence& sequence,
                                      bool lock = false,
                                      absl::Duration ttl = absl::ZeroDuration(),
                                      const CallOptions& call = {});
  absl::Status Release(uint64_t lease_id, const CallOptions& call = {});
  // New expiry of the lease, `ttl` from now (0 = default).
  absl::StatusOr<absl::Time> ExtendLease(uint64_t lease_id, absl::Duration ttl,
                                         const CallOptions& call = {});

  // ---- Insert ----
  // Stores the pages of `tokens` (a whole number of pages). `pages` holds
  // them back to back; `page_bytes` is the namespace's page size in bytes,
  // or 0 to look it up with DescribeNamespace first.
  absl::StatusOr<client::InsertResult> Insert(
      absl::string_view ns, absl::Span<const client::Token> tokens,
      absl::Span<const uint8_t> pages, uint64_t page_bytes,
      const CallOptions& call = {});
  // Same, one span per page (all the same size) wherever they live.
  absl::StatusOr<client::InsertResult> Insert(
      absl::string_view ns, absl::Span<const client::Token> tokens,
      absl::Span<const absl::Span<const uint8_t>> pages,
      const CallOptions& call = {});
  // A sequence of either kind, one span per page, and the append options
  // (client::InsertOptions: which pages `pages` holds, and the retry).
  // FAILED_PRECONDITION naming "header.skip_pages" (or NOT_FOUND /
  // FAILED_PRECONDITION naming "header.prefix_lease_id") when the skipped
  // prefix is not cached and no retry was possible.
  absl::StatusOr<client::InsertResult> Insert(
      absl::string_view ns, const client::Sequence& sequence,
      absl::Span<const absl::Span<const uint8_t>> pages,
      const client::InsertOptions& options, const CallOptions& call = {});
  // The same with the pages back to back, `page_bytes` each (0 = look the
  // size up with DescribeNamespace first).
  absl::StatusOr<client::InsertResult> Insert(
      absl::string_view ns, const client::Sequence& sequence,
      absl::Span<const uint8_t> pages, uint64_t page_bytes,
      const client::InsertOptions& options, const CallOptions& call = {});
  // Opens a layer-major upload of the pages of `sequence` after
  // options.skip_pages (include/kvharbor/layer_upload.h); retry_full does not
  // apply. Returns once the daemon accepted the header: its errors (the skipped
  // prefix not cached, no room, bad keys) come from here. `call`'s deadline
  // covers the whole upload, up to Commit. Costs one DescribeNamespace call
  // (the geometry sizes the layers).
  absl::StatusOr<std::unique_ptr<client::LayerUpload>> BeginInsert(
      absl::string_view ns, const client::Sequence& sequence,
      const client::InsertOptions& options, const CallOptions& call = {});
  // Same host only: stores the pages of `sequence` (after
  // options.skip_pages / options.prefix_lease_id, as Insert with only the
  // new pages given) whose bytes lie back to back in `region` at [offset,
  // offset + bytes): the daemon copies them out of the region instead of
  // receiving them on the stream (include/kvharbor/staging_region.h,
  // docs/operations.md "Same-host Insert"). `page_checksums`: empty, or the
  // XXH3-64 of each page, which the daemon checks (DATA_LOSS naming
  // page_checksums[i]). retry_full does not apply. INVALID_ARGUMENT naming
  // offset when the bytes do not lie in the region; the daemon's errors of
  // Insert and of header.staging (NOT_FOUND for a region this daemon did not
  // register). `filled` (may be empty) is called before the daemon is told
  // to read the bytes up to `end` (counted from `offset`): it returns once
  // they are in the region, so that a producer still filling it (a GPU
  // gather) overlaps the daemon's copy, or an error that ends the Insert
  // with nothing stored.
  absl::StatusOr<client::InsertResult> InsertStaged(
      absl::string_view ns, const client::Sequence& sequence,
      const client::StagingRegion& region, uint64_t offset, uint64_t bytes,
      absl::Span<const uint64_t> page_checksums,
      const client::InsertOptions& options, const CallOptions& call = {},
      const std::function<absl::Status(uint64_t end)>& filled = nullptr);

  // ---- Fetch ----
  // Writes page i at dst[i * page_bytes]; dst must hold every page
  // (INVALID_ARGUMENT naming "dst" as soon as one does not fit). With a
  // layer range (FetchSource::Layers) page_bytes is that of the layers sent.
  absl::StatusOr<client::FetchResult> FetchInto(
      absl::string_view ns, const client::FetchSource& source,
      absl::Span<uint8_t> dst, const CallOptions& call = {});
  // Writes page i at page_dsts[i], each holding `page_capacity` bytes
  // (INVALID_ARGUMENT naming "page_dsts" for a page that does not fit).
  absl::StatusOr<client::FetchResult> FetchInto(
      absl::string_view ns, const client::FetchSource& source,
      absl::Span<uint8_t* const> page_dsts, uint64_t page_capacity,
      const CallOptions& call = {});
  // Returns the pages in request order.
  absl::StatusOr<std::vector<std::vector<uint8_t>>> Fetch(
      absl::string_view ns, const client::FetchSource& source,
      const CallOptions& call = {});

  // Same as Fetch above for FetchFormat::kRaw. With kCompressed the daemon
  // sends each page's codec buffer as it stores it (less data on the wire for
  // cold pages), and the SDK decodes them on the CPU into raw pages: it gets
  // the namespace's calibration once per (namespace, fingerprint) with
  // GetCalibration and caches it. KVTC pages come back within the codec's
  // error bounds, identity pages byte-exact. To decode on the client's GPU
  // instead: FetchCompressed + client::GpuPageDecoder
  // (client/cuda/gpu_decode.h, library kvharbor_client_cuda).
  absl::StatusOr<std::vector<std::vector<uint8_t>>> Fetch(
      absl::string_view ns, const client::FetchSource& source,
      client::FetchFormat format, const CallOptions& call = {});
  // The compressed buffers as they are, undecoded (e.g. to keep them
  // compressed or decode them elsewhere); checksums verified as configured.
  absl::StatusOr<std::vector<client::CompressedPage>> FetchCompressed(
      absl::string_view ns, const client::FetchSource& source,
      const CallOptions& call = {});
  // Decodes one page from FetchCompressed of namespace `ns` into raw bytes
  // (loading and caching the calibration as Fetch does).
  absl::StatusOr<std::vector<uint8_t>> DecodePage(
      absl::string_view ns, const client::CompressedPage& page,
      const CallOptions& call = {});
  // Calibrations this client loaded for decoding so far.
  uint64_t calibrations_loaded() const;

  // ---- Streaming Fetch (transfers that overlap the stream with copies,
  // client/cuda/layout_transfer.h) ----
  // A RAW Fetch over gRPC only (never shared memory): page i goes where
  // `destination(i, page_bytes)` says; once all its bytes are there and its
  // checksum verified (as configured), `done(i)` is called, while later
  // pages are still arriving. An error from either ends the fetch with it.
  absl::StatusOr<client::FetchResult> FetchStreaming(
      absl::string_view ns, const client::FetchSource& source,
      const client::PageDestination& destination, const client::PageDone& done,
      const CallOptions& call = {});
  // A RAW Fetch on the daemon's bulk data plane (client::BulkSink,
  // docs/data_plane.md): the result (path kBulk), nullopt when the options
  // do not allow the plane or the daemon did not offer it (then nothing was
  // delivered and the caller streams), or the call's error.
  absl::StatusOr<std::optional<client::FetchResult>> FetchBulk(
      absl::string_view ns, const client::FetchSource& source,
      const client::BulkSink& sink, const CallOptions& call = {});
  // A COMPRESSED Fetch whose pages go to `on_page(index, page)` one by one,
  // in order, as each arrives whole (checksum verified as configured);
  // FetchCompressed collects them. An error from `on_page` ends the fetch
  // with it. Returns how many pages arrived.
  absl::StatusOr<uint32_t> FetchCompressedStreaming(
      absl::string_view ns, const client::FetchSource& source,
      const client::CompressedPageSink& on_page, const CallOptions& call = {});
  // Whether the same-host paths may be used for this daemon: the shared
  // host arena (ClientOptions::host_fetch) and the device arena by CUDA IPC
  // (ClientOptions::device_ipc), each by its mode and the address.
  bool host_fetch_allowed() const;
  bool device_ipc_allowed() const;

  // The pages of `source` run through `transform` by the daemon, as one
  // sequence: LOSSY and LENGTH-CHANGING, the result has fewer tokens than
  // the pages and says how many (client::TransformedKv). kKvcm needs a
  // namespace created with kvcm_path (FAILED_PRECONDITION naming
  // "transform" otherwise); kNone is INVALID_ARGUMENT (use Fetch). The
  // result's checksum is verified as configured.
  absl::StatusOr<client::TransformedKv> FetchTransformed(
      absl::string_view ns, const client::FetchSource& source,
      client::FetchTransform transform, const CallOptions& call = {});

  // ---- Tiers ----
  // The codec and calibration of a namespace (what decoding needs).
  absl::StatusOr<client::Calibration> GetCalibration(
      absl::string_view ns, const CallOptions& call = {});
  // A calibration the namespace still has, by fingerprint (0 = active).
  absl::StatusOr<client::Calibration> GetCalibration(
      absl::string_view ns, uint64_t fingerprint, const CallOptions& call = {});
  // Makes `bytes` (canonical calibration bytes of the namespace's codec)
  // the active calibration, pinned if asked; returns its fingerprint.
  // INVALID_ARGUMENT naming "calibration" for bytes that do not parse or fit.
  absl::StatusOr<uint64_t> UploadCalibration(absl::string_view ns,
                                             std::string bytes, bool pin,
                                             const CallOptions& call = {});
  absl::StatusOr<std::vector<client::CalibrationInfo>> ListCalibrations(
      absl::string_view ns, const CallOptions& call = {});
  // Pins (or unpins) the active calibration (fingerprint 0 = whichever is
  // active): online recalibration never replaces a pinned one.
  absl::Status PinCalibration(absl::string_view ns, uint64_t fingerprint,
                              bool pinned, const CallOptions& call = {});
  // Moves every unlocked page down to `tier` (kHostCompressed or kDisk);
  // returns how many pages moved.
  absl::StatusOr<uint64_t> Demote(absl::string_view ns, client::Tier tier,
                                  const CallOptions& call = {});

  // ---- Same-host zero copy (client/client_device.cc) ----
  // The CUDA IPC handle of the daemon's device arena and each page's offset
  // in it, for a lease of `ns` whose pages are all on the device tier. The
  // lease keeps them there until Release or its TTL. FAILED_PRECONDITION
  // when the daemon has no device tier ("store.device_pool_bytes"), does not
  // allow IPC ("store.allow_ipc") or a page is in a colder tier
  // ("pages[i]"); NOT_FOUND naming "lease_id" for an inactive lease. Map
  // and copy with client/cuda/device_ipc.h (CUDA builds).
  absl::StatusOr<client::DeviceHandles> GetDeviceHandles(
      absl::string_view ns, uint64_t lease_id, const CallOptions& call = {});
  // Same, and with options.stage_cold the daemon first decodes the lease's
  // host-compressed and disk pages on its GPU straight into free device
  // slots and makes them raw there (the lease follows their new handles:
  // DeviceHandles::pages[i].handle), so every page is described.
  // FAILED_PRECONDITION naming "stage_cold" when the namespace has too few
  // device slots for them (fall back to FetchCompressed + GPU decode);
  // DATA_LOSS naming a page whose stored bytes are corrupt.
  absl::StatusOr<client::DeviceHandles> GetDeviceHandles(
      absl::string_view ns, uint64_t lease_id,
      const client::DeviceHandlesOptions& options,
      const CallOptions& call = {});
  // Same-host insert into the device tier (include/kvharbor/device_upload.h):
  // opens a DeviceInsert stream for the pages of `tokens` (a whole number of
  // pages) and returns the slots the daemon reserved for them, held for `ttl`
  // (0 = the daemon's default lease TTL). The caller writes the pages there by
  // CUDA IPC and commits with their checksums. FAILED_PRECONDITION naming
  // "store.device_pool_bytes" or "store.allow_ipc" as GetDeviceHandles;
  // errors of the request name "begin.<field>".
  absl::StatusOr<std::unique_ptr<client::DeviceUpload>> BeginDeviceInsert(
      absl::string_view ns, absl::Span<const client::Token> tokens,
      absl::Duration ttl = absl::ZeroDuration(), const CallOptions& call = {});
  // Same-host Fetch through shared memory (client/client_host.cc): the
  // daemon's host IPC socket and where the pages of a lease of `ns` lie in
  // its shared host arena, with their checksums. FetchInto/Fetch of a lease
  // use it by themselves (ClientOptions::host_fetch); this is the raw call.
  // FAILED_PRECONDITION when the daemon does not offer it
  // ("store.host_ipc_socket") or a page is not in the arena ("pages[i]");
  // NOT_FOUND naming "lease_id" for an inactive lease.
  absl::StatusOr<client::HostHandles> GetHostHandles(
      absl::string_view ns, uint64_t lease_id, const CallOptions& call = {});
  // What the same-host Fetch path of this Client did so far.
  client::HostFetchStats host_fetch_stats() const;

  // ---- Eviction ----
  // These pages and every page that extends them.
  absl::StatusOr<client::EvictResult> EvictPages(
      absl::string_view ns, absl::Span<const client::PageHandle> pages,
      const CallOptions& call = {});
  // At least `bytes` of unlocked pages, least recently used first.
  absl::StatusOr<client::EvictResult> EvictBytes(absl::string_view ns,
                                                 uint64_t bytes,
                                                 const CallOptions& call = {});
  // Every unlocked page.
  absl::StatusOr<client::EvictResult> EvictAll(absl::string_view ns,
                                               const CallOptions& call = {});

  // ---- Introspection ----
  // One namespace, or all when `ns` is empty.
  absl::StatusOr<client::Stats> Stats(absl::string_view ns = "",
                                      const CallOptions& call = {});
  // max_nodes 0 = the daemon's default (1000).
  absl::StatusOr<client::TreeDump> DumpTree(absl::string_view ns,
                                            uint32_t max_nodes = 0,
                                            const CallOptions& call = {});

  struct Impl;  // client/client_impl.h

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CLIENT_H_
