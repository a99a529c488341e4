// BulkServer: the TCP side of the bulk data plane (docs/data_plane.md): a
// listening socket whose connections each carry one connection index of a
// BulkTicket's transfer, either way.
//
// A connection must send its BulkHello (types/bulk_wire.h) within
// hello_timeout; the server claims the hello's index in the
// BulkTicketTable, answers with a BulkAccept and, when accepted, runs the
// ticket's Transfer for that index (a Fetch's stripes sent straight from the
// pinned pages, or an Insert's received straight into its slots), then
// closes the connection. A peer that moves no byte for idle_timeout is
// dropped (its call then fails). Beyond max_connections open at once a new
// connection gets a RESOURCE_EXHAUSTED accept and is closed, so a flood of
// connections holds at most that many threads and descriptors and ends nothing
// but itself.
//
// Memory: owns the listening socket and one thread per open connection;
// the table must outlive it. Thread-safe; Stop (also run by the
// destructor) shuts every connection down and waits for its thread.
#ifndef KVHARBOR_SERVER_DATA_BULK_SERVER_H_
#define KVHARBOR_SERVER_DATA_BULK_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/data/bulk_ticket_table.h"

namespace kvharbor {

struct BulkServerOptions {
  // HOST:PORT to listen on ([v6]:PORT for IPv6; port 0 = any free one).
  std::string listen = "0.0.0.0:0";
  size_t max_connections = 64;
  absl::Duration hello_timeout = absl::Seconds(5);
  // A claimed connection that moves no byte for this long is dropped (its
  // transfer then fails).
  absl::Duration idle_timeout = absl::Seconds(30);
};

class BulkServer {
 public:
  // Binds and listens (INVALID_ARGUMENT naming data_plane.listen for an
  // address that does not parse, UNAVAILABLE when bind fails).
  static absl::StatusOr<std::unique_ptr<BulkServer>> Start(
      const BulkServerOptions& options, BulkTicketTable* tickets);
  ~BulkServer();
  BulkServer(const BulkServer&) = delete;
  BulkServer& operator=(const BulkServer&) = delete;

  uint16_t port() const { return port_; }
  // Connections refused for max_connections so far.
  uint64_t refused() const { return refused_.load(); }
  // Bytes moved on the plane so far, both ways.
  uint64_t bytes_moved() const { return moved_.load(); }
  void Stop();

 private:
  BulkServer(BulkServerOptions options, BulkTicketTable* tickets, int fd,
             int wake, uint16_t port);
  void AcceptLoop();
  void Serve(int fd);
  // Serves an accepted connection's hello and stripes; the status it ends
  // with (for the ticket, when it got one).
  void ServeClaimed(int fd, const BulkHello& hello,
                    const std::shared_ptr<BulkTicket>& ticket);

  const BulkServerOptions options_;
  BulkTicketTable* const tickets_;
  const int listen_fd_;
  const int wake_fd_;  // eventfd that ends AcceptLoop
  const uint16_t port_;
  std::thread acceptor_;
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> moved_{0};
  absl::Mutex mu_;
  absl::flat_hash_set<int> open_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DATA_BULK_SERVER_H_
