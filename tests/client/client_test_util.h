// Helpers for the SDK tests: an in-process daemon on a free loopback port,
// SDK clients connected to it, and deterministic page bytes and token ids.
//
// Test-only. Everything returned is owned by the caller; the helpers keep no
// state and may be called from any thread.
#ifndef KVHARBOR_TESTS_CLIENT_CLIENT_TEST_UTIL_H_
#define KVHARBOR_TESTS_CLIENT_CLIENT_TEST_UTIL_H_

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvharbor/client.h"
#include "server/daemon/daemon.h"

namespace kvharbor {
namespace testing {

inline std::unique_ptr<Daemon> StartTestDaemon(
    uint64_t budget_bytes = uint64_t{512} << 20,
    absl::Duration reap_interval = absl::Milliseconds(50)) {
  DaemonOptions options;
  options.listen = "127.0.0.1:0";
  options.store.pool_budget_bytes = budget_bytes;
  options.store.default_namespace_bytes = uint64_t{64} << 20;
  options.lease_reap_interval = reap_interval;
  options.drain_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(options);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  return *std::move(d);
}

inline std::unique_ptr<Client> Connect(const Daemon& daemon,
                                       ClientOptions options = {}) {
  options.address = daemon.address();
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(options);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return *std::move(c);
}

inline client::NamespaceSpec MakeSpec(const std::string& name, uint32_t layers,
                                      uint32_t heads, uint32_t head_dim,
                                      uint32_t page_size, client::DType dtype,
                                      uint64_t capacity_bytes = 0) {
  client::NamespaceSpec spec;
  spec.name = name;
  spec.geometry.num_layers = layers;
  spec.geometry.num_kv_heads = heads;
  spec.geometry.head_dim = head_dim;
  spec.geometry.page_size = page_size;
  spec.geometry.dtype = dtype;
  spec.capacity_bytes = capacity_bytes;
  return spec;
}

// Creates `spec` through the SDK and returns the daemon's page size in bytes.
inline uint64_t CreateNs(Client& c, const client::NamespaceSpec& spec) {
  absl::StatusOr<client::CreateNamespaceResult> r = c.CreateNamespace(spec);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  REQUIRE(r->created);
  REQUIRE(r->info.stats.page_bytes == spec.geometry.PageBytes());
  return r->info.stats.page_bytes;
}

inline std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    for (int b = 0; b < 8; ++b) out[i + b] = static_cast<uint8_t>(v >> (8 * b));
  }
  for (; i < n; ++i) out[i] = static_cast<uint8_t>(rng());
  return out;
}

// `pages` fp32 pages of uniform values in [-1, 1]: the range the lossy
// codecs' error bounds in these tests are stated for (KVTC), and inside the
// C8 test ranges (no saturation).
inline std::vector<uint8_t> FloatPages(size_t pages, uint64_t page_bytes,
                                       uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint8_t> out(pages * page_bytes);
  for (size_t i = 0; i + 4 <= out.size(); i += 4) {
    const float v = dist(rng);
    std::memcpy(&out[i], &v, 4);
  }
  return out;
}

// `n` token ids starting at `first` (distinct sequences per `first`).
inline std::vector<int32_t> TokenRange(size_t n, int32_t first) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = first + static_cast<int32_t>(i);
  return t;
}

// Whether `path` is a Unix socket file (the host IPC socket's life cycle).
inline bool IsSocket(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_CLIENT_CLIENT_TEST_UTIL_H_
