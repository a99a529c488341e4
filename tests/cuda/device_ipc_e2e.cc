// Same-host zero copy end to end (GPU machine only; built as
// kvharbor_device_ipc_tests, run by scripts/gpu_checks.sh): a daemon with a
// device arena and store.allow_ipc in this process, and a SECOND process
// (kvharbor_ipc_peer, next to this binary) that maps the arena with CUDA
// IPC and copies a lease's pages device-to-device, checked byte-exact
// against what was inserted. Then the lease's end and eviction: after
// Release the handle request fails (NOT_FOUND), and pages that eviction
// moved to the host tier are refused (FAILED_PRECONDITION naming pages[0]).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <climits>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cuda/tier/device_tier.h"
#include "kvharbor/client.h"
#include "server/daemon/daemon.h"
#include "spdlog/spdlog.h"
#include "tests/client/client_test_util.h"
#include "tests/temp_dir.h"

extern char** environ;

namespace kvharbor {
namespace {

using testing::TokenRange;

// fp16, 4 layers, 4 heads, head_dim 64, 16 tokens a page: 64 KiB pages.
constexpr uint32_t kPageSize = 16;
constexpr uint64_t kPageBytes = 2 * 4 * kPageSize * 4 * 64 * 2;

std::unique_ptr<Daemon> StartDaemon(bool allow_ipc) {
  spdlog::set_level(spdlog::level::warn);
  DaemonOptions o;
  o.listen = "127.0.0.1:0";
  o.store.pool_budget_bytes = uint64_t{512} << 20;
  o.store.default_namespace_bytes = uint64_t{1} << 20;
  o.store.device_pool_bytes = uint64_t{64} << 20;
  o.store.allow_ipc = allow_ipc;
  o.drain_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  // The tier really is on the GPU (Start falls back to host pools).
  REQUIRE(dynamic_cast<gpu::CudaDeviceTier*>(
              (*d)->store().options().device_tier.get()) != nullptr);
  return *std::move(d);
}

client::NamespaceSpec Spec(const std::string& name, uint32_t pages) {
  client::NamespaceSpec s = testing::MakeSpec(
      name, 4, 4, 64, kPageSize, client::DType::kFP16, pages * kPageBytes);
  s.host_compressed_bytes = 8 << 20;
  return s;
}

// Runs kvharbor_ipc_peer (next to this executable) and returns its exit
// status (-1 when it could not be started or did not exit normally).
int RunPeer(const std::vector<std::string>& args) {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  REQUIRE(n > 0);
  std::string exe(self, n);
  exe = exe.substr(0, exe.rfind('/') + 1) + "kvharbor_ipc_peer";
  std::vector<std::string> all = {exe};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc =
      posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), environ);
  INFO("posix_spawn " << exe << ": " << rc);
  REQUIRE(rc == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_CASE("GPU IPC: another process copies leased device pages byte-exact",
          "[gpu][ipc]") {
  testing::TempDir dir;
  auto daemon = StartDaemon(/*allow_ipc=*/true);
  auto c = testing::Connect(*daemon);
  // Two namespaces, so the leased pages do not start at the arena's byte 0.
  REQUIRE(c->CreateNamespace(Spec("before", 4)).ok());
  REQUIRE(c->CreateNamespace(Spec("ipc", 8)).ok());
  const auto tokens = TokenRange(6 * kPageSize, 100);
  const auto pages = testing::RandomBytes(6 * kPageBytes, 42);
  REQUIRE(c->Insert("ipc", tokens, pages, kPageBytes).ok());
  absl::StatusOr<client::Lease> l = c->Match("ipc", tokens, /*lock=*/true);
  REQUIRE(l.ok());
  REQUIRE(l->pages.size() == 6);

  absl::StatusOr<client::DeviceHandles> h = c->GetDeviceHandles("ipc", l->id);
  INFO(h.status().ToString());
  REQUIRE(h.ok());
  CHECK(h->ipc_handle.size() == 64);
  CHECK(h->device_uuid.size() == 16);
  REQUIRE(h->pages.size() == 6);
  for (const client::DevicePage& p : h->pages) {
    CHECK(p.bytes == kPageBytes);
    CHECK(p.offset >= 4 * kPageBytes);  // past "before"'s pool
    CHECK(p.offset + p.bytes <= h->arena_bytes);
  }
  // One daemon, one handle: the same bytes on every call.
  absl::StatusOr<client::DeviceHandles> again =
      c->GetDeviceHandles("ipc", l->id);
  REQUIRE(again.ok());
  CHECK(again->ipc_handle == h->ipc_handle);

  const std::string expected =
      dir.Write("expected.bin", std::string(pages.begin(), pages.end()));
  CHECK(RunPeer({daemon->address(), "ipc", absl::StrCat(l->id), expected}) ==
        0);

  // After Release, the handles are refused (to the peer too).
  REQUIRE(c->Release(l->id).ok());
  absl::Status gone = c->GetDeviceHandles("ipc", l->id).status();
  CHECK(gone.code() == absl::StatusCode::kNotFound);
  CHECK(absl::StartsWith(gone.message(), "lease_id: "));
  CHECK(RunPeer({daemon->address(), "ipc", absl::StrCat(l->id), expected}) ==
        1);

  // Eviction moves the unleased pages to the host tier; a lease taken on
  // them then has no device pages to describe.
  REQUIRE(c->Demote("ipc", client::Tier::kHostCompressed).ok());
  absl::StatusOr<client::Lease> cold = c->Match("ipc", tokens, true);
  REQUIRE(cold.ok());
  REQUIRE(cold->page_tiers[0] == client::Tier::kHostCompressed);
  absl::Status refused = c->GetDeviceHandles("ipc", cold->id).status();
  INFO(refused.ToString());
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StartsWith(refused.message(), "pages[0]: "));
  REQUIRE(c->Release(cold->id).ok());
}

TEST_CASE("GPU IPC: off unless store.allow_ipc", "[gpu][ipc]") {
  auto daemon = StartDaemon(/*allow_ipc=*/false);
  auto c = testing::Connect(*daemon);
  REQUIRE(c->CreateNamespace(Spec("ipc", 2)).ok());
  const auto tokens = TokenRange(kPageSize, 1);
  REQUIRE(
      c->Insert("ipc", tokens, testing::RandomBytes(kPageBytes, 1), kPageBytes)
          .ok());
  absl::StatusOr<client::Lease> l = c->Match("ipc", tokens, true);
  REQUIRE(l.ok());
  absl::Status s = c->GetDeviceHandles("ipc", l->id).status();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StartsWith(s.message(), "store.allow_ipc: "));
}

}  // namespace
}  // namespace kvharbor
