// BulkTicket (server/data/bulk_ticket.h).
#include "server/data/bulk_ticket.h"

#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvharbor {

BulkTicket::BulkTicket(const Options& options, size_t num_pages,
                       uint64_t page_bytes,
                       std::function<void(const absl::Status&)> done)
    : options_(options),
      num_pages_(num_pages),
      page_bytes_(page_bytes),
      fds_(options.connections, -1),
      claimed_(options.connections, false),
      done_(std::move(done)) {}

uint64_t BulkTicket::ConnectionPages(uint32_t index) const {
  const uint64_t sp = options_.stripe_pages, n = options_.connections;
  uint64_t pages = 0;
  for (uint64_t s = index; s * sp < num_pages_; s += n) {
    pages += std::min<uint64_t>(sp, num_pages_ - s * sp);
  }
  return pages;
}

uint64_t BulkTicket::StripePage(uint32_t index, uint64_t q) const {
  const uint64_t sp = options_.stripe_pages, n = options_.connections;
  return (index + (q / sp) * n) * sp + q % sp;
}

absl::Status BulkTicket::Claim(uint32_t index, int fd) {
  absl::MutexLock l(&mu_);
  if (ended_) {
    return absl::FailedPreconditionError(
        "bulk hello.token: the transfer has ended (its call finished, was "
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
  ++moving_;
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

void BulkTicket::Finished(uint32_t index, const absl::Status& status) {
  {
    absl::MutexLock l(&mu_);
    fds_[index] = -1;
    --moving_;
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
  // Unblocks connections still moving bytes (a stalled peer's send or
  // receive returns).
  for (int fd : fds_) {
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
  }
}

void BulkTicket::MaybeReleaseLocked() {
  if (!ended_ || moving_ != 0 || released_) return;
  released_ = true;
  EndedLocked(status_.ok() && finished_ == options_.connections);
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
