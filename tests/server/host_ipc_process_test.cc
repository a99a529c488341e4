// Same-host Fetch across processes: kvharbord started with --host_ipc_socket
// hands its arena to this (separate) process, whose SDK Fetch copies the
// pages out of it; a daemon killed with SIGKILL leaves a stale socket that
// the next one replaces, and SIGTERM removes the socket.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kvharbor/client.h"
#include "tests/client/client_test_util.h"
#include "tests/server/subprocess.h"
#include "tests/temp_dir.h"

#ifndef KVHARBORD_PATH
#error "KVHARBORD_PATH (the built kvharbord) must be defined by the build"
#endif

namespace kvharbor {
namespace testing {
namespace {

using std::chrono::milliseconds;

// Inserts three pages into a fresh namespace of `proc`, leases them and
// fetches them through the SDK; the pages' bytes come from `seed`.
void FetchThroughSharedMemory(Kvharbord& proc, uint64_t seed) {
  REQUIRE(proc.Connect() != nullptr);
  ClientOptions o;
  o.address = proc.address();
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(o);
  REQUIRE(c.ok());
  const client::NamespaceSpec spec =
      MakeSpec("p", 2, 2, 8, 4, client::DType::kFP16, 1 << 20);
  const uint64_t page_bytes = CreateNs(**c, spec);
  const auto tokens = TokenRange(3 * 4, 1);
  const auto pages = RandomBytes(3 * page_bytes, seed);
  REQUIRE((*c)->Insert("p", tokens, pages, page_bytes).ok());
  absl::StatusOr<client::Lease> l = (*c)->Match("p", tokens, /*lock=*/true);
  REQUIRE(l.ok());
  std::vector<uint8_t> dst(pages.size());
  absl::StatusOr<client::FetchResult> r = (*c)->FetchInto(
      "p", client::FetchSource::FromLease(l->id), absl::MakeSpan(dst));
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->path == client::FetchPath::kSharedMemory);
  CHECK(dst == pages);
}

TEST_CASE("kvharbord serves its arena to another process over the socket",
          "[server][process][host_ipc]") {
  TempDir dir;
  const std::string sock = dir.path + "/kvh.sock";
  const std::vector<std::string> args = {"--pool_bytes=16MiB",
                                         "--host_ipc_socket=" + sock};
  {
    Kvharbord first(KVHARBORD_PATH, args);
    REQUIRE(first.started());
    FetchThroughSharedMemory(first, 1);
    first.Signal(SIGKILL);
    REQUIRE(first.WaitExit(milliseconds(10000)) != -1);
    CHECK(IsSocket(sock));  // a crash leaves the file, nothing else
  }
  Kvharbord second(KVHARBORD_PATH, args);
  REQUIRE(second.started());
  FetchThroughSharedMemory(second, 2);  // stale socket replaced, new arena
  second.Signal(SIGTERM);
  const int status = second.WaitExit(milliseconds(10000));
  REQUIRE(status != -1);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_FALSE(IsSocket(sock));
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
