// KVTC GPU codec throughput for a Llama-3.1-8B-like geometry (32 layers x 8
// KV heads x 128 head_dim, bf16 pages of 16 tokens, per-token rows of 32768
// features, RoPE half-split undone on keys, 4 sink tokens), beside the
// arithmetic floor measured in the same run: the cuBLAS BF16 products of the
// same shapes (keys and values) alone.
//
// Compress: EncodeAsync of a whole batch into pinned host memory (the fused
// device-to-host path) or device memory; CUDA events over back-to-back calls
// after warm-up (host bookkeeping overlaps the GPU); FinishEncode's host
// checksum is timed separately. Decompress: DecodeAsync + FinishDecode of
// that buffer from pinned host memory (copied chunk by chunk on the
// workspace's copy stream, or read in place), every call verified (body
// checksum on the host, data checks in the kernels); calls alternate between
// two workspaces so one batch's host work overlaps the other's GPU work;
// wall time from the first call to the last FinishDecode. For the largest
// batch a per-stage breakdown (KvtcGpuOptions::stage_hook) follows each row.
// GB/s counts bf16 input bytes (tokens x 2 x 32768 x 2).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/kvtc_bench_util.h"
#include "core/codec/envelope.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "cuda/codec/kvtc_gpu_codec.h"
#include "cuda/codec/projection_gemm.h"

ABSL_FLAG(std::string, tokens, "4096,16384,65536", "batch sizes in tokens");
ABSL_FLAG(std::string, components, "4096,10240", "PCA components");
ABSL_FLAG(std::string, modes, "bf16,tf32,fp32",
          "projection GEMM modes, in the order run");
ABSL_FLAG(int, iters, 3, "timed iterations (fp32: 1)");
ABSL_FLAG(int, warmup, 1, "warm-up iterations");
ABSL_FLAG(double, max_seconds, 110, "skip remaining cases after this long");

namespace kvharbor {
namespace gpu {
namespace {

constexpr uint32_t kLayers = 32, kHeads = 8, kHeadDim = 128, kPage = 16;
constexpr uint64_t kFeatures = uint64_t{kLayers} * kHeads * kHeadDim;

#define CUDA_CHECK(expr)                                                 \
  do {                                                                   \
    const cudaError_t e_ = (expr);                                       \
    if (e_ != cudaSuccess) {                                             \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(e_));                              \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

using bench::Now;

KvtcBasis RandomBasis(uint64_t c, uint64_t seed) {
  return bench::RandomBasis(kFeatures, c, seed);
}

// Per-stage breakdown through KvtcGpuOptions::stage_hook: an event is
// recorded as each stage is enqueued; a stage's time is the gap to the next.
struct StageRecorder {
  bool on = false;
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> events;
  std::vector<std::string> names;

  void Hook(const char* name) {
    if (!on || names.size() == events.size()) return;
    CUDA_CHECK(cudaEventRecord(events[names.size()], stream));
    names.emplace_back(name);
  }
  // "stage ms  ..." summed over chunks, in first-seen order; then resets.
  std::string Summary() {
    std::vector<std::pair<std::string, float>> sums;
    if (!names.empty()) {
      CUDA_CHECK(cudaEventSynchronize(events[names.size() - 1]));
    }
    for (size_t i = 0; i + 1 < names.size(); ++i) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
      auto it = std::find_if(sums.begin(), sums.end(), [&](const auto& p) {
        return p.first == names[i];
      });
      if (it == sums.end()) {
        sums.emplace_back(names[i], ms);
      } else {
        it->second += ms;
      }
    }
    std::string out;
    for (const auto& [n, ms] : sums) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%s %.1f  ", n.c_str(), ms);
      out += buf;
    }
    names.clear();
    return out;
  }
};

// Mean milliseconds of `iters` back-to-back runs of f() on `stream`.
template <typename F>
float TimeIt(cudaStream_t stream, int warmup, int iters, F f) {
  for (int i = 0; i < warmup; ++i) f();
  CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  CUDA_CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < iters; ++i) f();
  CUDA_CHECK(cudaEventRecord(b, stream));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

// Mean milliseconds per batch of `iters` verified decodes of `buf` (see the
// top comment), alternating workspaces ws[0] / ws[1]; `async_ms` gets the
// host time of the last DecodeAsync (host checks + enqueue).
float TimeDecode(const KvtcGpuCodec& codec, absl::Span<const uint8_t> buf,
                 absl::Span<const MutablePageRef> outs,
                 const KvtcGpuWorkspace* const ws[2], cudaStream_t stream,
                 int warmup, int iters, double* async_ms) {
  auto run = [&](int n) {
    for (int i = 0; i < n; ++i) {
      const double c0 = Now();
      BENCH_CHECK(codec.DecodeAsync(buf, outs, *ws[i % 2], stream, nullptr));
      *async_ms = (Now() - c0) * 1e3;
      if (i > 0) BENCH_CHECK(codec.FinishDecode(buf, *ws[(i - 1) % 2]));
    }
    if (n > 0) BENCH_CHECK(codec.FinishDecode(buf, *ws[(n - 1) % 2]));
  };
  run(warmup);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const double t0 = Now();
  run(iters);
  return static_cast<float>((Now() - t0) * 1e3 / iters);
}

std::shared_ptr<KvtcCalibration> MakeCalibration(uint64_t comps) {
  auto cal = std::make_shared<KvtcCalibration>();
  cal->row_kind = KvtcRowKind::kPerToken;
  cal->num_layers = kLayers;
  cal->num_kv_heads = kHeads;
  cal->head_dim = kHeadDim;
  cal->page_size = kPage;
  cal->sink_tokens = 4;
  cal->rope_style = RopeStyle::kHalfSplit;
  cal->rope_theta = 500000.0f;
  cal->keys = RandomBasis(comps, 1);
  cal->values = RandomBasis(comps, 2);
  return cal;
}

// Device pages: random bf16 made on the host once (64 MiB) and replicated.
uint8_t* MakePages(size_t bytes) {
  void* raw = nullptr;
  CUDA_CHECK(cudaMalloc(&raw, bytes));
  uint8_t* arena = static_cast<uint8_t*>(raw);
  std::vector<uint16_t> tile(32 << 20);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (uint16_t& v : tile) {
    const float f = nd(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
  }
  const size_t tb = tile.size() * 2;
  CUDA_CHECK(cudaMemcpy(arena, tile.data(), std::min(tb, bytes),
                        cudaMemcpyHostToDevice));
  for (size_t at = tb; at < bytes; at += tb) {
    CUDA_CHECK(cudaMemcpy(arena + at, arena, std::min(tb, bytes - at),
                          cudaMemcpyDeviceToDevice));
  }
  return arena;
}

// Buffers of the arithmetic floor: bf16 X [rows][F], P [F][C]; fp32 Y.
struct Floor {
  void *x = nullptr, *p = nullptr, *y = nullptr, *w = nullptr;
  Floor(uint64_t rows, uint64_t comps) {
    CUDA_CHECK(cudaMalloc(&x, rows * kFeatures * 2));
    CUDA_CHECK(cudaMalloc(&p, kFeatures * comps * 2));
    CUDA_CHECK(cudaMalloc(&y, rows * comps * 4));
    CUDA_CHECK(cudaMalloc(&w, kProjectionGemmWorkspaceBytes));
    CUDA_CHECK(cudaMemset(x, 0x3C, rows * kFeatures * 2));
    CUDA_CHECK(cudaMemset(p, 0x3C, kFeatures * comps * 2));
    CUDA_CHECK(cudaMemset(y, 0x3C, rows * comps * 4));
  }
  ~Floor() {
    cudaFree(x);
    cudaFree(p);
    cudaFree(y);
    cudaFree(w);
  }
};

struct Row {
  float enc_pin, enc_dev, dec_pin, dec_map, floor_e, floor_d;
  double fin_ms, chk_ms, xxh_ms, ratio;
  std::string stages;
};

// One (tokens, comps, mode) case on an existing codec and workspace.
Row RunCase(const KvtcGpuCodec& codec, const KvtcGpuWorkspace& ws,
            const KvtcGpuWorkspace& ws2, uint8_t* arena, size_t n,
            uint64_t comps, uint8_t* pinned, uint8_t* dout, Floor& fl,
            cudaStream_t stream, int warmup, int iters, StageRecorder* rec) {
  const size_t page_bytes = codec.geometry().PageBytes();
  std::vector<PageRef> refs(n);
  std::vector<MutablePageRef> outs(n);
  for (size_t p = 0; p < n; ++p) {
    refs[p] = {arena + p * page_bytes, p * kPage};
    outs[p] = {arena + p * page_bytes, p * kPage};
  }
  const size_t size = *codec.EncodedSize(refs);
  Row r;
  r.enc_pin = TimeIt(stream, warmup, iters, [&] {
    BENCH_CHECK(codec.EncodeAsync(refs, pinned, size, ws, stream).status());
  });
  const double f0 = Now();
  auto fin =
      codec.FinishEncode(refs, absl::MakeSpan(pinned, size), ws, nullptr);
  r.fin_ms = (Now() - f0) * 1e3;
  BENCH_CHECK(fin.status());
  r.ratio = double(n) * kPage * 2 * kFeatures * 2 / *fin;
  r.enc_dev = TimeIt(stream, warmup, iters, [&] {
    BENCH_CHECK(codec.EncodeAsync(refs, dout, size, ws, stream).status());
  });
  const absl::Span<const uint8_t> buf(pinned, *fin);
  const auto env = ParseEnvelopeDeferBodyChecksum(buf);
  BENCH_CHECK(env.status());
  const double x0 = Now();
  BENCH_CHECK(CheckBodyChecksum(buf, env->header.body_checksum));
  r.xxh_ms = (Now() - x0) * 1e3;
  const KvtcGpuWorkspace* const pair[2] = {&ws, &ws2};
  r.dec_pin =
      TimeDecode(codec, buf, outs, pair, stream, warmup, iters, &r.chk_ms);
  // The seed's zero-copy read: kernels read the pinned input in place.
  KvtcGpuWorkspace map0 = ws, map1 = ws2;
  map0.copy_stream = map1.copy_stream = nullptr;
  const KvtcGpuWorkspace* const map_pair[2] = {&map0, &map1};
  double unused = 0;
  r.dec_map =
      TimeDecode(codec, buf, outs, map_pair, stream, warmup, iters, &unused);
  if (rec != nullptr) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    rec->on = true;
    BENCH_CHECK(codec.EncodeAsync(refs, pinned, size, ws, stream).status());
    r.stages = "    encode stages (ms): " + rec->Summary() + "\n";
    // The pages now hold decoded values: re-finish the buffer just written
    // (same layout, so the same size) before decoding it.
    auto again =
        codec.FinishEncode(refs, absl::MakeSpan(pinned, size), ws, nullptr);
    BENCH_CHECK(again.status());
    if (*again != buf.size()) {
      std::fprintf(stderr, "re-encoded size %zu != %zu\n", *again, buf.size());
      std::exit(1);
    }
    BENCH_CHECK(codec.DecodeAsync(buf, outs, ws, stream, nullptr));
    BENCH_CHECK(codec.FinishDecode(buf, ws));
    r.stages += "    decode stages (ms): " + rec->Summary() + "\n";
    rec->on = false;
  }
  // Floor: keys and values products in BF16, encode and decode shapes.
  const uint64_t rows = n * kPage - 4;  // sinks are not projected
  ProjectArgs pa{KvtcGemmMode::kBf16,      rows, kFeatures, comps, fl.x, fl.p,
                 static_cast<float*>(fl.y)};
  r.floor_e = TimeIt(stream, warmup, iters, [&] {
    for (int kv = 0; kv < 2; ++kv) {
      BENCH_CHECK(LaunchProject(pa, ws.cublas, fl.w,
                                kProjectionGemmWorkspaceBytes, stream));
    }
  });
  // Decode shape: Y[rows][C] x P^T -> X[rows][F] fp32, as 4 products of
  // rows / 2 (fp32 output of half the rows fits in the bf16 X buffer; Y is
  // the fp32 Y buffer read as bf16).
  ReconstructArgs rb{
      KvtcGemmMode::kBf16,      rows / 2, kFeatures, comps, fl.y, fl.p,
      static_cast<float*>(fl.x)};
  r.floor_d = TimeIt(stream, warmup, iters, [&] {
    for (int kv = 0; kv < 4; ++kv) {
      BENCH_CHECK(LaunchReconstruct(rb, ws.cublas, fl.w,
                                    kProjectionGemmWorkspaceBytes, stream));
    }
  });
  return r;
}

int Run() {
  std::vector<uint64_t> token_list, comp_list;
  for (auto s : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    token_list.push_back(std::stoull(std::string(s)));
  }
  for (auto s : absl::StrSplit(absl::GetFlag(FLAGS_components), ',')) {
    comp_list.push_back(std::stoull(std::string(s)));
  }
  std::vector<KvtcGemmMode> modes;
  for (auto s : absl::StrSplit(absl::GetFlag(FLAGS_modes), ',')) {
    auto m = ParseKvtcGemmMode(std::string(s));
    BENCH_CHECK(m.status());
    modes.push_back(*m);
  }
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const double t0 = Now();
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.1f GiB\n", prop.name,
              prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
  const uint64_t max_tokens =
      *std::max_element(token_list.begin(), token_list.end());
  const size_t max_pages = (max_tokens + kPage - 1) / kPage;
  Geometry g;
  g.num_layers = kLayers;
  g.num_kv_heads = kHeads;
  g.head_dim = kHeadDim;
  g.page_size = kPage;
  g.dtype = DType::kBF16;
  uint8_t* arena = MakePages(max_pages * g.PageBytes());
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  StageRecorder rec;
  rec.stream = stream;
  rec.events.resize(512);
  for (cudaEvent_t& e : rec.events) CUDA_CHECK(cudaEventCreate(&e));
  std::printf(
      "geometry: %u layers x %u kv heads x %u head_dim, bf16, page %u "
      "tokens, per-token rows (%lu features), RoPE half-split, 4 sinks\n"
      "ranges: 20%% FP8 | 40%% int4 | 40%% int2. GB/s = bf16 input bytes / "
      "time. enc_pin / enc_dev: output to pinned host / device memory; "
      "dec_pin: pinned input copied in chunks on a copy stream; dec_map: "
      "pinned input read in place by the kernels; floor_e / floor_d: the "
      "cuBLAS BF16 products alone (encode / decode shapes), same run; e/flr, "
      "d/flr: floor time / our time; fin_ms: FinishEncode (host checksum); "
      "chk_ms: DecodeAsync host checks + enqueue; xxh_ms: the body checksum "
      "alone on one host core (FinishDecode overlaps it with the GPU)\n\n",
      kLayers, kHeads, kHeadDim, kPage, (unsigned long)kFeatures);
  std::printf(
      "%7s %6s %5s | %8s %8s %8s %8s | %8s %8s | %5s %5s | %6s | %7s %7s "
      "%7s\n",
      "tokens", "comps", "mode", "enc_pin", "enc_dev", "dec_pin", "dec_map",
      "floor_e", "floor_d", "e/flr", "d/flr", "ratio", "fin_ms", "chk_ms",
      "xxh_ms");
  for (uint64_t comps : comp_list) {
    const auto cal = MakeCalibration(comps);
    for (KvtcGemmMode mode : modes) {
      const std::string mode_name(KvtcGemmModeName(mode));
      if (Now() - t0 > absl::GetFlag(FLAGS_max_seconds)) {
        std::printf("(time budget reached: comps %lu mode %s skipped)\n",
                    (unsigned long)comps, mode_name.c_str());
        continue;
      }
      CodecParams params;
      params.geometry = g;
      params.calibration = cal;
      KvtcGpuOptions opt;
      opt.gemm_mode = mode;
      opt.stage_hook = [&rec](const char* stage) { rec.Hook(stage); };
      auto codec_or = KvtcGpuCodec::Create(params, opt);
      BENCH_CHECK(codec_or.status());
      auto holder_or = KvtcGpuWorkspaceHolder::Create(**codec_or, max_pages);
      BENCH_CHECK(holder_or.status());
      auto holder2_or = KvtcGpuWorkspaceHolder::Create(**codec_or, max_pages);
      BENCH_CHECK(holder2_or.status());
      auto max_size = (*codec_or)->MaxEncodedSize(max_pages);
      BENCH_CHECK(max_size.status());
      void *pinned = nullptr, *dout = nullptr;
      CUDA_CHECK(cudaHostAlloc(&pinned, *max_size, cudaHostAllocMapped));
      CUDA_CHECK(cudaMalloc(&dout, *max_size));
      Floor fl(max_tokens, comps);
      const int iters =
          mode == KvtcGemmMode::kFp32 ? 1 : absl::GetFlag(FLAGS_iters);
      for (uint64_t tokens : token_list) {
        if (Now() - t0 > absl::GetFlag(FLAGS_max_seconds)) {
          std::printf("(time budget reached: %lu tokens skipped)\n",
                      (unsigned long)tokens);
          continue;
        }
        const size_t n = (tokens + kPage - 1) / kPage;
        const Row r = RunCase(
            **codec_or, (*holder_or)->get(), (*holder2_or)->get(), arena, n,
            comps, static_cast<uint8_t*>(pinned), static_cast<uint8_t*>(dout),
            fl, stream, warmup, iters, tokens == max_tokens ? &rec : nullptr);
        const double gb = double(n) * kPage * 2 * kFeatures * 2 / 1e9;
        std::printf(
            "%7lu %6lu %5s | %8.1f %8.1f %8.1f %8.1f | %8.1f %8.1f | %5.2f "
            "%5.2f | %6.2f | %7.1f %7.1f %7.1f\n%s",
            (unsigned long)(n * kPage), (unsigned long)comps, mode_name.c_str(),
            gb / r.enc_pin * 1e3, gb / r.enc_dev * 1e3, gb / r.dec_pin * 1e3,
            gb / r.dec_map * 1e3, gb / r.floor_e * 1e3, gb / r.floor_d * 1e3,
            r.floor_e / r.enc_pin, r.floor_d / r.dec_pin, r.ratio, r.fin_ms,
            r.chk_ms, r.xxh_ms, r.stages.c_str());
        std::fflush(stdout);
      }
      cudaFree(dout);
      cudaFreeHost(pinned);
    }
  }
  std::printf("\ntotal %.1f s\n", Now() - t0);
  cudaFree(arena);
  return 0;
}

}  // namespace
}  // namespace gpu
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvharbor::gpu::Run();
}
