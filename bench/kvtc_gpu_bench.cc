// KVTC GPU codec throughput for a Llama-3.1-8B-like geometry (32 layers x 8
// KV heads x 128 head_dim, bf16 pages of 16 tokens, per-token rows of 32768
// features, RoPE half-split undone on keys, 4 sink tokens), beside the
// arithmetic floor measured in the same run: the cuBLAS BF16 products of the
// same shapes (keys and values) alone.
//
// Compress: EncodeAsync of a whole batch into pinned host memory (the fused
// device-to-host path) or device memory. Decompress: DecodeAsync of that
// buffer from pinned host memory into the pages. Times are CUDA events over
// back-to-back calls after warm-up (host bookkeeping overlaps the GPU);
// FinishEncode's host checksum and DecodeAsync's host checks are timed
// separately. GB/s counts bf16 input bytes (tokens x 2 x 32768 x 2).
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
#include "core/kvtc_calibration.h"
#include "cuda/kvtc_gpu_codec.h"
#include "cuda/projection_gemm.h"

ABSL_FLAG(std::string, tokens, "4096,16384,65536", "batch sizes in tokens");
ABSL_FLAG(std::string, components, "4096,10240", "PCA components");
ABSL_FLAG(std::string, modes, "fp32,tf32,bf16", "projection GEMM modes");
ABSL_FLAG(int, iters, 3, "timed iterations (fp32: 1)");
ABSL_FLAG(int, warmup, 1, "warm-up iterations");
ABSL_FLAG(double, max_seconds, 110, "skip remaining cases after this long");

namespace kvharbor {
namespace gpu {
namespace {

constexpr uint32_t kLayers = 32, kHeads = 8, kHeadDim = 128, kPage = 16;
constexpr uint64_t kFeatures = uint64_t{kLayers} * kHeads * kHeadDim;

#define BENCH_CHECK(expr)                                     \
  do {                                                        \
    const absl::Status s_ = (expr);                           \
    if (!s_.ok()) {                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, \
                   s_.ToString().c_str());                    \
      std::exit(1);                                           \
    }                                                         \
  } while (0)
#define CUDA_CHECK(expr)                                                 \
  do {                                                                   \
    const cudaError_t e_ = (expr);                                       \
    if (e_ != cudaSuccess) {                                             \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(e_));                              \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<KvtcRange> Ranges(uint64_t c) {
  // The seed's split scaled to c: 20% FP8, 40% int4, 40% int2.
  const uint64_t a = c / 5, b = c * 3 / 5;
  return {{KvtcQuantType::kFp8, 0, 0, a},
          {KvtcQuantType::kIntX, 4, a, b},
          {KvtcQuantType::kIntX, 2, b, c}};
}

// A random projection with roughly orthonormal columns (Gaussian / sqrt(F));
// Gram-Schmidt on 32768 x 10240 would take minutes on the host.
KvtcBasis RandomBasis(uint64_t c, uint64_t seed) {
  KvtcBasis b;
  b.features = kFeatures;
  b.components = c;
  b.mean.assign(kFeatures, 0.01f);
  b.projection.resize(kFeatures * c);
  std::mt19937_64 rng(seed);
  const float scale = 1.0f / std::sqrt(float(kFeatures));
  uint64_t x = rng();
  for (float& v : b.projection) {  // xorshift + Irwin-Hall(4) ~ Gaussian
    float s = 0;
    for (int k = 0; k < 4; ++k) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      s += float(x >> 40) * (1.0f / 16777216.0f);
    }
    v = (s - 2.0f) * 1.7320508f * scale;
  }
  b.ranges = Ranges(c);
  return b;
}

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
  // Pages: one arena; random bf16 made on the host once (64 MiB) and
  // replicated on the device.
  const size_t page_bytes = g.PageBytes();
  void* arena_raw = nullptr;
  CUDA_CHECK(cudaMalloc(&arena_raw, max_pages * page_bytes));
  uint8_t* arena = static_cast<uint8_t*>(arena_raw);
  {
    std::vector<uint16_t> tile(32 << 20);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (uint16_t& v : tile) {
      const float f = nd(rng);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      v = static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
    }
    const size_t tb = tile.size() * 2, total = max_pages * page_bytes;
    CUDA_CHECK(cudaMemcpy(arena, tile.data(), std::min(tb, total),
                          cudaMemcpyHostToDevice));
    for (size_t at = tb; at < total; at += tb) {
      CUDA_CHECK(cudaMemcpy(arena + at, arena, std::min(tb, total - at),
                            cudaMemcpyDeviceToDevice));
    }
  }
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf(
      "geometry: %u layers x %u kv heads x %u head_dim, bf16, page %u "
      "tokens, per-token rows (%lu features), RoPE half-split, 4 sinks\n"
      "ranges: 20%% FP8 | 40%% int4 | 40%% int2; GB/s = bf16 input bytes / "
      "time; floor = cuBLAS BF16 GEMMs of the same shapes, same run\n\n",
      kLayers, kHeads, kHeadDim, kPage, (unsigned long)kFeatures);
  std::printf("%7s %6s %5s | %9s %9s %9s | %9s %9s | %6s %6s | %6s | %8s %8s\n",
              "tokens", "comps", "mode", "enc_pin", "enc_dev", "dec_pin",
              "floor_e", "floor_d", "e/flr", "d/flr", "ratio", "fin_ms",
              "chk_ms");
  for (uint64_t comps : comp_list) {
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
    for (KvtcGemmMode mode : modes) {
      if (Now() - t0 > absl::GetFlag(FLAGS_max_seconds)) {
        std::printf("(time budget reached: comps %lu mode %s skipped)\n",
                    (unsigned long)comps,
                    std::string(KvtcGemmModeName(mode)).c_str());
        continue;
      }
      CodecParams params;
      params.geometry = g;
      params.calibration = cal;
      KvtcGpuOptions opt;
      opt.gemm_mode = mode;
      auto codec_or = KvtcGpuCodec::Create(params, opt);
      BENCH_CHECK(codec_or.status());
      const KvtcGpuCodec& codec = **codec_or;
      auto holder_or = KvtcGpuWorkspaceHolder::Create(codec, max_pages);
      BENCH_CHECK(holder_or.status());
      const KvtcGpuWorkspace& ws = (*holder_or)->get();
      auto max_size = codec.MaxEncodedSize(max_pages);
      BENCH_CHECK(max_size.status());
      void *pinned_raw = nullptr, *dout_raw = nullptr;
      CUDA_CHECK(cudaHostAlloc(&pinned_raw, *max_size, cudaHostAllocMapped));
      CUDA_CHECK(cudaMalloc(&dout_raw, *max_size));
      uint8_t* pinned = static_cast<uint8_t*>(pinned_raw);
      uint8_t* dout = static_cast<uint8_t*>(dout_raw);
      // Floor operands: bf16 X [max rows][F] and P [F][C], fp32 Y / X out.
      const uint64_t max_rows = max_tokens;
      void *fx, *fp, *fy, *fw;
      CUDA_CHECK(cudaMalloc(&fx, max_rows * kFeatures * 2));
      CUDA_CHECK(cudaMalloc(&fp, kFeatures * comps * 2));
      CUDA_CHECK(cudaMalloc(&fy, max_rows * std::max<uint64_t>(comps, 1) * 4));
      CUDA_CHECK(cudaMalloc(&fw, kProjectionGemmWorkspaceBytes));
      CUDA_CHECK(cudaMemset(fx, 0x3C, max_rows * kFeatures * 2));
      CUDA_CHECK(cudaMemset(fp, 0x3C, kFeatures * comps * 2));
      CUDA_CHECK(cudaMemset(fy, 0x3C, max_rows * comps * 4));
      const int iters =
          mode == KvtcGemmMode::kFp32 ? 1 : absl::GetFlag(FLAGS_iters);
      for (uint64_t tokens : token_list) {
        if (Now() - t0 > absl::GetFlag(FLAGS_max_seconds)) {
          std::printf("(time budget reached: %lu tokens skipped)\n",
                      (unsigned long)tokens);
          continue;
        }
        const size_t n = (tokens + kPage - 1) / kPage;
        std::vector<PageRef> refs(n);
        std::vector<MutablePageRef> outs(n);
        for (size_t p = 0; p < n; ++p) {
          refs[p] = {arena + p * page_bytes, p * kPage};
          outs[p] = {arena + p * page_bytes, p * kPage};
        }
        const size_t size = *codec.EncodedSize(refs);
        const double in_gb = double(n) * kPage * 2 * kFeatures * 2 / 1e9;
        const float enc_pin = TimeIt(stream, warmup, iters, [&] {
          BENCH_CHECK(
              codec.EncodeAsync(refs, pinned, size, ws, stream).status());
        });
        const double f0 = Now();
        auto fin =
            codec.FinishEncode(refs, absl::MakeSpan(pinned, size), ws, nullptr);
        const double fin_ms = (Now() - f0) * 1e3;
        BENCH_CHECK(fin.status());
        const float enc_dev = TimeIt(stream, warmup, iters, [&] {
          BENCH_CHECK(codec.EncodeAsync(refs, dout, size, ws, stream).status());
        });
        const absl::Span<const uint8_t> buf(pinned, *fin);
        double chk = 0;
        const float dec_pin = TimeIt(stream, warmup, iters, [&] {
          const double c0 = Now();
          BENCH_CHECK(codec.DecodeAsync(buf, outs, ws, stream, nullptr));
          chk = (Now() - c0) * 1e3;  // host checks + enqueue, last call
        });
        // Floor: keys and values products in BF16 (encode and decode shapes).
        const uint64_t rows = n * kPage - 4;  // sinks are not projected
        ProjectArgs pa{KvtcGemmMode::kBf16,    rows, kFeatures, comps, fx, fp,
                       static_cast<float*>(fy)};
        const float floor_e = TimeIt(stream, warmup, iters, [&] {
          for (int kv = 0; kv < 2; ++kv) {
            BENCH_CHECK(LaunchProject(pa, ws.cublas, fw,
                                      kProjectionGemmWorkspaceBytes, stream));
          }
        });
        // Decode-shaped floor: Y[rows][C] x P^T -> X[rows][F] in fp32, as
        // 4 products of rows / 2 (the fp32 output of half the rows fits in
        // the bf16 X buffer); Y is the fy buffer read as bf16.
        ReconstructArgs rb{
            KvtcGemmMode::kBf16,    rows / 2, kFeatures, comps, fy, fp,
            static_cast<float*>(fx)};
        const float floor_d = TimeIt(stream, warmup, iters, [&] {
          for (int kv = 0; kv < 4; ++kv) {
            BENCH_CHECK(LaunchReconstruct(
                rb, ws.cublas, fw, kProjectionGemmWorkspaceBytes, stream));
          }
        });
        std::printf(
            "%7lu %6lu %5s | %9.1f %9.1f %9.1f | %9.1f %9.1f | %6.2f %6.2f "
            "| %6.2f | %8.1f %8.1f\n",
            (unsigned long)(n * kPage), (unsigned long)comps,
            std::string(KvtcGemmModeName(mode)).c_str(), in_gb / enc_pin * 1e3,
            in_gb / enc_dev * 1e3, in_gb / dec_pin * 1e3, in_gb / floor_e * 1e3,
            in_gb / floor_d * 1e3, floor_e / enc_pin, floor_d / dec_pin,
            in_gb * 1e9 / *fin, fin_ms, chk);
        std::fflush(stdout);
      }
      cudaFree(fx);
      cudaFree(fp);
      cudaFree(fy);
      cudaFree(fw);
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
