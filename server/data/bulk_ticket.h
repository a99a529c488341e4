// BulkTicket: one Fetch's transfer on the bulk data plane (docs/data_plane.md):
// the pinned pages it sends, how they are cut into stripes over its
// connections, which connections have claimed their index and which have
// finished, and whom to tell when the transfer ends.
//
// The Fetch reactor (server/rpc/bulk_fetch_reactor.h) makes it from the
// call's pinned pages and files it in the BulkTicketTable under a random
// token; each data connection that presents the token claims one index
// (once), sends that index's stripes (AppendStripe) and reports Finished.
// The ticket ends at the first failure or when every index finished; then
// its `done` callback runs once, outside the ticket's lock, after the pins
// are released (a client that sees the Fetch's status may insert into the
// room at once). Cancel ends it from the call's side (cancel, deadline,
// idle timeout): its connections are shut down so that no thread stays
// blocked in a send.
//
// Memory: owns the pinned pages until the transfer ends; shared by the
// reactor, the table and the connections serving it (shared_ptr). Thread-
// safe; AppendStripe reads the pages without the lock, which is safe
// because they are released only once no connection is sending (every
// claimed connection has reported Finished).
#ifndef KVHARBOR_SERVER_DATA_BULK_TICKET_H_
#define KVHARBOR_SERVER_DATA_BULK_TICKET_H_

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/store/pinned_pages.h"
#include "types/layer_range.h"

namespace kvharbor {

class BulkTicket {
 public:
  struct Options {
    uint32_t connections = 1;
    uint32_t stripe_pages = 1;
    PageRuns runs;  // count 0: whole pages
  };
  // `done` is called once with the transfer's status (see above).
  BulkTicket(PinnedPages pages, const Options& options,
             std::function<void(const absl::Status&)> done);
  BulkTicket(const BulkTicket&) = delete;
  BulkTicket& operator=(const BulkTicket&) = delete;

  uint32_t connections() const { return options_.connections; }
  // Bytes sent of every page (its runs, or all of it).
  uint64_t page_bytes() const { return page_bytes_; }
  size_t num_pages() const { return num_pages_; }
  // Bytes connection `index` sends in all.
  uint64_t ConnectionBytes(uint32_t index) const;

  // Claims `index` for a connection whose descriptor is `fd` (shut down by
  // Cancel). ALREADY_EXISTS when it was claimed before, FAILED_PRECONDITION
  // when the transfer has ended.
  absl::Status Claim(uint32_t index, int fd);
  // Appends to `out` the pieces of connection `index`'s bytes
  // [offset, offset + up to max_bytes), at most max_pieces of them; returns
  // the bytes appended (0 at the end). Only between Claim and Finished.
  uint64_t AppendStripe(uint32_t index, uint64_t offset, uint64_t max_bytes,
                        size_t max_pieces, std::vector<iovec>* out) const;
  // Connection `index` is done (with its status); it no longer touches the
  // pages or its descriptor.
  void Finished(uint32_t index, const absl::Status& status);
  // Ends the transfer from the call's side with `status` (no `done`).
  void Cancel(const absl::Status& status);
  // Called (under the ticket's lock, so cheap) as bytes go out: the
  // reactor's idle-timeout entry. Cleared by Detach.
  void SetProgress(std::function<void()> progress);
  void NoteProgress();
  // The reactor is going: `done` and the progress callback are never called
  // after this returns.
  void Detach();
  bool ended() const;
  bool all_claimed() const;

 private:
  // Ends the transfer with `s`; `notify`: `done` is to be called (Notify).
  void EndLocked(const absl::Status& s, bool notify)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the pins once the transfer ended and no connection sends.
  void MaybeReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `done` if EndLocked asked for it and no Detach came first.
  void Notify();

  const Options options_;
  const uint64_t page_bytes_;
  const size_t num_pages_;
  PinnedPages pages_;  // released when the transfer ends and no one sends
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(callback_mu_);
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);  // -1: not claimed / done
  std::vector<bool> claimed_ ABSL_GUARDED_BY(mu_);
  uint32_t sending_ ABSL_GUARDED_BY(mu_) = 0;   // claimed, not finished
  uint32_t finished_ ABSL_GUARDED_BY(mu_) = 0;  // finished OK
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool notify_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::function<void(const absl::Status&)> done_ ABSL_GUARDED_BY(mu_);
  std::function<void()> progress_ ABSL_GUARDED_BY(mu_);
  // Serializes the `done` call against Detach (lock order: callback_mu_
  // before mu_).
  absl::Mutex callback_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DATA_BULK_TICKET_H_
