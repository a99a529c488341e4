// BulkReceiveTicket (server/data/bulk_receive_ticket.h).
#include "server/data/bulk_receive_ticket.h"

#include <sys/socket.h>
#include <xxh3.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/socket_io.h"

namespace kvharbor {

namespace {

// Bytes received between two notes of progress.
constexpr uint64_t kProgressBytes = uint64_t{8} << 20;

uint32_t FirstSent(const Upload& u) { return u.num_pages() - u.sent_pages(); }

}  // namespace

BulkReceiveTicket::BulkReceiveTicket(
    std::unique_ptr<Upload> upload, const Options& options, uint64_t page_bytes,
    std::function<void(const absl::Status&)> done)
    : BulkTicket(options, upload->sent_pages(), page_bytes, std::move(done)),
      slots_(upload->sent_pages()),
      hashes_(upload->sent_pages()) {
  const uint32_t first = FirstSent(*upload);
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    slots_[i] = upload->SlotData(first + i);
    if (slots_[i] == nullptr) written_from_ = i + 1;
  }
  absl::MutexLock l(&mu_);
  upload_ = std::move(upload);
}

absl::Status BulkReceiveTicket::Transfer(int fd, uint32_t index,
                                         std::atomic<uint64_t>* moved) {
  const uint64_t pb = page_bytes(), pages = ConnectionPages(index);
  uint64_t since_progress = 0;
  std::vector<uint8_t> scratch;  // for pages already cached
  for (uint64_t q = 0; q < pages; ++q) {
    if (ended()) return absl::CancelledError("bulk: the transfer ended");
    const uint64_t page = StripePage(index, q);
    uint8_t* dst = slots_[page];
    if (dst == nullptr) {
      scratch.resize(pb);
      dst = scratch.data();
    }
    if (const int got = RecvFull(fd, dst, pb); got != 0) {
      return absl::UnavailableError(absl::StrCat(
          "bulk: connection ", index, " broke in page ", page, ": ",
          got == kPeerClosed ? "closed by the client"
          : got == EAGAIN || got == EWOULDBLOCK
              ? "the client sent nothing for the idle timeout"
              : SocketErrorText(got)));
    }
    moved->fetch_add(pb);
    hashes_[page] = XXH3_64bits(dst, pb);
    since_progress += pb;
    if (since_progress >= kProgressBytes) {
      NoteProgress();
      since_progress = 0;
    }
  }
  // Nothing may follow the last page: a peer sending more than it announced
  // is refused rather than ignored.
  uint8_t extra;
  const ssize_t r = recv(fd, &extra, 1, 0);
  if (r > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bulk: connection ", index, " sent more than its ", pages, " pages"));
  }
  if (r < 0) {
    return absl::UnavailableError(absl::StrCat(
        "bulk: connection ", index,
        " did not half-close after its pages (closed early or timed out)"));
  }
  return absl::OkStatus();
}

std::unique_ptr<Upload> BulkReceiveTicket::TakeUpload(
    std::vector<uint64_t>* hashes) {
  absl::MutexLock l(&mu_);
  if (!complete_) return nullptr;
  hashes->assign(hashes_.begin() + written_from_, hashes_.end());
  return std::move(upload_);
}

void BulkReceiveTicket::EndedLocked(bool ok) {
  complete_ = ok;
  if (!ok) upload_.reset();  // aborts: nothing stored, slots back
}

}  // namespace kvharbor
