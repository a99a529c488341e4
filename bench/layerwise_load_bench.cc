// Layer-wise loads into an engine's cache (issue 16, "Layer ranges"; vLLM's
// wait_for_layer_load): an engine that loads a cached prefix while it
// computes fetches a layout of one layer (or a group of layers) at a time,
// so that layer l waits only for its own fetch. Llama-3.1-8B KV geometry
// (32 layers x 8 KV heads x 128, bf16, 16-token pages of 2 MiB) into a
// vLLM-layout cache ([2, blocks, 16, 8, 128] per layer) through the SDK's
// LayoutTransfer (client/cuda/layout_transfer.h), against kvharbord child
// processes on this machine (tests/cuda/daemon_process.h).
//
// For each prefix length (--tokens) and path, in one run, on one lease per
// repetition (Match untimed): one fetch of all 32 layers (the baseline)
// beside 32 fetches of one layer each and 8 of 4 layers each, in layer
// order. Printed: the first call's time (what the engine's layer 0 waits
// for), the median and largest call, the sum of the calls and its ratio to
// the whole fetch, and the bytes the calls moved (TransferResult::
// bytes_moved, summed) against the whole fetch's: a path that moves only
// the layout's layers moves the same bytes in 32 calls as in one. Medians
// of --iters repetitions after one warm-up.
// Paths: device_ipc (daemon A: device tier, store.allow_ipc), host_shm
// (daemon B: host pools, store.host_ipc_socket) and raw_remote (A over
// gRPC only: host_fetch and device_ipc off). --device=-1 puts the cache in
// host memory (the "cpu" path against daemon B: a layer-range RAW stream
// per call, the whole fetch through the shared arena), which runs without
// a GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/gpu_bench_util.h"
#include "bench/kvtc_bench_util.h"
#include "client/cuda/layout_transfer.h"
#include "kvharbor/client.h"
#include "tests/cuda/daemon_process.h"

ABSL_FLAG(std::string, tokens, "4096,32768", "prefix lengths, comma-separated");
ABSL_FLAG(int, iters, 3, "repetitions per row after one warm-up (median)");
ABSL_FLAG(int, device, 0, "CUDA ordinal of the cache; -1: host memory");
ABSL_FLAG(int, remote_max_tokens, 4096,
          "the remote gRPC rows only up to this prefix length (at ~1.5 GB/s "
          "its 32 one-layer fetches of 32K tokens take minutes)");

namespace kvharbor {
namespace {

using bench::LlamaVllmCache;
using bench::Must;
using bench::Now;
using client::LayoutFetchOptions;
using client::LayoutTransfer;
using client::TransferResult;

constexpr uint32_t kLayers = bench::kLlamaLayers, kHeads = bench::kLlamaHeads,
                   kDim = bench::kLlamaDim, kPage = bench::kLlamaPage;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One row: the calls of a load in `group`-layer fetches, repeated.
struct Row {
  std::string path;
  double first = 0, call_median = 0, call_max = 0, total = 0;
  uint64_t bytes = 0;
  int calls = 0;
};

// Loads the prefix `prefix` (lease pages -> blocks) in fetches of `group`
// layers, 1 + iters times; medians of the repetitions after the first.
Row Load(Client& c, LayoutTransfer& t, const std::string& ns,
         const std::vector<int32_t>& prefix, const LlamaVllmCache& cache,
         const std::vector<int64_t>& blocks, uint32_t group) {
  Row row;
  std::vector<double> firsts, totals, calls;
  for (int rep = 0; rep <= absl::GetFlag(FLAGS_iters); ++rep) {
    // A lease long enough for the slowest row (the daemon caps it).
    const client::Lease l = Must(c.Match(ns, prefix, true, absl::Minutes(10)));
    LayoutFetchOptions o;
    o.page_tiers = l.page_tiers;
    double total = 0;
    uint64_t bytes = 0;
    for (uint32_t b = 0; b < kLayers; b += group) {
      const PagedKvLayout layout =
          cache.Layers(b, std::min(b + group, kLayers));
      const double t0 = Now();
      const TransferResult r = Must(t.Fetch(ns, l.id, layout, blocks, o));
      const double s = Now() - t0;
      total += s;
      bytes += r.bytes_moved;
      row.path = r.path;
      if (rep == 0) continue;  // warm-up
      if (b == 0) firsts.push_back(s);
      calls.push_back(s);
    }
    BENCH_CHECK(c.Release(l.id));
    if (rep > 0) totals.push_back(total);
    row.bytes = bytes;
  }
  row.first = Median(firsts);
  row.call_median = Median(calls);
  row.call_max =
      calls.empty() ? 0 : *std::max_element(calls.begin(), calls.end());
  row.total = Median(totals);
  row.calls = static_cast<int>((kLayers + group - 1) / group);
  return row;
}

void Print(int tokens, const std::string& source, uint32_t group, const Row& r,
           const Row& whole) {
  const std::string mode = group == kLayers ? std::string("all layers")
                                            : absl::StrFormat("by %u", group);
  std::printf(
      "%6d  %-12s %-10s %-11s %5d %9.5f %9.5f %9.5f %9.5f %7.2fx %9.1f "
      "%6.3f\n",
      tokens, source.c_str(), mode.c_str(), r.path.c_str(), r.calls, r.first,
      r.call_median, r.call_max, r.total, r.total / whole.total,
      r.bytes / double(1 << 20),
      whole.bytes == 0 ? 0.0 : r.bytes / double(whole.bytes));
}

std::unique_ptr<Client> Connect(const testing::Kvharbord& d, bool same_host) {
  ClientOptions o;
  if (!same_host) {
    o.host_fetch = HostFetchMode::kOff;
    o.device_ipc = DeviceIpcMode::kOff;
  }
  return Must(testing::ConnectChild(d, o));
}

int Main() {
  std::vector<int> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    sizes.push_back(std::stoi(std::string(s)) / kPage * kPage);
  }
  const int device = absl::GetFlag(FLAGS_device);
  const int max_tokens = *std::max_element(sizes.begin(), sizes.end());
  const uint64_t max_pages = max_tokens / kPage;
  const Geometry g = bench::LlamaKvGeometry();
  const uint64_t pb = g.PageBytes();
  std::printf(
      "layerwise_load_bench: Llama-3.1-8B KV (32 x 8 x 128 bf16, %lu-byte "
      "pages), prefixes %s tokens, cache on %s, median of %d after a "
      "warm-up\n",
      pb, absl::GetFlag(FLAGS_tokens).c_str(),
      device >= 0 ? absl::StrFormat("GPU %d", device).c_str() : "the host",
      absl::GetFlag(FLAGS_iters));
  if (device >= 0) CUDA_CHECK(cudaSetDevice(device));

  char tmpl[] = "/tmp/kvh_layerwise_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const uint64_t ns_bytes = max_pages * pb + (uint64_t{64} << 20);
  std::unique_ptr<testing::Kvharbord> da;
  if (device >= 0) {
    da = testing::StartChildDaemon(
        dir, "device",
        absl::StrFormat("store:\n  pool_budget_bytes: %u\n  "
                        "device_pool_bytes: %u\n  allow_ipc: true\n",
                        2 * ns_bytes, ns_bytes + (uint64_t{256} << 20)));
  }
  auto db = testing::StartChildDaemon(
      dir, "host",
      absl::StrFormat("store:\n  pool_budget_bytes: %u\n", 2 * ns_bytes),
      {"--host_ipc_socket=" + dir + "/kvh.sock"});
  client::NamespaceSpec raw;
  raw.name = "raw";
  raw.geometry = g;
  raw.capacity_bytes = ns_bytes;
  const std::vector<uint8_t> tile = bench::GaussianBf16Tile(64 << 20);
  std::vector<absl::Span<const uint8_t>> views;
  for (uint64_t p = 0; p < max_pages; ++p) {
    const size_t at = (p * 8198 + p * pb / 7) % (tile.size() - pb) & ~size_t{1};
    views.push_back(absl::MakeConstSpan(tile.data() + at, pb));
  }
  std::vector<int32_t> tokens(max_tokens);
  for (int i = 0; i < max_tokens; ++i) tokens[i] = i + 1;
  // (name, client, transfer) per path.
  struct Path {
    std::string name;
    std::unique_ptr<Client> client;
    std::unique_ptr<LayoutTransfer> transfer;
  };
  std::vector<Path> paths;
  auto add = [&](const std::string& name, const testing::Kvharbord& d,
                 bool same_host) {
    Path p{name, Connect(d, same_host), nullptr};
    p.transfer = Must(LayoutTransfer::Create(p.client.get()));
    paths.push_back(std::move(p));
  };
  if (device >= 0) {
    add("device tier", *da, true);
    add("host shm", *db, true);
    add("remote gRPC", *da, false);
    BENCH_CHECK(paths[0].client->CreateNamespace(raw).status());
    BENCH_CHECK(paths[0].client->Insert("raw", tokens, views).status());
    BENCH_CHECK(paths[1].client->CreateNamespace(raw).status());
    BENCH_CHECK(paths[1].client->Insert("raw", tokens, views).status());
  } else {
    add("host cache", *db, true);
    BENCH_CHECK(paths[0].client->CreateNamespace(raw).status());
    BENCH_CHECK(paths[0].client->Insert("raw", tokens, views).status());
  }
  LlamaVllmCache cache(max_pages, device);

  std::printf("\n%6s  %-12s %-10s %-11s %5s %9s %9s %9s %9s %8s %9s %6s\n",
              "tokens", "source", "layers", "path", "calls", "first_s",
              "call_med", "call_max", "total_s", "vs_whole", "MiB_moved",
              "bytes");
  for (int T : sizes) {
    const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + T);
    const uint64_t pages = T / kPage;
    std::vector<int64_t> blocks(pages);
    for (uint64_t i = 0; i < pages; ++i) blocks[i] = pages - 1 - i;
    for (Path& p : paths) {
      if (p.name == "remote gRPC" &&
          T > absl::GetFlag(FLAGS_remote_max_tokens)) {
        std::printf("%6d  %-12s skipped (--remote_max_tokens=%d)\n", T,
                    p.name.c_str(), absl::GetFlag(FLAGS_remote_max_tokens));
        continue;
      }
      const Row whole =
          Load(*p.client, *p.transfer, "raw", prefix, cache, blocks, kLayers);
      Print(T, p.name, kLayers, whole, whole);
      for (uint32_t group : {1u, 4u}) {
        const Row r =
            Load(*p.client, *p.transfer, "raw", prefix, cache, blocks, group);
        Print(T, p.name, group, r, whole);
      }
    }
  }
  std::printf(
      "\nfirst_s: the first call (layer 0's wait); vs_whole: the calls' sum "
      "over the one fetch of all layers; bytes: bytes_moved over the "
      "whole fetch's (1.000: only the layers' bytes move)\n");
  return 0;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  return kvharbor::Main();
}
