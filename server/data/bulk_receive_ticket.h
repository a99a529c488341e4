// BulkReceiveTicket: an Insert's transfer on the bulk data plane
// (docs/data_plane.md "Insert"): its sent pages arrive on the connections
// straight into the slots the upload reserved (a placed upload in host
// memory: Upload::SlotData), each page hashed (XXH3-64) by the connection
// that received it, as it lands. The Insert reactor takes the upload back
// once every connection finished (TakeUpload) and accepts the pages against
// the client's declared checksums with those hashes, then commits.
//
// Sent pages that were already cached when the upload began (a prefix of
// them: Upload::skip_pages) have no slot; their bytes are received into a
// scratch page and dropped, as the Insert stream drops them.
//
// Memory: owns the upload while connections write into its slots. A
// transfer that ends in failure or is cancelled destroys it (aborting it:
// nothing stored, the slots back in the pool) once no connection writes.
// Thread-safe (BulkTicket); each connection writes only its own pages' slots
// and hashes.
#ifndef KVHARBOR_SERVER_DATA_BULK_RECEIVE_TICKET_H_
#define KVHARBOR_SERVER_DATA_BULK_RECEIVE_TICKET_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/store/upload.h"
#include "server/data/bulk_ticket.h"

namespace kvharbor {

class BulkReceiveTicket final : public BulkTicket {
 public:
  // `upload`: a placed upload whose slots are in host memory; its sent
  // pages (Upload::sent_pages) are the ticket's pages, in order.
  BulkReceiveTicket(std::unique_ptr<Upload> upload, const Options& options,
                    uint64_t page_bytes,
                    std::function<void(const absl::Status&)> done);

  absl::Status Transfer(int fd, uint32_t index,
                        std::atomic<uint64_t>* moved) override;
  // After the transfer ended with every connection finished: the upload and
  // the hash of each written sent page as received (sent pages
  // [written_from(), num_pages())); null before, or after a failure.
  std::unique_ptr<Upload> TakeUpload(std::vector<uint64_t>* hashes);
  // The first sent page with a slot (the ones before it are dropped).
  uint32_t written_from() const { return written_from_; }

 private:
  void EndedLocked(bool ok) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<Upload> upload_ ABSL_GUARDED_BY(mu_);
  bool complete_ ABSL_GUARDED_BY(mu_) = false;
  // Where sent page i goes (null: dropped); written at construction, read
  // by connections.
  std::vector<uint8_t*> slots_;
  uint32_t written_from_ = 0;
  // Page i's hash, written by the one connection that receives it.
  std::vector<uint64_t> hashes_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DATA_BULK_RECEIVE_TICKET_H_
