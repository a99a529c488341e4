// UCX's TCP transport on loopback, next to the plain-socket ceiling that
// bench/tcp_link_bench.cc measures (issue 31: UCX's TCP path against a
// multi-connection socket plane and the tuned gRPC stream). For each count
// in --connections it opens that many independent UCX connections in one
// process: per connection a server worker with a listener on 127.0.0.1
// (port 0) and a client worker whose endpoint connects to it through UCX's
// sockaddr API, all workers of one UCP context. Once every endpoint has
// exchanged a handshake, one thread per worker per side moves --gib GiB in
// total, split over the connections, in --write_mib MiB messages (tagged or
// stream API, --api) from one buffer per sender into one buffer per
// receiver, each thread progressing only its own worker. Only the transfer
// is timed. The receiver checks the first and last byte of each message
// against the sender's pattern, so a number is only printed for bytes that
// arrived where they belong.
//
// UCX_TLS from the environment is honoured; when it is unset the bench sets
// it to "tcp" so that the measurement is UCX's TCP transport and not its
// shared-memory ones. The header line names the UCX version, the
// transports the endpoints actually use, and where UCX_TLS came from.
// Output is the same as tcp_link_bench's: one "%2d connections: %6.1f GB/s"
// line per count and, with --json, {"connections": {"1": GB/s, ...}}.
// Any UCX error is printed (ucs_status_string) and the bench exits 1.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

ABSL_FLAG(int, gib, 8, "GiB moved per connection count");
ABSL_FLAG(int, write_mib, 4, "MiB per message");
ABSL_FLAG(std::string, connections, "1,4,8", "connection counts to measure");
ABSL_FLAG(std::string, json, "", "also write the results here as JSON");
ABSL_FLAG(std::string, api, "tag",
          "UCP API moving the bytes: tag (ucp_tag_send_nbx/recv_nbx, "
          "rendezvous for large messages) or stream (ucp_stream_*_nbx)");
ABSL_FLAG(int, inflight, 4,
          "messages in flight per connection and direction; the receiver's "
          "buffer holds this many messages");

namespace {

constexpr ucp_tag_t kTag = 0x6b7668;  // "kvh"; one tag, so matching is FIFO.
constexpr ucp_tag_t kTagMask = ~ucp_tag_t{0};
// Message k is sent from offset k % kShift of the sender's buffer, so its
// first and last bytes differ from those of its neighbours.
constexpr uint64_t kShift = 256;

bool use_stream = false;  // --api=stream; set once in main.

// Prints the failed call and UCX's reason and exits 1. _exit, not exit:
// other threads may still be inside UCX.
[[noreturn]] void Fail(const char* what, ucs_status_t status) {
  std::fprintf(stderr, "ucx_link_bench: %s: %s\n", what,
               ucs_status_string(status));
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(1);
}

void Check(ucs_status_t status, const char* what) {
  if (status != UCS_OK) Fail(what, status);
}

// The sender buffer's byte at `offset`: odd multiplier, so 256 distinct
// consecutive values.
uint8_t Pattern(uint64_t offset) {
  return static_cast<uint8_t>(offset * 131 + 7);
}

// Waits for the operation behind `req` (as returned by an *_nbx call),
// progressing `a` and, when not null, `b` (both sides of a connection while
// the main thread drives them). Frees the request.
void Wait(ucs_status_ptr_t req, ucp_worker_h a, ucp_worker_h b,
          const char* what) {
  if (req == nullptr) return;
  if (UCS_PTR_IS_ERR(req)) Fail(what, UCS_PTR_STATUS(req));
  ucs_status_t status;
  while ((status = ucp_request_check_status(req)) == UCS_INPROGRESS) {
    ucp_worker_progress(a);
    if (b != nullptr) ucp_worker_progress(b);
  }
  ucp_request_free(req);
  Check(status, what);
}

// Posts a send of `len` bytes at `buf` on `ep`.
ucs_status_ptr_t PostSend(ucp_ep_h ep, const void* buf, size_t len) {
  ucp_request_param_t p{};
  return use_stream ? ucp_stream_send_nbx(ep, buf, len, &p)
                    : ucp_tag_send_nbx(ep, buf, len, kTag, &p);
}

// Posts a receive of exactly `len` bytes into `buf` (tag: from `worker`;
// stream: from `ep`, with WAITALL so one receive is one message).
ucs_status_ptr_t PostRecv(ucp_worker_h worker, ucp_ep_h ep, void* buf,
                          size_t len) {
  ucp_request_param_t p{};
  if (!use_stream) {
    return ucp_tag_recv_nbx(worker, buf, len, kTag, kTagMask, &p);
  }
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_STREAM_RECV_FLAG_WAITALL;
  size_t got = 0;  // Only written on immediate completion; WAITALL => len.
  return ucp_stream_recv_nbx(ep, buf, len, &got, &p);
}

// One connection: a server worker whose listener accepts exactly one
// endpoint, and a client worker whose endpoint connects to it.
struct Link {
  ucp_worker_h server = nullptr;
  ucp_worker_h client = nullptr;
  ucp_listener_h listener = nullptr;
  ucp_ep_h server_ep = nullptr;
  ucp_ep_h client_ep = nullptr;
};

// Runs on the server worker's progress: the client's connection request
// becomes the server's endpoint.
void OnConnRequest(ucp_conn_request_h request, void* arg) {
  Link* link = static_cast<Link*>(arg);
  if (link->server_ep != nullptr) {
    Check(ucp_listener_reject(link->listener, request), "ucp_listener_reject");
    return;
  }
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  p.conn_request = request;
  Check(ucp_ep_create(link->server, &p, &link->server_ep),
        "ucp_ep_create (server, from conn_request)");
}

ucp_worker_h NewWorker(ucp_context_h context) {
  ucp_worker_params_t p{};
  // Each worker is driven by one thread at a time (main during setup and
  // teardown, its own thread during the transfer).
  p.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  p.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  Check(ucp_worker_create(context, &p, &worker), "ucp_worker_create");
  return worker;
}

// Listens on 127.0.0.1, port 0; returns the port UCX bound.
uint16_t Listen(Link* link) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ucp_listener_params_t p{};
  p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                 UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&a);
  p.sockaddr.addrlen = sizeof(a);
  p.conn_handler.cb = OnConnRequest;
  p.conn_handler.arg = link;
  Check(ucp_listener_create(link->server, &p, &link->listener),
        "ucp_listener_create (127.0.0.1:0)");
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  Check(ucp_listener_query(link->listener, &attr), "ucp_listener_query");
  return ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
}

// Creates both workers, the listener and both endpoints, then sends one
// small message each way so that both endpoints are fully wired up before
// anything is timed.
void Connect(ucp_context_h context, Link* link) {
  link->server = NewWorker(context);
  link->client = NewWorker(context);
  const uint16_t port = Listen(link);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&a);
  p.sockaddr.addrlen = sizeof(a);
  Check(ucp_ep_create(link->client, &p, &link->client_ep),
        "ucp_ep_create (client, 127.0.0.1)");
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (link->server_ep == nullptr) {
    ucp_worker_progress(link->client);
    ucp_worker_progress(link->server);
    if (std::chrono::steady_clock::now() > deadline) {
      Fail("waiting for the connection request", UCS_ERR_TIMED_OUT);
    }
  }
  uint64_t ping = 1, pong = 0, back = 0;
  ucs_status_ptr_t r = PostRecv(link->server, link->server_ep, &pong, 8);
  Wait(PostSend(link->client_ep, &ping, 8), link->client, link->server,
       "handshake send (client)");
  Wait(r, link->server, link->client, "handshake recv (server)");
  r = PostRecv(link->client, link->client_ep, &back, 8);
  Wait(PostSend(link->server_ep, &pong, 8), link->server, link->client,
       "handshake send (server)");
  Wait(r, link->client, link->server, "handshake recv (client)");
  if (pong != 1 || back != 1) Fail("handshake", UCS_ERR_IO_ERROR);
}

// Closes both endpoints (flushing, so progress both sides) and frees the
// listener and workers.
void Close(Link* link) {
  ucp_request_param_t p{};
  ucs_status_ptr_t c = ucp_ep_close_nbx(link->client_ep, &p);
  ucs_status_ptr_t s = ucp_ep_close_nbx(link->server_ep, &p);
  Wait(c, link->client, link->server, "ucp_ep_close_nbx (client)");
  Wait(s, link->server, link->client, "ucp_ep_close_nbx (server)");
  ucp_listener_destroy(link->listener);
  ucp_worker_destroy(link->client);
  ucp_worker_destroy(link->server);
}

// The "transport/device" names of an endpoint's lanes, from
// ucp_ep_print_info (e.g. "tcp/lo"): what UCX chose, not what it may use.
// Its connection-manager lane is left out: UCX 1.13.1 names rdmacm there
// even on a host without RDMA devices, where the tcp one connected.
std::string Transports(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return "?";
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StrContains(line, "lane[")) continue;
    for (absl::string_view word : absl::StrSplit(line, ' ')) {
      const size_t colon = word.find(':');
      if (colon == absl::string_view::npos || !absl::StrContains(word, '/')) {
        continue;
      }
      // "1:tcp/lo.0": lane's resource index, transport/device, path index.
      absl::string_view name = word.substr(colon + 1);
      name = name.substr(0, name.rfind('.'));
      names.insert(std::string(name));
      break;
    }
  }
  std::free(text);
  return names.empty() ? "?" : absl::StrJoin(names, ",");
}

// The byte length of message k when `each` bytes go in `write`-byte
// messages.
uint64_t MessageLen(uint64_t k, uint64_t each, uint64_t write) {
  return std::min<uint64_t>(write, each - k * write);
}

// Sends `each` bytes over the link's client endpoint, `inflight` messages
// at a time, all from one buffer.
void Sender(const Link& link, uint64_t each, uint64_t write, int inflight) {
  std::vector<uint8_t> buf(write + kShift);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = Pattern(i);
  std::vector<ucs_status_ptr_t> slots(inflight, nullptr);
  const uint64_t messages = (each + write - 1) / write;
  for (uint64_t k = 0; k < messages; ++k) {
    ucs_status_ptr_t& slot = slots[k % inflight];
    Wait(slot, link.client, nullptr, "ucp send");
    slot = PostSend(link.client_ep, buf.data() + k % kShift,
                    MessageLen(k, each, write));
  }
  for (ucs_status_ptr_t& slot : slots) {
    Wait(slot, link.client, nullptr, "ucp send");
  }
}

// Checks message k's first and last byte (at `at`, `len` bytes) against
// the sender's pattern.
void CheckMessage(const uint8_t* at, uint64_t k, uint64_t len) {
  const uint64_t first = k % kShift;
  if (at[0] != Pattern(first) || at[len - 1] != Pattern(first + len - 1)) {
    std::fprintf(stderr, "ucx_link_bench: message %llu: wrong bytes\n",
                 static_cast<unsigned long long>(k));
    Fail("receive check", UCS_ERR_IO_ERROR);
  }
}

// Receives `each` bytes on the link's server side into one buffer of
// `inflight` message slots, checking each message as it completes.
void Receiver(const Link& link, uint64_t each, uint64_t write, int inflight) {
  std::vector<uint8_t> buf(write * inflight);
  std::vector<ucs_status_ptr_t> slots(inflight, nullptr);
  const uint64_t messages = (each + write - 1) / write;
  auto finish = [&](uint64_t k) {
    Wait(slots[k % inflight], link.server, nullptr, "ucp recv");
    slots[k % inflight] = nullptr;
    CheckMessage(&buf[(k % inflight) * write], k, MessageLen(k, each, write));
  };
  for (uint64_t k = 0; k < messages; ++k) {
    if (k >= static_cast<uint64_t>(inflight)) finish(k - inflight);
    slots[k % inflight] =
        PostRecv(link.server, link.server_ep, &buf[(k % inflight) * write],
                 MessageLen(k, each, write));
  }
  const uint64_t first =
      messages > static_cast<uint64_t>(inflight) ? messages - inflight : 0;
  for (uint64_t k = first; k < messages; ++k) finish(k);
}

// GB/s (1e9 B/s) of `bytes` over `n` UCX connections; prints the
// transports of the first connection when `print_transports`.
double Measure(ucp_context_h context, int n, uint64_t bytes, uint64_t write,
               bool print_transports) {
  std::vector<std::unique_ptr<Link>> links;
  for (int i = 0; i < n; ++i) {
    links.push_back(std::make_unique<Link>());
    Connect(context, links.back().get());
  }
  if (print_transports) {
    std::printf("UCX lanes: client %s, server %s\n",
                Transports(links[0]->client_ep).c_str(),
                Transports(links[0]->server_ep).c_str());
  }
  const uint64_t each = bytes / n;
  const int inflight = absl::GetFlag(FLAGS_inflight);
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::unique_ptr<Link>& link : links) {
    threads.emplace_back(Sender, std::cref(*link), each, write, inflight);
    threads.emplace_back(Receiver, std::cref(*link), each, write, inflight);
  }
  for (std::thread& t : threads) t.join();
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  for (const std::unique_ptr<Link>& link : links) Close(link.get());
  return static_cast<double>(each * n) / s / 1e9;
}

// One context for all workers of both sides; UCX_TLS defaults to "tcp".
// Returns where UCX_TLS came from for the header line.
ucp_context_h InitContext(std::string* tls_note) {
  const char* tls = std::getenv("UCX_TLS");
  if (tls == nullptr) {
    setenv("UCX_TLS", "tcp", 1);
    *tls_note = "UCX_TLS=tcp (unset, so set by this bench: TCP transport)";
  } else {
    *tls_note = absl::StrCat("UCX_TLS=", tls, " (from the environment)");
  }
  ucp_config_t* config = nullptr;
  Check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  p.features = use_stream ? UCP_FEATURE_STREAM : UCP_FEATURE_TAG;
  // The workers run on different threads at once.
  p.mt_workers_shared = 1;
  ucp_context_h context = nullptr;
  const ucs_status_t status = ucp_init(&p, config, &context);
  ucp_config_release(config);
  Check(status, "ucp_init");
  return context;
}

// Parses --connections; empty on a bad entry (after saying why).
std::vector<int> ConnectionCounts() {
  std::vector<int> counts;
  for (absl::string_view c :
       absl::StrSplit(absl::GetFlag(FLAGS_connections), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(c, &n) || n < 1 || n > 64) {
      std::fprintf(stderr, "--connections: '%s' is not 1 to 64\n",
                   std::string(c).c_str());
      return {};
    }
    counts.push_back(n);
  }
  return counts;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string api = absl::GetFlag(FLAGS_api);
  if ((api != "tag" && api != "stream") || absl::GetFlag(FLAGS_inflight) < 1 ||
      absl::GetFlag(FLAGS_write_mib) < 1 || absl::GetFlag(FLAGS_gib) < 1) {
    std::fprintf(stderr,
                 "--api is tag or stream; --inflight, --write_mib and "
                 "--gib are >= 1\n");
    return 2;
  }
  use_stream = api == "stream";
  const std::vector<int> counts = ConnectionCounts();
  if (counts.empty()) return 2;
  const uint64_t bytes = uint64_t(absl::GetFlag(FLAGS_gib)) << 30;
  const uint64_t write = uint64_t(absl::GetFlag(FLAGS_write_mib)) << 20;
  std::string tls_note;
  ucp_context_h context = InitContext(&tls_note);
  std::printf(
      "UCX %s loopback, %s API, %s\n"
      "%d GiB per count, %d MiB messages, %d in flight, %u CPUs\n",
      ucp_get_version_string(), api.c_str(), tls_note.c_str(),
      absl::GetFlag(FLAGS_gib), absl::GetFlag(FLAGS_write_mib),
      absl::GetFlag(FLAGS_inflight), std::thread::hardware_concurrency());
  std::vector<std::string> json;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double gbs = Measure(context, counts[i], bytes, write, i == 0);
    std::printf("%2d connections: %6.1f GB/s\n", counts[i], gbs);
    std::fflush(stdout);
    json.push_back(absl::StrCat("\"", counts[i], "\": ", gbs));
  }
  ucp_cleanup(context);
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_json))
        << "{\"connections\": {" << absl::StrJoin(json, ", ") << "}}\n";
  }
  return 0;
}
