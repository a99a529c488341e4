// Fetching a lease's pages into an engine's paged KV cache, and storing
// pages from one, when that cache is in HOST memory (types/kv_layout.h;
// GPU memory: client/cuda/layout_transfer.h, which uses the helpers here
// too). Page i of the call goes to (comes from) block block_ids[i] of every
// layer the layout holds.
//
// The host path ("cpu") fetches the pages as Client::FetchInto does (the
// daemon's shared memory on the same host, else the RAW stream; or the
// COMPRESSED stream decoded on the CPU when asked; a layout of some of the
// layers fetches only those, a layer-range RAW stream), then runs the CPU
// scatter of core/memory/paged_kv_copy.h; an insert runs the CPU gather and
// Client::Insert. Everything is validated before anything is written: the
// layout against the namespace's geometry (DescribeNamespace) and the block
// ids, INVALID_ARGUMENT naming the field; a device layout is refused here
// (naming layout.device).
//
// Memory: the layout's buffers belong to the caller and are written only at
// the addressed elements of the given blocks; a temporary copy of the pages
// lives for the call. Thread-safe as the Client is.
#ifndef KVHARBOR_CLIENT_LAYOUT_FETCH_H_
#define KVHARBOR_CLIENT_LAYOUT_FETCH_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvharbor/client.h"
#include "kvharbor/types.h"
#include "types/kv_layout.h"

namespace kvharbor {
namespace client {

// Which pages a fetch into a layout takes: lease pages [start_page,
// start_page + block_ids.size()).
struct LayoutFetchOptions {
  uint32_t start_page = 0;
  // The tier of each page of the lease (Lease::page_tiers), or empty when
  // not known (all taken as raw). Cold pages decide the COMPRESSED path.
  std::vector<Tier> page_tiers;
  // Unset: the fastest path there is. Set: this format and no same-host
  // path: the gRPC stream, or for RAW into a GPU layout the bulk data plane
  // first when the client may use it and the daemon serves it
  // (docs/data_plane.md; ClientOptions::data_plane kOff keeps it off).
  std::optional<FetchFormat> format;
  // GPU layouts only: a cudaStream_t whose earlier work the transfer waits
  // for and on which it scatters (0: its own streams). The call returns
  // once the destination holds the pages either way.
  uint64_t stream = 0;
};

// The checked description of one call: the namespace's geometry and the
// layout resolved against it (types/kv_layout.h), block ids checked.
struct LayoutCall {
  Geometry geometry;
  PagedKvLayout layout;
};
// DescribeNamespace, then ResolveLayout (all layers when `all_layers`) and
// CheckBlockIds for `num_pages` pages.
absl::StatusOr<LayoutCall> PrepareLayoutCall(
    Client& client, absl::string_view ns, const PagedKvLayout& layout,
    absl::Span<const int64_t> block_ids, size_t num_pages, bool all_layers,
    const CallOptions& call);
// The pages `tokens` make in namespace `ns` (DescribeNamespace);
// INVALID_ARGUMENT naming tokens unless they are a whole, non-zero number.
absl::StatusOr<uint32_t> PagesOfTokens(Client& client, absl::string_view ns,
                                       absl::Span<const Token> tokens,
                                       const CallOptions& call);
// `call` with a deadline, so that every RPC of a transfer shares one.
CallOptions WithDeadline(const Client& client, const CallOptions& call);

// Seconds per stage of a transfer, in the order first met.
class TransferClock {
 public:
  TransferClock() : start_(std::chrono::steady_clock::now()), last_(start_) {}
  // Adds the time since the previous Lap (or the start) to `stage`.
  void Lap(const std::string& stage);
  // Adds `seconds` to `stage` (GPU event times).
  void Add(const std::string& stage, double seconds);
  double Total() const;
  // The stages and the total into `r`.
  void Finish(TransferResult* r) const;

 private:
  std::chrono::steady_clock::time_point start_, last_;
  std::vector<std::pair<std::string, double>> stages_;
};

// Lease pages [opts.start_page, + block_ids.size()) of `lease_id` into
// blocks block_ids of a host-memory layout ("cpu" path).
absl::StatusOr<TransferResult> FetchToHostLayout(
    Client& client, absl::string_view ns, uint64_t lease_id,
    const PagedKvLayout& layout, absl::Span<const int64_t> block_ids,
    const LayoutFetchOptions& opts = {}, const CallOptions& call = {});

// Stores the pages of `tokens` (a whole number of pages), page i read from
// blocks block_ids[i] of a host-memory layout of all the namespace's layers
// ("cpu" path).
absl::StatusOr<std::pair<InsertResult, TransferResult>> InsertFromHostLayout(
    Client& client, absl::string_view ns, absl::Span<const Token> tokens,
    const PagedKvLayout& layout, absl::Span<const int64_t> block_ids,
    const CallOptions& call = {});

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_LAYOUT_FETCH_H_
