// Client::Impl::SendBulkInsert: an Insert's page bytes on the daemon's bulk
// data plane (docs/data_plane.md "Insert"). The Insert stream carries the
// header (with InsertHeader.bulk) and, once the bytes are in, the
// half-close; the daemon's offer comes in the stream's initial metadata.
// Each connection's thread writes its stripes' pages straight from the
// caller's memory (sendmsg over up to 64 pages), half-closes, and waits
// for the daemon to close (it has then received and hashed every byte).
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/bulk_socket.h"
#include "client/client_impl.h"
#include "core/base/socket_io.h"
#include "types/bulk_wire.h"

namespace kvharbor {

namespace {

constexpr size_t kSendPieces = 64;

// Sends the pages of connection `index` of `offer` on `fd`.
absl::Status SendStripes(int fd, const v1::BulkOffer& offer, uint32_t index,
                         absl::Span<const absl::Span<const uint8_t>> pages) {
  const uint64_t sp = offer.stripe_pages(), c = offer.connections();
  std::vector<iovec> pieces;
  auto flush = [&]() -> absl::Status {
    const int sent = SendPieces(fd, absl::MakeSpan(pieces));
    pieces.clear();
    if (sent == 0) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat("bulk: connection ", index,
                     " broke while sending: ", SocketErrorText(sent)));
  };
  for (uint64_t s = index; s * sp < pages.size(); s += c) {
    for (uint64_t p = s * sp;
         p < std::min<uint64_t>(pages.size(), (s + 1) * sp); ++p) {
      pieces.push_back(
          iovec{const_cast<uint8_t*>(pages[p].data()), pages[p].size()});
      if (pieces.size() == kSendPieces) {
        if (absl::Status st = flush(); !st.ok()) return st;
      }
    }
  }
  if (absl::Status st = flush(); !st.ok()) return st;
  // Done sending: the daemon reads to the end, checks that nothing more
  // comes, and closes once it has every byte.
  shutdown(fd, SHUT_WR);
  uint8_t byte;
  const ssize_t r = recv(fd, &byte, 1, 0);
  if (r != 0) {
    return absl::UnavailableError(absl::StrCat(
        "bulk: connection ", index,
        " did not end cleanly after its pages (the daemon's status says why)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Client::Impl::SendBulkInsert(
    const v1::BulkOffer& offer,
    absl::Span<const absl::Span<const uint8_t>> pages,
    absl::Time deadline) const {
  if (offer.token().size() != kBulkTokenBytes || offer.port() == 0 ||
      offer.port() > 65535 ||
      offer.connections() != options.data_plane_connections ||
      offer.stripe_pages() == 0 ||
      (!pages.empty() && offer.page_bytes() != pages[0].size())) {
    return absl::InternalError(
        "bulk_offer: the daemon's insert offer does not match the request");
  }
  const std::string host(TargetHost(options.address));
  absl::Mutex mu;
  absl::Status error;
  std::vector<int> fds(offer.connections(), -1);
  auto connection = [&](uint32_t index) {
    absl::Status s;
    absl::StatusOr<int> fd = client::ConnectTcp(host, offer.port(), deadline);
    if (!fd.ok()) {
      s = fd.status();
    } else {
      {
        absl::MutexLock l(&mu);
        fds[index] = *fd;
      }
      s = client::BulkHandshake(*fd, offer, index);
      if (s.ok()) s = SendStripes(*fd, offer, index, pages);
    }
    absl::MutexLock l(&mu);
    if (fds[index] >= 0) close(fds[index]);
    fds[index] = -1;
    if (!s.ok() && error.ok()) {
      error = s;
      for (int other : fds) {
        if (other >= 0) shutdown(other, SHUT_RDWR);
      }
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t i = 1; i < offer.connections(); ++i) {
    threads.emplace_back(connection, i);
  }
  connection(0);
  for (std::thread& t : threads) t.join();
  absl::MutexLock l(&mu);
  return error;
}

bool Client::Impl::BulkWanted() const {
  return bulk_allowed &&
         absl::GetCurrentTimeNanos() >= bulk_retry_after_ns.load();
}

void Client::Impl::NoteBulkNotOffered() const {
  bulk_retry_after_ns.store(absl::GetCurrentTimeNanos() +
                            absl::ToInt64Nanoseconds(kBulkRetry));
}

}  // namespace kvharbor
