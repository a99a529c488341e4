// LoadConfigFile, ParseByteSize and ValidateDaemonOptions: the example config
// loads, and every bad value is rejected with a message naming its key.
#include "server/daemon/config.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/daemon/daemon.h"
#include "spdlog/spdlog.h"

namespace kvharbor {
namespace {

// A config file in the temp directory, removed at scope exit.
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    char name[] = "/tmp/kvharbor_config_XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    close(fd);
    path_ = name;
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Loads `yaml` into `o`: the load must fail with INVALID_ARGUMENT and a
// message that starts with `prefix` (the key it names).
void ExpectRefused(const std::string& yaml, const std::string& prefix,
                   DaemonOptions* o) {
  INFO(yaml);
  TempFile f(yaml);
  absl::Status s = LoadConfigFile(f.path(), o);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Matchers::StartsWith(prefix));
}

std::string ExamplePath() {
  return std::string(KVHARBOR_SOURCE_DIR) + "/deploy/kvharbord.example.yaml";
}

TEST_CASE("The example config loads", "[server][config]") {
  DaemonOptions o;
  absl::Status s = LoadConfigFile(ExamplePath(), &o);
  INFO(s.ToString());
  REQUIRE(s.ok());
  CHECK(o.listen == "127.0.0.1:50051");
  CHECK(o.store.pool_budget_bytes == (uint64_t{8} << 30));
  CHECK(o.store.default_namespace_bytes == (uint64_t{1} << 30));
  CHECK(o.store.default_lease_ttl == absl::Seconds(30));
  CHECK(o.store.max_lease_ttl == absl::Minutes(10));
  CHECK(o.store.max_tokens_per_request == 1048576);
  CHECK(o.default_chunk_bytes == (1u << 20));
  CHECK(o.max_chunk_bytes == 4128768);
  CHECK(o.drain_timeout == absl::Seconds(10));
  CHECK(o.lease_reap_interval == absl::Milliseconds(500));
  REQUIRE(o.namespaces.size() == 2);
  const NamespaceSpec& a = o.namespaces[0];
  CHECK(a.name == "llama3-8b");
  CHECK(a.geometry.num_layers == 32);
  CHECK(a.geometry.num_kv_heads == 8);
  CHECK(a.geometry.head_dim == 128);
  CHECK(a.geometry.page_size == 16);
  CHECK(a.geometry.dtype == DType::kBF16);
  CHECK(a.geometry.layout == PageLayout::kKvLayerTokenHeadDim);
  CHECK(a.geometry.rope_theta == 500000.0f);
  CHECK(a.capacity_bytes == (uint64_t{4} << 30));
  // What needs files or directories is commented out, so that the file
  // starts a daemon as is (tests/deploy/deploy_configs_test.sh runs it).
  CHECK(a.codec == "identity");
  CHECK(a.calibration_path.empty());
  CHECK(a.host_compressed_bytes == (uint64_t{8} << 30));
  CHECK(a.disk_dir.empty());
  CHECK(a.kvcm_path.empty());
  CHECK(o.namespaces[1].host_compressed_bytes == 0);
  CHECK(o.namespaces[1].disk_dir.empty());
  CHECK(o.namespaces[1].geometry.dtype == DType::kFP16);
  CHECK(o.namespaces[1].codec.empty());
}

// The example with the lines "# KEY: ..." of `keys` uncommented, and
// "codec: identity" dropped when a commented codec replaces it.
std::string ExampleWith(const std::vector<std::string>& keys) {
  std::ifstream in(ExamplePath());
  std::string out;
  std::string line;
  while (std::getline(in, line)) {
    const size_t hash = line.find("# ");
    const bool uncomment =
        hash != std::string::npos && line.find_first_not_of(' ') == hash &&
        std::any_of(keys.begin(), keys.end(), [&](const std::string& k) {
          return line.compare(hash + 2, k.size() + 1, k + ":") == 0;
        });
    if (uncomment) line.erase(hash, 2);
    const bool replaced = line == "    codec: identity" &&
                          std::count(keys.begin(), keys.end(), "codec") > 0;
    if (!replaced) out += line + "\n";
  }
  return out;
}

TEST_CASE("The example config's commented keys load once uncommented",
          "[server][config]") {
  DaemonOptions o;
  const absl::Status s =
      LoadConfigText(ExampleWith({"codec", "calibration_path", "disk_dir",
                                  "disk_bytes", "kvcm_path", "key_kind"}),
                     "example", &o);
  INFO(s.ToString());
  REQUIRE(s.ok());
  REQUIRE(o.namespaces.size() == 2);
  const NamespaceSpec& a = o.namespaces[0];
  CHECK(a.codec == "kvtc");
  CHECK(a.calibration_path == "/var/lib/kvharbor/llama3-8b.kvtc");
  CHECK(a.host_compressed_bytes == (uint64_t{8} << 30));
  CHECK(a.disk_dir == "/var/lib/kvharbor/llama3-8b");
  CHECK(a.disk_bytes == (uint64_t{64} << 30));
  CHECK(a.kvcm_path == "/var/lib/kvharbor/llama3-8b.kvcm.bin");
  CHECK(a.key_kind == KeyKind::kTokens);
  CHECK(o.namespaces[1].kvcm_path.empty());
}

TEST_CASE("A namespace's key_kind loads, and a bad one names the key",
          "[server][config]") {
  const std::string ns =
      "namespaces:\n  - name: sgl\n    geometry: {num_layers: 2, "
      "num_kv_heads: 2, head_dim: 8, page_size: 4, dtype: bf16}\n";
  TempFile f(ns + "    key_kind: page_keys\n");
  DaemonOptions o;
  REQUIRE(LoadConfigFile(f.path(), &o).ok());
  REQUIRE(o.namespaces.size() == 1);
  CHECK(o.namespaces[0].key_kind == KeyKind::kPageKeys);
  TempFile h(ns + "    key_kind: page_hashes\n");
  DaemonOptions p;
  REQUIRE(LoadConfigFile(h.path(), &p).ok());
  CHECK(p.namespaces[0].key_kind == KeyKind::kPageHashes);
  DaemonOptions d;
  ExpectRefused(ns + "    key_kind: hashes\n",
                "config: namespaces[0].key_kind:", &d);
}

TEST_CASE("A config file sets only the keys it has", "[server][config]") {
  TempFile f("store:\n  pool_budget_bytes: 123MiB\n");
  DaemonOptions o;
  o.listen = "127.0.0.1:7";
  o.default_chunk_bytes = 4096;
  REQUIRE(LoadConfigFile(f.path(), &o).ok());
  CHECK(o.store.pool_budget_bytes == 123u << 20);
  CHECK(o.listen == "127.0.0.1:7");
  CHECK(o.default_chunk_bytes == 4096);
  TempFile empty("");
  REQUIRE(LoadConfigFile(empty.path(), &o).ok());
  CHECK(o.store.pool_budget_bytes == 123u << 20);
}

TEST_CASE("A config with namespaces starts a daemon", "[server][config]") {
  spdlog::set_level(spdlog::level::warn);
  TempFile f(R"(
listen: 127.0.0.1:0
store: {pool_budget_bytes: 1MiB}
namespaces:
  - name: small
    geometry: {num_layers: 1, num_kv_heads: 1, head_dim: 8, page_size: 2,
               dtype: fp32, layout: layer_kv_token_head_dim}
    capacity_bytes: 64KiB
)");
  DaemonOptions o;
  REQUIRE(LoadConfigFile(f.path(), &o).ok());
  auto d = Daemon::Start(o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  auto ns = (*d)->store().Get("small");
  REQUIRE(ns.ok());
  CHECK((*ns)->page_bytes() == 2 * 1 * 1 * 8 * 2 * 4);
  CHECK((*ns)->config().geometry.layout == PageLayout::kLayerKvTokenHeadDim);
  CHECK((*ns)->config().capacity_bytes == 64 * 1024);
}

TEST_CASE("A config namespace with tiers starts a daemon", "[server][config]") {
  spdlog::set_level(spdlog::level::warn);
  char dir[] = "/tmp/kvharbor_config_disk_XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  TempFile f(std::string(R"(
listen: 127.0.0.1:0
store: {pool_budget_bytes: 1MiB}
namespaces:
  - name: tiered
    geometry: {num_layers: 1, num_kv_heads: 1, head_dim: 8, page_size: 2,
               dtype: fp32}
    capacity_bytes: 1KiB
    codec: identity
    host_compressed_bytes: 4KiB
    disk_bytes: 1MiB
    disk_dir: )") +
             dir + "\n");
  DaemonOptions o;
  absl::Status loaded = LoadConfigFile(f.path(), &o);
  INFO(loaded.ToString());
  REQUIRE(loaded.ok());
  {
    auto d = Daemon::Start(o);
    INFO(d.status().ToString());
    REQUIRE(d.ok());
    auto ns = (*d)->store().Get("tiered");
    REQUIRE(ns.ok());
    CHECK((*ns)->tiered());
    CHECK((*ns)->config().host_compressed_bytes == 4096);
    CHECK((*ns)->config().disk_dir == dir);
    CHECK((*ns)->config().disk_bytes == (1u << 20));
  }
  std::string rm = std::string("rm -rf ") + dir;
  CHECK(std::system(rm.c_str()) == 0);
}

TEST_CASE("Bad tier config values are rejected naming the key",
          "[server][config]") {
  const std::string ns =
      "namespaces: [{name: a, geometry: {num_layers: 1, num_kv_heads: 1, "
      "head_dim: 8, page_size: 2, dtype: bf16}, ";
  struct Case {
    std::string yaml;
    const char* prefix;
  };
  const Case cases[] = {
      {ns + "codec: zip}]\n",
       "config: namespaces[0].codec: unknown value 'zip'"},
      {ns + "codec: kvtc}]\n",
       "config: namespaces[0].calibration_path: required"},
      {ns + "calibration_path: /x}]\n",
       "config: namespaces[0].calibration_path: only a calibrated codec"},
      {ns + "host_compressed_bytes: lots}]\n",
       "config: namespaces[0].host_compressed_bytes:"},
      {ns + "disk_dir: /tmp/x}]\n",
       "config: namespaces[0].disk_dir: a disk tier needs"},
      {ns + "host_compressed_bytes: 1MiB, disk_dir: ''}]\n",
       "config: namespaces[0].disk_dir: empty"},
      {ns + "disk_bytes: 1GiB}]\n",
       "config: namespaces[0].disk_bytes: set without disk_dir"},
      {ns + "host_compressed_bytes: 1MiB, disk_dir: /tmp/x, disk_bytes: 1.5}]"
            "\n",
       "config: namespaces[0].disk_bytes:"},
      {"namespaces:\n"
       "  - {name: a, geometry: {num_layers: 1, num_kv_heads: 1, head_dim: 8, "
       "page_size: 2, dtype: bf16}, host_compressed_bytes: 1MiB, disk_dir: "
       "/d}\n"
       "  - {name: b, geometry: {num_layers: 1, num_kv_heads: 1, head_dim: 8, "
       "page_size: 2, dtype: bf16}, host_compressed_bytes: 1MiB, disk_dir: "
       "/d}\n",
       "config: namespaces[1].disk_dir: '/d' is used by another namespace"},
  };
  for (const Case& c : cases) {
    INFO(c.yaml);
    TempFile f(c.yaml);
    DaemonOptions o;
    absl::Status s = LoadConfigFile(f.path(), &o);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Matchers::StartsWith(c.prefix));
  }
}

TEST_CASE("Device tier config keys load and bad values name the key",
          "[server][config]") {
  TempFile f(
      "store:\n  device_pool_bytes: 2GiB\n  device: 1\n  allow_ipc: true\n"
      "  promote_on_fetch: true\n");
  DaemonOptions o;
  CHECK_FALSE(o.store.allow_ipc);  // IPC handles are off unless configured
  CHECK_FALSE(o.store.promote_on_fetch);  // off by default
  REQUIRE(LoadConfigFile(f.path(), &o).ok());
  CHECK(o.store.device_pool_bytes == uint64_t{2} << 30);
  CHECK_FALSE(o.device_pool_auto);
  CHECK(o.store.device == 1);
  CHECK(o.store.allow_ipc);
  CHECK(o.store.promote_on_fetch);
  const std::pair<const char*, const char*> bad[] = {
      {"store:\n  allow_ipc: yes\n", "config: store.allow_ipc:"},
      {"store:\n  promote_on_fetch: yes\n", "config: store.promote_on_fetch:"},
      {"store:\n  device: -1\n", "config: store.device:"},
      {"store:\n  device: 5000\n", "config: store.device:"},
      {"store:\n  device_pool_bytes: lots\n",
       "config: store.device_pool_bytes:"},
  };
  for (const auto& [yaml, prefix] : bad) {
    DaemonOptions d;
    ExpectRefused(yaml, prefix, &d);
  }
  // "auto" (kvharbord's default, server/daemon/device_setup.h); a size or 0
  // turns it off.
  {
    TempFile a("store:\n  device_pool_bytes: auto\n");
    DaemonOptions ao;
    REQUIRE(LoadConfigFile(a.path(), &ao).ok());
    CHECK(ao.device_pool_auto);
    TempFile zero("store:\n  device_pool_bytes: 0\n");
    ao.device_pool_auto = true;
    REQUIRE(LoadConfigFile(zero.path(), &ao).ok());
    CHECK_FALSE(ao.device_pool_auto);
    CHECK(ao.store.device_pool_bytes == 0);
  }
  DaemonOptions d;
  d.store.device = -3;
  absl::Status st = ValidateDaemonOptions(d, "flags");
  CHECK_THAT(std::string(st.message()),
             Catch::Matchers::StartsWith("flags: store.device:"));
}

TEST_CASE("Host IPC config keys load and bad values name the key",
          "[server][config][host_ipc]") {
  DaemonOptions o;
  CHECK(o.host_ipc.socket.empty());  // same-host Fetch is off by default
  CHECK(o.host_ipc.socket_mode == 0600);
  TempFile f(
      "store:\n  host_ipc_socket: /run/kvharbor/kvh.sock\n"
      "  host_ipc_socket_mode: '0660'\n");
  REQUIRE(LoadConfigFile(f.path(), &o).ok());
  CHECK(o.host_ipc.socket == "/run/kvharbor/kvh.sock");
  CHECK(o.host_ipc.socket_mode == 0660);
  const std::pair<std::string, const char*> bad[] = {
      {"store:\n  host_ipc_socket: relative.sock\n",
       "config: store.host_ipc_socket: 'relative.sock' must be an absolute"},
      {"store:\n  host_ipc_socket: /" + std::string(120, 'x') + "\n",
       "config: store.host_ipc_socket: the path has 121 bytes"},
      {"store:\n  host_ipc_socket: [a]\n",
       "config: store.host_ipc_socket: must be a single value"},
      {"store:\n  host_ipc_socket_mode: rw\n",
       "config: store.host_ipc_socket_mode: 'rw' is not an octal"},
      {"store:\n  host_ipc_socket_mode: '0666'\n",
       "config: store.host_ipc_socket_mode: 0666 must grant"},
      {"store:\n  host_ipc_socket_mode: '0400'\n",
       "config: store.host_ipc_socket_mode: 0400 must grant"},
  };
  for (const auto& [yaml, prefix] : bad) {
    DaemonOptions d;
    ExpectRefused(yaml, prefix, &d);
  }
}

TEST_CASE("Without that GPU (or CUDA) the daemon keeps host pools",
          "[server][config]") {
  spdlog::set_level(spdlog::level::off);
  DaemonOptions o;
  o.listen = "127.0.0.1:0";
  o.store.pool_budget_bytes = 8 << 20;
  o.store.default_namespace_bytes = 1 << 20;
  o.store.device_pool_bytes = 1 << 20;
  o.store.device = kMaxDeviceIndex;  // no machine has this GPU
  NamespaceSpec spec;
  spec.name = "a";
  spec.geometry.num_layers = 1;
  spec.geometry.num_kv_heads = 1;
  spec.geometry.head_dim = 8;
  spec.geometry.page_size = 2;
  o.namespaces.push_back(spec);
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  CHECK((*d)->store().options().device_tier == nullptr);
  CHECK((*d)->store().options().pool_budget_bytes == 8 << 20);
  CHECK((*d)->store().Get("a").ok());
}

TEST_CASE("Bad config values are rejected naming the key", "[server][config]") {
  struct Case {
    const char* yaml;
    const char* prefix;
  };
  const Case cases[] = {
      {"listne: x\n", "config: listne: unknown key"},
      {"listen: nowhere\n", "config: listen:"},
      {"listen: [a, b]\n", "config: listen: must be a single value"},
      {"store: 5\n", "config: store: must be a mapping"},
      {"store: {pool_bytes: 1}\n", "config: store.pool_bytes: unknown key"},
      {"store: {pool_budget_bytes: lots}\n",
       "config: store.pool_budget_bytes:"},
      {"store: {pool_budget_bytes: -5}\n", "config: store.pool_budget_bytes:"},
      {"store: {pool_budget_bytes: 4.5GiB}\n",
       "config: store.pool_budget_bytes:"},
      {"store: {pool_budget_bytes: 99999999999TiB}\n",
       "config: store.pool_budget_bytes:"},
      {"store: {pool_budget_bytes: 0}\n", "config: store.pool_budget_bytes:"},
      {"store: {default_lease_ttl_ms: 0}\n",
       "config: store.default_lease_ttl_ms:"},
      {"store: {default_lease_ttl_ms: 5000, max_lease_ttl_ms: 1000}\n",
       "config: store.max_lease_ttl_ms:"},
      {"store: {max_tokens_per_request: 0}\n",
       "config: store.max_tokens_per_request:"},
      {"store: {max_tokens_per_request: 99999999}\n",
       "config: store.max_tokens_per_request:"},
      {"fetch: {default_chunk_bytes: 100}\n",
       "config: fetch.default_chunk_bytes:"},
      {"fetch: {default_chunk_bytes: 2MiB, max_chunk_bytes: 1MiB}\n",
       "config: fetch.default_chunk_bytes:"},
      {"fetch: {max_chunk_bytes: 64MiB}\n", "config: fetch.max_chunk_bytes:"},
      {"fetch: {chunk: 1}\n", "config: fetch.chunk: unknown key"},
      {"drain_timeout_ms: soon\n", "config: drain_timeout_ms:"},
      {"lease_reap_interval_ms: 0\n", "config: lease_reap_interval_ms:"},
      {"namespaces: {a: 1}\n", "config: namespaces: must be a list"},
      {"namespaces: [5]\n", "config: namespaces[0]: must be a mapping"},
      {"namespaces: [{geometry: {}}]\n",
       "config: namespaces[0].name: required"},
      {"namespaces: [{name: 'a b'}]\n", "config: namespaces[0].name:"},
      {"namespaces: [{name: a}]\n", "config: namespaces[0].geometry: required"},
      {"namespaces: [{name: a, colour: red}]\n",
       "config: namespaces[0].colour: unknown key"},
      {"namespaces: [{name: a, geometry: {num_layers: 1, num_kv_heads: 1, "
       "head_dim: 8, dtype: bf16}}]\n",
       "config: namespaces[0].geometry.page_size: required"},
      {"namespaces: [{name: a, geometry: {num_layers: 1, num_kv_heads: 1, "
       "head_dim: 8, page_size: 2}}]\n",
       "config: namespaces[0].geometry.dtype: required"},
      {"namespaces: [{name: a, geometry: {num_layers: 1, num_kv_heads: 1, "
       "head_dim: 8, page_size: 2, dtype: int4}}]\n",
       "config: namespaces[0].geometry.dtype: unknown value 'int4'"},
      {"namespaces: [{name: a, geometry: {num_layers: 1, num_kv_heads: 1, "
       "head_dim: 8, page_size: 2, dtype: bf16, layout: rows}}]\n",
       "config: namespaces[0].geometry.layout: unknown value 'rows'"},
      {"namespaces: [{name: a, geometry: {num_layers: 1, num_kv_heads: 1, "
       "head_dim: 0, page_size: 2, dtype: bf16}}]\n",
       "config: namespaces[0].geometry.head_dim:"},
      {"namespaces: [{name: a, geometry: {num_layers: 1, num_kv_heads: 1, "
       "head_dim: 8, page_size: 2, dtype: bf16, rope_theta: x}}]\n",
       "config: namespaces[0].geometry.rope_theta:"},
      {"namespaces: [{name: a, geometry: {num_layers: 1, num_kv_heads: 1, "
       "head_dim: 8, page_size: 2, dtype: bf16}, capacity_bytes: many}]\n",
       "config: namespaces[0].capacity_bytes:"},
      {"namespaces:\n"
       "  - {name: a, geometry: {num_layers: 1, num_kv_heads: 1, head_dim: 8, "
       "page_size: 2, dtype: bf16}}\n"
       "  - {name: a, geometry: {num_layers: 1, num_kv_heads: 1, head_dim: 8, "
       "page_size: 2, dtype: bf16}}\n",
       "config: namespaces[1].name: 'a' appears twice"},
      {"listen: [unclosed\n", "config: '"},
      {"- just\n- a list\n", "config: (top level): must be a mapping"},
  };
  for (const Case& c : cases) {
    DaemonOptions o;
    o.listen = "127.0.0.1:1";
    ExpectRefused(c.yaml, c.prefix, &o);
    INFO(c.yaml);
    CHECK(o.listen == "127.0.0.1:1");  // unchanged on error
  }
}

TEST_CASE("A missing config file is NOT_FOUND", "[server][config]") {
  DaemonOptions o;
  absl::Status s = LoadConfigFile("/nonexistent/kvharbord.yaml", &o);
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(s.message()),
             Catch::Matchers::StartsWith("config: cannot read"));
}

TEST_CASE("ParseByteSize", "[server][config]") {
  CHECK(*ParseByteSize("0", "f") == 0);
  CHECK(*ParseByteSize("4096", "f") == 4096);
  CHECK(*ParseByteSize("64KiB", "f") == 64 << 10);
  CHECK(*ParseByteSize("3 MiB", "f") == 3 << 20);
  CHECK(*ParseByteSize("4GiB", "f") == uint64_t{4} << 30);
  CHECK(*ParseByteSize("2TiB", "f") == uint64_t{2} << 40);
  CHECK(*ParseByteSize("12B", "f") == 12);
  for (const char* bad : {"", "GiB", "-1", "1.5GiB", "1GB", "1 gib", "x",
                          "20000000TiB", "99999999999999999999"}) {
    INFO(bad);
    absl::StatusOr<uint64_t> v = ParseByteSize(bad, "--pool_bytes");
    REQUIRE_FALSE(v.ok());
    CHECK_THAT(std::string(v.status().message()),
               Catch::Matchers::StartsWith("--pool_bytes: "));
  }
}

TEST_CASE("DefaultPoolBudgetBytes is at most 4 GiB", "[server][config]") {
  const uint64_t b = DefaultPoolBudgetBytes();
  CHECK(b > 0);
  CHECK(b <= (uint64_t{4} << 30));
  const uint64_t ram = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                       static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  CHECK(b <= ram / 4);
}

}  // namespace
}  // namespace kvharbor
