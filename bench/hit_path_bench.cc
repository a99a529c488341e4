// Hit paths into an engine's GPU KV cache (issue 20), Llama-3.1-8B KV
// geometry (32 layers x 8 KV heads x 128, bf16, 16-token pages: 2 MiB),
// measured end to end against kvharbord child processes on this machine
// (tests/cuda/daemon_process.h) through the SDK's LayoutTransfer
// (client/cuda/layout_transfer.h), into a vLLM-layout cache
// ([2, blocks, 16, 8, 128] per layer) on GPU 0.
//
// Load time = Match (lock) + fetch + decode + scatter until the layout holds
// the prefix (the call synchronises). For each prefix length (--tokens) and
// path: the first call (cold: IPC mapping, arena registration, GPU decoder)
// and the median of --iters warm calls; GB/s of raw page bytes; the speedup
// over the OLD hit path measured in the same run (the same pages fetched
// into pageable host memory with Client::FetchInto, then cudaMemcpy'd to the
// GPU: what an engine had to do before); the ratio to the prefill times
// issue 20 measured with HF transformers on an H200 (printed as reference,
// not measured here); and each copy stage's rate as a fraction of its link
// (pinned H2D / D2H and D2D measured here with cudaMemcpy).
// Paths: device_ipc (daemon A, device tier, store.allow_ipc), host_shm
// (daemon B, host pools, store.host_ipc_socket), compressed_local (KVTC
// pages demoted to A's host tier, GPU decode, random calibration of
// --components components), compressed_remote and raw_remote (gRPC only:
// host_fetch, device_ipc and the data plane off), remote_bulk (the same
// client with A's bulk data plane, docs/data_plane.md), and the insert
// from the layout: into B
// (host_shm: gather + D2H into this process's staging region, which the
// daemon copies the pages out of; and, as a client on another host would,
// remote_bulk: gather + D2H + B's bulk data plane, docs/data_plane.md) and
// into A (device_ipc:
// DeviceInsert, one gather into A's device slots by CUDA IPC), beside the
// old path (cudaMemcpy to pageable memory + Insert); each insert's whole
// call as a fraction of pinned D2H.
// The host KVTC rows are printed for each reconstruction GEMM mode
// (ClientOptions::gpu_decode_gemm: fp32, tf32, bf16; two batches in flight)
// beside FP32 with the fewest staging slots the SDK accepts (2: the least
// overlap, the nearest to its decode before), with each mode's ratio to that
// row and its relative RMS error against the SDK's CPU decode of the first 8
// pages, and beside stage_cold (the daemon decodes the pages on its GPU into
// its device tier, then device_ipc; the pages are demoted again before each
// call, untimed), and the default mode again beside the same fetch with one
// message per compressed page (ClientOptions::fetch_pages_per_message = 1:
// the stream before packing), with their load ratio and stream stages, and
// beside the same fetch decoded into staging slots and then scattered
// (LayoutTransferOptions::decode_into_layout = false: the path before the
// decode wrote the layout itself), with their load ratio and decode and
// scatter stages, and beside the same fetch over one gRPC stream
// (LayoutTransferOptions::compressed_streams = 1: the stream before
// several), with their load ratio and stream stages, and beside the same
// fetch with each group's payload copied range by range
// (LayoutTransferOptions::h2d_batch_bytes = 0: the copies before they were
// gathered), with their load ratio and the gathered h2d stage's rate.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/gpu_bench_util.h"
#include "bench/kvtc_bench_util.h"
#include "client/cuda/layout_transfer.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/memory/paged_kv_copy.h"
#include "kvharbor/client.h"
#include "tests/cuda/daemon_process.h"

ABSL_FLAG(std::string, tokens, "4096,32768", "prefix lengths, comma-separated");
ABSL_FLAG(int, iters, 3, "warm calls per path (median reported)");
ABSL_FLAG(int, components, 1024, "PCA components of the KVTC calibration");

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

// Issue 20's HF prefill times of a Llama-3.1-8B-shaped model on an H200.
double IssuePrefillSeconds(int tokens) {
  static const std::map<int, double> kPrefill = {
      {1024, 0.032}, {4096, 0.123}, {16384, 0.568}, {32768, 1.406}};
  auto it = kPrefill.find(tokens);
  return it == kPrefill.end() ? 0 : it->second;
}

struct Links {
  double h2d = 0, d2h = 0, d2d = 0;  // GB/s
};

Links MeasureLinks() {
  const size_t bytes = size_t{1} << 30;
  void *pinned, *a, *b;
  CUDA_CHECK(cudaHostAlloc(&pinned, bytes, 0));
  CUDA_CHECK(cudaMalloc(&a, bytes));
  CUDA_CHECK(cudaMalloc(&b, bytes));
  std::memset(pinned, 1, bytes);
  auto rate = [&](void* dst, const void* src, cudaMemcpyKind kind) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
    double best = 1e9;
    for (int i = 0; i < 3; ++i) {
      const double t0 = Now();
      CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
      CUDA_CHECK(cudaDeviceSynchronize());
      best = std::min(best, Now() - t0);
    }
    return bytes / best / 1e9;
  };
  Links l;
  l.h2d = rate(a, pinned, cudaMemcpyHostToDevice);
  l.d2h = rate(pinned, a, cudaMemcpyDeviceToHost);
  l.d2d = rate(b, a, cudaMemcpyDeviceToDevice);
  cudaFreeHost(pinned);
  cudaFree(a);
  cudaFree(b);
  return l;
}

// 64 MiB of Gaussian bf16; page i is read from it at a page-dependent shift.
std::vector<uint8_t> MakeTile() { return bench::GaussianBf16Tile(64 << 20); }

std::vector<absl::Span<const uint8_t>> PageViews(
    const std::vector<uint8_t>& tile, size_t pages, uint64_t pb) {
  std::vector<absl::Span<const uint8_t>> out;
  const size_t span = tile.size() - pb;
  for (size_t p = 0; p < pages; ++p) {
    const size_t at = (p * 4099 * 2 + p * pb / 7) % span & ~size_t{1};
    out.push_back(absl::MakeConstSpan(tile.data() + at, pb));
  }
  return out;
}

std::string WriteCalibration(const std::string& dir, int components) {
  KvtcCalibration cal;
  cal.row_kind = KvtcRowKind::kPerToken;
  cal.num_layers = kLayers;
  cal.num_kv_heads = kHeads;
  cal.head_dim = kDim;
  cal.page_size = kPage;
  cal.sink_tokens = 4;
  cal.rope_style = RopeStyle::kHalfSplit;
  cal.rope_theta = 500000.0f;
  const uint64_t f = uint64_t{kLayers} * kHeads * kDim;
  cal.keys = bench::RandomBasis(f, components, 1);
  cal.values = bench::RandomBasis(f, components, 2);
  const std::string bytes = Must(SerializeKvtcCalibration(cal));
  const std::string path = dir + "/bench.kvtc";
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::unique_ptr<Client> Connect(const testing::Kvharbord& d, bool same_host,
                                ClientOptions o = ClientOptions()) {
  if (!same_host) {
    o.host_fetch = HostFetchMode::kOff;
    o.device_ipc = DeviceIpcMode::kOff;
  }
  return Must(testing::ConnectChild(d, o));
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Relative RMS error of the first `pages` call pages in the cache (blocks
// `blocks`) against the SDK's CPU decode of the same pages of the lease.
absl::StatusOr<double> RelativeError(Client& c, const std::string& ns,
                                     uint64_t lease, const PagedKvLayout& dl,
                                     const std::vector<int64_t>& blocks,
                                     uint32_t pages) {
  absl::StatusOr<std::vector<std::vector<uint8_t>>> want =
      c.Fetch(ns, client::FetchSource::FromLease(lease, 0, pages),
              client::FetchFormat::kCompressed);
  if (!want.ok()) return want.status();
  const Geometry g = bench::LlamaKvGeometry();
  const uint64_t block_bytes = dl.block_stride * 2;
  // The blocks copied to a host layout of `pages` blocks, then gathered.
  PagedKvLayout hl = dl;
  hl.device = -1;
  hl.num_blocks = pages;
  std::vector<std::vector<uint8_t>> host(
      2 * kLayers, std::vector<uint8_t>(pages * block_bytes));
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      std::vector<uint8_t>& h = host[2 * l + kv];
      const uint64_t base = kv == 0 ? dl.k[l] : dl.v[l];
      for (uint32_t i = 0; i < pages; ++i) {
        CUDA_CHECK(cudaMemcpy(
            h.data() + i * block_bytes,
            reinterpret_cast<const void*>(base + blocks[i] * block_bytes),
            block_bytes, cudaMemcpyDeviceToHost));
      }
      (kv == 0 ? hl.k : hl.v)[l] = reinterpret_cast<uint64_t>(h.data());
    }
  }
  std::vector<int64_t> ids(pages);
  std::vector<std::vector<uint8_t>> got(pages,
                                        std::vector<uint8_t>(g.PageBytes()));
  std::vector<uint8_t*> ptrs;
  for (uint32_t i = 0; i < pages; ++i) {
    ids[i] = i;
    ptrs.push_back(got[i].data());
  }
  if (absl::Status s = GatherLayoutToPages(g, hl, ids, ptrs); !s.ok()) return s;
  double diff = 0, norm = 0;
  for (uint32_t i = 0; i < pages; ++i) {
    const auto* a = reinterpret_cast<const uint16_t*>(got[i].data());
    const auto* b = reinterpret_cast<const uint16_t*>((*want)[i].data());
    for (size_t e = 0; e < g.PageBytes() / 2; ++e) {
      const double x = Bf16ToFloat(a[e]), y = Bf16ToFloat(b[e]);
      diff += (x - y) * (x - y);
      norm += y * y;
    }
  }
  return norm == 0 ? 0 : std::sqrt(diff / norm);
}

double StageSeconds(const TransferResult& r, const std::string& stage) {
  for (const auto& [name, s] : r.stages) {
    if (name == stage) return s;
  }
  return 0;
}

struct Timing {
  absl::Status error;  // the first failed call; then nothing else is set
  double cold = 0, warm = 0;
  TransferResult first, last;
};

// Runs `once` (the prefix in the cache when it returns) 1 + iters times:
// the first call and the median of the rest; stops at the first error.
// `before` (when set) runs before each call, untimed.
template <typename F>
Timing Time(F&& once, const std::function<void()>& before = nullptr) {
  Timing t;
  std::vector<double> warm;
  for (int i = 0; i <= absl::GetFlag(FLAGS_iters); ++i) {
    if (before) before();
    const double t0 = Now();
    absl::StatusOr<TransferResult> r = once();
    const double s = Now() - t0;
    if (!r.ok()) {
      t.error = r.status();
      return t;
    }
    if (i == 0) {
      t.cold = s;
      t.first = *r;
    } else {
      warm.push_back(s);
    }
    t.last = *std::move(r);
  }
  std::sort(warm.begin(), warm.end());
  t.warm = warm.empty() ? t.cold : warm[warm.size() / 2];
  return t;
}

std::string Stages(const TransferResult& x) {
  std::string out;
  for (const auto& [name, s] : x.stages) {
    out += absl::StrFormat(" %s=%.4f", name, s);
  }
  if (!x.fallbacks.empty()) {
    out += " | fallbacks: " + absl::StrJoin(x.fallbacks, " | ");
  }
  return out;
}

// One row, printed as soon as it is measured. `old_s`: the old path of the
// same source, measured in this run.
void Print(int tokens, const std::string& name, const Timing& t, double old_s,
           uint64_t bytes, const Links& links) {
  if (!t.error.ok()) {
    std::printf("%6d  %-34s FAILED: %s\n", tokens, name.c_str(),
                t.error.ToString().c_str());
    return;
  }
  const TransferResult& x = t.last;
  std::string stage = "-";
  if (StageSeconds(x, "scatter") > 0 && x.path == "device_ipc") {
    const double gbs = x.bytes_moved / StageSeconds(x, "scatter") / 1e9;
    stage = absl::StrFormat("scatter %.0f GB/s = %.2f of D2D", gbs,
                            gbs / links.d2d);
  } else if (StageSeconds(x, "gather") > 0 && x.path == "device_ipc") {
    // An insert by DeviceInsert: one gather into the daemon's slots.
    const double gbs = x.bytes_moved / StageSeconds(x, "gather") / 1e9;
    stage =
        absl::StrFormat("gather %.0f GB/s = %.2f of D2D", gbs, gbs / links.d2d);
  } else if (StageSeconds(x, "h2d") > 0) {
    // A compressed path's h2d stage copied its merged batches (h2d_bytes).
    const uint64_t moved = x.h2d_bytes > 0 ? x.h2d_bytes : bytes;
    const double gbs = moved / StageSeconds(x, "h2d") / 1e9;
    stage =
        absl::StrFormat("h2d %.1f GB/s = %.2f of H2D", gbs, gbs / links.h2d);
  } else if (StageSeconds(x, "d2h") > 0) {
    const double gbs = bytes / StageSeconds(x, "d2h") / 1e9;
    stage =
        absl::StrFormat("d2h %.1f GB/s = %.2f of D2H", gbs, gbs / links.d2h);
  }
  const double prefill = IssuePrefillSeconds(tokens);
  const std::string vs_prefill =
      prefill > 0 ? absl::StrFormat("%.1fx", prefill / t.warm) : "-";
  std::printf("%6d  %-34s %-18s %8.4f %8.4f %7.1f %7.1fx %9s  %s\n", tokens,
              name.c_str(), x.path.c_str(), t.cold, t.warm,
              bytes / t.warm / 1e9, old_s / t.warm, vs_prefill.c_str(),
              stage.c_str());
  std::printf("        warm stages:%s\n", Stages(x).c_str());
  if (x.path != "old") {
    std::printf("        cold stages:%s\n", Stages(t.first).c_str());
  }
}

int Main() {
  std::vector<int> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    sizes.push_back(std::stoi(std::string(s)) / kPage * kPage);
  }
  const int max_tokens = *std::max_element(sizes.begin(), sizes.end());
  const uint64_t max_pages = max_tokens / kPage;
  const Geometry g = bench::LlamaKvGeometry();
  const uint64_t pb = g.PageBytes();
  std::printf(
      "hit_path_bench: Llama-3.1-8B KV (32 x 8 x 128 bf16, 16-token "
      "pages of %lu bytes), prefixes %s tokens, %d warm iters\n",
      pb, absl::GetFlag(FLAGS_tokens).c_str(), absl::GetFlag(FLAGS_iters));
  CUDA_CHECK(cudaSetDevice(0));
  const Links links = MeasureLinks();
  std::printf(
      "links (cudaMemcpy, 1 GiB): pinned H2D %.1f GB/s, pinned D2H "
      "%.1f GB/s, D2D %.0f GB/s\n",
      links.h2d, links.d2h, links.d2d);

  char tmpl[] = "/tmp/kvh_hit_path_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string cal =
      WriteCalibration(dir, absl::GetFlag(FLAGS_components));
  const uint64_t ns_bytes = max_pages * pb + (uint64_t{64} << 20);
  auto da = testing::StartChildDaemon(
      dir, "device",
      absl::StrFormat("store:\n  pool_budget_bytes: %u\n  device_pool_bytes: "
                      "%u\n  allow_ipc: true\ndata_plane:\n  listen: "
                      "127.0.0.1:0\n",
                      4 * ns_bytes, 2 * ns_bytes + (uint64_t{256} << 20)));
  auto db = testing::StartChildDaemon(
      dir, "host",
      absl::StrFormat("store:\n  pool_budget_bytes: %u\ndata_plane:\n  "
                      "listen: 127.0.0.1:0\n",
                      2 * ns_bytes),
      {"--host_ipc_socket=" + dir + "/kvh.sock"});
  // B's same-host client streams its plain inserts (the "old insert"
  // baseline); the remote-style one takes B's bulk data plane.
  ClientOptions streamed;
  streamed.data_plane = DataPlaneMode::kOff;
  auto ca = Connect(*da, true), cb = Connect(*db, true, streamed);
  // Remote-style clients of A: the gRPC stream, and A's bulk data plane.
  auto cr = Connect(*da, false, streamed);
  auto crb = Connect(*da, false);
  auto cbr = Connect(*db, false);
  // The GEMM modes of the host KVTC rows, each its own client (the decoder
  // is made per client), and stage_cold.
  const std::pair<client::GpuDecodeGemm, const char*> kModes[] = {
      {client::GpuDecodeGemm::kFp32, "fp32"},
      {client::GpuDecodeGemm::kTf32, "tf32"},
      {client::GpuDecodeGemm::kBf16, "bf16"}};
  std::vector<std::unique_ptr<Client>> cmode;
  for (const auto& [gemm, name] : kModes) {
    ClientOptions o;
    o.gpu_decode_gemm = gemm;
    cmode.push_back(Connect(*da, true, o));
  }
  ClientOptions serial_o;
  serial_o.gpu_decode_gemm = client::GpuDecodeGemm::kFp32;
  auto cserial = Connect(*da, true, serial_o);
  ClientOptions stage_o;
  stage_o.stage_cold = true;
  auto cstage = Connect(*da, true, stage_o);
  // The host KVTC row as before FetchRequest.max_pages_per_message: one
  // message per compressed page (default GEMM).
  ClientOptions unpacked_o;
  unpacked_o.fetch_pages_per_message = 1;
  auto cunpacked = Connect(*da, true, unpacked_o);
  // The host KVTC row as before the decode into the layout: decoded into
  // staging slots, then scattered (LayoutTransferOptions::decode_into_layout
  // false; default GEMM).
  auto cscatter = Connect(*da, true, ClientOptions());
  // The host KVTC row as before LayoutTransferOptions::compressed_streams:
  // one gRPC stream per call (default GEMM).
  auto cone = Connect(*da, true, ClientOptions());
  // The host KVTC row as before LayoutTransferOptions::h2d_batch_bytes:
  // each group's payload copied range by range (default GEMM).
  auto cranges = Connect(*da, true, ClientOptions());
  std::printf("client default gpu_decode_gemm: %s\n",
              kModes[static_cast<int>(ClientOptions().gpu_decode_gemm)].second);
  client::NamespaceSpec raw;
  raw.name = "raw";
  raw.geometry = g;
  raw.capacity_bytes = ns_bytes;
  client::NamespaceSpec kvtc = raw;
  kvtc.name = "kvtc";
  kvtc.codec = "kvtc";
  kvtc.calibration_path = cal;
  kvtc.host_compressed_bytes = ns_bytes;
  BENCH_CHECK(ca->CreateNamespace(raw).status());
  BENCH_CHECK(ca->CreateNamespace(kvtc).status());
  BENCH_CHECK(cb->CreateNamespace(raw).status());
  const std::vector<uint8_t> tile = MakeTile();
  const auto views = PageViews(tile, max_pages, pb);
  std::vector<int32_t> tokens(max_tokens);
  for (int i = 0; i < max_tokens; ++i) tokens[i] = i + 1;
  double t0 = Now();
  BENCH_CHECK(ca->Insert("raw", tokens, views).status());
  BENCH_CHECK(ca->Insert("kvtc", tokens, views).status());
  BENCH_CHECK(cb->Insert("raw", tokens, views).status());
  std::printf("setup: 3 inserts of %d tokens in %.1f s\n", max_tokens,
              Now() - t0);
  t0 = Now();
  const uint64_t demoted =
      Must(ca->Demote("kvtc", client::Tier::kHostCompressed));
  std::printf("setup: %lu KVTC pages demoted to the host tier in %.1f s\n",
              demoted, Now() - t0);

  LlamaVllmCache cache(max_pages, 0);
  auto ta = Must(LayoutTransfer::Create(ca.get()));
  auto tb = Must(LayoutTransfer::Create(cb.get()));
  auto tr = Must(LayoutTransfer::Create(cr.get()));
  auto trb = Must(LayoutTransfer::Create(crb.get()));
  auto tbr = Must(LayoutTransfer::Create(cbr.get()));
  std::vector<std::unique_ptr<LayoutTransfer>> tmode;
  for (auto& c : cmode) tmode.push_back(Must(LayoutTransfer::Create(c.get())));
  client::LayoutTransferOptions one_slot;
  one_slot.staging_slots = 2;  // the fewest the SDK accepts: least overlap
  auto tserial = Must(LayoutTransfer::Create(cserial.get(), one_slot));
  auto tstage = Must(LayoutTransfer::Create(cstage.get()));
  auto tunpacked = Must(LayoutTransfer::Create(cunpacked.get()));
  client::LayoutTransferOptions staged_scatter;
  staged_scatter.decode_into_layout = false;
  auto tscatter = Must(LayoutTransfer::Create(cscatter.get(), staged_scatter));
  client::LayoutTransferOptions one_stream;
  one_stream.compressed_streams = 1;
  auto tone = Must(LayoutTransfer::Create(cone.get(), one_stream));
  client::LayoutTransferOptions range_copies;
  range_copies.h2d_batch_bytes = 0;
  auto tranges = Must(LayoutTransfer::Create(cranges.get(), range_copies));
  std::vector<uint8_t> host(max_pages * pb);
  void* staging = nullptr;
  CUDA_CHECK(cudaMalloc(&staging, max_pages * pb));

  std::printf("\n%6s  %-34s %-18s %8s %8s %7s %8s %9s  %s\n", "tokens", "row",
              "path", "cold_s", "load_s", "GB/s", "vs_old", "vs_prefill",
              "copy stage");
  for (int T : sizes) {
    const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + T);
    const uint64_t pages = T / kPage;
    const uint64_t bytes = pages * pb;
    std::vector<int64_t> blocks(pages);
    for (uint64_t i = 0; i < pages; ++i) blocks[i] = pages - 1 - i;
    // The old hit: pageable host bytes, then the engine's own H2D copy.
    auto old = [&](Client& c, const std::string& ns) {
      return Time([&]() -> absl::StatusOr<TransferResult> {
        absl::StatusOr<client::Lease> l = c.Match(ns, prefix, true);
        if (!l.ok()) return l.status();
        absl::Status s = c.FetchInto(ns, client::FetchSource::FromLease(l->id),
                                     absl::MakeSpan(host.data(), bytes))
                             .status();
        CUDA_CHECK(
            cudaMemcpy(staging, host.data(), bytes, cudaMemcpyHostToDevice));
        BENCH_CHECK(c.Release(l->id));
        if (!s.ok()) return s;
        TransferResult r;
        r.path = "old";
        return r;
      });
    };
    // `before`: untimed, before each call.
    auto fetch = [&](Client& c, LayoutTransfer& t, const std::string& ns,
                     std::function<void()> before = nullptr) {
      return Time(
          [&]() -> absl::StatusOr<TransferResult> {
            absl::StatusOr<client::Lease> l = c.Match(ns, prefix, true);
            if (!l.ok()) return l.status();
            LayoutFetchOptions o;
            o.page_tiers = l->page_tiers;
            absl::StatusOr<TransferResult> r =
                t.Fetch(ns, l->id, cache.layout(), blocks, o);
            BENCH_CHECK(c.Release(l->id));
            return r;
          },
          before);
    };
    // One more (untimed) call, and the relative error of its first 8 pages
    // against the CPU decode.
    auto error_of = [&](Client& c, LayoutTransfer& t,
                        const std::string& ns) -> absl::StatusOr<double> {
      absl::StatusOr<client::Lease> l = c.Match(ns, prefix, true);
      if (!l.ok()) return l.status();
      LayoutFetchOptions o;
      o.page_tiers = l->page_tiers;
      const absl::Status f =
          t.Fetch(ns, l->id, cache.layout(), blocks, o).status();
      absl::StatusOr<double> e =
          f.ok() ? RelativeError(c, ns, l->id, cache.layout(), blocks, 8)
                 : absl::StatusOr<double>(f);
      BENCH_CHECK(c.Release(l->id));
      return e;
    };
    auto row = [&](const char* name, const Timing& t, double old_s) {
      Print(T, name, t, old_s, bytes, links);
    };
    const Timing old_dev = old(*ca, "raw");
    row("old: device tier -> pageable + H2D", old_dev, old_dev.warm);
    const Timing old_host = old(*cb, "raw");
    row("old: host shm -> pageable + H2D", old_host, old_host.warm);
    const Timing old_kvtc = old(*ca, "kvtc");
    row("old: KVTC RAW -> pageable + H2D", old_kvtc, old_kvtc.warm);
    row("device tier, same host", fetch(*ca, *ta, "raw"), old_dev.warm);
    row("host raw, same host", fetch(*cb, *tb, "raw"), old_host.warm);
    const Timing serial = fetch(*cserial, *tserial, "kvtc");
    row("host KVTC, fp32, 2 staging slots", serial, old_kvtc.warm);
    for (size_t m = 0; m < cmode.size(); ++m) {
      const Timing t = fetch(*cmode[m], *tmode[m], "kvtc");
      double error = -1;
      if (T == sizes.front() && t.error.ok()) {
        absl::StatusOr<double> e = error_of(*cmode[m], *tmode[m], "kvtc");
        if (e.ok()) {
          error = *e;
        } else {
          std::printf("        %s: relative error not measured: %s\n",
                      kModes[m].second, e.status().ToString().c_str());
        }
      }
      row(absl::StrFormat("host KVTC, same host, %s", kModes[m].second).c_str(),
          t, old_kvtc.warm);
      if (t.error.ok() && serial.error.ok()) {
        std::printf("        %s: %.2fx the fp32 2-slot row%s\n",
                    kModes[m].second, serial.warm / t.warm,
                    error >= 0 ? absl::StrFormat(", relative RMS error vs the "
                                                 "CPU decode (8 pages) %.3g",
                                                 error)
                                     .c_str()
                               : "");
      }
    }
    {
      const size_t dm = static_cast<size_t>(ClientOptions().gpu_decode_gemm);
      const Timing packed = fetch(*cmode[dm], *tmode[dm], "kvtc");
      const Timing unpacked = fetch(*cunpacked, *tunpacked, "kvtc");
      row("host KVTC, 1 page per message", unpacked, old_kvtc.warm);
      const Timing scattered = fetch(*cscatter, *tscatter, "kvtc");
      row("host KVTC, decode + scatter", scattered, old_kvtc.warm);
      const Timing single = fetch(*cone, *tone, "kvtc");
      row("host KVTC, 1 compressed stream", single, old_kvtc.warm);
      // A stage of a side's last call, in ms.
      const auto stage_ms = [](const Timing& t, const char* stage) {
        return StageSeconds(t.last, stage) * 1e3;
      };
      const Timing ranges = fetch(*cranges, *tranges, "kvtc");
      row("host KVTC, copies range by range", ranges, old_kvtc.warm);
      if (packed.error.ok() && ranges.error.ok()) {
        const double h2d = StageSeconds(packed.last, "h2d");
        std::printf(
            "        gathered H2D copies (%lu MiB) vs range by range, same "
            "run: load %.2fx faster; h2d %s\n",
            client::LayoutTransferOptions().h2d_batch_bytes >> 20,
            ranges.warm / packed.warm,
            h2d > 0
                ? absl::StrFormat("%.1f GB/s = %.2f of pinned H2D",
                                  packed.last.h2d_bytes / h2d / 1e9,
                                  packed.last.h2d_bytes / h2d / 1e9 / links.h2d)
                      .c_str()
                : "not timed");
      }
      if (packed.error.ok() && scattered.error.ok()) {
        std::printf(
            "        decoded into the layout vs decode + scatter, same run: "
            "load %.2fx faster; decode %.2f vs %.2f ms, scatter %.2f vs "
            "%.2f ms\n",
            scattered.warm / packed.warm, stage_ms(packed, "decode"),
            stage_ms(scattered, "decode"), stage_ms(packed, "scatter"),
            stage_ms(scattered, "scatter"));
      }
      if (packed.error.ok() && single.error.ok()) {
        std::printf(
            "        %d compressed streams vs 1, same run: load %.2fx "
            "faster, stream %.1f vs %.1f ms\n",
            client::LayoutTransferOptions().compressed_streams,
            single.warm / packed.warm, stage_ms(packed, "stream"),
            stage_ms(single, "stream"));
      }
      if (packed.error.ok() && unpacked.error.ok()) {
        std::printf(
            "        packed (%u pages/message) vs 1 page per message, same "
            "run: load %.2fx faster, stream %.1f vs %.1f ms\n",
            ClientOptions().fetch_pages_per_message,
            unpacked.warm / packed.warm, stage_ms(packed, "stream"),
            stage_ms(unpacked, "stream"));
      }
    }
    // The daemon decodes on its GPU into its device tier, then device_ipc:
    // the pages are made cold again before each call (untimed).
    const Timing staged = fetch(*cstage, *tstage, "kvtc", [&] {
      BENCH_CHECK(ca->Demote("kvtc", client::Tier::kHostCompressed).status());
    });
    row("host KVTC, stage_cold (daemon GPU)", staged, old_kvtc.warm);
    if (staged.error.ok() && serial.error.ok()) {
      std::printf("        stage_cold: %.2fx the serial fp32 row\n",
                  serial.warm / staged.warm);
    }
    BENCH_CHECK(ca->Demote("kvtc", client::Tier::kHostCompressed).status());
    row("KVTC, remote-style gRPC", fetch(*cr, *tr, "kvtc"), old_kvtc.warm);
    row("raw, remote-style gRPC", fetch(*cr, *tr, "raw"), old_dev.warm);
    row("raw, remote-style bulk plane", fetch(*crb, *trb, "raw"), old_dev.warm);
    // Insert from the layout (the cache holds the prefix now). Each round a
    // new prefix: the daemon evicts the last one (LRU) to make room.
    std::vector<int32_t> fresh(T);
    int round = 0;
    const Timing old_ins = Time([&]() -> absl::StatusOr<TransferResult> {
      ++round;  // token ids stay far below 2^31: rounds are few
      for (int i = 0; i < T; ++i) fresh[i] = 1000000 + round * 65536 + i;
      CUDA_CHECK(
          cudaMemcpy(host.data(), staging, bytes, cudaMemcpyDeviceToHost));
      absl::Status s =
          cb->Insert("raw", fresh, absl::MakeConstSpan(host.data(), bytes), pb)
              .status();
      if (!s.ok()) return s;
      TransferResult r;
      r.path = "old";
      return r;
    });
    row("old insert: D2H pageable + Insert", old_ins, old_ins.warm);
    auto insert = [&](LayoutTransfer& t) {
      return Time([&]() -> absl::StatusOr<TransferResult> {
        ++round;  // token ids stay far below 2^31: rounds are few
        for (int i = 0; i < T; ++i) fresh[i] = 1000000 + round * 65536 + i;
        auto r = t.Insert("raw", fresh, cache.layout(), blocks);
        if (!r.ok()) return r.status();
        return r->second;
      });
    };
    // The whole call (gather, D2H, the daemon's copy or the stream, commit)
    // against pinned D2H of the same bytes.
    auto insert_row = [&](const char* name, const Timing& t) {
      row(name, t, old_ins.warm);
      if (t.error.ok()) {
        const double gbs = bytes / t.warm / 1e9;
        std::printf("        whole insert: %.1f GB/s = %.2f of pinned D2H\n",
                    gbs, gbs / links.d2h);
      }
    };
    insert_row("insert from layout (host daemon)", insert(*tb));
    insert_row("insert, host daemon, remote-style", insert(*tbr));
    // The same into the device daemon: DeviceInsert by CUDA IPC (path
    // device_ipc; pinned, with the reason among the fallbacks, if the
    // daemon cannot take it).
    insert_row("insert from layout (device daemon)", insert(*ta));
    // Both daemons' prefix again, for the next size.
    BENCH_CHECK(cb->Insert("raw", tokens, views).status());
    BENCH_CHECK(ca->Insert("raw", tokens, views).status());
  }
  cudaFree(staging);
  return 0;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  return kvharbor::Main();
}
