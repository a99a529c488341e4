// FetchReactor: server side of the server-streaming Fetch RPC.
//
// Streams pinned pages in chunks of at most `chunk_bytes`, one write
// outstanding at a time (StartWrite, then the next from OnWriteDone), so a
// slow client holds at most one chunk of memory here. The first chunk of each
// page carries the page's handle, size, checksum and tier, and for a
// compressed fetch the codec name and calibration fingerprint. With
// `pages_per_message` > 1 (FetchRequest.max_pages_per_message), a message
// whose page is complete also carries the following pages whole in
// packed_pages, up to that count and while data plus packed metadata fit
// `chunk_bytes`: small (compressed) pages then cost one message per chunk
// instead of one each. A transformed
// fetch (server/rpc/fetch_transform.h) streams its result instead, as a single
// page 0 whose first chunk also carries the token counts; its source pages
// stay pinned like the others (bytes_out is counted through them). A
// layer-range fetch (FetchRequest.layer_begin/layer_end) sends of each raw
// page only the runs that hold those layers (types/layer_range.h), as one
// smaller page with the checksum of exactly those bytes. The pins
// are released when the reactor is deleted (OnDone), whether the stream
// completed, failed or was cancelled.
//
// Before each chunk the reactor checks the call (CallAlive): once the client
// cancelled or the deadline passed it produces no more chunks and finishes,
// which releases the pins. A client that takes no chunk for
// limits.fetch_idle_timeout_ms (its write does not complete) has its call
// cancelled by the service's IdleWatchdog, with the same effect.
//
// Owned by gRPC's callback machinery: created by KvHarborService::Fetch and
// deleted in OnDone; `ctx` is the call's and outlives the reactor.
// Everything runs in the serialized write reactions.
#ifndef KVHARBOR_SERVER_RPC_FETCH_REACTOR_H_
#define KVHARBOR_SERVER_RPC_FETCH_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <optional>
#include <string>

#include "core/store/namespace.h"
#include "kvharbor/v1/kvharbor.pb.h"
#include "server/rpc/call_tracker.h"
#include "server/rpc/fetch_transform.h"
#include "server/rpc/idle_watchdog.h"
#include "types/layer_range.h"

namespace kvharbor {

// The XXH3-64 of the bytes a fetch sends of pinned page `page`: its stored
// checksum for whole pages (`runs` count 0), else a hash of those runs (one
// more read of them). The stream and the bulk data plane's offer both send
// it.
uint64_t SentChecksum(const Namespace::PinnedPages& pages, size_t page,
                      const PageRuns& runs);

class FetchReactor final : public grpc::ServerWriteReactor<v1::FetchResponse> {
 public:
  // A reactor that finishes at once with `error` (bad request).
  FetchReactor(grpc::CallbackServerContext* ctx, CallTracker* calls,
               const CallRecord& call, const grpc::Status& error);
  // Compressed pages go out with their own codec and calibration
  // fingerprint (PinnedPages::codec_name / calibration_fingerprint).
  // `idle` (null: not watched) is the call's entry in `watchdog`, which the
  // reactor unwatches when done. `runs` (count 0 = whole pages) selects the
  // bytes of each raw page sent. `pages_per_message` >= 1: see above. With
  // `transformed` (made from `pages`), that one result is streamed instead
  // of the pages (runs and pages_per_message unused).
  FetchReactor(grpc::CallbackServerContext* ctx, CallTracker* calls,
               const CallRecord& call, Namespace::PinnedPages pages,
               uint32_t chunk_bytes, IdleWatchdog* watchdog,
               IdleWatchdog::Entry* idle, PageRuns runs = PageRuns(),
               uint32_t pages_per_message = 1,
               std::optional<TransformedKv> transformed = std::nullopt);

  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  void WriteNext();
  // Pages the stream sends: the pinned ones, or the one transformed result.
  size_t num_pages() const { return transformed_ ? 1 : pages_.size(); }
  // Bytes sent for `page` (its runs_, or all of it).
  uint64_t PageBytes(size_t page) const;
  // Appends bytes [offset, offset + n) of what `page` sends to `out`.
  void AppendPageBytes(size_t page, uint64_t offset, uint64_t n,
                       std::string* out) const;
  // Sets the metadata of page_'s first chunk in response_.
  void SetPageMetadata();
  // Sets the first-chunk metadata of stored page `page` in `m` (a
  // FetchResponse or a PackedPage: the same field names).
  template <typename Message>
  void SetStoredPageMetadata(size_t page, Message* m) const;
  // Appends whole pages from page_ on to response_.packed_pages while they
  // fit (see above); `used` is the data already in the message.
  void PackPages(uint64_t used);
  void FinishWith(const grpc::Status& status);  // notes the code, Finish

  grpc::CallbackServerContext* const ctx_;
  CallTracker* const calls_;
  IdleWatchdog* const watchdog_ = nullptr;
  IdleWatchdog::Entry* const idle_ = nullptr;
  CallRecord call_;
  Namespace::PinnedPages pages_;
  const uint64_t chunk_bytes_ = 0;
  const bool transformed_ = false;
  const PageRuns runs_;  // count 0: whole pages
  const uint32_t pages_per_message_ = 1;
  TransformedKv transformed_kv_;  // transformed_ only
  size_t page_ = 0;               // page of the next chunk
  uint64_t offset_ = 0;           // offset of the next chunk in its page
  uint64_t bytes_in_write_ = 0;   // data bytes of the outstanding write
  v1::FetchResponse response_;    // the one outstanding write's message
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_RPC_FETCH_REACTOR_H_
