// Client::Impl::TryBulkFetchCompressed: a COMPRESSED Fetch whose codec
// buffers come on the bulk data plane (docs/data_plane.md). Each page is
// received into a buffer of its own, sized by the offer; the pages go to
// the caller's sink in order, each as soon as it and every page before it
// arrived and was checked, so that a decoder downstream works while later
// pages are still on the wire.
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/bulk_receive.h"
#include "client/client_impl.h"
#include "kvharbor/client.h"

namespace kvharbor {

namespace {

// Pages that arrived, in the order the receivers finish them, handed out
// in page order.
class InOrderPages {
 public:
  explicit InOrderPages(uint32_t n) : arrived_(n, false) {}

  void Arrived(uint32_t page) {
    absl::MutexLock l(&mu_);
    arrived_[page] = true;
  }
  // The receivers stopped: with an error (abort) or all done.
  void Stopped() {
    absl::MutexLock l(&mu_);
    stopped_ = true;
  }
  // Waits until `page` arrived (true) or the receivers stopped without it.
  bool Wait(uint32_t page) {
    absl::MutexLock l(&mu_);
    auto ready = [this, page]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return arrived_[page] || stopped_;
    };
    mu_.Await(absl::Condition(&ready));
    return arrived_[page];
  }

 private:
  absl::Mutex mu_;
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::optional<uint32_t>> Client::Impl::TryBulkFetchCompressed(
    absl::string_view ns, const client::FetchSource& source,
    const client::CompressedPageSink& on_page, const CallOptions& call) const {
  if (!BulkWanted()) return std::nullopt;
  BulkFetchCall c;
  absl::StatusOr<BulkOpened> opened = OpenBulkFetch(
      ns, source, /*compressed=*/true, kCompressedStripePages, call, &c);
  if (!opened.ok()) return opened.status();
  if (*opened == BulkOpened::kNotOffered) return std::nullopt;
  if (*opened == BulkOpened::kNoPages) return 0u;
  const v1::BulkOffer& offer = c.first.bulk_offer();
  const uint32_t n = static_cast<uint32_t>(offer.page_handles_size());
  if (n == 0) {
    if (absl::Status f = FinishBulkFetch(&c, absl::OkStatus()); !f.ok()) {
      return f;
    }
    return 0u;
  }
  std::vector<client::CompressedPage> pages(n);
  for (uint32_t i = 0; i < n; ++i) {
    pages[i].buffer.resize(offer.page_sizes(i));
  }
  InOrderPages arrived(n);
  client::BulkSink sink;
  sink.stripe_pages = kCompressedStripePages;
  sink.destination = [&pages](uint32_t page,
                              uint64_t) -> absl::StatusOr<uint8_t*> {
    return reinterpret_cast<uint8_t*>(pages[page].buffer.data());
  };
  sink.done = [&arrived](uint32_t page) {
    arrived.Arrived(page);
    return absl::OkStatus();
  };
  client::BulkReceive receive(offer, sink,
                              std::string(TargetHost(options.address)),
                              c.deadline, options.verify_checksums);
  absl::Status received;
  std::thread receiver([&] {
    received = receive.Run();
    arrived.Stopped();
  });
  // Hands each page over as soon as it and those before it are in. A sink
  // error cancels the call, which ends the receivers (the daemon shuts
  // their connections down).
  absl::Status delivered;
  uint32_t next = 0;
  for (; next < n && arrived.Wait(next); ++next) {
    client::CompressedPage& p = pages[next];
    p.handle = offer.page_handles(next);
    p.tier = static_cast<client::Tier>(offer.page_tiers(next));
    p.codec = offer.page_codecs(next);
    p.calibration_fingerprint = offer.page_calibration_fingerprints(next);
    delivered = on_page(next, std::move(p));
    if (!delivered.ok()) {
      c.ctx.TryCancel();
      break;
    }
  }
  receiver.join();
  const absl::Status s = !delivered.ok() ? delivered : received;
  if (absl::Status f = FinishBulkFetch(&c, s); !f.ok()) return f;
  return next;
}

}  // namespace kvharbor
