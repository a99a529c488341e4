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
#include "client/bulk_socket.h"
#include "client/client_impl.h"
#include "core/base/socket_io.h"
#include "kvharbor/client.h"
#include "types/bulk_wire.h"

namespace kvharbor {

namespace {

using client::BulkHandshake;
using client::ConnectTcp;

// Largest codec buffer of one page a daemon's offer may announce.
constexpr uint64_t kMaxCompressedPageBytes = uint64_t{1} << 30;

// The offer's fields against the request (INTERNAL naming the field: a
// daemon that breaks the protocol).
absl::Status CheckOffer(const v1::BulkOffer& o, uint32_t connections,
                        uint32_t stripe_pages, uint32_t expected) {
  auto bad = [](const std::string& what) {
    return absl::InternalError(absl::StrCat("bulk_offer.", what));
  };
  if (o.token().size() != kBulkTokenBytes) {
    return bad(absl::StrCat("token: ", o.token().size(), " bytes, not ",
                            kBulkTokenBytes));
  }
  if (o.port() == 0 || o.port() > 65535) {
    return bad(absl::StrCat("port: ", o.port()));
  }
  if (o.connections() != connections || o.stripe_pages() != stripe_pages) {
    return bad("connections/stripe_pages: not those asked for");
  }
  const int n = o.page_handles_size();
  if (o.page_checksums_size() != n || o.page_tiers_size() != n) {
    return bad("page_checksums/page_tiers: not one per page");
  }
  if (expected != 0 && static_cast<uint32_t>(n) != expected) {
    return bad(absl::StrCat("page_handles: ", n, " pages, ", expected,
                            " were asked for"));
  }
  if (o.page_sizes_size() == 0) {
    if (n > 0 && o.page_bytes() == 0) return bad("page_bytes: 0");
    return absl::OkStatus();
  }
  // Compressed pages: a size, codec and fingerprint each, and no size taken
  // at its word past kMaxCompressedPageBytes (memory is reserved for it).
  if (o.page_sizes_size() != n || o.page_codecs_size() != n ||
      o.page_calibration_fingerprints_size() != n) {
    return bad("page_sizes/page_codecs/page_calibration_fingerprints: not "
               "one per page");
  }
  if (o.page_bytes() != 0) return bad("page_bytes: set beside page_sizes");
  for (int i = 0; i < n; ++i) {
    if (o.page_sizes(i) > kMaxCompressedPageBytes) {
      return bad(absl::StrCat("page_sizes[", i, "]: ", o.page_sizes(i),
                              " bytes, above the limit of ",
                              kMaxCompressedPageBytes));
    }
  }
  return absl::OkStatus();
}

// Bytes of page `page` on the wire.
uint64_t OfferedPageBytes(const v1::BulkOffer& o, uint32_t page) {
  return o.page_sizes_size() == 0 ? o.page_bytes() : o.page_sizes(page);
}

// The receiving side of one transfer: a thread per connection.
class BulkReceive {
 public:
  BulkReceive(const v1::BulkOffer& offer, const client::BulkSink& sink,
              std::string host, absl::Time deadline, bool verify)
      : offer_(offer),
        sink_(sink),
        host_(std::move(host)),
        deadline_(deadline),
        verify_(verify),
        fds_(offer.connections(), -1) {}

  // Receives every connection's pages; the first error, if any.
  absl::Status Run() {
    std::vector<std::thread> threads;
    for (uint32_t i = 1; i < offer_.connections(); ++i) {
      threads.emplace_back([this, i] { Connection(i); });
    }
    Connection(0);
    for (std::thread& t : threads) t.join();
    absl::MutexLock l(&mu_);
    return error_;
  }

 private:
  void Connection(uint32_t index) {
    absl::Status s = Serve(index);
    bool first_error = false;
    {
      absl::MutexLock l(&mu_);
      if (fds_[index] >= 0) close(fds_[index]);
      fds_[index] = -1;
      if (!s.ok() && error_.ok()) {
        error_ = s;
        first_error = true;
        // The other connections stop too: their bytes are of no use now.
        for (int fd : fds_) {
          if (fd >= 0) shutdown(fd, SHUT_RDWR);
        }
      }
    }
    // A destination blocked on another connection's page wakes up (outside
    // mu_: the sink takes its own lock).
    if (first_error && sink_.abort) sink_.abort();
  }

  absl::Status Serve(uint32_t index) {
    absl::StatusOr<int> fd = ConnectTcp(host_, offer_.port(), deadline_);
    if (!fd.ok()) return fd.status();
    {
      absl::MutexLock l(&mu_);
      fds_[index] = *fd;
      if (!error_.ok()) return error_;
    }
    if (absl::Status s = BulkHandshake(*fd, offer_, index); !s.ok()) return s;
    const uint32_t n = static_cast<uint32_t>(offer_.page_handles_size());
    const uint32_t sp = offer_.stripe_pages(), c = offer_.connections();
    for (uint64_t s = index; s * sp < n; s += c) {
      for (uint64_t p = s * sp; p < std::min<uint64_t>(n, (s + 1) * sp); ++p) {
        const uint32_t page = static_cast<uint32_t>(p);
        const uint64_t pb = OfferedPageBytes(offer_, page);
        absl::StatusOr<uint8_t*> dst = sink_.destination(page, pb);
        if (!dst.ok()) return dst.status();
        if (RecvFull(*fd, *dst, pb) != 0) {
          return absl::UnavailableError(absl::StrFormat(
              "bulk: connection %u broke in page %u (closed by the daemon, "
              "or nothing came within the call's deadline)",
              index, page));
        }
        if (verify_ && XXH3_64bits(*dst, pb) != offer_.page_checksums(page)) {
          return absl::DataLossError(absl::StrFormat(
              "bulk: page %u does not match its checksum", page));
        }
        if (sink_.done) {
          if (absl::Status d = sink_.done(page); !d.ok()) return d;
        }
      }
    }
    return absl::OkStatus();
  }

  const v1::BulkOffer& offer_;
  const client::BulkSink& sink_;
  const std::string host_;
  const absl::Time deadline_;
  const bool verify_;
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

// One bulk Fetch call: the request sent and the daemon's first message.
struct Client::Impl::BulkFetchCall {
  grpc::ClientContext ctx;
  absl::Time deadline = absl::InfiniteFuture();
  std::unique_ptr<grpc::ClientReader<v1::FetchResponse>> reader;
  v1::FetchResponse first;
};

absl::StatusOr<Client::Impl::BulkOpened> Client::Impl::OpenBulkFetch(
    const v1::FetchRequest& req, const CallOptions& call,
    BulkFetchCall* c) const {
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
  v1::FetchRequest req;
  absl::StatusOr<uint32_t> expected = BuildFetchRequest(ns, source, &req);
  if (!expected.ok()) return expected.status();
  const uint32_t connections = options.data_plane_connections;
  req.mutable_bulk()->set_connections(connections);
  req.mutable_bulk()->set_stripe_pages(sink.stripe_pages);
  BulkFetchCall c;
  absl::StatusOr<BulkOpened> opened = OpenBulkFetch(req, call, &c);
  if (!opened.ok()) return opened.status();
  if (*opened == BulkOpened::kNotOffered) return std::nullopt;
  client::FetchResult result;
  result.path = client::FetchPath::kBulk;
  if (*opened == BulkOpened::kNoPages) return result;
  const v1::BulkOffer& offer = c.first.bulk_offer();
  absl::Status s = CheckOffer(offer, connections, sink.stripe_pages, *expected);
  if (s.ok() && offer.page_sizes_size() != 0) {
    s = absl::InternalError("bulk_offer.page_sizes: set for a RAW fetch");
  }
  const uint32_t n = static_cast<uint32_t>(offer.page_handles_size());
  if (s.ok() && sink.begin) s = sink.begin(n, offer.page_bytes());
  if (s.ok() && n > 0) {
    BulkReceive receive(offer, sink, std::string(TargetHost(options.address)),
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

absl::StatusOr<std::optional<uint32_t>> Client::Impl::TryBulkFetchCompressed(
    absl::string_view ns, const client::FetchSource& source,
    const client::CompressedPageSink& on_page, const CallOptions& call) const {
  if (!BulkWanted()) return std::nullopt;
  v1::FetchRequest req;
  absl::StatusOr<uint32_t> expected = BuildFetchRequest(ns, source, &req);
  if (!expected.ok()) return expected.status();
  req.set_format(v1::FETCH_FORMAT_COMPRESSED);
  const uint32_t connections = options.data_plane_connections;
  req.mutable_bulk()->set_connections(connections);
  req.mutable_bulk()->set_stripe_pages(kCompressedStripePages);
  BulkFetchCall c;
  absl::StatusOr<BulkOpened> opened = OpenBulkFetch(req, call, &c);
  if (!opened.ok()) return opened.status();
  if (*opened == BulkOpened::kNotOffered) return std::nullopt;
  if (*opened == BulkOpened::kNoPages) return 0u;
  const v1::BulkOffer& offer = c.first.bulk_offer();
  absl::Status s =
      CheckOffer(offer, connections, kCompressedStripePages, *expected);
  const uint32_t n = static_cast<uint32_t>(offer.page_handles_size());
  if (s.ok() && n > 0 && offer.page_sizes_size() == 0) {
    s = absl::InternalError("bulk_offer.page_sizes: none for a COMPRESSED "
                            "fetch");
  }
  // Each page lands in a buffer of its own; the pages go to `on_page` in
  // order once all arrived whole and checked.
  std::vector<client::CompressedPage> pages(s.ok() ? n : 0);
  for (uint32_t i = 0; i < pages.size(); ++i) {
    pages[i].buffer.resize(offer.page_sizes(i));
  }
  if (s.ok() && n > 0) {
    client::BulkSink sink;
    sink.stripe_pages = kCompressedStripePages;
    sink.destination = [&pages](uint32_t page,
                                uint64_t) -> absl::StatusOr<uint8_t*> {
      return reinterpret_cast<uint8_t*>(pages[page].buffer.data());
    };
    BulkReceive receive(offer, sink, std::string(TargetHost(options.address)),
                        c.deadline, options.verify_checksums);
    s = receive.Run();
  }
  if (absl::Status f = FinishBulkFetch(&c, s); !f.ok()) return f;
  for (uint32_t i = 0; i < n; ++i) {
    pages[i].handle = offer.page_handles(i);
    pages[i].tier = static_cast<client::Tier>(offer.page_tiers(i));
    pages[i].codec = offer.page_codecs(i);
    pages[i].calibration_fingerprint = offer.page_calibration_fingerprints(i);
    if (absl::Status d = on_page(i, std::move(pages[i])); !d.ok()) return d;
  }
  return n;
}

absl::StatusOr<std::optional<client::FetchResult>> Client::FetchBulk(
    absl::string_view ns, const client::FetchSource& source,
    const client::BulkSink& sink, const CallOptions& call) {
  return impl_->TryBulkFetch(ns, source, sink, call);
}

}  // namespace kvharbor
