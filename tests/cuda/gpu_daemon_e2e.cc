// The daemon on a GPU machine, as a separate kvharbord process (GPU machine
// only; built as kvharbor_gpu_daemon_tests, run by scripts/gpu_checks.sh;
// CUDA IPC cannot map an arena in the process that exported it):
//   - README command 1's defaults (store.device_pool_bytes auto) give a
//     daemon whose pools live in a device arena it states at startup, made
//     by the GPU tier plugin it loaded;
//   - DeviceInsert: this process maps the arena by IPC, copies pages into
//     the reserved slots device-to-device, hashes them there with the GPU
//     XXH3 kernel and commits; the pages come back byte-exact through Fetch
//     and GetDeviceHandles; a page changed after hashing is DATA_LOSS and
//     nothing is stored;
//   - GetDeviceHandles with stage_cold on host-KVTC pages: the staged pages,
//     copied out through the IPC mapping, equal the SDK's CPU decode.
// The kvharbord binary is the one next to this executable (the GPU bundle),
// else $KVHARBORD, else the build tree's.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cuda/device_ipc.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "cuda/kernels/xxh3_checksum.h"
#include "kvharbor/client.h"
#include "tests/client/client_test_util.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"
#include "tests/server/subprocess.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

using testing::TempDir;
using testing::TokenRange;

// fp16, 4 layers, 4 heads, head_dim 64, 16 tokens a page: 64 KiB pages.
constexpr uint32_t kLayers = 4, kHeads = 4, kHeadDim = 64, kPageSize = 16;
constexpr uint64_t kPageBytes = 2 * kLayers * kPageSize * kHeads * kHeadDim * 2;

std::string KvharbordPath() {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string dir(self, n);
    dir.resize(dir.rfind('/') + 1);
    if (access((dir + "kvharbord").c_str(), X_OK) == 0) {
      return dir + "kvharbord";
    }
  }
  if (const char* env = std::getenv("KVHARBORD")) return env;
  return KVHARBORD_PATH;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A kvharbord child with `config_yaml`, its output in dir/name.log.
struct Child {
  Child(const TempDir& dir, const std::string& name,
        const std::string& config_yaml)
      : log(dir.path + "/" + name + ".log") {
    const std::string config = dir.Write(name + ".yaml", config_yaml);
    proc = std::make_unique<testing::Kvharbord>(
        KvharbordPath(),
        std::vector<std::string>{"--config=" + config, "--log_level=info"},
        log);
    REQUIRE(proc->started());
    ClientOptions o;
    o.address = proc->address();
    o.wait_for_ready = true;
    o.default_timeout = absl::Seconds(60);
    o.max_message_bytes = 64 << 20;
    auto c = Client::Create(o);
    REQUIRE(c.ok());
    client = *std::move(c);
    const bool up =
        client->WaitForConnected(absl::Now() + absl::Seconds(60)).ok();
    INFO(ReadAll(log));
    REQUIRE(up);
  }
  std::string log;
  std::unique_ptr<testing::Kvharbord> proc;
  std::unique_ptr<Client> client;
};

constexpr char kIpcConfig[] =
    "store:\n  device_pool_bytes: 256MiB\n  allow_ipc: true\n"
    "  pool_budget_bytes: 256MiB\n";

client::NamespaceSpec Spec(const std::string& name, uint32_t pages) {
  client::NamespaceSpec s =
      testing::MakeSpec(name, kLayers, kHeads, kHeadDim, kPageSize,
                        client::DType::kFP16, pages * kPageBytes);
  s.host_compressed_bytes = 16 << 20;
  return s;
}

// The arena of the daemon mapped into this process by IPC.
const uint8_t* MapArena(const client::DeviceInsertSlots& s) {
  client::DeviceHandles h;
  h.ipc_handle = s.ipc_handle;
  h.device = s.device;
  h.device_uuid = s.device_uuid;
  h.arena_bytes = s.arena_bytes;
  absl::StatusOr<client::DeviceArenaMapper::Mapping> m =
      client::DeviceArenaMapper::Process().Map(h);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  return m->base;
}

TEST_CASE("GPU daemon: the default config gives a device pool it states",
          "[gpu][daemon]") {
  TempDir dir;
  Child d(dir, "auto", "store:\n  pool_budget_bytes: 64MiB\n");
  std::string log;
  for (int i = 0; i < 200; ++i) {  // the summary comes once it serves
    log = ReadAll(d.log);
    if (absl::StrContains(log, "serving on")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  INFO(log);
  // e.g. "device tier: GPU 0 (NVIDIA H200), device arena 8.00 GiB
  // (store.device_pool_bytes auto: 1/16 of the 139.xx GiB free, ...)"
  CHECK(absl::StrContains(log, "device tier: GPU "));
  CHECK(absl::StrContains(log, "store.device_pool_bytes auto: 1/16 of the"));
  CHECK(absl::StrContains(log, "on the GPU ("));  // the startup summary
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, "device tier: ")) {
      std::printf("kvharbord with the defaults: %s\n",
                  std::string(line).c_str());
    }
  }
  // Its namespaces' pages are served from the device arena.
  REQUIRE(d.client->CreateNamespace(Spec("ns", 4)).ok());
  const auto tok = TokenRange(2 * kPageSize, 7);
  const auto pages = testing::RandomBytes(2 * kPageBytes, 7);
  REQUIRE(d.client->Insert("ns", tok, pages, kPageBytes).ok());
  auto got = d.client->Fetch("ns", client::FetchSource::FromLease(
                                       d.client->Match("ns", tok, true)->id));
  REQUIRE(got.ok());
  CHECK((*got)[1] ==
        std::vector<uint8_t>(pages.begin() + kPageBytes, pages.end()));
}

TEST_CASE("GPU daemon: DeviceInsert by IPC stores the pages byte-exact",
          "[gpu][daemon][device_insert]") {
  TempDir dir;
  Child d(dir, "ins", kIpcConfig);
  Client& c = *d.client;
  REQUIRE(c.CreateNamespace(Spec("before", 4)).ok());
  REQUIRE(c.CreateNamespace(Spec("ns", 16)).ok());
  constexpr size_t kPages = 10;
  const auto tok = TokenRange(kPages * kPageSize, 100);
  const auto pages = testing::RandomBytes(kPages * kPageBytes, 11);
  // The first 3 pages cached already: the insert writes only the rest.
  REQUIRE(c.Insert("ns", absl::MakeConstSpan(tok).first(3 * kPageSize),
                   absl::MakeConstSpan(pages).first(3 * kPageBytes), kPageBytes)
              .ok());
  uint8_t* src = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&src), pages.size()) ==
          cudaSuccess);
  REQUIRE(cudaMemcpy(src, pages.data(), pages.size(), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  auto sums = gpu::Xxh3Checksummer::Create(0);
  REQUIRE(sums.ok());

  auto up = c.BeginDeviceInsert("ns", tok);
  INFO(up.status().ToString());
  REQUIRE(up.ok());
  const client::DeviceInsertSlots& s = (*up)->slots();
  REQUIRE(s.first_page == 3);
  REQUIRE(s.slots.size() == kPages - 3);
  const uint8_t* base = MapArena(s);
  std::vector<const uint8_t*> where;
  for (size_t i = 0; i < s.slots.size(); ++i) {
    uint8_t* dst = const_cast<uint8_t*>(base) + s.slots[i].offset;
    REQUIRE(cudaMemcpy(dst, src + (s.first_page + i) * kPageBytes, kPageBytes,
                       cudaMemcpyDeviceToDevice) == cudaSuccess);
    where.push_back(dst);
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  auto h = (*sums)->Checksum(where, kPageBytes);
  REQUIRE(h.ok());
  auto r = (*up)->Commit(*h);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->pages_stored == kPages - 3);
  CHECK(r->already_present_tokens == 3 * kPageSize);
  // Back through gRPC (checksums verified by the SDK) and through IPC.
  auto l = c.Match("ns", tok, /*lock=*/true);
  REQUIRE(l.ok());
  REQUIRE(l->matched_tokens == tok.size());
  auto got = c.Fetch("ns", client::FetchSource::FromLease(l->id));
  REQUIRE(got.ok());
  std::vector<uint8_t> joined;
  for (const auto& p : *got) joined.insert(joined.end(), p.begin(), p.end());
  CHECK(joined == pages);
  REQUIRE(c.Release(l->id).ok());
  std::printf(
      "device_insert ipc: %zu pages written by IPC and committed "
      "(%u skipped as cached), fetched back byte-exact\n",
      s.slots.size(), s.first_page);

  // A page changed after it was hashed: DATA_LOSS, nothing stored.
  const auto tok2 = TokenRange(4 * kPageSize, 5000);
  auto up2 = c.BeginDeviceInsert("ns", tok2);
  REQUIRE(up2.ok());
  std::vector<const uint8_t*> where2;
  for (size_t i = 0; i < 4; ++i) {
    uint8_t* dst = const_cast<uint8_t*>(base) + (*up2)->slots().slots[i].offset;
    REQUIRE(cudaMemcpy(dst, src + i * kPageBytes, kPageBytes,
                       cudaMemcpyDeviceToDevice) == cudaSuccess);
    where2.push_back(dst);
  }
  // The copies are asynchronous to the host and the checksummer hashes on
  // its own non-blocking stream: wait for them first.
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  auto h2 = (*sums)->Checksum(where2, kPageBytes);
  REQUIRE(h2.ok());
  REQUIRE(cudaMemset(const_cast<uint8_t*>(where2[2]) + 100, 0x5a, 1) ==
          cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  absl::Status bad = (*up2)->Commit(*h2).status();
  INFO(bad.ToString());
  CHECK(bad.code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StartsWith(bad.message(), "commit.page_checksums[2]: "));
  CHECK(c.Match("ns", tok2)->matched_tokens == 0);
  auto st = c.Stats("ns");
  REQUIRE(st.ok());
  CHECK(st->namespaces[0].free_pages == 16 - kPages);  // no slot leaked
  cudaFree(src);
}

TEST_CASE("GPU daemon: stage_cold hands host-KVTC pages over by IPC",
          "[gpu][daemon][stage]") {
  TempDir dir;
  Child d(dir, "stage", kIpcConfig);
  Client& c = *d.client;
  // fp32 (finite values for KVTC), 2 layers, 2 heads, head_dim 64: 32 KiB
  // pages.
  constexpr uint32_t kL = 2, kH = 2, kD = 64;
  constexpr uint64_t kBytes = 2 * kL * kPageSize * kH * kD * 4;
  Geometry g;
  g.num_layers = kL;
  g.num_kv_heads = kH;
  g.head_dim = kD;
  g.page_size = kPageSize;
  g.dtype = DType::kFP32;
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  // All-FP8 identity bases: GPU and CPU decode agree bit for bit.
  auto cal = testing::MakeCalibration(g, KvtcRowKind::kPerToken,
                                      IdentityBasis(f, f, testing::Fp8All(f)),
                                      IdentityBasis(f, f, testing::Fp8All(f)));
  auto cal_bytes = SerializeKvtcCalibration(*cal);
  REQUIRE(cal_bytes.ok());
  client::NamespaceSpec s = testing::MakeSpec(
      "kv", kL, kH, kD, kPageSize, client::DType::kFP32, 16 * kBytes);
  s.host_compressed_bytes = 16 << 20;
  s.codec = "kvtc";
  s.calibration = *cal_bytes;
  REQUIRE(c.CreateNamespace(s).ok());
  constexpr size_t kPages = 8;
  const auto tok = TokenRange(kPages * kPageSize, 9);
  REQUIRE(
      c.Insert("kv", tok, testing::FloatPages(kPages, kBytes, 3), kBytes).ok());
  REQUIRE(c.Demote("kv", client::Tier::kHostCompressed).ok());
  auto l = c.Match("kv", tok, /*lock=*/true);
  REQUIRE(l.ok());
  REQUIRE(l->page_tiers[0] == client::Tier::kHostCompressed);
  auto comp = c.FetchCompressed("kv", client::FetchSource::FromLease(l->id));
  REQUIRE(comp.ok());
  client::DeviceHandlesOptions stage;
  stage.stage_cold = true;
  auto h = c.GetDeviceHandles("kv", l->id, stage);
  INFO(h.status().ToString());
  REQUIRE(h.ok());
  REQUIRE(h->pages.size() == kPages);
  uint8_t* dst = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dst), kPages * kBytes) ==
          cudaSuccess);
  REQUIRE(client::DeviceArenaMapper::Process()
              .CopyPages(*h, dst, kPages * kBytes, nullptr)
              .ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<uint8_t> got(kPages * kBytes);
  REQUIRE(cudaMemcpy(got.data(), dst, got.size(), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  size_t exact = 0;
  for (size_t i = 0; i < kPages; ++i) {
    auto want = c.DecodePage("kv", (*comp)[i]);
    REQUIRE(want.ok());
    REQUIRE(want->size() == kBytes);
    exact += std::equal(want->begin(), want->end(), got.begin() + i * kBytes);
  }
  CHECK(exact == kPages);
  std::printf(
      "stage_cold over ipc: %zu host-KVTC pages staged, %zu equal to "
      "the CPU decode\n",
      kPages, exact);
  REQUIRE(c.Release(l->id).ok());
  cudaFree(dst);
}

}  // namespace
}  // namespace kvharbor
