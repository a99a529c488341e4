// The fixture of the CPU tests of same-host zero copy (GetDeviceHandles,
// stage_cold, DeviceInsert): an in-process daemon whose device tier is the
// host-memory stand-in of tests/host_arena_tier.h, so a test reads and
// writes what the offsets point at; small fp16 namespaces; lease and error
// helpers. Test-only, header-only; for the test thread.
#ifndef KVHARBOR_TESTS_SERVER_IPC_DAEMON_H_
#define KVHARBOR_TESTS_SERVER_IPC_DAEMON_H_

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "kvharbor/client.h"
#include "server/daemon/daemon.h"
#include "spdlog/spdlog.h"
#include "tests/client/client_test_util.h"
#include "tests/host_arena_tier.h"

namespace kvharbor {
namespace testing {

constexpr uint32_t kPageSize =
    4;  // internal linkage: server_test_util.h has its own
// fp16, 2 layers, 2 heads, head_dim 8: 512-byte pages.
constexpr uint64_t kPageBytes = 2 * 2 * kPageSize * 2 * 8 * 2;

struct IpcDaemon {
  explicit IpcDaemon(bool allow_ipc,
                     absl::Duration reap_interval = absl::Milliseconds(500)) {
    spdlog::set_level(spdlog::level::warn);
    tier = std::make_shared<HostArenaTier>(1 << 20);
    DaemonOptions o;
    o.listen = "127.0.0.1:0";
    o.store.pool_budget_bytes = 1 << 20;
    o.store.default_namespace_bytes = 8 * kPageBytes;
    o.store.device_tier = tier;
    o.store.allow_ipc = allow_ipc;
    o.drain_timeout = absl::Seconds(2);
    o.lease_reap_interval = reap_interval;
    absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
    INFO(d.status().ToString());
    REQUIRE(d.ok());
    daemon = *std::move(d);
    c = Connect(*daemon);
  }
  std::shared_ptr<HostArenaTier> tier;
  std::unique_ptr<Daemon> daemon;
  std::unique_ptr<Client> c;
};

inline client::NamespaceSpec Spec(const std::string& name, uint32_t pages) {
  client::NamespaceSpec s = MakeSpec(name, 2, 2, 8, kPageSize,
                                     client::DType::kFP16, pages * kPageBytes);
  s.host_compressed_bytes = 1 << 16;
  return s;
}

inline client::Lease Lock(Client& c, const std::string& ns,
                          const std::vector<int32_t>& tokens) {
  absl::StatusOr<client::Lease> l = c.Match(ns, tokens, /*lock=*/true);
  INFO(l.status().ToString());
  REQUIRE(l.ok());
  REQUIRE(l->locked());
  return *l;
}

inline void ExpectError(const absl::Status& s, absl::StatusCode code,
                        const std::string& starts_with) {
  INFO(s.ToString());
  CHECK(s.code() == code);
  CHECK(absl::StartsWith(s.message(), starts_with));
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_SERVER_IPC_DAEMON_H_
