// Same-host Insert through shared memory: a client registers a staging
// region (a sealed memfd of its own) on the daemon's staging socket and names
// it in Insert (InsertHeader.staging); the daemon copies the pages out of it.
// Checked here: the registry (keys, one tenant per region, one Insert at a
// time, unregistering while an Insert reads, the region limit, bounds); the
// socket's refusals (not a memfd, no F_SEAL_SHRINK, too few bytes, a bad
// message); and through the daemon, byte-exact round trips, checksums,
// bounds, a wrong key, an unregistered region, a cancelled Insert (nothing
// stored, the region usable again), and a daemon that serves no socket.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "kvharbor/client.h"
#include "kvharbor/staging_region.h"
#include "server/local/staging_registry.h"
#include "server/local/staging_server.h"
#include "tests/server/server_test_util.h"
#include "tests/temp_dir.h"
#include "types/staging_wire.h"

namespace kvharbor {
namespace testing {
namespace {

std::unique_ptr<StagingMapping> Anonymous(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  static_cast<uint8_t*>(p)[0] = 42;
  return std::make_unique<StagingMapping>(static_cast<const uint8_t*>(p),
                                          bytes);
}

std::string KeyOf(const StagingRegistry::Grant& g) {
  return std::string(reinterpret_cast<const char*>(g.key.data()), g.key.size());
}

void ExpectError(const absl::Status& s, absl::StatusCode code,
                 const std::string& starts_with) {
  INFO(s.ToString());
  CHECK(s.code() == code);
  CHECK(absl::StartsWith(s.message(), starts_with));
}

TEST_CASE("StagingRegistry: keys, tenants, one Insert at a time",
          "[server][staging]") {
  StagingRegistry reg(2);
  auto a = reg.Add(Anonymous(4096));
  REQUIRE(a.ok());
  auto b = reg.Add(Anonymous(4096));
  REQUIRE(b.ok());
  CHECK(a->id != b->id);
  CHECK(KeyOf(*a) != KeyOf(*b));
  ExpectError(reg.Add(Anonymous(4096)).status(),
              absl::StatusCode::kResourceExhausted, "staging: 2 regions");
  // A wrong key, a short key and an unknown id look the same.
  std::string wrong = KeyOf(*a);
  wrong[15] ^= 1;
  ExpectError(reg.Acquire(a->id, wrong, "t1").status(),
              absl::StatusCode::kNotFound, "header.staging.id");
  ExpectError(reg.Acquire(a->id, "short", "t1").status(),
              absl::StatusCode::kNotFound, "header.staging.id");
  ExpectError(reg.Acquire(a->id + 1, KeyOf(*a), "t1").status(),
              absl::StatusCode::kNotFound, "header.staging.id");
  {
    auto use = reg.Acquire(a->id, KeyOf(*a), "t1");
    REQUIRE(use.ok());
    ExpectError(reg.Acquire(a->id, KeyOf(*a), "t1").status(),
                absl::StatusCode::kFailedPrecondition, "header.staging:");
    auto bytes = (*use)->Bytes(0, 1, "f");
    REQUIRE(bytes.ok());
    CHECK((*bytes)[0] == 42);
    ExpectError((*use)->Bytes(4000, 97, "f").status(),
                absl::StatusCode::kInvalidArgument, "f: 97 bytes");
    ExpectError((*use)->Bytes(~uint64_t{0}, 2, "f").status(),
                absl::StatusCode::kInvalidArgument, "f:");
  }
  // Bound to t1 by its first use: another tenant is refused, t1 is not.
  ExpectError(reg.Acquire(a->id, KeyOf(*a), "t2").status(),
              absl::StatusCode::kPermissionDenied, "header.staging:");
  auto again = reg.Acquire(a->id, KeyOf(*a), "t1");
  REQUIRE(again.ok());
  // Unregistered while an Insert reads it: the mapping stays until the Use
  // ends; the id is gone for everyone else at once.
  reg.Remove(a->id);
  CHECK(reg.size() == 1);
  auto still = (*again)->Bytes(0, 1, "f");
  REQUIRE(still.ok());
  CHECK((*still)[0] == 42);
  ExpectError(reg.Acquire(a->id, KeyOf(*a), "t1").status(),
              absl::StatusCode::kNotFound, "header.staging.id");
  again->reset();
  REQUIRE(reg.Add(Anonymous(4096)).ok());  // room again
}

// Connects to `path` and sends a register of `bytes` with `fd` attached
// (none when fd < 0); the grant.
StagingGrant RawRegister(const std::string& path, int fd, uint64_t bytes,
                         uint32_t version = kStagingVersion) {
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(s >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  REQUIRE(connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  StagingRegister req{};
  std::memcpy(req.magic, kStagingMagic, sizeof(req.magic));
  req.version = version;
  req.bytes = bytes;
  iovec iov{&req, sizeof(req)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  REQUIRE(sendmsg(s, &msg, MSG_NOSIGNAL) == sizeof(req));
  StagingGrant g{};
  size_t got = 0;
  while (got < sizeof(g)) {
    const ssize_t n =
        recv(s, reinterpret_cast<char*>(&g) + got, sizeof(g) - got, 0);
    REQUIRE(n > 0);
    got += static_cast<size_t>(n);
  }
  close(s);
  return g;
}

TEST_CASE("StagingServer: refuses what is not a sealed memfd of enough bytes",
          "[server][staging]") {
  TempDir dir;
  StagingRegistry reg(8);
  StagingServerOptions o;
  o.socket = dir.path + "/s.stage";
  o.max_region_bytes = 1 << 20;
  auto server = StagingServer::Start(o, &reg, 77);
  REQUIRE(server.ok());
  const auto refused = [](const StagingGrant& g, absl::StatusCode code,
                          const std::string& why) {
    INFO(g.error);
    CHECK(g.code == static_cast<int32_t>(code));
    CHECK(absl::StartsWith(g.error, why));
  };
  const int plain = open(dir.path.c_str(), O_RDONLY | O_DIRECTORY);
  refused(RawRegister(o.socket, plain, 4096),
          absl::StatusCode::kInvalidArgument, "register: the descriptor");
  close(plain);
  const int unsealed = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(ftruncate(unsealed, 8192) == 0);
  refused(RawRegister(o.socket, unsealed, 4096),
          absl::StatusCode::kInvalidArgument, "register: the memfd lacks");
  REQUIRE(fcntl(unsealed, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
  refused(RawRegister(o.socket, unsealed, 16384),
          absl::StatusCode::kInvalidArgument, "register.bytes: 16384");
  refused(RawRegister(o.socket, unsealed, 2 << 20),
          absl::StatusCode::kInvalidArgument, "register.bytes:");
  refused(RawRegister(o.socket, -1, 4096), absl::StatusCode::kInvalidArgument,
          "register: 0 descriptors");
  refused(RawRegister(o.socket, unsealed, 4096, 99),
          absl::StatusCode::kInvalidArgument, "register: not a");
  // Holes: the daemon would allocate them itself.
  refused(RawRegister(o.socket, unsealed, 4096),
          absl::StatusCode::kInvalidArgument, "register: only 0 of the 4096");
  CHECK(reg.size() == 0);
  const std::string zeros(8192, '\0');
  REQUIRE(pwrite(unsealed, zeros.data(), zeros.size(), 0) == 8192);
  const StagingGrant ok = RawRegister(o.socket, unsealed, 4096);
  CHECK(ok.code == 0);
  CHECK(ok.daemon_id == 77);
  // RawRegister closed its connection: the region is unregistered.
  for (int i = 0; i < 50 && reg.size() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  CHECK(reg.size() == 0);
  close(unsealed);
}

DaemonOptions StagingOptions(const std::string& dir) {
  DaemonOptions o = TestOptions();
  o.host_ipc.socket = dir + "/kvh.sock";
  return o;
}

std::unique_ptr<Client> Sdk(const Daemon& d) {
  ClientOptions o;
  o.address = d.address();
  auto c = Client::Create(o);
  REQUIRE(c.ok());
  return *std::move(c);
}

// The token ids of `pages` pages from `first`, kept alive for the Sequence
// that views them.
struct Seq {
  Seq(size_t pages, int32_t first) : ids(Tokens(pages * kPageSize, first)) {}
  operator client::Sequence() const {  // NOLINT: a view of ids
    return client::Sequence::OfTokens(ids);
  }
  std::vector<int32_t> ids;
};

TEST_CASE("staged Insert: byte-exact, checked, bounded", "[server][staging]") {
  TempDir dir;
  TestServer s(StagingOptions(dir.path));
  auto c = Sdk(*s.daemon);
  auto info = c->DescribeNamespace(kNs);
  REQUIRE(info.ok());
  CHECK(info->staging_socket == dir.path + "/kvh.sock" + kStagingSocketSuffix);
  CHECK(info->daemon_id == s.daemon->daemon_id());
  auto region =
      client::StagingRegion::Create(info->staging_socket, 16 * kPageBytes);
  REQUIRE(region.ok());
  CHECK((*region)->daemon_id() == s.daemon->daemon_id());
  const std::string bytes = RandomBytes(8 * kPageBytes, 5);
  std::memcpy((*region)->data(), bytes.data(), bytes.size());
  std::vector<uint64_t> sums;
  for (size_t p = 0; p < 4; ++p) sums.push_back(PageChecksum(bytes, p));
  // Pages 0-3 with checksums, then 4-7 (at an offset) without.
  auto r =
      c->InsertStaged(kNs, Seq(4, 100), **region, 0, 4 * kPageBytes, sums, {});
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 4);
  r = c->InsertStaged(kNs, Seq(4, 500), **region, 4 * kPageBytes,
                      4 * kPageBytes, {}, {});
  REQUIRE(r.ok());
  for (const auto& [first, at] : {std::pair{100, 0}, std::pair{500, 4}}) {
    auto l = c->Match(kNs, Tokens(4 * kPageSize, first), /*lock=*/true);
    REQUIRE(l.ok());
    REQUIRE(l->matched_tokens == 4 * kPageSize);
    auto got = c->Fetch(kNs, client::FetchSource::FromLease(l->id));
    REQUIRE(got.ok());
    for (size_t p = 0; p < 4; ++p) {
      CHECK(std::string((*got)[p].begin(), (*got)[p].end()) ==
            bytes.substr((at + p) * kPageBytes, kPageBytes));
    }
    REQUIRE(c->Release(l->id).ok());
  }
  // A producer still filling the region: `filled` is asked for the bytes
  // before the daemon reads them (here it writes them then); its error
  // ends the Insert with nothing stored.
  std::memset((*region)->data(), 0, 4 * kPageBytes);
  std::vector<uint64_t> asked;
  r = c->InsertStaged(kNs, Seq(4, 700), **region, 0, 4 * kPageBytes, sums, {},
                      {}, [&](uint64_t end) {
                        asked.push_back(end);
                        std::memcpy((*region)->data(), bytes.data(), end);
                        return absl::OkStatus();
                      });
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 4);
  CHECK(asked == std::vector<uint64_t>{4 * kPageBytes});
  ExpectError(
      c->InsertStaged(
           kNs, Seq(4, 800), **region, 0, 4 * kPageBytes, {}, {}, {},
           [](uint64_t) { return absl::InternalError("gather: failed"); })
          .status(),
      absl::StatusCode::kInternal, "gather:");
  auto nothing = c->Match(kNs, Tokens(4 * kPageSize, 800), false);
  REQUIRE(nothing.ok());
  CHECK(nothing->matched_tokens == 0);
  // A page that is not what its checksum says: nothing stored.
  sums[2] ^= 1;
  ExpectError(
      c->InsertStaged(kNs, Seq(4, 900), **region, 0, 4 * kPageBytes, sums, {})
          .status(),
      absl::StatusCode::kDataLoss, "header.page_checksums[2]");
  auto none = c->Match(kNs, Tokens(4 * kPageSize, 900), false);
  REQUIRE(none.ok());
  CHECK(none->matched_tokens == 0);
  // Bytes outside the region: the SDK names offset; a raw staged chunk
  // past it gets the daemon's error naming staged.staging_offset.
  ExpectError(c->InsertStaged(kNs, Seq(4, 900), **region, 13 * kPageBytes,
                              4 * kPageBytes, {}, {})
                  .status(),
              absl::StatusCode::kInvalidArgument, "offset:");
  std::vector<v1::InsertRequest> msgs(2);
  msgs[0] = Header(kNs, Tokens(4 * kPageSize, 900));
  msgs[0].mutable_header()->mutable_staging()->set_id((*region)->id());
  msgs[0].mutable_header()->mutable_staging()->set_key((*region)->key());
  msgs[1].mutable_staged()->set_offset(0);
  msgs[1].mutable_staged()->set_staging_offset(15 * kPageBytes);
  msgs[1].mutable_staged()->set_length(4 * kPageBytes);
  grpc::Status st = SendInsert(s.stub.get(), msgs);
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(absl::StartsWith(st.error_message(), "staged.staging_offset:"));
  // The wrong key, and a staged chunk in an Insert that names no region.
  std::string wrong = (*region)->key();
  wrong[0] ^= 1;
  msgs[0].mutable_header()->mutable_staging()->set_key(wrong);
  st = SendInsert(s.stub.get(), msgs);
  CHECK(st.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(absl::StartsWith(st.error_message(), "header.staging.id:"));
  msgs[0].mutable_header()->clear_staging();
  st = SendInsert(s.stub.get(), msgs);
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(absl::StartsWith(st.error_message(), "staged:"));
  none = c->Match(kNs, Tokens(4 * kPageSize, 900), false);
  REQUIRE(none.ok());
  CHECK(none->matched_tokens == 0);
}

TEST_CASE("staged Insert: cancelled, unregistered, not served",
          "[server][staging]") {
  TempDir dir;
  TestServer s(StagingOptions(dir.path));
  auto c = Sdk(*s.daemon);
  auto info = c->DescribeNamespace(kNs);
  REQUIRE(info.ok());
  auto region =
      client::StagingRegion::Create(info->staging_socket, 8 * kPageBytes);
  REQUIRE(region.ok());
  const std::string bytes = RandomBytes(4 * kPageBytes, 9);
  std::memcpy((*region)->data(), bytes.data(), bytes.size());
  {
    // Half the bytes, then the client goes away: nothing is stored, and the
    // region is free for the next Insert.
    grpc::ClientContext ctx;
    v1::InsertResponse resp;
    auto w = s.stub->Insert(&ctx, &resp);
    v1::InsertRequest h = Header(kNs, Tokens(4 * kPageSize, 40));
    h.mutable_header()->mutable_staging()->set_id((*region)->id());
    h.mutable_header()->mutable_staging()->set_key((*region)->key());
    REQUIRE(w->Write(h));
    v1::InsertRequest part;
    part.mutable_staged()->set_length(2 * kPageBytes);
    REQUIRE(w->Write(part));
    ctx.TryCancel();
    CHECK(!w->Finish().ok());
  }
  auto none = c->Match(kNs, Tokens(4 * kPageSize, 40), false);
  REQUIRE(none.ok());
  CHECK(none->matched_tokens == 0);
  absl::StatusOr<client::InsertResult> r = absl::UnknownError("not run");
  for (int i = 0; i < 50; ++i) {  // the cancelled reactor lets go shortly
    r = c->InsertStaged(kNs, Seq(4, 40), **region, 0, 4 * kPageBytes, {}, {});
    if (r.status().code() != absl::StatusCode::kFailedPrecondition) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 4);
  // The client drops its region: its id and key stop working.
  const uint64_t id = (*region)->id();
  const std::string key = (*region)->key();
  region->reset();
  std::vector<v1::InsertRequest> msgs(2);
  msgs[0] = Header(kNs, Tokens(4 * kPageSize, 60));
  msgs[0].mutable_header()->mutable_staging()->set_id(id);
  msgs[0].mutable_header()->mutable_staging()->set_key(key);
  msgs[1].mutable_staged()->set_length(4 * kPageBytes);
  grpc::Status st;
  for (int i = 0; i < 50; ++i) {
    st = SendInsert(s.stub.get(), msgs);
    if (st.error_code() == grpc::StatusCode::NOT_FOUND) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  CHECK(st.error_code() == grpc::StatusCode::NOT_FOUND);
  // A daemon without store.host_ipc_socket serves no staging socket.
  TestServer plain;
  auto pc = Sdk(*plain.daemon);
  auto pinfo = pc->DescribeNamespace(kNs);
  REQUIRE(pinfo.ok());
  CHECK(pinfo->staging_socket.empty());
  st = SendInsert(plain.stub.get(), msgs);
  CHECK(st.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(absl::StartsWith(st.error_message(), "header.staging:"));
  ExpectError(client::StagingRegion::Create(dir.path + "/none", 4096).status(),
              absl::StatusCode::kUnavailable, "socket_path:");
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
