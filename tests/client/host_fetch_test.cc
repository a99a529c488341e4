// Same-host Fetch through shared memory: a daemon with store.host_ipc_socket
// hands its host arena to the SDK, whose Fetch of a lease then copies the
// pages out of it. Checked here: byte-exact copies (whole leases and
// ranges), the GetHostHandles errors (off, unknown lease, cold pages), the
// fallbacks to the gRPC stream, a copy that fails its checksum (never
// returned), the socket's life cycle (stale file, busy path, removal at
// stop), the read-only descriptor, and another daemon's socket refused.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "core/memory/host_arena.h"
#include "kvharbor/checksum.h"
#include "kvharbor/client.h"
#include "kvharbor/host_ipc.h"
#include "server/daemon/daemon.h"
#include "server/local/host_ipc_server.h"
#include "spdlog/spdlog.h"
#include "tests/client/client_test_util.h"
#include "tests/temp_dir.h"
#include "types/host_ipc_wire.h"

namespace kvharbor {
namespace testing {
namespace {

constexpr uint32_t kPageSize = 4;
// fp16, 2 layers, 2 heads, head_dim 8: 512-byte pages.
constexpr uint64_t kPageBytes = 2 * 2 * kPageSize * 2 * 8 * 2;

std::unique_ptr<Daemon> StartShmDaemon(const std::string& socket) {
  spdlog::set_level(spdlog::level::warn);
  DaemonOptions o;
  o.listen = "127.0.0.1:0";
  o.store.pool_budget_bytes = 1 << 20;
  o.store.default_namespace_bytes = 8 * kPageBytes;
  o.host_ipc.socket = socket;
  o.drain_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  return *std::move(d);
}

client::NamespaceSpec Spec(const std::string& name, uint32_t pages,
                           bool tiered = false) {
  client::NamespaceSpec s = MakeSpec(name, 2, 2, 8, kPageSize,
                                     client::DType::kFP16, pages * kPageBytes);
  if (tiered) s.host_compressed_bytes = 1 << 16;
  return s;
}

client::Lease Lock(Client& c, const std::string& ns,
                   const std::vector<int32_t>& tokens) {
  absl::StatusOr<client::Lease> l = c.Match(ns, tokens, /*lock=*/true);
  INFO(l.status().ToString());
  REQUIRE(l.ok());
  REQUIRE(l->locked());
  REQUIRE(l->matched_tokens == tokens.size());
  return *l;
}

void ExpectError(const absl::Status& s, absl::StatusCode code,
                 const std::string& starts_with) {
  INFO(s.ToString());
  CHECK(s.code() == code);
  CHECK(absl::StartsWith(s.message(), starts_with));
}

TEST_CASE("Same-host Fetch copies leased pages byte-exact from the arena",
          "[client][host_ipc]") {
  TempDir dir;
  const std::string sock = dir.path + "/kvh.sock";
  std::unique_ptr<Daemon> d = StartShmDaemon(sock);
  CHECK(d->host_ipc_socket() == sock);
  CHECK(IsSocket(sock));
  std::unique_ptr<Client> c = Connect(*d);
  REQUIRE(c->CreateNamespace(Spec("a", 8)).ok());
  REQUIRE(c->CreateNamespace(Spec("b", 8)).ok());
  const auto tokens = TokenRange(5 * kPageSize, 100);
  const auto pages = RandomBytes(5 * kPageBytes, 3);
  const auto other = RandomBytes(5 * kPageBytes, 4);
  REQUIRE(c->Insert("a", tokens, pages, kPageBytes).ok());
  REQUIRE(c->Insert("b", tokens, other, kPageBytes).ok());
  const client::Lease la = Lock(*c, "a", tokens);
  const client::Lease lb = Lock(*c, "b", tokens);

  absl::StatusOr<client::HostHandles> h = c->GetHostHandles("a", la.id);
  INFO(h.status().ToString());
  REQUIRE(h.ok());
  CHECK(h->socket_path == sock);
  CHECK(h->daemon_id == d->daemon_id());
  CHECK(h->daemon_id != 0);
  CHECK(h->arena_bytes >= uint64_t{1} << 20);
  CHECK(h->arena_generation == 0);  // nothing given back yet
  CHECK(absl::ToUnixMillis(h->lease_expiry) == absl::ToUnixMillis(la.expiry));
  REQUIRE(h->pages.size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    INFO("page " << i);
    CHECK(h->pages[i].handle == la.pages[i]);
    CHECK(h->pages[i].bytes == kPageBytes);
    CHECK(h->pages[i].checksum ==
          client::PageChecksum(
              absl::MakeConstSpan(pages.data() + i * kPageBytes, kPageBytes)));
  }

  SECTION("arena_generation counts the ranges given back") {
    REQUIRE(c->Release(lb.id).ok());
    REQUIRE(c->DeleteNamespace("b").ok());
    // The pool's range goes back once the last reference lets it go.
    uint64_t gen = 0;
    for (int i = 0; i < 200 && gen == 0; ++i) {
      absl::StatusOr<client::HostHandles> again = c->GetHostHandles("a", la.id);
      REQUIRE(again.ok());
      gen = again->arena_generation;
      if (gen == 0) absl::SleepFor(absl::Milliseconds(10));
    }
    CHECK(gen == 1);
  }

  SECTION("FetchInto of a whole lease, two namespaces") {
    for (const auto* want : {&pages, &other}) {
      const bool is_a = want == &pages;
      std::vector<uint8_t> dst(want->size());
      absl::StatusOr<client::FetchResult> r =
          c->FetchInto(is_a ? "a" : "b",
                       client::FetchSource::FromLease(is_a ? la.id : lb.id),
                       absl::MakeSpan(dst));
      INFO(r.status().ToString());
      REQUIRE(r.ok());
      CHECK(r->path == client::FetchPath::kSharedMemory);
      CHECK(r->num_pages == 5);
      CHECK(r->page_bytes == kPageBytes);
      CHECK(r->handles == (is_a ? la.pages : lb.pages));
      CHECK(dst == *want);
    }
    const client::HostFetchStats s = c->host_fetch_stats();
    CHECK(s.shm_fetches == 2);
    CHECK(s.shm_pages == 10);
    CHECK(s.fallbacks == 0);
    CHECK(s.checksum_mismatches == 0);
    // The daemon counts what it offered, not what it sent: "a" described
    // its 5 pages twice (the GetHostHandles call above and the fetch).
    for (const auto& [name, pages_offered] :
         {std::pair<const char*, uint64_t>{"a", 10}, {"b", 5}}) {
      absl::StatusOr<client::Stats> st = c->Stats(name);
      REQUIRE(st.ok());
      REQUIRE(st->namespaces.size() == 1);
      CHECK(st->namespaces[0].host_ipc_bytes == pages_offered * kPageBytes);
      CHECK(st->namespaces[0].bytes_out == 0);
    }
  }
  SECTION("a page range, per-page destinations and Fetch") {
    std::vector<uint8_t> p0(kPageBytes), p1(kPageBytes);
    uint8_t* dsts[] = {p0.data(), p1.data()};
    absl::StatusOr<client::FetchResult> r =
        c->FetchInto("a", client::FetchSource::FromLease(la.id, 2, 2),
                     absl::MakeConstSpan(dsts), kPageBytes);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(r->path == client::FetchPath::kSharedMemory);
    REQUIRE(r->handles.size() == 2);
    CHECK(r->handles[0] == la.pages[2]);
    CHECK(std::memcmp(p0.data(), pages.data() + 2 * kPageBytes, kPageBytes) ==
          0);
    CHECK(std::memcmp(p1.data(), pages.data() + 3 * kPageBytes, kPageBytes) ==
          0);
    absl::StatusOr<std::vector<std::vector<uint8_t>>> all =
        c->Fetch("a", client::FetchSource::FromLease(la.id, 3));
    REQUIRE(all.ok());
    REQUIRE(all->size() == 2);
    CHECK(std::memcmp((*all)[1].data(), pages.data() + 4 * kPageBytes,
                      kPageBytes) == 0);
    CHECK(c->host_fetch_stats().shm_fetches == 2);
    // The mapping was made once for this process and daemon.
    CHECK(c->host_fetch_stats().connects == 1);
  }
  SECTION("a destination too small is the Fetch's own error") {
    std::vector<uint8_t> dst(2 * kPageBytes);
    absl::StatusOr<client::FetchResult> r = c->FetchInto(
        "a", client::FetchSource::FromLease(la.id), absl::MakeSpan(dst));
    ExpectError(r.status(), absl::StatusCode::kInvalidArgument, "dst");
  }
  SECTION("a range past the lease streams and gets the daemon's error") {
    std::vector<uint8_t> dst(5 * kPageBytes);
    absl::StatusOr<client::FetchResult> r = c->FetchInto(
        "a", client::FetchSource::FromLease(la.id, 9), absl::MakeSpan(dst));
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(c->host_fetch_stats().fallbacks == 1);
  }
  SECTION("kOff never asks for handles") {
    ClientOptions o;
    o.host_fetch = HostFetchMode::kOff;
    std::unique_ptr<Client> off = Connect(*d, o);
    std::vector<uint8_t> dst(pages.size());
    absl::StatusOr<client::FetchResult> r = off->FetchInto(
        "a", client::FetchSource::FromLease(la.id), absl::MakeSpan(dst));
    REQUIRE(r.ok());
    CHECK(r->path == client::FetchPath::kGrpc);
    CHECK(dst == pages);
    CHECK(off->host_fetch_stats().fallbacks == 0);
    CHECK(off->host_fetch_stats().shm_fetches == 0);
  }
}

TEST_CASE("GetHostHandles errors, and Fetch falls back to the stream",
          "[client][host_ipc]") {
  const auto tokens = TokenRange(3 * kPageSize, 10);
  const auto pages = RandomBytes(3 * kPageBytes, 9);

  SECTION("off: FAILED_PRECONDITION naming the key, Fetch streams") {
    std::unique_ptr<Daemon> d = StartTestDaemon(uint64_t{1} << 20);
    CHECK(d->host_ipc_socket().empty());
    std::unique_ptr<Client> c = Connect(*d);
    REQUIRE(c->CreateNamespace(Spec("n", 8)).ok());
    REQUIRE(c->Insert("n", tokens, pages, kPageBytes).ok());
    const client::Lease l = Lock(*c, "n", tokens);
    ExpectError(c->GetHostHandles("n", l.id).status(),
                absl::StatusCode::kFailedPrecondition, "store.host_ipc_socket");
    for (int i = 0; i < 2; ++i) {
      std::vector<uint8_t> dst(pages.size());
      absl::StatusOr<client::FetchResult> r = c->FetchInto(
          "n", client::FetchSource::FromLease(l.id), absl::MakeSpan(dst));
      REQUIRE(r.ok());
      CHECK(r->path == client::FetchPath::kGrpc);
      CHECK(dst == pages);
    }
    // Asked once; the second Fetch did not ask again.
    CHECK(c->host_fetch_stats().fallbacks == 1);
    CHECK(c->host_fetch_stats().shm_fetches == 0);
  }

  TempDir dir;
  std::unique_ptr<Daemon> d = StartShmDaemon(dir.path + "/kvh.sock");
  std::unique_ptr<Client> c = Connect(*d);
  REQUIRE(c->CreateNamespace(Spec("n", 8, /*tiered=*/true)).ok());
  REQUIRE(c->Insert("n", tokens, pages, kPageBytes).ok());

  SECTION("unknown lease, lease 0 and unknown namespace") {
    ExpectError(c->GetHostHandles("n", 424242).status(),
                absl::StatusCode::kNotFound, "lease_id");
    ExpectError(c->GetHostHandles("n", 0).status(),
                absl::StatusCode::kInvalidArgument, "lease_id");
    ExpectError(c->GetHostHandles("nope", 1).status(),
                absl::StatusCode::kNotFound, "namespace");
    std::vector<uint8_t> dst(pages.size());
    absl::StatusOr<client::FetchResult> r = c->FetchInto(
        "n", client::FetchSource::FromLease(424242), absl::MakeSpan(dst));
    ExpectError(r.status(), absl::StatusCode::kNotFound, "lease_id");
  }
  SECTION("a lease of another namespace is unknown here") {
    REQUIRE(c->CreateNamespace(Spec("m", 8)).ok());
    REQUIRE(c->Insert("m", tokens, pages, kPageBytes).ok());
    const client::Lease lm = Lock(*c, "m", tokens);
    ExpectError(c->GetHostHandles("n", lm.id).status(),
                absl::StatusCode::kNotFound, "lease_id");
  }
  SECTION("cold pages: FAILED_PRECONDITION naming pages[i], same bytes") {
    REQUIRE(c->Demote("n", client::Tier::kHostCompressed).ok());
    const client::Lease l = Lock(*c, "n", tokens);
    ExpectError(c->GetHostHandles("n", l.id).status(),
                absl::StatusCode::kFailedPrecondition, "pages[0]");
    std::vector<uint8_t> dst(pages.size());
    absl::StatusOr<client::FetchResult> r = c->FetchInto(
        "n", client::FetchSource::FromLease(l.id), absl::MakeSpan(dst));
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(r->path == client::FetchPath::kGrpc);
    CHECK(dst == pages);
    CHECK(c->host_fetch_stats().fallbacks == 1);
    CHECK(c->host_fetch_stats().shm_fetches == 0);
  }
}

TEST_CASE("A copy that fails its checksum is never returned",
          "[client][host_ipc]") {
  TempDir dir;
  std::unique_ptr<Daemon> d = StartShmDaemon(dir.path + "/kvh.sock");
  std::unique_ptr<Client> c = Connect(*d);
  REQUIRE(c->CreateNamespace(Spec("n", 4)).ok());
  const auto tokens = TokenRange(2 * kPageSize, 10);
  const auto pages = RandomBytes(2 * kPageBytes, 1);
  REQUIRE(c->Insert("n", tokens, pages, kPageBytes).ok());
  const client::Lease l = Lock(*c, "n", tokens);
  absl::StatusOr<client::HostHandles> h = c->GetHostHandles("n", l.id);
  REQUIRE(h.ok());
  absl::StatusOr<std::shared_ptr<const client::HostArenaMapping>> map =
      client::HostIpc::Default().Get(*h);
  INFO(map.status().ToString());
  REQUIRE(map.ok());
  std::vector<uint8_t> dst(pages.size());
  const client::HostPageDestination to_dst =
      [&](uint32_t i, uint64_t n) -> absl::StatusOr<uint8_t*> {
    REQUIRE(n == kPageBytes);
    return dst.data() + i * kPageBytes;
  };
  REQUIRE(client::CopyHostPages(**map, *h, 0, 2, to_dst).ok());
  CHECK(dst == pages);

  SECTION("the lease ran out and other pages took its slots") {
    REQUIRE(c->Release(l.id).ok());
    REQUIRE(c->EvictAll("n").ok());
    const auto others = RandomBytes(2 * kPageBytes, 2);
    REQUIRE(c->Insert("n", TokenRange(2 * kPageSize, 500), others, kPageBytes)
                .ok());
    // The slots are reused last-freed-first: the old offsets now hold the
    // new pages, and the stale handles' checksums catch it.
    absl::Status s = client::CopyHostPages(**map, *h, 0, 2, to_dst);
    ExpectError(s, absl::StatusCode::kDataLoss, "");
    CHECK(absl::StrContains(s.message(), "checksum"));
    // Through the SDK the old lease is simply gone.
    absl::StatusOr<client::FetchResult> r = c->FetchInto(
        "n", client::FetchSource::FromLease(l.id), absl::MakeSpan(dst));
    ExpectError(r.status(), absl::StatusCode::kNotFound, "lease_id");
  }
  SECTION("bytes changed under a live lease: mismatch, fallback, DATA_LOSS") {
    // Stands in for a slot rewritten while the client copied: the arena's
    // bytes no longer match the checksum the daemon holds for the page.
    const HostArena* arena = d->store().options().host_arena.get();
    REQUIRE(arena != nullptr);
    arena->base()[h->pages[1].offset + 7] ^= 0x5a;
    std::fill(dst.begin(), dst.end(), 0);
    absl::StatusOr<client::FetchResult> r = c->FetchInto(
        "n", client::FetchSource::FromLease(l.id), absl::MakeSpan(dst));
    // The stream reads the same slot, and the SDK's check refuses it too.
    ExpectError(r.status(), absl::StatusCode::kDataLoss, "");
    const client::HostFetchStats s = c->host_fetch_stats();
    CHECK(s.checksum_mismatches == 1);
    CHECK(s.fallbacks == 1);
    CHECK(s.shm_fetches == 0);
  }
}

TEST_CASE("The host IPC socket: stale file, busy path, removed at stop",
          "[client][host_ipc]") {
  TempDir dir;
  const std::string sock = dir.path + "/kvh.sock";
  SECTION("a stale socket of a crashed daemon is replaced") {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, sock.data(), sock.size());
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    close(fd);  // no listener, file left behind
    REQUIRE(IsSocket(sock));
    std::unique_ptr<Daemon> d = StartShmDaemon(sock);
    CHECK(d->host_ipc_socket() == sock);
  }
  SECTION("a live daemon's path is refused, and the file goes at stop") {
    std::unique_ptr<Daemon> d = StartShmDaemon(sock);
    struct stat st {};
    REQUIRE(lstat(sock.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    DaemonOptions o;
    o.listen = "127.0.0.1:0";
    o.store.pool_budget_bytes = 1 << 20;
    o.host_ipc.socket = sock;
    absl::StatusOr<std::unique_ptr<Daemon>> second = Daemon::Start(o);
    ExpectError(second.status(), absl::StatusCode::kFailedPrecondition,
                "store.host_ipc_socket");
    CHECK(IsSocket(sock));  // the failed start left the first one's file
    d->Shutdown(absl::Seconds(1));
    CHECK_FALSE(IsSocket(sock));
    CHECK(access(sock.c_str(), F_OK) != 0);
  }
  SECTION("a file that is not a socket is never replaced") {
    dir.Write("kvh.sock", "data");
    DaemonOptions o;
    o.listen = "127.0.0.1:0";
    o.store.pool_budget_bytes = 1 << 20;
    o.host_ipc.socket = sock;
    ExpectError(Daemon::Start(o).status(),
                absl::StatusCode::kFailedPrecondition, "store.host_ipc_socket");
    CHECK(access(sock.c_str(), F_OK) == 0);
  }
  SECTION("a group mode is applied") {
    DaemonOptions o;
    o.listen = "127.0.0.1:0";
    o.store.pool_budget_bytes = 1 << 20;
    o.host_ipc.socket = sock;
    o.host_ipc.socket_mode = 0660;
    absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
    REQUIRE(d.ok());
    struct stat st {};
    REQUIRE(lstat(sock.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0660);
  }
}

TEST_CASE("The socket hands out a read-only descriptor and its daemon's id",
          "[client][host_ipc]") {
  TempDir dir;
  const std::string sock = dir.path + "/kvh.sock";
  std::unique_ptr<Daemon> d = StartShmDaemon(sock);
  const int s = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, sock.data(), sock.size());
  REQUIRE(connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  HostIpcGreeting g{};
  iovec iov{&g, sizeof(g)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  REQUIRE(recvmsg(s, &msg, MSG_WAITALL) == static_cast<ssize_t>(sizeof(g)));
  close(s);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  REQUIRE(cm != nullptr);
  REQUIRE(cm->cmsg_type == SCM_RIGHTS);
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(cm), sizeof(int));
  REQUIRE(fd >= 0);
  CHECK(std::memcmp(g.magic, kHostIpcMagic, sizeof(g.magic)) == 0);
  CHECK(g.daemon_id == d->daemon_id());
  CHECK(g.arena_bytes == d->store().options().host_arena->bytes());
  CHECK((fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY);
  // No writable shared mapping, and no way to reopen it for writing.
  errno = 0;
  CHECK(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) ==
        MAP_FAILED);
  CHECK(errno == EACCES);
  void* ro = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  CHECK(ro != MAP_FAILED);
  if (ro != MAP_FAILED) munmap(ro, 4096);
  close(fd);
}

TEST_CASE("Another daemon's arena is refused; a restarted daemon remapped",
          "[client][host_ipc]") {
  TempDir dir;
  const std::string sock_a = dir.path + "/a.sock";
  const std::string sock_b = dir.path + "/b.sock";
  std::unique_ptr<Daemon> a = StartShmDaemon(sock_a);
  std::unique_ptr<Daemon> b = StartShmDaemon(sock_b);
  REQUIRE(a->daemon_id() != b->daemon_id());
  std::unique_ptr<Client> c = Connect(*a);
  REQUIRE(c->CreateNamespace(Spec("n", 4)).ok());
  const auto tokens = TokenRange(2 * kPageSize, 10);
  const auto pages = RandomBytes(2 * kPageBytes, 5);
  REQUIRE(c->Insert("n", tokens, pages, kPageBytes).ok());
  const client::Lease l = Lock(*c, "n", tokens);
  absl::StatusOr<client::HostHandles> h = c->GetHostHandles("n", l.id);
  REQUIRE(h.ok());

  SECTION("a socket that names another daemon") {
    client::HostHandles wrong = *h;
    wrong.socket_path = sock_b;  // b answers there, not a
    ExpectError(client::HostArenaMapping::Connect(
                    wrong.socket_path, wrong.daemon_id, wrong.arena_bytes)
                    .status(),
                absl::StatusCode::kFailedPrecondition, "daemon_id");
    ExpectError(client::HostIpc::Default().Get(wrong).status(),
                absl::StatusCode::kFailedPrecondition, "daemon_id");
    ExpectError(client::HostArenaMapping::Connect(dir.path + "/none.sock",
                                                  h->daemon_id, h->arena_bytes)
                    .status(),
                absl::StatusCode::kUnavailable, "socket_path");
  }
  SECTION("the same path served by a restarted daemon is mapped again") {
    // b mapped too, then stopped: its mapping goes at the next connection.
    std::unique_ptr<Client> cb = Connect(*b);
    REQUIRE(cb->CreateNamespace(Spec("n", 4)).ok());
    REQUIRE(cb->Insert("n", tokens, pages, kPageBytes).ok());
    absl::StatusOr<client::HostHandles> hb =
        cb->GetHostHandles("n", Lock(*cb, "n", tokens).id);
    REQUIRE(hb.ok());
    REQUIRE(client::HostIpc::Default().Get(*hb).ok());
    CHECK(client::HostIpc::Default().Cached(sock_b));
    b->Shutdown(absl::Seconds(1));
    std::vector<uint8_t> dst(pages.size());
    absl::StatusOr<client::FetchResult> first = c->FetchInto(
        "n", client::FetchSource::FromLease(l.id), absl::MakeSpan(dst));
    REQUIRE(first.ok());
    REQUIRE(first->path == client::FetchPath::kSharedMemory);
    a->Shutdown(absl::Seconds(1));
    a.reset();
    std::unique_ptr<Daemon> a2 = StartShmDaemon(sock_a);
    std::unique_ptr<Client> c2 = Connect(*a2);
    REQUIRE(c2->CreateNamespace(Spec("n", 4)).ok());
    const auto pages2 = RandomBytes(2 * kPageBytes, 6);
    REQUIRE(c2->Insert("n", tokens, pages2, kPageBytes).ok());
    const client::Lease l2 = Lock(*c2, "n", tokens);
    absl::StatusOr<client::FetchResult> r = c2->FetchInto(
        "n", client::FetchSource::FromLease(l2.id), absl::MakeSpan(dst));
    REQUIRE(r.ok());
    CHECK(r->path == client::FetchPath::kSharedMemory);
    CHECK(dst == pages2);
    CHECK(c2->host_fetch_stats().connects == 1);  // the old mapping was stale
    CHECK(client::HostIpc::Default().Cached(sock_a));
    CHECK_FALSE(client::HostIpc::Default().Cached(sock_b));
  }
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
