// BulkSendTicket: a Fetch's transfer on the bulk data plane (docs/data_plane.md
// "Wire"): the pinned pages it sends (whole, or a layer range's runs of
// each), written on each connection straight from the pages with sendmsg
// over up to 64 pieces at a time, no copy in user space.
//
// Memory: owns the pinned pages until the transfer ends and no connection
// sends (EndedLocked), so a client that sees the Fetch's status may insert
// into the room they held. Thread-safe (BulkTicket); Transfer reads the
// pages without the lock, which is safe because they are released only
// once every claimed connection has reported Finished.
#ifndef KVHARBOR_SERVER_DATA_BULK_SEND_TICKET_H_
#define KVHARBOR_SERVER_DATA_BULK_SEND_TICKET_H_

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/store/pinned_pages.h"
#include "server/data/bulk_ticket.h"
#include "types/layer_range.h"

namespace kvharbor {

class BulkSendTicket final : public BulkTicket {
 public:
  // `runs` (count 0: whole pages) selects the bytes of each page sent.
  // Raw pages all have one size; compressed ones (PinnedPages::format()
  // kCompressed, whole pages only) each that of its codec buffer.
  BulkSendTicket(PinnedPages pages, const Options& options, PageRuns runs,
                 std::function<void(const absl::Status&)> done);

  absl::Status Transfer(int fd, uint32_t index,
                        std::atomic<uint64_t>* moved) override;

  // Where a connection's sending stands: its q-th page, bytes into it.
  struct Cursor {
    uint64_t q = 0;
    uint64_t in_page = 0;
  };
  // Appends to `out` the pieces of connection `index`'s next bytes from
  // `*at`, up to max_bytes in at most max_pieces pieces, and moves `*at`
  // past them; returns the bytes appended (0 at the end).
  uint64_t AppendStripe(uint32_t index, Cursor* at, uint64_t max_bytes,
                        size_t max_pieces, std::vector<iovec>* out) const;
  // Bytes sent for page `page`: its runs' or its whole size.
  uint64_t SentBytes(size_t page) const;
  // Bytes connection `index` carries.
  uint64_t ConnectionBytes(uint32_t index) const;

 private:
  void EndedLocked(bool ok) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PageRuns runs_;
  const uint64_t total_bytes_;  // of every page, for the byte counters
  PinnedPages pages_;           // released by EndedLocked
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DATA_BULK_SEND_TICKET_H_
