// BulkTicket: one call's transfer on the bulk data plane (docs/data_plane.md):
// how its pages are cut into stripes over its connections, which
// connections have claimed their index and which have finished, and whom to
// tell when the transfer ends. What moves, and which way, is a subclass's
// (Transfer): BulkSendTicket sends a Fetch's pinned pages, BulkReceiveTicket
// receives an Insert's pages into its reserved slots.
//
// The call's reactor makes the ticket and files it in the BulkTicketTable
// under a random token; each data connection that presents the token claims
// one index (once), runs Transfer for it and reports Finished. The ticket
// ends at the first failure or when every index finished; then its `done`
// callback runs once, outside the ticket's lock, after EndedLocked let the
// subclass drop what it no longer needs. Cancel ends it from the call's
// side (cancel, deadline, idle timeout): its connections are shut down so
// that no thread stays blocked in a send or receive.
//
// Memory: shared by the reactor, the table and the connections serving it
// (shared_ptr). Thread-safe. Lock order: callback_mu_ before mu_.
#ifndef KVHARBOR_SERVER_DATA_BULK_TICKET_H_
#define KVHARBOR_SERVER_DATA_BULK_TICKET_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace kvharbor {

class BulkTicket {
 public:
  struct Options {
    uint32_t connections = 1;
    uint32_t stripe_pages = 1;
  };
  virtual ~BulkTicket() = default;
  BulkTicket(const BulkTicket&) = delete;
  BulkTicket& operator=(const BulkTicket&) = delete;

  uint32_t connections() const { return options_.connections; }
  uint32_t stripe_pages() const { return options_.stripe_pages; }
  size_t num_pages() const { return num_pages_; }
  // Bytes of every page on the wire; 0 when they differ from page to page
  // (compressed pages: BulkSendTicket::SentBytes).
  uint64_t page_bytes() const { return page_bytes_; }
  // Pages connection `index` carries, and the page its q-th one is (stripe
  // s holds pages [s * stripe_pages, (s + 1) * stripe_pages) and travels on
  // connection s % connections).
  uint64_t ConnectionPages(uint32_t index) const;
  uint64_t StripePage(uint32_t index, uint64_t q) const;

  // Claims `index` for a connection whose descriptor is `fd` (shut down by
  // Cancel). ALREADY_EXISTS when it was claimed before, FAILED_PRECONDITION
  // when the transfer has ended.
  absl::Status Claim(uint32_t index, int fd);
  // Moves connection `index`'s pages on `fd` (a claimed connection, with
  // its timeouts set); adds the bytes moved to `*moved` as they go.
  virtual absl::Status Transfer(int fd, uint32_t index,
                                std::atomic<uint64_t>* moved) = 0;
  // Connection `index` is done (with its status); it no longer touches the
  // ticket's memory or its descriptor.
  void Finished(uint32_t index, const absl::Status& status);
  // Ends the transfer from the call's side with `status` (no `done`).
  void Cancel(const absl::Status& status);
  // Called (under the ticket's lock, so cheap) as bytes move: the call's
  // idle-timeout entry. Cleared by Detach.
  void SetProgress(std::function<void()> progress);
  void NoteProgress();
  // The reactor is going: `done` and the progress callback are never
  // called after this returns.
  void Detach();
  bool ended() const;
  bool all_claimed() const;

 protected:
  // `done` is called once with the transfer's status (see above).
  BulkTicket(const Options& options, size_t num_pages, uint64_t page_bytes,
             std::function<void(const absl::Status&)> done);
  // The transfer ended (`ok`: every connection finished) and no connection
  // is moving bytes: the subclass drops what it holds for them. Once.
  virtual void EndedLocked(bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;

  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(callback_mu_);

 private:
  void EndLocked(const absl::Status& s, bool notify)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `done` if EndLocked asked for it and no Detach came first.
  void Notify();

  const Options options_;
  const size_t num_pages_;
  const uint64_t page_bytes_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);  // -1: not claimed / done
  std::vector<bool> claimed_ ABSL_GUARDED_BY(mu_);
  uint32_t moving_ ABSL_GUARDED_BY(mu_) = 0;    // claimed, not finished
  uint32_t finished_ ABSL_GUARDED_BY(mu_) = 0;  // finished OK
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;  // EndedLocked ran
  bool notify_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::function<void(const absl::Status&)> done_ ABSL_GUARDED_BY(mu_);
  std::function<void()> progress_ ABSL_GUARDED_BY(mu_);
  absl::Mutex callback_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DATA_BULK_TICKET_H_
