// Faults seen through the daemon: the pool exhausted by leases, a client
// whose TCP connection drops mid-upload, a deadline expiring mid-fetch, a
// corrupted stored buffer (refused with DATA_LOSS and counted in /metrics).
// The SIGKILL + warm restart test is in crash_restart_test.cc.
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/http_get.h"
#include "tests/server/server_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

// A loopback TCP proxy to the daemon whose connections the test can cut
// abruptly (no gRPC cancel, no RST_STREAM): what a crashed client or a
// broken network looks like to the server.
class CutProxy {
 public:
  explicit CutProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    REQUIRE(bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) == 0);
    REQUIRE(listen(listen_fd_, 8) == 0);
    REQUIRE(getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) ==
            0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~CutProxy() {
    stop_ = true;
    thread_.join();
    Cut();
    close(listen_fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // Drops every proxied connection at once.
  void Cut() {
    std::lock_guard<std::mutex> l(mu_);
    for (int fd : fds_) {
      shutdown(fd, SHUT_RDWR);
      close(fd);
    }
    fds_.clear();
  }

 private:
  int Connect() const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(target_port_);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }
  // Accepts and pumps bytes both ways until stopped.
  void Run() {
    std::vector<std::pair<int, int>> pairs;  // (from, to), both directions
    while (!stop_) {
      std::vector<pollfd> p{{listen_fd_, POLLIN, 0}};
      {
        std::lock_guard<std::mutex> l(mu_);
        for (auto& [from, to] : pairs) p.push_back({from, POLLIN, 0});
      }
      if (poll(p.data(), p.size(), 20) <= 0) continue;
      if (p[0].revents & POLLIN) {
        const int c = accept(listen_fd_, nullptr, nullptr);
        const int s = Connect();
        if (c >= 0 && s >= 0) {
          std::lock_guard<std::mutex> l(mu_);
          fds_.push_back(c);
          fds_.push_back(s);
          pairs.emplace_back(c, s);
          pairs.emplace_back(s, c);
        }
      }
      for (size_t i = 1; i < p.size(); ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[1 << 16];
        const ssize_t n = read(p[i].fd, buf, sizeof(buf));
        if (n > 0) {
          (void)!write(pairs[i - 1].second, buf, static_cast<size_t>(n));
        }
      }
      std::lock_guard<std::mutex> l(mu_);
      // Forget pairs whose sockets Cut() closed.
      std::vector<std::pair<int, int>> live;
      for (auto& pr : pairs) {
        bool open = false;
        for (int fd : fds_) open |= fd == pr.first;
        if (open) live.push_back(pr);
      }
      pairs.swap(live);
    }
  }

  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<int> fds_;  // guarded by mu_
  std::thread thread_;
};

int PortOf(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

TEST_CASE("faults: a pool exhausted by leases refuses inserts, loses nothing",
          "[server][faults]") {
  TestServer s;
  std::shared_ptr<Namespace> ns = s.ns();
  // Fill every slot with 4 prompts of 8 pages, each leased.
  std::vector<std::string> data;
  std::vector<uint64_t> leases;
  for (int i = 0; i < 4; ++i) {
    const std::vector<int32_t> t = Tokens(8 * kPageSize, 1000 * (i + 1));
    data.push_back(RandomBytes(8 * kPageBytes, 40 + i));
    REQUIRE(InsertPages(s.stub.get(), t, data.back(), 3000).ok());
    leases.push_back(MatchOk(s.stub.get(), t, true).lease_id());
  }
  REQUIRE(ns->Counters().free_pages == 0);
  REQUIRE(ns->Counters().evictable_pages == 0);
  const Snapshot before = Snap(*ns);
  grpc::Status st = InsertPages(s.stub.get(), Tokens(kPageSize, 9),
                                RandomBytes(kPageBytes, 9), 1000);
  CHECK(st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  INFO(st.error_message());
  CHECK(st.error_message().find("full") != std::string::npos);
  CheckSettled(*ns);
  const Snapshot after = Snap(*ns);
  CHECK(after.c.cached_pages == before.c.cached_pages);
  CHECK(after.tree == before.tree);
  CHECK(after.c.uploads_in_flight == 0);
  // Every leased page is still there, byte-exact.
  for (size_t i = 0; i < leases.size(); ++i) {
    v1::FetchRequest req;
    req.set_namespace_(kNs);
    req.set_lease_id(leases[i]);
    FetchResult f = FetchAll(s.stub.get(), req);
    REQUIRE(f.status.ok());
    CHECK(Reassemble(f, 1 << 20) == data[i]);
  }
  // Releasing one lease makes room again.
  grpc::ClientContext ctx;
  v1::ReleaseRequest rel;
  rel.set_lease_id(leases[0]);
  v1::ReleaseResponse rr;
  REQUIRE(s.stub->Release(&ctx, rel, &rr).ok());
  CHECK(InsertPages(s.stub.get(), Tokens(kPageSize, 9),
                    RandomBytes(kPageBytes, 9), 1000)
            .ok());
  CheckSettled(*ns);
}

TEST_CASE("faults: a connection dropped mid-upload leaves nothing behind",
          "[server][faults]") {
  TestServer s;
  std::shared_ptr<Namespace> ns = s.ns();
  REQUIRE(InsertPages(s.stub.get(), Tokens(2 * kPageSize, 500),
                      RandomBytes(2 * kPageBytes, 1), 4096)
              .ok());
  const Snapshot before = Snap(*ns);
  CutProxy proxy(PortOf(s.daemon->address()));
  auto ch =
      grpc::CreateChannel(proxy.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::KvHarbor::NewStub(ch);
  const std::vector<int32_t> tokens = Tokens(6 * kPageSize, 1);
  const std::string bytes = RandomBytes(6 * kPageBytes, 2);
  grpc::ClientContext ctx;
  v1::InsertResponse resp;
  auto writer = stub->Insert(&ctx, &resp);
  REQUIRE(writer->Write(Header(kNs, tokens)));
  // Two and a half pages arrive; the connection dies in the middle.
  REQUIRE(writer->Write(Chunk(0, bytes.substr(0, 10000))));
  REQUIRE(Eventually([&] { return ns->Counters().uploads_in_flight == 1; }));
  CHECK(ns->Counters().free_pages == kCapacityPages - 2 - 6);
  proxy.Cut();
  CHECK(!writer->Finish().ok());
  CheckSettled(*ns);
  const NamespaceStats c = ns->Counters();
  CHECK(c.free_pages == kCapacityPages - 2);
  CHECK(c.cached_pages == before.c.cached_pages);
  CHECK(Snap(*ns).tree == before.tree);
  CHECK(MatchOk(s.stub.get(), tokens).matched_tokens() == 0);
}

TEST_CASE(
    "faults: a deadline expiring mid-fetch stops the stream, the lease "
    "and pages stay intact",
    "[server][faults]") {
  TestServer s(BigPageOptions());
  std::shared_ptr<Namespace> ns = s.ns("big");
  const uint64_t capacity = ns->Counters().capacity_pages;
  const size_t pages = 8;
  const std::vector<int32_t> tokens = Tokens(pages * 32, 1);
  const std::string bytes = RandomBytes(pages << 20, 3);
  REQUIRE(
      InsertPages(s.stub.get(), tokens, bytes, 1 << 20, nullptr, "big").ok());
  v1::MatchResponse m = MatchOk(s.stub.get(), tokens, true, 60000, "big");
  REQUIRE(m.lease_id() != 0);
  v1::FetchRequest req;
  req.set_namespace_("big");
  req.set_lease_id(m.lease_id());
  req.set_max_chunk_bytes(4096);
  const uint64_t out_before = ns->Counters().bytes_out;
  {
    // A connection of its own: the Insert above has grown the shared one's
    // HTTP/2 window (BDP probing) far beyond what this fetch sends.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = v1::KvHarbor::NewStub(grpc::CreateCustomChannel(
        s.daemon->address(), grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(500));
    auto reader = stub->Fetch(&ctx, req);
    v1::FetchResponse r;
    REQUIRE(reader->Read(&r));
    // Stop reading until the deadline has passed; the server's writes
    // block on flow control meanwhile.
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
    while (reader->Read(&r)) {
    }
    CHECK(reader->Finish().error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // The server stopped sending (far from all bytes went out) and its pins
  // are gone (checked by the EvictAll below).
  CheckSettled(*ns);
  NamespaceStats c = ns->Counters();
  CHECK(c.bytes_out - out_before < (pages << 20));
  CHECK(c.active_leases == 1);
  CHECK(c.cached_pages == pages);
  CHECK(c.free_pages == capacity - pages);
  // The same lease still fetches every page byte-exact.
  req.set_max_chunk_bytes(1 << 20);
  FetchResult f = FetchAll(s.stub.get(), req);
  REQUIRE(f.status.ok());
  std::string got;
  for (const v1::FetchResponse& ch : f.chunks) got += ch.data();
  CHECK(got == bytes);
  grpc::ClientContext rctx;
  v1::ReleaseRequest rel;
  rel.set_lease_id(m.lease_id());
  v1::ReleaseResponse rr;
  REQUIRE(s.stub->Release(&rctx, rel, &rr).ok());
  // With the lease gone and no pins left, every slot can be freed.
  REQUIRE(ns->EvictAll().pages == pages);
  CHECK(ns->Counters().free_pages == capacity);
  CheckSettled(*ns);
}

TEST_CASE(
    "faults: a corrupted host-compressed buffer is refused and counted "
    "in /metrics",
    "[server][faults]") {
  DaemonOptions o = TestOptions();
  o.metrics_listen = "127.0.0.1:0";
  o.namespaces[0].host_compressed_bytes = 16 * (kPageBytes + 512);
  TestServer s(o);
  std::shared_ptr<Namespace> ns = s.ns();
  const std::vector<int32_t> tokens = Tokens(3 * kPageSize, 1);
  const std::string bytes = RandomBytes(3 * kPageBytes, 4);
  REQUIRE(InsertPages(s.stub.get(), tokens, bytes, 4096).ok());
  REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 3);
  v1::MatchResponse m = MatchOk(s.stub.get(), tokens);
  REQUIRE(m.page_handles_size() == 3);
  {
    // A memory fault in the stored buffer of the last page.
    const PageHandle h = m.page_handles(2);
    auto pinned =
        ns->PinPages(absl::MakeConstSpan(&h, 1), FetchFormat::kCompressed);
    REQUIRE(pinned.ok());
    const absl::string_view b = pinned->bytes(0);
    const_cast<char*>(b.data())[b.size() / 3] ^= 0x01;
  }
  v1::FetchRequest req;
  req.set_namespace_(kNs);
  for (uint64_t h : m.page_handles()) req.mutable_pages()->add_page_handles(h);
  FetchResult f = FetchAll(s.stub.get(), req);
  CHECK(f.status.error_code() == grpc::StatusCode::DATA_LOSS);
  CHECK(f.chunks.empty());  // nothing of a corrupt request is sent
  // A miss from then on; the intact prefix is still served.
  CHECK(MatchOk(s.stub.get(), tokens).matched_tokens() == 2 * kPageSize);
  const std::string body = HttpGet(s.daemon->metrics_port(), "/metrics").body;
  CHECK(
      body.find("kvharbor_corrupt_pages_dropped_total{namespace=\"test\"} 1") !=
      std::string::npos);
  CheckSettled(*ns);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
