// GPU tier 0 (issue 5), measured through the Store / Namespace API in
// process (no gRPC), Llama-3.1-8B-like geometry: 32 layers x 8 KV heads x
// head_dim 128, bf16, pages of 16 tokens (2 MiB), a random KVTC calibration
// (--components, the seed's 20% FP8 / 40% int4 / 40% int2 split, 4 sinks,
// RoPE half-split undone).
//
// 1. Eviction: DemoteAll(host_compressed) of a device namespace holding the
//    whole prefix (GPU: selection, batched KVTC encode into pinned host
//    memory, split into per-page buffers, commit), beside the same call on
//    a host-pool namespace with the CPU KVTC codec over --cpu_pages of the
//    same pages, in the same run. GB/s of raw input.
// 2. Cached tokens per GiB of host memory with KVTC against raw (the
//    ratio follows the calibration: components and ranges).
// 3. A --prefix_tokens prefix back as raw host bytes (Match + PinLease RAW):
//    device hit (one batched device-to-host copy through the pool's pinned
//    bounce buffer), host-compressed hit (batched KVTC decode on the GPU),
//    disk hit (file read, page cache warm, + GPU decode); beside the paths
//    they replace, measured in the same run: the device pages copied one
//    synchronous cudaMemcpy per page into freshly allocated strings (the
//    old device hit, on a second pool holding the same pages), and the CPU
//    codec decoding --cpu_pages of the stored buffers, scaled to the prefix
//    (the old cold hit); beside a plain host memcpy of the same raw bytes
//    (the floor any in-memory store's GET pays) and a real Redis GET of
//    them (redis-server next to this binary, as scripts/gpu_bundle.sh
//    bundles it, or --redis_server; the pages SET untimed, then pipelined
//    GETs into host memory, as bench/insert_fetch_bench.cc; the row is
//    skipped with a note when there is none); and the time to recompute the
//    prefix:
//    the matrix-product FLOPs of a Llama-3.1-8B prefill of that length
//    divided by the BF16 cuBLAS GEMM rate measured here.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "bench/gpu_bench_util.h"
#include "bench/kvtc_bench_util.h"
#include "bench/redis_server.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/memory/host_block.h"
#include "core/store/store.h"
#include "cuda/tier/device_page_pool.h"
#include "cuda/tier/device_tier.h"

ABSL_FLAG(int, prefix_tokens, 32768, "prefix length in tokens");
ABSL_FLAG(int, components, 1024, "PCA components of the calibration");
ABSL_FLAG(int, cpu_pages, 32, "pages the CPU eviction baseline encodes");
ABSL_FLAG(std::string, redis_server, "",
          "redis-server binary (default: the one next to this binary)");
ABSL_FLAG(int, redis_batch_pages, 64, "pages per Redis SET/GET pipeline");

namespace kvharbor {
namespace {

constexpr uint32_t kLayers = bench::kLlamaLayers, kHeads = bench::kLlamaHeads,
                   kHeadDim = bench::kLlamaDim, kPage = bench::kLlamaPage;
constexpr uint64_t kFeatures = uint64_t{kLayers} * kHeads * kHeadDim;

using bench::Now;

// --redis_server, else redis-server in this binary's folder; "" if none.
std::string RedisBinary() {
  if (!absl::GetFlag(FLAGS_redis_server).empty()) {
    return bench::FindInPath(absl::GetFlag(FLAGS_redis_server));
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  std::string dir(self, n);
  dir.resize(dir.rfind('/') + 1);
  return bench::FindInPath(dir + "redis-server");
}

// Seconds to GET the `src.size() / pb` pages of `src` (SET first, untimed)
// from a redis-server into `dst`, pipelined; nullopt (with a note) when
// there is no redis-server or it misbehaves.
std::optional<double> RedisGetSeconds(const std::vector<uint8_t>& src,
                                      std::vector<uint8_t>& dst, uint64_t pb) {
  const std::string binary = RedisBinary();
  if (binary.empty()) {
    std::printf(
        "   (Redis GET row skipped: no redis-server next to the "
        "binary or at --redis_server)\n");
    return std::nullopt;
  }
  bench::RedisServer redis;
  if (std::string why = redis.Start(binary); !why.empty()) {
    std::printf("   (Redis GET row skipped: %s)\n", why.c_str());
    return std::nullopt;
  }
  const size_t pages = src.size() / pb;
  const size_t batch = std::max(1, absl::GetFlag(FLAGS_redis_batch_pages));
  for (size_t first = 0; first < pages; first += batch) {
    if (!redis.Set("p:", first, std::min(batch, pages - first),
                   src.data() + first * pb, pb)) {
      std::printf("   (Redis GET row skipped: SET failed)\n");
      return std::nullopt;
    }
  }
  std::fill(dst.begin(), dst.end(), 0);
  const double t0 = Now();
  for (size_t first = 0; first < pages; first += batch) {
    if (!redis.Get("p:", first, std::min(batch, pages - first),
                   dst.data() + first * pb, pb)) {
      std::printf("   (Redis GET row skipped: GET failed)\n");
      return std::nullopt;
    }
  }
  const double s = Now() - t0;
  if (dst != src) {
    std::printf("   (Redis GET row skipped: GET returned other bytes)\n");
    return std::nullopt;
  }
  std::printf("   (redis: %s on 127.0.0.1:%d, %zu-page pipelines)\n",
              binary.c_str(), redis.port(), batch);
  return s;
}

std::string Calibration(uint64_t comps) {
  KvtcCalibration cal;
  cal.row_kind = KvtcRowKind::kPerToken;
  cal.num_layers = kLayers;
  cal.num_kv_heads = kHeads;
  cal.head_dim = kHeadDim;
  cal.page_size = kPage;
  cal.sink_tokens = 4;
  cal.rope_style = RopeStyle::kHalfSplit;
  cal.rope_theta = 500000.0f;
  cal.keys = bench::RandomBasis(kFeatures, comps, 1);
  cal.values = bench::RandomBasis(kFeatures, comps, 2);
  absl::StatusOr<std::string> bytes = SerializeKvtcCalibration(cal);
  BENCH_CHECK(bytes.status());
  return *std::move(bytes);
}

// 64 MiB of Gaussian bf16; page i is read from it at a page-dependent shift.
std::vector<uint8_t> MakeTile() { return bench::GaussianBf16Tile(64 << 20); }

std::vector<Token> Tokens(size_t n) {
  std::vector<Token> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<Token>(i + 1);
  return t;
}

void Insert(Namespace& ns, const std::vector<Token>& tokens,
            const std::vector<uint8_t>& tile) {
  auto up = ns.BeginInsert(tokens, {});
  BENCH_CHECK(up.status());
  const size_t pb = ns.page_bytes(), pages = tokens.size() / kPage;
  const size_t span = tile.size() - pb;
  for (size_t p = 0; p < pages; ++p) {
    const size_t at = (p * 4096 * 2 + p * pb / 7) % span & ~size_t{1};
    BENCH_CHECK((*up)->Write(
        p * pb, absl::string_view(
                    reinterpret_cast<const char*>(tile.data() + at), pb)));
  }
  BENCH_CHECK((*up)->Commit().status());
}

// Seconds to Match + PinLease RAW the whole prefix (the bytes a RAW fetch
// streams); checks every page came back.
double FetchSeconds(Namespace& ns, const std::vector<Token>& tokens) {
  const double t0 = Now();
  auto m = ns.Match(tokens, /*lock=*/true, absl::ZeroDuration());
  BENCH_CHECK(m.status());
  auto pinned = ns.PinLease(m->lease_id, 0, 0, FetchFormat::kRaw);
  BENCH_CHECK(pinned.status());
  const double t = Now() - t0;
  if (pinned->size() != tokens.size() / kPage) std::exit(1);
  BENCH_CHECK(ns.Release(m->lease_id));
  return t;
}

// The old device hit and its replacement on `pool` (slots 0..n-1): one
// synchronous copy per page into a fresh string, and one ReadMany into one
// block. Returns {old seconds, new seconds}; checks both read equal bytes.
std::pair<double, double> DeviceReadSeconds(PagePool& pool, uint32_t n) {
  const size_t pb = pool.slot_bytes();
  double t0 = Now();
  std::vector<std::string> strings(n);
  for (uint32_t i = 0; i < n; ++i) {
    strings[i].resize(pb);
    BENCH_CHECK(pool.Read(i, reinterpret_cast<uint8_t*>(&strings[i][0])));
  }
  const double old_s = Now() - t0;
  t0 = Now();
  auto block = HostBlock::Create(uint64_t{n} * pb);  // as Fetch allocates
  BENCH_CHECK(block.status());
  std::vector<uint32_t> slots(n);
  std::vector<uint8_t*> dst(n);
  for (uint32_t i = 0; i < n; ++i) {
    slots[i] = i;
    dst[i] = (*block)->data() + uint64_t{i} * pb;
  }
  BENCH_CHECK(pool.ReadMany(slots, dst));
  const double new_s = Now() - t0;
  for (uint32_t i = 0; i < n; ++i) {
    if (std::memcmp(dst[i], strings[i].data(), pb) != 0) std::exit(1);
  }
  return {old_s, new_s};
}

// The old cold hit: the CPU codec decoding the first `n` stored buffers of
// the prefix (fetched COMPRESSED); seconds for all `total` pages at that
// rate.
double CpuDecodeSeconds(Namespace& ns, const std::vector<Token>& tokens,
                        uint64_t n, uint64_t total) {
  auto m = ns.Match(tokens, /*lock=*/true, absl::ZeroDuration());
  BENCH_CHECK(m.status());
  auto pinned = ns.PinLease(m->lease_id, 0, static_cast<uint32_t>(n),
                            FetchFormat::kCompressed);
  BENCH_CHECK(pinned.status());
  const std::shared_ptr<const Codec> codec = ns.calibrations().tier_codec();
  std::vector<uint8_t> page(ns.page_bytes());
  CodecWorkspace ws;
  const double t0 = Now();
  for (uint64_t i = 0; i < n; ++i) {
    const absl::string_view b = pinned->bytes(i);
    const MutablePageRef ref{page.data(), i * kPage};
    BENCH_CHECK(
        codec->Decode(absl::MakeConstSpan(
                          reinterpret_cast<const uint8_t*>(b.data()), b.size()),
                      absl::MakeConstSpan(&ref, 1), &ws));
  }
  const double t = Now() - t0;
  BENCH_CHECK(ns.Release(m->lease_id));
  return t / n * total;
}

// Dense BF16 GEMM rate of this GPU (cuBLAS, 8192 x 14336 x 4096).
double GemmTflops() {
  const int m = 8192, n = 14336, k = 4096;
  void *a, *b, *c;
  cudaMalloc(&a, size_t{m} * k * 2);
  cudaMalloc(&b, size_t{k} * n * 2);
  cudaMalloc(&c, size_t{m} * n * 2);
  cudaMemset(a, 0, size_t{m} * k * 2);
  cudaMemset(b, 0, size_t{k} * n * 2);
  cublasHandle_t h;
  cublasCreate(&h);
  const float one = 1, zero = 0;
  auto run = [&] {
    cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a, CUDA_R_16BF, m,
                 b, CUDA_R_16BF, k, &zero, c, CUDA_R_16BF, m,
                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  run();
  cudaDeviceSynchronize();
  const int iters = 20;
  const double t0 = Now();
  for (int i = 0; i < iters; ++i) run();
  cudaDeviceSynchronize();
  const double t = (Now() - t0) / iters;
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * m * n * k / t / 1e12;
}

// Matrix-product FLOPs of a Llama-3.1-8B prefill of t tokens: the layers'
// weights (2 x 6.98e9 per token; no LM head) and causal attention
// (QK^T and PV: 2 x t^2 x 4096 per layer over 32 layers).
double PrefillFlops(double t) {
  const double per_layer_weights =
      4096.0 * 4096 * 2 + 4096.0 * 1024 * 2 + 3 * 4096.0 * 14336;
  return 2 * 32 * per_layer_weights * t + 32 * 2 * t * t * 4096;
}

std::shared_ptr<Namespace> MakeNamespace(Store& store, const char* name,
                                         uint64_t pages, const std::string& cal,
                                         const std::string& disk_dir) {
  NamespaceSpec spec;
  spec.name = name;
  spec.geometry = bench::LlamaKvGeometry();
  spec.capacity_bytes = pages * spec.geometry.PageBytes();
  spec.codec = "kvtc";
  spec.calibration = cal;
  // Room for every page encoded (they are smaller than raw); the host tier
  // shares the store's memory budget, which it must fit.
  spec.host_compressed_bytes = std::min(pages * spec.geometry.PageBytes(),
                                        store.options().pool_budget_bytes);
  spec.disk_dir = disk_dir;
  auto ns = store.CreateNamespace(spec, false);
  BENCH_CHECK(ns.status());
  return ns->first;
}

int Main() {
  const int tokens_n = absl::GetFlag(FLAGS_prefix_tokens) / kPage * kPage;
  const uint64_t pages = tokens_n / kPage;
  const uint64_t pb = bench::LlamaKvGeometry().PageBytes();
  const double gib = double(uint64_t{1} << 30);
  std::printf(
      "gpu_tier_bench: %d tokens = %lu pages of %lu bytes (%.2f GiB), "
      "%d components\n",
      tokens_n, pages, pb, pages * pb / gib, absl::GetFlag(FLAGS_components));
  const std::string cal = Calibration(absl::GetFlag(FLAGS_components));
  const std::vector<uint8_t> tile = MakeTile();
  const std::vector<Token> tokens = Tokens(tokens_n);
  char dir_template[] = "/tmp/kvh_gpu_tier_XXXXXX";
  const std::string dir = mkdtemp(dir_template);

  // Room for the namespace and a second pool of the same pages (the old
  // device-hit path's baseline).
  auto tier = gpu::CudaDeviceTier::Create(0, 2 * pages * pb + (64 << 20));
  BENCH_CHECK(tier.status());
  std::printf("device tier: %s\n", (*tier)->Describe().c_str());
  StoreOptions gopt;
  gopt.device_tier = *tier;
  gopt.pool_budget_bytes = (*tier)->arena_bytes();
  Store gstore(gopt);
  auto ns = MakeNamespace(gstore, "gpu", pages, cal, dir + "/disk");
  auto side_pool = (*tier)->CreatePool(pb, static_cast<uint32_t>(pages));
  BENCH_CHECK(side_pool.status());
  for (uint64_t p = 0; p < pages; ++p) {
    BENCH_CHECK((*side_pool)
                    ->Write(static_cast<uint32_t>(p), 0,
                            tile.data() + (p * 4099 * 2) % (tile.size() - pb),
                            pb));
  }

  // ---- 1. Eviction, GPU beside CPU. A first round loads the kernels and
  // warms cuBLAS; the measured round starts from a fresh insert.
  double t0 = Now();
  Insert(*ns, tokens, tile);
  BENCH_CHECK(ns->tiers().DemoteAll(Tier::kHostCompressed).status());
  const double first_round_s = Now() - t0;
  ns->EvictAll();
  const double ti = Now();
  Insert(*ns, tokens, tile);
  const double insert_s = Now() - ti;
  const double dev_s = FetchSeconds(*ns, tokens);
  t0 = Now();
  auto moved = ns->tiers().DemoteAll(Tier::kHostCompressed);
  const double gpu_evict_s = Now() - t0;
  BENCH_CHECK(moved.status());
  const NamespaceStats c = ns->Counters();
  const double gpu_gbs = *moved * pb / gpu_evict_s / 1e9;

  const uint64_t cpu_pages =
      std::min<uint64_t>(absl::GetFlag(FLAGS_cpu_pages), pages);
  StoreOptions copt;
  copt.pool_budget_bytes = 2 * cpu_pages * pb;  // raw pages + the host tier
  Store cstore(copt);
  auto cns = MakeNamespace(cstore, "cpu", cpu_pages, cal, "");
  Insert(*cns,
         std::vector<Token>(tokens.begin(), tokens.begin() + cpu_pages * kPage),
         tile);
  t0 = Now();
  auto cmoved = cns->tiers().DemoteAll(Tier::kHostCompressed);
  const double cpu_evict_s = Now() - t0;
  BENCH_CHECK(cmoved.status());
  const double cpu_gbs = *cmoved * pb / cpu_evict_s / 1e9;
  std::printf(
      "\n1. eviction raw -> host_compressed (KVTC), GB/s of raw input\n");
  std::printf("   insert (host -> device pool): %.3f s, %.2f GB/s\n", insert_s,
              pages * pb / insert_s / 1e9);
  std::printf("   (first round, insert + evict, cold start: %.3f s)\n",
              first_round_s);
  std::printf("   GPU batched : %lu pages in %.3f s = %.2f GB/s\n", *moved,
              gpu_evict_s, gpu_gbs);
  std::printf("   CPU codec   : %lu pages in %.3f s = %.3f GB/s\n", *cmoved,
              cpu_evict_s, cpu_gbs);
  std::printf("   GPU / CPU   : %.1fx\n", gpu_gbs / cpu_gbs);

  // ---- 2. Density.
  const double kvtc_page = double(c.tiers[1].bytes) / c.tiers[1].pages;
  const double raw_tok = gib / (double(pb) / kPage);
  const double kvtc_tok = gib / (kvtc_page / kPage);
  std::printf("\n2. cached tokens per GiB of host memory\n");
  std::printf("   raw  : %.0f tokens/GiB (%lu bytes a page)\n", raw_tok, pb);
  std::printf("   KVTC : %.0f tokens/GiB (%.0f bytes a page)\n", kvtc_tok,
              kvtc_page);
  std::printf("   KVTC / raw: %.2fx\n", kvtc_tok / raw_tok);

  // ---- 3. The prefix back (each row printed as soon as measured).
  std::vector<uint8_t> src(pages * pb, 1), dst(pages * pb);
  std::memcpy(dst.data(), src.data(), dst.size());  // touch
  t0 = Now();
  std::memcpy(dst.data(), src.data(), dst.size());
  const double memcpy_s = Now() - t0;
  std::printf("\n3. %d-token prefix (%.2f GiB raw) back as raw host bytes\n",
              tokens_n, pages * pb / gib);
  const std::optional<double> redis_s = RedisGetSeconds(src, dst, pb);
  std::printf("   %-34s %9s %9s %9s\n", "source", "seconds", "vs memcpy",
              "vs Redis");
  // Ratios are time over the baseline's time (below 1: faster than it).
  auto row = [&](const char* what, double s) {
    std::printf("   %-34s %9.3f %9.2fx %9s\n", what, s, s / memcpy_s,
                redis_s ? absl::StrFormat("%.2fx", s / *redis_s).c_str() : "-");
  };
  row("host memcpy", memcpy_s);
  if (redis_s) row("Redis GET (hiredis, pipelined)", *redis_s);
  const auto [old_read_s, new_read_s] =
      DeviceReadSeconds(**side_pool, static_cast<uint32_t>(pages));
  row("device pages, per-page sync copies", old_read_s);
  row("device pages, pinned bounce batch", new_read_s);
  std::printf("   (bounce batch / per-page: %.2fx faster)\n",
              old_read_s / new_read_s);
  row("device hit (Match+PinLease, bounce)", dev_s);
  const double tflops = GemmTflops();
  const double recompute_s = PrefillFlops(tokens_n) / (tflops * 1e12);
  row("recompute estimate", recompute_s);
  std::printf(
      "   (recompute: %.3g FLOP at %.0f TFLOP/s, cuBLAS BF16 measured)\n",
      PrefillFlops(tokens_n), tflops);
  const double host_gpu_s = FetchSeconds(*ns, tokens);
  row("host_compressed hit (GPU decode)", host_gpu_s);
  const double host_cpu_s = CpuDecodeSeconds(*ns, tokens, cpu_pages, pages);
  row("host_compressed, CPU decode (scaled)", host_cpu_s);
  std::printf(
      "   (CPU decode of %lu pages scaled to %lu; GPU / CPU: %.1fx "
      "faster)\n",
      cpu_pages, pages, host_cpu_s / host_gpu_s);
  t0 = Now();
  auto dmoved = ns->tiers().DemoteAll(Tier::kDisk);
  BENCH_CHECK(dmoved.status());
  std::printf("   (demote host -> disk: %lu pages in %.3f s)\n", *dmoved,
              Now() - t0);
  row("disk hit (cache warm, GPU decode)", FetchSeconds(*ns, tokens));

  return 0;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as soon as measured
  return kvharbor::Main();
}
