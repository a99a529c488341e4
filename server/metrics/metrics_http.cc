#include "server/metrics/metrics_http.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvharbor {

namespace {

// "HOST:PORT" -> host (brackets of an IPv6 address removed) and port.
bool SplitListen(absl::string_view listen, std::string* host, int* port) {
  const size_t colon = listen.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  absl::string_view h = listen.substr(0, colon);
  absl::string_view p = listen.substr(colon + 1);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') {
    h = h.substr(1, h.size() - 2);
  }
  if (h.empty() || p.empty() ||
      p.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(p, port) || *port < 0 || *port > 65535) {
    return false;
  }
  *host = std::string(h);
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, const metrics::Registry* registry,
    absl::string_view field, Authorizer authorize) {
  std::string host;
  int port = 0;
  if (!SplitListen(listen, &host, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", listen,
                     "' is not HOST:PORT (PORT 0..65535; 0 picks a free "
                     "port)"));
  }
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->http_ = std::make_unique<httplib::Server>();
  httplib::Server& http = *s->http_;
  // httplib's default socket options add SO_REUSEPORT; keep only REUSEADDR
  // (rebinding a port in TIME_WAIT after a restart).
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  http.set_keep_alive_max_count(1);
  http.set_read_timeout(std::chrono::seconds(2));
  http.set_write_timeout(std::chrono::seconds(5));
  http.set_payload_max_length(64 << 10);
  http.Get("/metrics", [registry, authorize](const httplib::Request& req,
                                             httplib::Response& res) {
    if (authorize != nullptr) {
      const absl::Status ok = authorize(req.get_header_value("Authorization"));
      if (!ok.ok()) {
        const bool unauthenticated = absl::IsUnauthenticated(ok);
        res.status = unauthenticated ? 401 : 403;
        if (unauthenticated) {
          res.set_header("WWW-Authenticate", "Bearer realm=\"kvharbord\"");
        }
        res.set_content(absl::StrCat(ok.message(), "\n"), "text/plain");
        return;
      }
    }
    res.set_content(registry->Render(), metrics::kContentType);
  });
  int bound = -1;
  if (port == 0) {
    bound = http.bind_to_any_port(host);
  } else if (http.bind_to_port(host, port)) {
    bound = port;
  }
  if (bound <= 0) {
    return absl::UnavailableError(
        absl::StrCat(field, ": cannot serve metrics on '", listen,
                     "' (address in use, not local, or malformed)"));
  }
  s->port_ = bound;
  s->thread_ = std::thread([&http] { http.listen_after_bind(); });
  // stop() only takes effect once the accept loop runs; wait for it so that
  // a Stop right after Start cannot be lost.
  while (!http.is_running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return s;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (!thread_.joinable()) return;
  http_->stop();
  thread_.join();
}

}  // namespace kvharbor
