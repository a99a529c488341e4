// BulkTicketTable: the open transfers of the bulk data plane, by token
// (docs/data_plane.md "Security").
//
// A token is 32 bytes from getrandom(2), known only to the daemon and to
// the client of the one Fetch call it was issued on (in its BulkOffer, on
// the authenticated control plane). It is a capability for that call's
// pinned pages and nothing else: a data connection that presents it
// claims one connection index, once; when every index is claimed the
// token is dropped, and the reactor drops it when the call ends whatever
// happened. A token that is unknown, dropped or replayed gets
// PERMISSION_DENIED (or ALREADY_EXISTS for an index opened twice while
// others are still open) and that connection is closed; nothing else is
// affected.
//
// Memory: shares the tickets (shared_ptr) with their reactors and
// connections. Thread-safe.
#ifndef KVHARBOR_SERVER_DATA_BULK_TICKET_TABLE_H_
#define KVHARBOR_SERVER_DATA_BULK_TICKET_TABLE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/data/bulk_ticket.h"
#include "types/bulk_wire.h"

namespace kvharbor {

class BulkTicketTable {
 public:
  // At most `max_tickets` open at once (RESOURCE_EXHAUSTED beyond).
  explicit BulkTicketTable(size_t max_tickets) : max_tickets_(max_tickets) {}

  // Files `ticket` under a new random token.
  absl::StatusOr<BulkToken> Add(std::shared_ptr<BulkTicket> ticket);
  // The ticket of `hello.token` with `hello.index` claimed for `fd` (see
  // above; INVALID_ARGUMENT when hello.connections is not the ticket's).
  absl::StatusOr<std::shared_ptr<BulkTicket>> Claim(const BulkHello& hello,
                                                    int fd);
  void Remove(const BulkToken& token);
  size_t size() const;

 private:
  const size_t max_tickets_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<BulkTicket>> tickets_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DATA_BULK_TICKET_TABLE_H_
