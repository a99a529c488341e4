// Client::Impl: the channel and stub behind kvharbor::Client, shared by
// client.cc (unary calls) and client_stream.cc (Insert and Fetch).
//
// Internal to the SDK (not installed). Immutable after construction except
// for the decoder cache, which locks itself, hence thread-safe; every call
// builds its own grpc::ClientContext.
#ifndef KVHARBOR_CLIENT_CLIENT_IMPL_H_
#define KVHARBOR_CLIENT_CLIENT_IMPL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/fetch_assembler.h"
#include "client/page_decoder.h"
#include "client/proto_convert.h"
#include "kvharbor/client.h"
#include "kvharbor/v1/kvharbor.grpc.pb.h"

namespace kvharbor {

// Whether a gRPC target names this host: a unix: socket, localhost,
// 127.0.0.0/8 or [::1] (client/client_host.cc).
bool IsLocalTarget(absl::string_view target);
// The host of a gRPC target ("dns:///h:p", "ipv4:h:p", "h:p", "[::1]:p").
absl::string_view TargetHost(absl::string_view target);

struct Client::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::KvHarbor::Stub> stub;
  // Fetch read through FetchSink (client/fetch_wire.h) rather than the
  // stub, so that page bytes go from gRPC's slices to the caller in one copy.
  std::unique_ptr<grpc::internal::RpcMethod> fetch_method;
  // Insert sent through InsertOut (client/insert_wire.h), for the same reason.
  std::unique_ptr<grpc::internal::RpcMethod> insert_method;

  // Deadline and wait-for-ready of one call. DEADLINE_EXCEEDED when the
  // deadline has already passed: the call is then not started at all, so
  // the outcome does not depend on how gRPC races its timer against a fast
  // reply.
  absl::Status Prepare(grpc::ClientContext* ctx, const CallOptions& call) const;
  // `call` with its deadline made absolute, for one SDK call made of
  // several RPCs that share it.
  CallOptions OneDeadline(const CallOptions& call) const;

  // One unary RPC through `method` of the stub.
  template <typename Req, typename Resp>
  absl::Status Unary(grpc::Status (v1::KvHarbor::Stub::*method)(
                         grpc::ClientContext*, const Req&, Resp*),
                     const Req& req, Resp* resp,
                     const CallOptions& call) const {
    grpc::ClientContext ctx;
    absl::Status s = Prepare(&ctx, call);
    if (!s.ok()) return s;
    return client::FromGrpcStatus((stub.get()->*method)(&ctx, req, resp));
  }

  // One unary RPC whose response `convert` turns into the SDK's answer.
  template <typename Req, typename Resp, typename Convert>
  auto Call(grpc::Status (v1::KvHarbor::Stub::*method)(grpc::ClientContext*,
                                                       const Req&, Resp*),
            const Req& req, const CallOptions& call, Convert convert) const
      -> absl::StatusOr<
          std::decay_t<decltype(convert(std::declval<const Resp&>()))>> {
    Resp resp;
    absl::Status s = Unary(method, req, &resp, call);
    if (!s.ok()) return s;
    return convert(resp);
  }

  // The decoders of compressed fetches, with their calibrations (the only
  // mutable state; internally synchronized).
  std::unique_ptr<client::PageDecoder> decoder;

  // Fills a FetchRequest (RAW format) from `source`; returns the number of
  // pages it implies (0 = unknown, a lease fetched to its end).
  absl::StatusOr<uint32_t> BuildFetchRequest(absl::string_view ns,
                                             const client::FetchSource& source,
                                             v1::FetchRequest* req) const;

  // Same-host Fetch through shared memory (client/client_host.cc): whether
  // ClientOptions::host_fetch allows it for this address, its counters, and
  // until when (Unix nanoseconds) it is not tried after the daemon said it
  // is off or its socket did not answer.
  bool host_fetch_allowed = false;
  struct HostFetchCounters {
    std::atomic<uint64_t> shm_fetches{0};
    std::atomic<uint64_t> shm_pages{0};
    std::atomic<uint64_t> fallbacks{0};
    std::atomic<uint64_t> checksum_mismatches{0};
    std::atomic<uint64_t> connects{0};
    std::atomic<int64_t> retry_after_ns{0};
  };
  mutable HostFetchCounters host_fetch;

  // A Fetch of a lease through the daemon's shared host arena: the result,
  // nullopt when the caller should stream over gRPC instead (not allowed,
  // not offered, not reachable, a page outside the arena, a checksum
  // mismatch), or an error that a gRPC Fetch would give as well (unknown
  // lease, bad destination, deadline).
  // The GetHostHandles RPC (Client::GetHostHandles and TryHostFetch).
  absl::StatusOr<client::HostHandles> GetHostHandles(
      absl::string_view ns, uint64_t lease_id, const CallOptions& call) const;
  absl::StatusOr<std::optional<client::FetchResult>> TryHostFetch(
      absl::string_view ns, const client::FetchSource& source,
      const client::FetchAssembler::Destination& destination,
      const CallOptions& call) const;

  // The bulk data plane (client/bulk_fetch.cc, docs/data_plane.md): whether
  // ClientOptions::data_plane allows asking for it, and until when (Unix
  // nanoseconds) it is not asked for after the daemon did not offer it.
  bool bulk_allowed = false;
  mutable std::atomic<int64_t> bulk_retry_after_ns{0};
  // A RAW Fetch whose bytes come on the bulk data plane: the result,
  // nullopt when the daemon did not offer it (the caller streams), or the
  // error of the call. `sink`'s callbacks run on the receiving threads.
  absl::StatusOr<std::optional<client::FetchResult>> TryBulkFetch(
      absl::string_view ns, const client::FetchSource& source,
      const client::BulkSink& sink, const CallOptions& call) const;
  // A COMPRESSED Fetch on the bulk data plane
  // (client/bulk_fetch_compressed.cc): every page received into a buffer of its
  // own and checked, and handed to `on_page` on this thread in order, as soon
  // as it and every page before it are in. The page count, nullopt when not
  // offered (the caller streams), or the error of the call (pages before it may
  // have been handed over, as with a stream that breaks).
  absl::StatusOr<std::optional<uint32_t>> TryBulkFetchCompressed(
      absl::string_view ns, const client::FetchSource& source,
      const client::CompressedPageSink& on_page, const CallOptions& call) const;
  // Pages per stripe of a compressed bulk fetch: its buffers are small
  // (tens of KiB), so stripes of many pages keep each write large.
  static constexpr uint32_t kCompressedStripePages = 64;
  // The Fetch call of a bulk transfer (client/bulk_fetch.cc): opened (the
  // offer read, or why there is none) and finished (its status combined
  // with the transfer's).
  struct BulkFetchCall {
    grpc::ClientContext ctx;
    absl::Time deadline = absl::InfiniteFuture();
    std::unique_ptr<grpc::ClientReader<v1::FetchResponse>> reader;
    v1::FetchResponse first;  // the offer, when there is one
  };
  enum class BulkOpened { kOffer, kNotOffered, kNoPages };
  // Sends the Fetch of `source` (COMPRESSED when `compressed`) asking for
  // the plane with `stripe_pages`, reads the daemon's first message and
  // checks the offer against the request; an offer that breaks the protocol
  // finishes the call and is its error (INTERNAL naming bulk_offer.<field>).
  absl::StatusOr<BulkOpened> OpenBulkFetch(
      absl::string_view ns, const client::FetchSource& source, bool compressed,
      uint32_t stripe_pages, const CallOptions& call, BulkFetchCall* c) const;
  absl::Status FinishBulkFetch(BulkFetchCall* c, const absl::Status& s) const;

  // Sends `pages` (the sent pages of an Insert, in order) on the bulk data
  // plane as `offer` (from the Insert's initial metadata) says, one thread
  // per connection; OK once every connection's pages are written and the
  // daemon closed it.
  absl::Status SendBulkInsert(const v1::BulkOffer& offer,
                              absl::Span<const absl::Span<const uint8_t>> pages,
                              absl::Time deadline) const;
  // Whether to ask for the bulk data plane now (allowed, and no daemon's
  // "not offered" within kBulkRetry).
  bool BulkWanted() const;
  void NoteBulkNotOffered() const;

  // A Fetch: through shared memory when allowed (TryHostFetch), then the
  // bulk data plane when allowed and offered, else StreamRaw.
  // `destination` must be safe to call from several threads at once for
  // different pages (the bulk plane's receivers); `begin` (may be empty) is
  // called with the page count and size before them on the bulk plane.
  absl::StatusOr<client::FetchResult> Fetch(
      absl::string_view ns, const client::FetchSource& source,
      client::FetchAssembler::Destination destination, const CallOptions& call,
      const std::function<absl::Status(uint32_t, uint64_t)>& begin =
          nullptr) const;
  // Runs a RAW Fetch stream, handing every chunk to an assembler built from
  // `destination` and `done` (may be empty).
  absl::StatusOr<client::FetchResult> StreamRaw(
      absl::string_view ns, const client::FetchSource& source,
      client::FetchAssembler::Destination destination, client::PageDone done,
      const CallOptions& call) const;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CLIENT_IMPL_H_
