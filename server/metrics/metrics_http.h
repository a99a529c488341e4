// MetricsHttpServer: serves GET /metrics (Prometheus text format 0.0.4) over
// HTTP/1.1 with cpp-httplib, rendering a metrics::Registry on each request.
//
// Any other path is 404. The listener does not set SO_REUSEPORT, so a busy
// port is an error instead of a silently shared one. Connections are closed
// after each response (scrapes are seconds apart), so Stop() never waits on
// an idle keep-alive connection; it waits at most for a request being read
// or written (bounded by 2 s / 5 s timeouts).
//
// With an `authorize` function every request must carry an "Authorization:
// Bearer <token>" header it accepts (401 without one, 403 for one it
// refuses); without, the endpoint is open (keep it on loopback).
//
// The registry must outlive the server. Requests are served on two threads
// of the server's own; Stop must not be called concurrently with itself (the
// Daemon calls it under its shutdown lock); the destructor stops the server.
#ifndef KVHARBOR_SERVER_METRICS_METRICS_HTTP_H_
#define KVHARBOR_SERVER_METRICS_METRICS_HTTP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/metrics/metrics.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace kvharbor {

class MetricsHttpServer {
 public:
  // OK when the value of a request's Authorization header may scrape;
  // Unauthenticated / PermissionDenied otherwise. Called on the server's
  // threads.
  using Authorizer = std::function<absl::Status(absl::string_view)>;

  // Binds `listen` ("HOST:PORT", HOST may be a bracketed IPv6 address; port
  // 0 picks a free port) and serves until Stop. Errors name `field`.
  // `authorize` null: no token needed.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, const metrics::Registry* registry,
      absl::string_view field, Authorizer authorize = nullptr);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }
  // Closes the listener and waits for the serving threads. Idempotent.
  void Stop();

 private:
  MetricsHttpServer() = default;

  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_METRICS_METRICS_HTTP_H_
