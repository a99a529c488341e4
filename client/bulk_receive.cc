// BulkReceive and the offer's checks (client/bulk_receive.h).
#include "client/bulk_receive.h"

#include <sys/socket.h>
#include <unistd.h>
#include <xxh3.h>

#include <algorithm>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/bulk_socket.h"
#include "core/base/socket_io.h"
#include "types/bulk_wire.h"

namespace kvharbor {
namespace client {

absl::Status CheckBulkOffer(const v1::BulkOffer& o, uint32_t connections,
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
    return bad(
        "page_sizes/page_codecs/page_calibration_fingerprints: not "
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

uint64_t OfferedPageBytes(const v1::BulkOffer& o, uint32_t page) {
  return o.page_sizes_size() == 0 ? o.page_bytes() : o.page_sizes(page);
}

BulkReceive::BulkReceive(const v1::BulkOffer& offer, const BulkSink& sink,
                         std::string host, absl::Time deadline, bool verify)
    : offer_(offer),
      sink_(sink),
      host_(std::move(host)),
      deadline_(deadline),
      verify_(verify),
      fds_(offer.connections(), -1) {}

absl::Status BulkReceive::Run() {
  std::vector<std::thread> threads;
  for (uint32_t i = 1; i < offer_.connections(); ++i) {
    threads.emplace_back([this, i] { Connection(i); });
  }
  Connection(0);
  for (std::thread& t : threads) t.join();
  absl::MutexLock l(&mu_);
  return error_;
}

void BulkReceive::Connection(uint32_t index) {
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

absl::Status BulkReceive::Serve(uint32_t index) {
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
        return absl::DataLossError(
            absl::StrFormat("bulk: page %u does not match its checksum", page));
      }
      if (sink_.done) {
        if (absl::Status d = sink_.done(page); !d.ok()) return d;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace client
}  // namespace kvharbor
