// GPU KVCM compressor (cuda/codec/kvcm_gpu.h) against the CPU transform
// (core/transform/kvcm_compressor.h): the MLP alone and the whole
// length-reducing Apply, over a sweep of factors, head sizes, hidden widths,
// heads, token counts (tails, segments below min_seq_len, image segments,
// text-only files) and weight file dtypes (fp16 / bf16 / fp32, round-tripped
// through the .bin writer and reader). Bound: max |gpu - cpu| <= 1e-4 * max
// |cpu| (summation orders of cuBLAS and OpenBLAS differ); output length equal.
#include "cuda/codec/kvcm_gpu.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "core/transform/kvcm_compressor.h"
#include "core/transform/kvcm_format.h"
#include "cuda/kernels/cuda_check.h"
#include "tests/cuda/cuda_test_util.h"

namespace kvharbor {
namespace gpu {
namespace {

using testing::DeviceBuf;

struct KvcmCase {
  uint32_t layers, hd, f, h1, h2, blocks, heads, min_seq_len;
  bool bias;
  KvcmDType dtype;
};

KvcmWeights Weights(const KvcmCase& k, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  KvcmWeights w;
  w.header.dtype = k.dtype;
  w.header.num_layers = k.layers;
  w.header.num_heads = k.heads;
  w.header.head_dim = k.hd;
  w.header.compression_factor = k.f;
  w.header.min_seq_len = k.min_seq_len;
  w.header.weight_count_per_layer = k.blocks;
  const uint32_t dims[4] = {k.f * k.hd, k.h1, k.h2, k.hd};
  w.layers.resize(k.layers);
  for (auto& layer : w.layers) {
    for (uint32_t b = 0; b < k.blocks; ++b) {
      KvcmLinear lin;
      lin.cols = dims[b % 3];
      lin.rows = dims[b % 3 + 1];
      const float s = 1.0f / std::sqrt(float(lin.cols));
      for (uint64_t i = 0; i < uint64_t{lin.rows} * lin.cols; ++i) {
        lin.weight.push_back(s * nd(rng));
      }
      if (k.bias || b % 3 == 2) {
        for (uint32_t i = 0; i < lin.rows; ++i)
          lin.bias.push_back(0.1f * nd(rng));
      }
      layer.push_back(std::move(lin));
    }
  }
  // Through the file format, so fp16 / bf16 weights are what a file holds.
  auto bytes = SerializeKvcmWeights(w);
  REQUIRE(bytes.ok());
  auto parsed = ParseKvcmWeights(absl::MakeConstSpan(
      reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()));
  REQUIRE(parsed.ok());
  return *std::move(parsed);
}

double MaxRelError(const std::vector<float>& got,
                   const std::vector<float>& want) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(double(got[i]) - want[i]));
    ref = std::max(ref, std::fabs(double(want[i])));
  }
  return ref > 0 ? err / ref : err;
}

class Cublas {
 public:
  Cublas() { REQUIRE(cublasCreate(&h_) == CUBLAS_STATUS_SUCCESS); }
  ~Cublas() { cublasDestroy(h_); }
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

TEST_CASE("KVCM MLP and compressor on the GPU match the CPU", "[cuda][kvcm]") {
  std::mt19937_64 rng(67);
  Cublas blas;
  const KvcmCase cases[] = {
      {2, 8, 2, 12, 10, 6, 2, 2, true, KvcmDType::kFP32},
      {1, 64, 4, 256, 128, 12, 4, 1, false, KvcmDType::kFP16},
      {3, 32, 3, 64, 48, 12, 1, 3, true, KvcmDType::kBF16},
      {1, 128, 8, 512, 256, 6, 8, 4, true, KvcmDType::kFP32},
  };
  const uint64_t token_counts[] = {1, 5, 7, 64, 301};
  double worst = 0;
  int runs = 0;
  for (const KvcmCase& k : cases) {
    auto w = std::make_shared<const KvcmWeights>(Weights(k, rng));
    auto dw = KvcmDeviceWeights::Upload(*w);
    KVH_STATUS_REQUIRE(dw.status());
    for (uint64_t image_tokens : {uint64_t{0}, uint64_t{13}}) {
      KvcmCompressorOptions opt;
      opt.image_tokens = image_tokens;
      auto cpu = KvcmCompressor::Create(w, k.layers, k.heads, k.hd, opt);
      KVH_STATUS_REQUIRE(cpu.status());
      for (uint64_t n : token_counts) {
        INFO("f " << k.f << " hd " << k.hd << " heads " << k.heads << " blocks "
                  << k.blocks << " image " << image_tokens << " tokens " << n);
        KvSequenceShape in_shape{k.layers, k.heads, k.hd, n};
        std::vector<float> in(in_shape.Elements());
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (float& x : in) x = nd(rng);
        auto out_n = (*cpu)->OutputTokens(n);
        REQUIRE(out_n.ok());
        REQUIRE(KvcmGpuOutputTokens(**dw, image_tokens, n) == *out_n);
        KvSequenceShape out_shape = in_shape;
        out_shape.num_tokens = *out_n;
        std::vector<float> want(out_shape.Elements());
        KVH_STATUS_REQUIRE(
            (*cpu)->Apply({in_shape, in.data()}, {out_shape, want.data()}));
        DeviceBuf din(in.size() * 4), dout(want.size() * 4);
        din.Upload(in.data(), in.size() * 4);
        dout.Fill(0xFF);  // NaN: every output element must be written
        KvcmCompressArgs a;
        a.weights = dw->get();
        a.num_kv_heads = k.heads;
        a.image_tokens = image_tokens;
        a.in_tokens = n;
        a.in = din.as<float>();
        a.out = dout.as<float>();
        DeviceBuf ws(KvcmCompressWorkspaceBytes(a));
        KVH_STATUS_REQUIRE(
            LaunchKvcmCompress(a, blas.get(), ws.bytes(), ws.size(), nullptr));
        KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
        std::vector<float> got(want.size());
        dout.Download(got.data(), got.size() * 4);
        for (float g : got) REQUIRE(std::isfinite(g));
        const double e = MaxRelError(got, want);
        worst = std::max(worst, e);
        ++runs;
        CHECK(e <= 1e-4);
      }
    }
    // The MLP alone on many rows (several cuBLAS tile shapes).
    for (uint64_t rows : {uint64_t{1}, uint64_t{33}, uint64_t{4099}}) {
      const KvcmLinear& l0 = w->linear(0, KvcmPrefix::kTextValue, 0);
      std::vector<float> x(rows * l0.cols), want(rows * k.hd), got(rows * k.hd);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (float& v : x) v = nd(rng);
      KvcmMlpForward(*w, 0, KvcmPrefix::kTextValue, x.data(), rows,
                     want.data());
      KvcmMlpArgs m;
      for (uint32_t i = 0; i < 3; ++i) {
        m.linear[i] = (*dw)->linear(0, KvcmPrefix::kTextValue, i);
      }
      m.rows = rows;
      DeviceBuf dx(x.size() * 4), dy(got.size() * 4),
          ws(KvcmMlpWorkspaceBytes(m));
      dx.Upload(x.data(), x.size() * 4);
      m.in = dx.as<float>();
      m.out = dy.as<float>();
      KVH_STATUS_REQUIRE(
          LaunchKvcmMlp(m, blas.get(), ws.bytes(), ws.size(), nullptr));
      KVH_CUDA_REQUIRE(cudaDeviceSynchronize());
      dy.Download(got.data(), got.size() * 4);
      const double e = MaxRelError(got, want);
      worst = std::max(worst, e);
      ++runs;
      CHECK(e <= 1e-4);
    }
  }
  std::printf(
      "kvcm gpu: %d runs over 4 weight sets (fp32/fp16/bf16 files): "
      "lengths equal, worst max|gpu-cpu|/max|cpu| = %.3g (bound "
      "1e-4)\n",
      runs, worst);
}

TEST_CASE("KVCM GPU launchers refuse bad arguments", "[cuda][kvcm]") {
  Cublas blas;
  KvcmCompressArgs a;
  absl::Status st = LaunchKvcmCompress(a, blas.get(), nullptr, 0, nullptr);
  CHECK(st.message().find("weights") != std::string::npos);
  KvcmMlpArgs m;
  m.rows = 4;
  DeviceBuf buf(1024);
  m.in = buf.as<float>();
  m.out = buf.as<float>();
  st = LaunchKvcmMlp(m, blas.get(), buf.bytes(), buf.size(), nullptr);
  CHECK(st.message().find("linear[0]") != std::string::npos);
  KvcmWeights bad;
  CHECK_FALSE(KvcmDeviceWeights::Upload(bad).ok());
}

}  // namespace
}  // namespace gpu
}  // namespace kvharbor
