// BulkTicket (server/data/bulk_ticket.h).
#include "server/data/bulk_ticket.h"

#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvharbor {

namespace {

uint64_t BytesSent(const PinnedPages& pages, const PageRuns& runs) {
  if (pages.size() == 0) return 0;
  return runs.count == 0 ? pages.bytes(0).size() : runs.total();
}

}  // namespace

BulkTicket::BulkTicket(PinnedPages pages, const Options& options,
                       std::function<void(const absl::Status&)> done)
    : options_(options),
      page_bytes_(BytesSent(pages, options.runs)),
      num_pages_(pages.size()),
      pages_(std::move(pages)),
      fds_(options.connections, -1),
      claimed_(options.connections, false),
      done_(std::move(done)) {}

uint64_t BulkTicket::ConnectionBytes(uint32_t index) const {
  const uint64_t sp = options_.stripe_pages, n = options_.connections;
  uint64_t pages = 0;
  for (uint64_t s = index; s * sp < num_pages_; s += n) {
    pages += std::min<uint64_t>(sp, num_pages_ - s * sp);
  }
  return pages * page_bytes_;
}

absl::Status BulkTicket::Claim(uint32_t index, int fd) {
  absl::MutexLock l(&mu_);
  if (ended_) {
    return absl::FailedPreconditionError(
        "bulk hello.token: the transfer has ended (its Fetch finished, was "
        "cancelled or failed)");
  }
  if (claimed_[index]) {
    return absl::AlreadyExistsError(absl::StrCat(
        "bulk hello.index: connection ", index,
        " of this offer was opened before (a token is good for one "
        "connection per index)"));
  }
  claimed_[index] = true;
  fds_[index] = fd;
  ++sending_;
  return absl::OkStatus();
}

bool BulkTicket::all_claimed() const {
  absl::MutexLock l(&mu_);
  return std::all_of(claimed_.begin(), claimed_.end(),
                     [](bool c) { return c; });
}

bool BulkTicket::ended() const {
  absl::MutexLock l(&mu_);
  return ended_;
}

uint64_t BulkTicket::AppendStripe(uint32_t index, uint64_t offset,
                                  uint64_t max_bytes, size_t max_pieces,
                                  std::vector<iovec>* out) const {
  const uint64_t sp = options_.stripe_pages, n = options_.connections;
  const PageRuns& runs = options_.runs;
  uint64_t appended = 0;
  size_t pieces = 0;
  while (appended < max_bytes && pieces < max_pieces && page_bytes_ > 0) {
    // The connection's q-th page is page `q % sp` of its (q / sp)-th stripe.
    const uint64_t q = offset / page_bytes_;
    const uint64_t page = (index + (q / sp) * n) * sp + q % sp;
    if (page >= num_pages_) break;
    uint64_t in_page = offset % page_bytes_;
    const uint8_t* base = pages_.data(page);
    // The page's pieces: its runs, or all of it.
    const int count = runs.count == 0 ? 1 : runs.count;
    for (int r = 0; r < count && appended < max_bytes && pieces < max_pieces;
         ++r) {
      const uint64_t run_offset = runs.count == 0 ? 0 : runs.offset[r];
      const uint64_t run_bytes = runs.count == 0 ? page_bytes_ : runs.bytes[r];
      if (in_page >= run_bytes) {
        in_page -= run_bytes;
        continue;
      }
      const uint64_t take = std::min(run_bytes - in_page, max_bytes - appended);
      out->push_back(iovec{const_cast<uint8_t*>(base + run_offset + in_page),
                           static_cast<size_t>(take)});
      ++pieces;
      appended += take;
      offset += take;
      in_page = 0;
    }
  }
  return appended;
}

void BulkTicket::Finished(uint32_t index, const absl::Status& status) {
  {
    absl::MutexLock l(&mu_);
    fds_[index] = -1;
    --sending_;
    if (status.ok()) ++finished_;
    if (!ended_ && !status.ok()) {
      EndLocked(status, /*notify=*/true);
    } else if (!ended_ && finished_ == options_.connections) {
      EndLocked(absl::OkStatus(), /*notify=*/true);
    }
    MaybeReleaseLocked();
  }
  Notify();
}

void BulkTicket::Cancel(const absl::Status& status) {
  absl::MutexLock l(&mu_);
  if (!ended_) EndLocked(status, /*notify=*/false);
  MaybeReleaseLocked();
}

void BulkTicket::EndLocked(const absl::Status& s, bool notify) {
  ended_ = true;
  status_ = s;
  notify_ = notify;
  // Unblocks connections still sending (a stalled client's send returns).
  for (int fd : fds_) {
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
  }
}

void BulkTicket::MaybeReleaseLocked() {
  if (ended_ && sending_ == 0) pages_ = PinnedPages();
}

void BulkTicket::Notify() {
  absl::MutexLock c(&callback_mu_);
  std::function<void(const absl::Status&)> done;
  absl::Status status;
  {
    absl::MutexLock l(&mu_);
    if (!notify_) return;
    notify_ = false;
    done = std::move(done_);
    done_ = nullptr;
    status = status_;
  }
  if (done) done(status);
}

void BulkTicket::SetProgress(std::function<void()> progress) {
  absl::MutexLock l(&mu_);
  progress_ = std::move(progress);
}

void BulkTicket::NoteProgress() {
  absl::MutexLock l(&mu_);
  if (progress_) progress_();
}

void BulkTicket::Detach() {
  absl::MutexLock c(&callback_mu_);
  absl::MutexLock l(&mu_);
  done_ = nullptr;
  progress_ = nullptr;
  notify_ = false;
}

}  // namespace kvharbor
