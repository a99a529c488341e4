// Client::Impl::TryBulkFetch and Client::FetchBulk: RAW fetches whose page
// bytes come on the daemon's bulk data plane (docs/data_plane.md). The
// Fetch stream carries the BulkOffer and then the transfer's status; the
// bytes come on `connections` TCP connections at once, each received by a
// thread of its own straight into the caller's memory, and checked against
// the offer's checksums there.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxh3.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/bulk_receive.h"
#include "client/client_impl.h"
#include "core/base/socket_io.h"
#include "kvharbor/client.h"
#include "types/bulk_wire.h"

namespace kvharbor {

absl::StatusOr<Client::Impl::BulkOpened> Client::Impl::OpenBulkFetch(
    absl::string_view ns, const client::FetchSource& source, bool compressed,
    uint32_t stripe_pages, const CallOptions& call, BulkFetchCall* c) const {
  v1::FetchRequest req;
  absl::StatusOr<uint32_t> expected = BuildFetchRequest(ns, source, &req);
  if (!expected.ok()) return expected.status();
  if (compressed) req.set_format(v1::FETCH_FORMAT_COMPRESSED);
  const uint32_t connections = options.data_plane_connections;
  req.mutable_bulk()->set_connections(connections);
  req.mutable_bulk()->set_stripe_pages(stripe_pages);
  if (absl::Status s = Prepare(&c->ctx, call); !s.ok()) return s;
  if (c->ctx.deadline() != std::chrono::system_clock::time_point::max()) {
    c->deadline = absl::FromChrono(c->ctx.deadline());
  }
  c->reader = stub->Fetch(&c->ctx, req);
  if (!c->reader->Read(&c->first)) {
    absl::Status s = client::FromGrpcStatus(c->reader->Finish());
    if (absl::IsFailedPrecondition(s) &&
        absl::StartsWith(s.message(), "bulk:")) {
      NoteBulkNotOffered();  // this daemon has no plane: stream
      return BulkOpened::kNotOffered;
    }
    if (!s.ok()) return s;
    return BulkOpened::kNoPages;
  }
  if (!c->first.has_bulk_offer()) {
    // A daemon older than the plane streams: this stream's pages are of no
    // use to the caller's sink (it expects the plane's order); stop it and
    // stream instead.
    c->ctx.TryCancel();
    v1::FetchResponse rest;
    while (c->reader->Read(&rest)) {
    }
    c->reader->Finish();
    NoteBulkNotOffered();
    return BulkOpened::kNotOffered;
  }
  // The offer against the request; a daemon that breaks the protocol ends
  // the call with the error.
  const v1::BulkOffer& offer = c->first.bulk_offer();
  absl::Status s =
      client::CheckBulkOffer(offer, connections, stripe_pages, *expected);
  if (s.ok() && !compressed && offer.page_sizes_size() != 0) {
    s = absl::InternalError("bulk_offer.page_sizes: set for a RAW fetch");
  }
  if (s.ok() && compressed && offer.page_handles_size() > 0 &&
      offer.page_sizes_size() == 0) {
    s = absl::InternalError(
        "bulk_offer.page_sizes: none for a COMPRESSED fetch");
  }
  if (!s.ok()) return FinishBulkFetch(c, s);
  return BulkOpened::kOffer;
}

absl::Status Client::Impl::FinishBulkFetch(BulkFetchCall* c,
                                           const absl::Status& s) const {
  if (!s.ok()) c->ctx.TryCancel();
  v1::FetchResponse extra;
  while (c->reader->Read(&extra)) {
  }
  const absl::Status finished = client::FromGrpcStatus(c->reader->Finish());
  // The daemon's status says why a transfer broke (its deadline, a
  // refused connection's cause) better than a closed socket does.
  if (!s.ok()) {
    return !finished.ok() && finished.code() != absl::StatusCode::kCancelled &&
                   s.code() == absl::StatusCode::kUnavailable
               ? finished
               : s;
  }
  return finished;
}

absl::StatusOr<std::optional<client::FetchResult>> Client::Impl::TryBulkFetch(
    absl::string_view ns, const client::FetchSource& source,
    const client::BulkSink& sink, const CallOptions& call) const {
  if (!BulkWanted()) return std::nullopt;
  if (sink.stripe_pages == 0 || !sink.destination) {
    return absl::InvalidArgumentError(
        "sink: needs a destination and stripe_pages >= 1");
  }
  BulkFetchCall c;
  absl::StatusOr<BulkOpened> opened = OpenBulkFetch(
      ns, source, /*compressed=*/false, sink.stripe_pages, call, &c);
  if (!opened.ok()) return opened.status();
  if (*opened == BulkOpened::kNotOffered) return std::nullopt;
  client::FetchResult result;
  result.path = client::FetchPath::kBulk;
  if (*opened == BulkOpened::kNoPages) return result;
  const v1::BulkOffer& offer = c.first.bulk_offer();
  const uint32_t n = static_cast<uint32_t>(offer.page_handles_size());
  absl::Status s;
  if (sink.begin) s = sink.begin(n, offer.page_bytes());
  if (s.ok() && n > 0) {
    client::BulkReceive receive(offer, sink,
                                std::string(TargetHost(options.address)),
                                c.deadline, options.verify_checksums);
    s = receive.Run();
  }
  if (absl::Status f = FinishBulkFetch(&c, s); !f.ok()) return f;
  result.num_pages = n;
  result.page_bytes = offer.page_bytes();
  result.handles.assign(offer.page_handles().begin(),
                        offer.page_handles().end());
  return result;
}

absl::StatusOr<std::optional<client::FetchResult>> Client::FetchBulk(
    absl::string_view ns, const client::FetchSource& source,
    const client::BulkSink& sink, const CallOptions& call) {
  return impl_->TryBulkFetch(ns, source, sink, call);
}

}  // namespace kvharbor
