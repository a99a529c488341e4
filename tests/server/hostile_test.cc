// Hostile clients against the daemon (issue 18), each found by trying and
// reproduced here: a tenant's unread Fetch streams, a connection's many
// calls, an Insert header with no data, Stats' totals and /metrics across
// tenants, and the shared arena's descriptor. Each test checks that the
// abuse is bounded and that another tenant or connection goes on.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/memory/host_arena.h"
#include "server/rpc/service.h"
#include "tests/server/http_get.h"
#include "tests/server/server_test_util.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::system_clock;

constexpr char kAReader[] = "a-read-token-00000000001";
constexpr char kBReader[] = "b-read-token-00000000002";
constexpr char kAAdmin[] = "a-admin-token-0000000003";
constexpr char kOperator[] = "operator-token-000000004";

std::string TokensFile(const TempDir& dir) {
  return dir.Write("tokens.yaml",
                   absl::StrCat("tokens:\n"
                                "  - {token: ",
                                kAReader,
                                ", tenant: a, role: read}\n"
                                "  - {token: ",
                                kBReader,
                                ", tenant: b, role: read}\n"
                                "  - {token: ",
                                kAAdmin,
                                ", tenant: a, role: admin}\n"
                                "  - {token: ",
                                kOperator,
                                ", tenant: ops, role: admin, daemon_admin: "
                                "true}\n"));
}

NamespaceSpec Owned(NamespaceSpec spec, const std::string& name,
                    const std::string& tenant) {
  spec.name = name;
  spec.tenant = tenant;
  return spec;
}

// A daemon with tokens: tenant a owns "big" (1 MiB pages) and "test", tenant
// b owns "b-test".
DaemonOptions TenantOptions(const std::string& tokens_file) {
  DaemonOptions o = BigPageOptions();
  o.security.tokens_file = tokens_file;
  o.namespaces[0] = Owned(o.namespaces[0], kNs, "a");
  o.namespaces[1] = Owned(o.namespaces[1], "big", "a");
  o.namespaces.push_back(Owned(o.namespaces[0], "b-test", "b"));
  return o;
}

void Authorize(grpc::ClientContext* ctx, const std::string& token) {
  ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  ctx->set_deadline(Clock::now() + std::chrono::seconds(20));
}

std::shared_ptr<grpc::Channel> OwnChannel(const Daemon& d) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(64 << 20);
  // A client that reads nothing keeps its flow-control window where it
  // starts: with BDP probing on, a quiet loopback sometimes grew the window
  // until a whole 8 MiB Fetch fit and the stream finished unread.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return grpc::CreateCustomChannel(d.address(),
                                   grpc::InsecureChannelCredentials(), args);
}

grpc::Status Match(v1::KvHarbor::Stub* stub, const std::string& token,
                   const std::string& ns, bool lock = false,
                   v1::MatchResponse* out = nullptr) {
  grpc::ClientContext ctx;
  Authorize(&ctx, token);
  v1::MatchRequest req;
  req.set_namespace_(ns);
  for (int32_t t : Tokens(kPageSize, 1)) req.add_token_ids(t);
  req.set_lock(lock);
  v1::MatchResponse resp;
  return stub->Match(&ctx, req, out != nullptr ? out : &resp);
}

// A Fetch stream whose client never reads.
struct UnreadFetch {
  UnreadFetch(v1::KvHarbor::Stub* stub, const std::string& token,
              uint64_t lease) {
    Authorize(&ctx, token);
    v1::FetchRequest req;
    req.set_namespace_("big");
    req.set_lease_id(lease);
    reader = stub->Fetch(&ctx, req);
  }
  grpc::Status Finish() {
    v1::FetchResponse r;
    while (reader->Read(&r)) {
    }
    return reader->Finish();
  }
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::FetchResponse>> reader;
};

TEST_CASE("hostile: one tenant's unread Fetch streams cannot starve another",
          "[server][limits][hostile]") {
  // Found: 1,030 Fetch streams that a read-only token never read filled the
  // daemon's 1,024 in-flight places; every other tenant's Match was then
  // RESOURCE_EXHAUSTED, and idle streams never timed out.
  TempDir dir;
  DaemonOptions o = TenantOptions(TokensFile(dir));
  o.limits.max_in_flight_calls = 16;
  o.limits.max_in_flight_calls_per_tenant = 6;
  o.limits.fetch_idle_timeout = absl::Milliseconds(400);
  TestServer t(o);
  // Tenant a's 8 pages of 1 MiB, leased: one Fetch is 8 MiB, far beyond
  // what flow control lets through to a client that does not read.
  auto big = t.ns("big");
  const size_t big_page = big->page_bytes();
  const std::vector<int32_t> tokens = Tokens(8 * 32, 1);
  {
    grpc::ClientContext ctx;
    Authorize(&ctx, kAAdmin);
    v1::InsertResponse resp;
    auto w = t.stub->Insert(&ctx, &resp);
    for (const v1::InsertRequest& m :
         InsertMessages("big", tokens, RandomBytes(8 * big_page, 1), 1 << 20)) {
      REQUIRE(w->Write(m));
    }
    w->WritesDone();
    REQUIRE(w->Finish().ok());
  }
  v1::MatchResponse lease;
  {
    grpc::ClientContext ctx;
    Authorize(&ctx, kAReader);
    v1::MatchRequest req;
    req.set_namespace_("big");
    for (int32_t x : tokens) req.add_token_ids(x);
    req.set_lock(true);
    REQUIRE(t.stub->Match(&ctx, req, &lease).ok());
  }
  // 20 unread streams from tenant a over 4 connections.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::KvHarbor::Stub>> stubs;
  std::vector<std::unique_ptr<UnreadFetch>> streams;
  for (int c = 0; c < 4; ++c) {
    channels.push_back(OwnChannel(*t.daemon));
    stubs.push_back(v1::KvHarbor::NewStub(channels.back()));
  }
  for (int i = 0; i < 20; ++i) {
    streams.push_back(std::make_unique<UnreadFetch>(
        stubs[i % 4].get(), kAReader, lease.lease_id()));
  }
  // The refused ones end at once; the 6 admitted ones stay, stalled.
  CallTracker& calls = t.daemon->service().calls();
  REQUIRE(Eventually([&] { return calls.in_flight() == 6; }));
  // Tenant b is served at once, every time.
  for (int i = 0; i < 20; ++i) {
    const grpc::Status s = Match(t.stub.get(), kBReader, "b-test");
    INFO(s.error_message());
    REQUIRE(s.ok());
  }
  // The admitted ones are cancelled once idle for 400 ms (read nothing
  // before that: reading is progress).
  const bool all_cancelled =
      Eventually([&] { return calls.idle_cancelled() == 6; });
  INFO("idle-cancelled " << calls.idle_cancelled() << ", in flight "
                         << calls.in_flight());
  REQUIRE(all_cancelled);
  // Tenant a got its 6 places; the rest were refused, naming the key.
  int refused = 0, cancelled = 0;
  for (auto& f : streams) {
    const grpc::Status s = f->Finish();
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      CHECK(absl::StartsWith(s.error_message(),
                             "limits.max_in_flight_calls_per_tenant: tenant "
                             "'a'"));
      ++refused;
    } else {
      INFO(s.error_code() << " " << s.error_message());
      CHECK(s.error_code() == grpc::StatusCode::CANCELLED);
      ++cancelled;
    }
  }
  CHECK(refused == 14);
  CHECK(cancelled == 6);
  CHECK(calls.idle_cancelled() == 6);
  CHECK(Match(t.stub.get(), kAReader, kNs).ok());  // a is served again
  CheckSettled(*big);
}

TEST_CASE("hostile: one connection's calls are bounded, others go on",
          "[server][limits][hostile]") {
  DaemonOptions o = TestOptions();
  o.limits.max_in_flight_calls_per_connection = 3;
  o.limits.max_concurrent_streams = 64;  // HTTP/2 would not stop them
  TestServer t(o);
  auto channel = OwnChannel(*t.daemon);
  auto stub = v1::KvHarbor::NewStub(channel);
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<v1::InsertResponse> resps(4);
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::InsertRequest>>> held;
  for (int i = 0; i < 4; ++i) {
    ctxs.push_back(std::make_unique<grpc::ClientContext>());
    ctxs.back()->set_deadline(Clock::now() + std::chrono::seconds(20));
    held.push_back(stub->Insert(ctxs.back().get(), &resps[i]));
    held.back()->Write(Header(kNs, Tokens(kPageSize, 100 * i)));
    if (i < 3) {
      REQUIRE(Eventually(
          [&] { return t.ns()->Counters().uploads_in_flight == i + 1u; }));
    }
  }
  held[3]->WritesDone();
  CheckError(held[3]->Finish(), grpc::StatusCode::RESOURCE_EXHAUSTED,
             "limits.max_in_flight_calls_per_connection");
  // Another connection is not affected.
  CHECK(MatchOk(t.stub.get(), Tokens(kPageSize, 1)).matched_tokens() == 0);
  for (int i = 0; i < 3; ++i) {
    ctxs[i]->TryCancel();
    held[i]->Finish();
  }
  CheckSettled(*t.ns());
}

TEST_CASE("hostile: an Insert header without data holds one slot, then goes",
          "[server][limits][hostile]") {
  // Found: one Insert header declaring 262,144 tokens, with no data,
  // evicted the whole namespace and held every slot indefinitely.
  DaemonOptions o = TestOptions();
  o.limits.upload_idle_timeout = absl::Milliseconds(300);
  TestServer t(o);
  auto ns = t.ns();
  // The namespace is full of cached pages.
  const std::string bytes = RandomBytes(kCapacityPages * kPageBytes, 7);
  const std::vector<int32_t> cached = Tokens(kCapacityPages * kPageSize, 1);
  REQUIRE(InsertPages(t.stub.get(), cached, bytes, 1 << 16).ok());
  REQUIRE(ns->Counters().cached_pages == kCapacityPages);
  grpc::ClientContext ctx;
  ctx.set_deadline(Clock::now() + std::chrono::seconds(20));
  v1::InsertResponse resp;
  auto writer = t.stub->Insert(&ctx, &resp);
  REQUIRE(
      writer->Write(Header(kNs, Tokens(kCapacityPages * kPageSize, 1000000))));
  REQUIRE(Eventually([&] { return ns->Counters().uploads_in_flight == 1; }));
  // One page made room for the first page's bytes; the rest stay cached.
  CHECK(ns->Counters().cached_pages == kCapacityPages - 1);
  // No data for 300 ms: cancelled, its slot back.
  const auto start = Clock::now();
  const grpc::Status s = writer->Finish();
  CHECK(s.error_code() == grpc::StatusCode::CANCELLED);
  CHECK(Clock::now() - start < std::chrono::seconds(5));
  CHECK(Eventually([&] {
    const NamespaceStats c = ns->Counters();
    return c.uploads_in_flight == 0 && c.free_pages == 1;
  }));
  CHECK(Eventually(
      [&] { return t.daemon->service().calls().idle_cancelled() == 1; }));
  CHECK(MatchOk(t.stub.get(), cached).matched_tokens() ==
        (kCapacityPages - 1) * kPageSize);
  CheckSettled(*ns);
}

TEST_CASE("hostile: a DeviceInsert that never begins is cancelled",
          "[server][limits][hostile]") {
  // Issue 34, row 2: DeviceInsert streams that never sent their begin were
  // watched by nothing and held their in-flight places for good (1030 of
  // them starved every other client). Until the begin, one is now cut like
  // an idle Insert.
  DaemonOptions o = TestOptions();
  o.limits.upload_idle_timeout = absl::Milliseconds(300);
  TestServer t(o);
  grpc::ClientContext ctx;
  ctx.set_deadline(Clock::now() + std::chrono::seconds(20));
  auto stream = t.stub->DeviceInsert(&ctx);
  CallTracker& calls = t.daemon->service().calls();
  REQUIRE(Eventually([&] { return calls.in_flight() == 1; }));
  const auto start = Clock::now();
  v1::DeviceInsertResponse resp;
  CHECK(!stream->Read(&resp));
  const grpc::Status s = stream->Finish();
  CHECK(s.error_code() == grpc::StatusCode::CANCELLED);
  CHECK(Clock::now() - start < std::chrono::seconds(5));
  CHECK(Eventually([&] { return calls.in_flight() == 0; }));
  CHECK(Eventually([&] { return calls.idle_cancelled() == 1; }));
}

TEST_CASE("hostile: long Matches wait on the work pool, short ones go on",
          "[server][limits][hostile]") {
  // Found: 8 clients looping Matches of 262,144 pages held gRPC's callback
  // threads (one per core); another tenant's one-page Match waited 240 ms
  // at the median. Long Matches now run on the service's WorkPool.
  TestServer t(TestOptions());
  const std::string bytes = RandomBytes(8 * kPageBytes, 3);
  REQUIRE(
      InsertPages(t.stub.get(), Tokens(8 * kPageSize, 1), bytes, 1 << 16).ok());
  // 8 cached pages, then a long miss: 8,192 tokens in all.
  const std::vector<int32_t> longer = Tokens(8192, 1);
  const auto long_match = [&](int deadline_ms, v1::MatchResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Clock::now() + milliseconds(deadline_ms));
    v1::MatchRequest req;
    req.set_namespace_(kNs);
    for (int32_t x : longer) req.add_token_ids(x);
    return t.stub->Match(&ctx, req, resp);
  };
  v1::MatchResponse resp;
  REQUIRE(long_match(20000, &resp).ok());
  CHECK(resp.matched_tokens() == 8 * kPageSize);
  // Every pool thread busy: a long Match waits (and its deadline passes),
  // a short one is served at once.
  WorkPool& pool = t.daemon->service().pool();
  absl::Notification go;
  std::atomic<int> busy{0};
  for (int i = 0; i < pool.threads(); ++i) {
    pool.Run("x", [&] {
      ++busy;
      go.WaitForNotification();
    });
  }
  REQUIRE(Eventually([&] { return busy == pool.threads(); }));
  const auto start = Clock::now();
  const grpc::Status waited = long_match(300, &resp);
  CHECK(waited.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK(pool.queued() == 1);
  CHECK(MatchOk(t.stub.get(), Tokens(kPageSize, 1)).matched_tokens() ==
        kPageSize);
  CHECK(Clock::now() - start < std::chrono::seconds(5));
  // Freed, the pool finds the waiting call over and does no work for it.
  go.Notify();
  CallTracker& calls = t.daemon->service().calls();
  CHECK(Eventually([&] { return calls.in_flight() == 0; }));
  CHECK(pool.queued() == 0);
  REQUIRE(long_match(20000, &resp).ok());
  CHECK(resp.matched_tokens() == 8 * kPageSize);
  CheckSettled(*t.ns());
}

TEST_CASE(
    "hostile: Stats' totals are the caller's tenant's, except the "
    "daemon admin's",
    "[server][security][hostile]") {
  // Found: an admin of tenant a saw every tenant's hits and misses.
  TempDir dir;
  TestServer t(TenantOptions(TokensFile(dir)));
  for (int i = 0; i < 3; ++i) {
    REQUIRE(Match(t.stub.get(), kBReader, "b-test").ok());
  }
  const auto global = [&](const std::string& token) {
    grpc::ClientContext ctx;
    Authorize(&ctx, token);
    v1::StatsRequest req;
    v1::StatsResponse resp;
    REQUIRE(t.stub->Stats(&ctx, req, &resp).ok());
    return resp.global();
  };
  const v1::GlobalStats a = global(kAAdmin);
  CHECK(a.namespaces() == 2);   // "test" and "big"
  CHECK(a.miss_tokens() == 0);  // b's misses are b's
  const v1::GlobalStats b = global(kBReader);
  CHECK(b.namespaces() == 1);
  CHECK(b.miss_tokens() == 3 * kPageSize);
  const v1::GlobalStats op = global(kOperator);
  CHECK(op.namespaces() == 3);
  CHECK(op.miss_tokens() == 3 * kPageSize);
}

TEST_CASE("hostile: /metrics can require a daemon_admin token",
          "[server][security][hostile]") {
  // Found: /metrics listed every tenant's namespace names to anyone.
  TempDir dir;
  DaemonOptions o = TenantOptions(TokensFile(dir));
  o.metrics_listen = "127.0.0.1:0";
  o.metrics_require_token = true;
  TestServer t(o);
  const int port = t.daemon->metrics_port();
  REQUIRE(port > 0);
  const HttpResponse none = HttpGet(port, "/metrics");
  CHECK(none.status == 401);
  CHECK_FALSE(absl::StrContains(none.body, "b-test"));
  const HttpResponse tenant =
      HttpGet(port, "/metrics",
              absl::StrCat("Authorization: Bearer ", kAAdmin, "\r\n"));
  CHECK(tenant.status == 403);
  CHECK_FALSE(absl::StrContains(tenant.body, "b-test"));
  const HttpResponse bad = HttpGet(
      port, "/metrics", "Authorization: Bearer not-a-token-0000000000\r\n");
  CHECK(bad.status == 401);
  const HttpResponse op =
      HttpGet(port, "/metrics",
              absl::StrCat("Authorization: Bearer ", kOperator, "\r\n"));
  CHECK(op.status == 200);
  CHECK(absl::StrContains(op.body, "namespace=\"b-test\""));
  // Without tokens the option is refused at start.
  DaemonOptions plain = TestOptions();
  plain.metrics_listen = "127.0.0.1:0";
  plain.metrics_require_token = true;
  const absl::Status s = ValidateDaemonOptions(plain, "flags");
  CHECK(absl::StrContains(s.message(), "metrics.require_token"));
}

// One greeting from the host IPC socket: the descriptor it carries.
int ReceiveArenaFd(const std::string& path) {
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(sock);
    return -1;
  }
  char data[256];
  iovec iov{data, sizeof(data)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  int fd = -1;
  if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) > 0) {
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
         c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_type == SCM_RIGHTS)
        std::memcpy(&fd, CMSG_DATA(c), sizeof(fd));
    }
  }
  close(sock);
  return fd;
}

TEST_CASE("hostile: the arena a client gets cannot be written, reopened or not",
          "[server][security][hostile][host_ipc]") {
  // Found: the memfd was mode 0777 with only F_SEAL_SEAL; a client reopened
  // /proc/self/fd/N O_RDWR and wrote into every tenant's pages, which a raw
  // Fetch then served and Demote wrote to disk under a fresh checksum.
  TempDir dir;
  DaemonOptions o = TestOptions();
  o.host_ipc.socket = dir.path + "/kvh.sock";
  TestServer t(o);
  const std::string bytes = RandomBytes(2 * kPageBytes, 11);
  REQUIRE(
      InsertPages(t.stub.get(), Tokens(2 * kPageSize, 1), bytes, 4096).ok());
  const int fd = ReceiveArenaFd(o.host_ipc.socket);
  REQUIRE(fd >= 0);
  CHECK((fcntl(fd, F_GET_SEALS) & HostArena::RequiredSeals()) ==
        HostArena::RequiredSeals());
  struct stat st;
  REQUIRE(fstat(fd, &st) == 0);
  CHECK((st.st_mode & 07777) == 0400);
  const int rw =
      open(absl::StrCat("/proc/self/fd/", fd).c_str(), O_RDWR | O_CLOEXEC);
  for (int d : {fd, rw}) {
    if (d < 0) continue;  // not root: the mode refused the reopening
    CHECK(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, d, 0) ==
          MAP_FAILED);
    const char b = 0;
    CHECK(pwrite(d, &b, 1, 0) == -1);
    CHECK(ftruncate(d, 0) == -1);
  }
  if (rw >= 0) close(rw);
  close(fd);
  // The daemon still serves the bytes it was given.
  v1::FetchRequest req;
  req.set_namespace_(kNs);
  *req.mutable_pages()->mutable_page_handles() =
      MatchOk(t.stub.get(), Tokens(2 * kPageSize, 1)).page_handles();
  const FetchResult f = FetchAll(t.stub.get(), req);
  REQUIRE(f.status.ok());
  CHECK(Reassemble(f, 1 << 20) == bytes);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
