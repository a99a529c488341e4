// Value types of the kvharbor C++ SDK: the data that kvharbor::Client sends
// and returns, mirroring the messages of proto/kvharbor/v1/kvharbor.proto.
//
// They live in kvharbor::client; the types the daemon's core uses as well
// (Geometry, DType, PageLayout, Tier, the statistics, NamespaceSpec and its
// OnlineCalibration) are the shared types of types/, brought in with
// using-declarations, so an application can include both the SDK and the
// daemon's core headers without clashes. This header
// needs only abseil and types/: the SDK's public headers include no gRPC,
// protobuf or kvharbor core header.
//
// Plain value types: they own their members (vectors, strings), copy freely
// and are thread-compatible. FetchSource is the exception: it views handles
// that the caller owns for the duration of one call.
#ifndef KVHARBOR_CLIENT_TYPES_H_
#define KVHARBOR_CLIENT_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "types/geometry.h"
#include "types/key_kind.h"
#include "types/namespace_spec.h"
#include "types/online_calibration.h"
#include "types/stats.h"
#include "types/tier.h"

namespace kvharbor {
namespace client {

using Token = int32_t;
// Opaque page handle from Match; valid until its page is evicted.
using PageHandle = uint64_t;

// The geometry, dtype, page layout and tier types are the ones the daemon's
// core uses (types/, library kvharbor_types): one definition for both ends.
using ::kvharbor::DType;
using ::kvharbor::DTypeName;
using ::kvharbor::DTypeSize;
using ::kvharbor::Geometry;
using ::kvharbor::KeyKind;
using ::kvharbor::kMaxPageKeyBytes;
using ::kvharbor::PageLayout;
using ::kvharbor::PageLayoutName;
using ::kvharbor::ParseDType;
using ::kvharbor::Tier;
using ::kvharbor::TierName;
using ::kvharbor::Topology;
// So are the statistics (types/stats.h).
using ::kvharbor::CalibrationEstimate;
using ::kvharbor::CalibrationState;
using ::kvharbor::CalibrationStateName;
using ::kvharbor::CalibrationStats;
using ::kvharbor::CodecStats;
using ::kvharbor::GlobalStats;
using ::kvharbor::NamespaceStats;
using ::kvharbor::TierStats;
// So is what a namespace is created with (types/namespace_spec.h), the
// online calibration under the SDK's name (types/online_calibration.h).
using ::kvharbor::KvtcRowKind;
using ::kvharbor::NamespaceSpec;
using ::kvharbor::RopeStyle;
using OnlineCalibration = ::kvharbor::OnlineCalibrationOptions;

// How Fetch returns pages; values match kvharbor.v1.FetchFormat.
enum class FetchFormat : int {
  kRaw = 0,         // raw page bytes (the daemon decodes cold pages)
  kCompressed = 1,  // codec buffers over the wire, decoded by the SDK
};

// A transform the daemon applies to fetched pages; values match
// kvharbor.v1.FetchTransform.
enum class FetchTransform : int {
  kNone = 0,
  // LOSSY and LENGTH-CHANGING: the namespace's KVCM compressor merges every
  // compression_factor tokens (per layer, K and V, KV head) into one; the
  // result is a new, shorter cache with its own token count.
  kKvcm = 1,
};

// Arithmetic of the KVTC reconstruction GEMM when the SDK decodes cold
// pages on its GPU (cuda/codec/projection_gemm.h; values match
// gpu::KvtcGemmMode): kFp32: float32 cuBLAS SGEMM (the arithmetic of the CPU
// reference); kTf32: tensor cores, inputs rounded to 10-bit mantissas, float32
// accumulation; kBf16: bfloat16 coefficients and basis, float32
// accumulation. docs/hit_paths.md states the error and speed of each.
enum class GpuDecodeGemm : int { kFp32 = 0, kTf32 = 1, kBf16 = 2 };

struct NamespaceInfo {
  NamespaceSpec spec;  // with the daemon's defaults filled in
  NamespaceStats stats;
  // The daemon's staging socket for same-host Insert through shared memory
  // (include/kvharbor/staging_region.h); empty when it serves none.
  std::string staging_socket;
  uint64_t daemon_id = 0;  // the daemon's random identity
};

struct CreateNamespaceResult {
  NamespaceInfo info;
  bool created = false;  // false: it existed already (if_not_exists)
};

struct Stats {
  GlobalStats global;
  std::vector<NamespaceStats> namespaces;
};

// What Match returns. With lock, `id` names a lease that protects `pages`
// from eviction until `expiry` (or Release); without lock (or when nothing
// matched) id is 0 and the handles are only valid until eviction.
struct Lease {
  uint64_t id = 0;
  absl::Time expiry = absl::InfinitePast();
  std::vector<PageHandle> pages;  // one per matched page, prompt order
  std::vector<Tier> page_tiers;   // tier of each page at match time
  uint64_t matched_tokens = 0;    // a multiple of page_size
  uint64_t page_bytes = 0;

  bool locked() const { return id != 0; }
};

// Same-host zero copy (Client::GetDeviceHandles, docs/tiers.md): the CUDA
// IPC handle of the daemon's device arena and where a lease's pages lie in
// it. Valid while the lease lives; after Release or its TTL the offsets may
// hold other pages. client/cuda/device_ipc.h (CUDA builds) maps and copies
// them.
struct DevicePage {
  PageHandle handle = 0;
  uint64_t offset = 0;  // from the mapped arena's base address
  uint64_t bytes = 0;   // the namespace's page bytes
};
struct DeviceHandles {
  // cudaIpcMemHandle_t bytes (64): the same for every call to one daemon
  // process, so it keys a per-process cache of the mapping.
  std::string ipc_handle;
  int device = 0;                 // CUDA ordinal in the DAEMON's process
  std::string device_uuid;        // 16 bytes: finds the GPU in this process
  uint64_t arena_bytes = 0;       // size of the mapping
  std::vector<DevicePage> pages;  // the lease's, in order
  absl::Time lease_expiry = absl::InfinitePast();
};

// Same-host Fetch through shared memory (Client::GetHostHandles,
// docs/operations.md "Same-host Fetch"): the daemon's socket that hands out
// its shared host arena read-only, and where a lease's pages lie in it.
// Valid while the lease lives; after Release or its TTL the offsets may hold
// other pages (a copy then fails its checksum). include/kvharbor/host_ipc.h
// maps the arena and copies the pages.
struct HostPage {
  PageHandle handle = 0;
  uint64_t offset = 0;    // from byte 0 of the arena mapping
  uint64_t bytes = 0;     // the namespace's page bytes
  uint64_t checksum = 0;  // XXH3-64 of the page, as Fetch sends it
};
struct HostHandles {
  std::string socket_path;  // the daemon's store.host_ipc_socket
  // Random identity of the daemon process; the socket's greeting must
  // carry the same, so another daemon's arena is never used.
  uint64_t daemon_id = 0;
  uint64_t arena_bytes = 0;     // size of the mapping
  std::vector<HostPage> pages;  // the lease's, in order
  absl::Time lease_expiry = absl::InfinitePast();
  // Ranges the daemon punched out of the arena so far; DMA registrations
  // of the mapping made under another value may not see current pages.
  uint64_t arena_generation = 0;
};

// How a Fetch got its pages: streamed over gRPC, or copied by this process
// out of the daemon's shared host arena (same-host Fetch, ClientOptions::
// host_fetch).
enum class FetchPath { kGrpc, kSharedMemory, kBulk };

// Counters of the same-host Fetch path of one Client (Client::
// host_fetch_stats), e.g. to see whether it is in use.
struct HostFetchStats {
  uint64_t shm_fetches = 0;  // Fetch calls served from shared memory
  uint64_t shm_pages = 0;    // pages copied from shared memory
  // Fetch calls that tried shared memory and then streamed over gRPC: the
  // daemon did not offer it or a page was not in the arena (kept in
  // FAILED_PRECONDITION), the socket did not answer or named another
  // daemon, or a copy failed its checksum (counted in checksum_mismatches
  // too).
  uint64_t fallbacks = 0;
  uint64_t checksum_mismatches = 0;
  uint64_t connects = 0;  // arena mappings this process made for it
};

// The elements of a sequence, as Match and Insert name its pages: token ids
// (a token namespace) or one page key of 1..kMaxPageKeyBytes bytes per page (a
// page-key namespace; the daemon refuses the other kind, naming the field).
// Views the caller's memory, which must outlive the call.
class Sequence {
 public:
  static Sequence OfTokens(absl::Span<const Token> tokens) {
    return Sequence(tokens, {}, false);
  }
  static Sequence OfKeys(absl::Span<const absl::string_view> page_keys) {
    return Sequence({}, page_keys, true);
  }
  bool page_keys() const { return keys_given_; }
  absl::Span<const Token> tokens() const { return tokens_; }
  absl::Span<const absl::string_view> keys() const { return keys_; }

 private:
  // No default constructor: `Match(ns, {})` stays the token overload.
  Sequence(absl::Span<const Token> tokens,
           absl::Span<const absl::string_view> keys, bool keys_given)
      : tokens_(tokens), keys_(keys), keys_given_(keys_given) {}

  absl::Span<const Token> tokens_;
  absl::Span<const absl::string_view> keys_;
  bool keys_given_ = false;
};

// How an Insert stores a sequence's pages (docs/engines_api.md "Append
// insert").
struct InsertOptions {
  // Append: the first skip_pages pages are cached (the daemon checks, and
  // holds them until the Insert ends) and not sent. The pages given to Insert
  // are either every page of the sequence (the SDK sends those after the
  // skipped ones, and when the prefix is no longer cached retries once
  // sending all of them) or only those after the skipped ones (no retry is
  // possible: the FAILED_PRECONDITION naming header.skip_pages is returned).
  // For a token sequence, telling the two apart takes the namespace's
  // page_size (one DescribeNamespace call).
  uint32_t skip_pages = 0;
  // Append after a lease (Match with lock) on a prefix of the sequence: skip
  // exactly its pages. With pages for the whole sequence, give skip_pages
  // too (the lease's page count); without, the pages given are the new
  // ones.
  uint64_t prefix_lease_id = 0;
  // Whether the retry above happens.
  bool retry_full = true;
};

struct InsertResult {
  uint64_t already_present_tokens = 0;
  uint32_t pages_stored = 0;
  uint32_t pages_evicted = 0;  // unlocked pages evicted to make room
  // The page bytes went on the daemon's bulk data plane (ClientOptions::
  // data_plane, docs/data_plane.md), not in the Insert stream.
  bool data_plane = false;
};

// Which pages a Fetch asks for: a lease's pages [start_page, start_page +
// page_count) (page_count 0 = to the end), or pages by handle. Views the
// handles; they must outlive the call.
struct FetchSource {
  uint64_t lease_id = 0;
  uint32_t start_page = 0;
  uint32_t page_count = 0;
  absl::Span<const PageHandle> pages;
  // Layers [layer_begin, layer_end) of each page instead of all (0, 0 =
  // all; docs/engines_api.md "Layer ranges"): each page then holds only
  // those layers, in the namespace's layout restricted to them, and is that
  // much smaller. Raw format only.
  uint32_t layer_begin = 0;
  uint32_t layer_end = 0;

  static FetchSource FromLease(uint64_t lease_id, uint32_t start_page = 0,
                               uint32_t page_count = 0) {
    FetchSource s;
    s.lease_id = lease_id;
    s.start_page = start_page;
    s.page_count = page_count;
    return s;
  }
  static FetchSource FromPages(absl::Span<const PageHandle> handles) {
    FetchSource s;
    s.pages = handles;
    return s;
  }
  // This source restricted to layers [begin, end).
  FetchSource Layers(uint32_t begin, uint32_t end) const {
    FetchSource s = *this;
    s.layer_begin = begin;
    s.layer_end = end;
    return s;
  }
  bool by_lease() const { return lease_id != 0; }
  bool layer_range() const { return layer_begin != 0 || layer_end != 0; }
};

// What a Fetch delivered: pages 0..num_pages-1 in request order.
struct FetchResult {
  uint32_t num_pages = 0;
  uint64_t page_bytes = 0;
  std::vector<PageHandle> handles;  // per page, as the daemon sent them
  FetchPath path = FetchPath::kGrpc;
};

// Streaming Fetch (Client::FetchStreaming): where page `index` of
// `page_bytes` bytes goes (memory for at least that many bytes, or an error
// that ends the fetch), and the call made once it is there and verified.
using PageDestination = std::function<absl::StatusOr<uint8_t*>(
    uint32_t index, uint64_t page_bytes)>;
using PageDone = std::function<absl::Status(uint32_t index)>;

// A Fetch on the bulk data plane (Client::FetchBulk, docs/data_plane.md):
// the pages come on `connections` TCP connections at once, stripe s
// (pages [s * stripe_pages, (s + 1) * stripe_pages)) on connection
// s % connections, each connection's pages in increasing order. `begin`
// (may be empty) is called once with the page count and size before any
// page; `destination` and `done` as for FetchStreaming, but called from
// the receiving threads, concurrently for pages of different connections.
// `abort` (may be empty) is called once, from a receiving thread, when the
// fetch fails: a destination that waits for something another connection
// was to deliver must then stop waiting and return an error.
struct BulkSink {
  std::function<absl::Status(uint32_t num_pages, uint64_t page_bytes)> begin;
  PageDestination destination;
  PageDone done;
  std::function<void()> abort;
  uint32_t stripe_pages = 16;
};

// What a fetch into (or an insert from) an engine's paged KV cache did
// (include/kvharbor/layout_fetch.h for host memory,
// client/cuda/layout_transfer.h for GPU memory).
struct TransferResult {
  // The path that served the call: "device_ipc", "host_shm",
  // "compressed_local", "compressed_remote", "remote_bulk", "raw_remote" or
  // "cpu" for a
  // fetch; "device_ipc", "host_shm", "remote_bulk", "pinned" or "cpu" for an
  // insert. A lease
  // whose pages are partly raw and partly cold is served by two paths, joined
  // with '+' (raw part first, e.g. "host_shm+compressed_local").
  std::string path;
  uint32_t pages = 0;
  // Bytes the path's copy stage moved: over the wire (gRPC paths), over
  // PCIe (host_shm, pinned), device to device (device_ipc), or in host
  // memory (cpu).
  uint64_t bytes_moved = 0;
  // Bytes the "h2d" stage copied on a compressed path, which are not
  // bytes_moved: the merged KVTC batches of its gathered copies (the pages'
  // buffers without their per-page headers, decoded on the GPU) and the
  // pages it decoded on the CPU; 0 on other paths.
  uint64_t h2d_bytes = 0;
  double seconds = 0;  // the whole call
  // Seconds per stage, in the order first met ("describe", "rpc", "map",
  // "register", "h2d", "decode", "scatter", "gather", "d2h", "insert", ...).
  std::vector<std::pair<std::string, double>> stages;
  // Each faster path that was tried or asked for and could not serve, with
  // why (e.g. "device_ipc: FAILED_PRECONDITION: ...").
  std::vector<std::string> fallbacks;
};

// What a transformed fetch returns: not pages but ONE KV sequence of
// `output_tokens` tokens made from the `input_tokens` tokens of the fetched
// pages (in request order), in the namespace's dtype, laid out
// [2 (K then V)][layer][token][kv_head][head_dim] whatever the page layout.
// Lossy: attention must run on it as it is, with output_tokens positions.
struct TransformedKv {
  std::vector<uint8_t> bytes;  // 2 * layers * output_tokens * heads * dim
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
};

// One page of a compressed fetch, as the daemon stores it.
struct CompressedPage {
  PageHandle handle = 0;
  Tier tier = Tier::kRaw;                // where the daemon read it from
  std::string codec;                     // the namespace's codec
  uint64_t calibration_fingerprint = 0;  // 0 = none
  std::string buffer;  // one self-describing codec buffer (core/codec/codec.h)
};

// Streaming compressed Fetch (Client::FetchCompressedStreaming): receives
// page `index` once it arrived whole; an error ends the fetch.
using CompressedPageSink =
    std::function<absl::Status(uint32_t index, CompressedPage page)>;

// What a namespace's codec needs to decode compressed pages.
struct Calibration {
  std::string codec;
  // Canonical calibration bytes ("" for identity; proto GetCalibration).
  std::string bytes;
  uint64_t fingerprint = 0;
};

// One calibration of a namespace (ListCalibrations).
struct CalibrationInfo {
  std::string codec;
  uint64_t fingerprint = 0;
  std::string source;  // "config", "uploaded" or "online"
  int64_t created_unix_ms = 0;
  bool active = false;
  bool pinned = false;
  uint64_t pages = 0;  // stored pages encoded with it
};

struct EvictResult {
  uint64_t pages_evicted = 0;
  uint64_t bytes_freed = 0;
};

struct TreeDump {
  std::string text;
  uint64_t nodes = 0;
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_TYPES_H_
