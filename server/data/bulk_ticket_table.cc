// BulkTicketTable (server/data/bulk_ticket_table.h).
#include "server/data/bulk_ticket_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/random_bytes.h"

namespace kvharbor {

namespace {

std::string Key(const BulkToken& t) {
  return std::string(reinterpret_cast<const char*>(t.data()), t.size());
}

}  // namespace

absl::StatusOr<BulkToken> BulkTicketTable::Add(
    std::shared_ptr<BulkTicket> ticket) {
  BulkToken token;
  if (absl::Status s = FillRandom(token.data(), token.size(), "data plane");
      !s.ok()) {
    return s;
  }
  absl::MutexLock l(&mu_);
  if (tickets_.size() >= max_tickets_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "bulk: ", tickets_.size(),
        " transfers are open on the data plane, the daemon's limit "
        "(data_plane.max_connections); retry later"));
  }
  tickets_.emplace(Key(token), std::move(ticket));
  return token;
}

absl::StatusOr<std::shared_ptr<BulkTicket>> BulkTicketTable::Claim(
    const BulkHello& hello, int fd) {
  absl::MutexLock l(&mu_);
  auto it = tickets_.find(Key(hello.token));
  if (it == tickets_.end()) {
    return absl::PermissionDeniedError(
        "bulk hello.token: unknown (never issued, already used by every "
        "connection of its offer, or its Fetch has ended)");
  }
  std::shared_ptr<BulkTicket> ticket = it->second;
  if (hello.connections != ticket->connections()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bulk hello.connections: ", hello.connections,
                     " but the offer has ", ticket->connections()));
  }
  if (absl::Status s = ticket->Claim(hello.index, fd); !s.ok()) return s;
  // Single use: once every index is claimed the token opens nothing more.
  if (ticket->all_claimed()) tickets_.erase(it);
  return ticket;
}

void BulkTicketTable::Remove(const BulkToken& token) {
  absl::MutexLock l(&mu_);
  tickets_.erase(Key(token));
}

size_t BulkTicketTable::size() const {
  absl::MutexLock l(&mu_);
  return tickets_.size();
}

}  // namespace kvharbor
