// KvtcGpuCodec vs the CPU KvtcCodec with real (non-identity) bases, where
// the GEMMs round differently: buffer layout and sinks identical, quantized
// bytes mostly identical, cross-decoding within stated bounds, for the FP32,
// TF32 and BF16 projection modes. Prints each mode's accuracy.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/codec/kvtc/kvtc_codec.h"
#include "core/codec/kvtc/kvtc_format.h"
#include "cuda/codec/kvtc_gpu_codec.h"
#include "cuda/codec/projection_gemm.h"
#include "cuda/kernels/coeff_utils.h"
#include "tests/cuda/codec_test_util.h"

namespace kvharbor {
namespace gpu {
namespace {

using namespace testing;  // NOLINT: test helpers

absl::Span<const uint8_t> Span(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()),
                             s.size());
}

std::vector<float> ToFloats(const Geometry& g,
                            const std::vector<std::vector<uint8_t>>& pages) {
  std::vector<float> out;
  const size_t es = DTypeSize(g.dtype);
  for (const auto& p : pages) {
    for (size_t i = 0; i < p.size() / es; ++i) {
      out.push_back(ElementToFloat(g.dtype, p.data() + i * es));
    }
  }
  return out;
}

double Rms(const std::vector<float>& a) {
  double s = 0;
  for (float v : a) s += double(v) * v;
  return std::sqrt(s / a.size());
}
double RmsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    s += (double(a[i]) - b[i]) * (a[i] - b[i]);
  return std::sqrt(s / a.size());
}

// Compares the GPU buffer with the CPU buffer region by region: everything
// but IntX metadata and quantized data (and the checksums) must be equal;
// returns the fraction of quantized data bytes that differ.
double CompareBuffers(const KvtcCodec& cpu, const std::vector<uint64_t>& pos,
                      const std::string& a, const std::string& b) {
  REQUIRE(a.size() == b.size());
  const auto layout = cpu.PayloadLayout(pos);
  REQUIRE(layout.ok());
  const size_t head = kEnvelopeHeaderBytes + 8 * pos.size();
  std::vector<bool> free_byte(a.size(), false);            // allowed to differ
  for (size_t i = 80; i < 88; ++i) free_byte[i] = true;    // body checksum
  for (size_t i = 120; i < 128; ++i) free_byte[i] = true;  // header checksum
  uint64_t data_bytes = 0, data_diff = 0;
  for (int s = 0; s < 2; ++s) {
    for (const KvtcRangeLayout& rl : layout->sections[s].ranges) {
      for (uint64_t i = 0; i < rl.metadata_bytes; ++i) {
        free_byte[head + rl.metadata_offset + i] = true;
      }
      for (uint64_t i = 0; i < rl.data_bytes; ++i) {
        const size_t at = head + rl.data_offset + i;
        free_byte[at] = true;
        data_diff += a[at] != b[at];
      }
      data_bytes += rl.data_bytes;
    }
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (free_byte[i]) continue;
    INFO("byte " << i << " (payload offset " << long(i) - long(head) << ")");
    REQUIRE(a[i] == b[i]);
  }
  return data_bytes == 0 ? 0.0 : double(data_diff) / data_bytes;
}

struct ModeBounds {
  KvtcGemmMode mode;
  double max_byte_diff;   // fraction of quantized bytes differing from CPU
  double max_decode_rel;  // rms(gpu decode - cpu decode) / rms(pages)
  double max_err_ratio;   // gpu end-to-end error / cpu end-to-end error
};
constexpr ModeBounds kModes[] = {
    {KvtcGemmMode::kFp32, 0.01, 2e-3, 1.01},
    {KvtcGemmMode::kTf32, 0.10, 2e-2, 1.05},
    {KvtcGemmMode::kBf16, 0.25, 4e-2, 1.25},
};

TEST_CASE("GPU and CPU agree within bounds with a random basis",
          "[cuda][codec][accuracy]") {
  std::mt19937_64 rng(99);
  for (DType dt : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3}) {
    for (KvtcRowKind kind : {KvtcRowKind::kPerToken, KvtcRowKind::kPerPage}) {
      for (int ranges : {0, 1}) {
        Geometry g;
        g.num_layers = 3;
        g.num_kv_heads = 2;
        g.head_dim = 16;
        g.page_size = 8;
        g.dtype = dt;
        g.layout = ranges ? PageLayout::kLayerKvTokenHeadDim
                          : PageLayout::kKvLayerTokenHeadDim;
        const uint64_t f = (kind == KvtcRowKind::kPerToken ? 3 : 8) * 2 * 16;
        CodecParams params;
        params.geometry = g;
        params.calibration =
            MakeCalibration(g, kind, RopeStyle::kHalfSplit, 4,
                            BasisKind::kRandom, ranges, f / 2, rng);
        auto cpu = KvtcCodec::Create(params);
        KVH_STATUS_REQUIRE(cpu.status());
        PageSet pages = MakePages(g, {0, 8, 16, 24, 4096, 4104}, rng);
        const auto cbuf = (*cpu)->EncodeToString(pages.HostRefs(), nullptr);
        KVH_STATUS_REQUIRE(cbuf.status());
        auto cpu_dec = SentinelPages(pages, 0);
        KVH_STATUS_REQUIRE((*cpu)->Decode(
            Span(*cbuf), Refs(cpu_dec, pages.positions), nullptr));
        const std::vector<float> orig = ToFloats(g, pages.host);
        const std::vector<float> cdec = ToFloats(g, cpu_dec);
        const double cpu_err = RmsDiff(cdec, orig);
        for (const ModeBounds& mb : kModes) {
          INFO(DTypeName(dt)
               << " " << KvtcRowKindName(kind) << " ranges " << ranges
               << " mode " << KvtcGemmModeName(mb.mode));
          KvtcGpuOptions opt;
          opt.gemm_mode = mb.mode;
          opt.max_rows_per_chunk = 5;
          auto gpu = KvtcGpuCodec::Create(params, opt);
          KVH_STATUS_REQUIRE(gpu.status());
          const auto gbuf = (*gpu)->EncodeToString(pages.DeviceRefs(), nullptr);
          KVH_STATUS_REQUIRE(gbuf.status());
          const double diff =
              CompareBuffers(**cpu, pages.positions, *gbuf, *cbuf);
          INFO("quantized bytes differing: " << diff);
          REQUIRE(diff <= mb.max_byte_diff);
          // CPU decodes the GPU's buffer; GPU decodes the CPU's buffer.
          auto cross = SentinelPages(pages, 0);
          KVH_STATUS_REQUIRE((*cpu)->Decode(
              Span(*gbuf), Refs(cross, pages.positions), nullptr));
          const std::vector<float> gpu_err_pages = ToFloats(g, cross);
          pages.arena->Fill(0xFF);  // NaN in every dtype
          KVH_STATUS_REQUIRE(
              (*gpu)->Decode(Span(*cbuf), pages.DeviceOut(), nullptr));
          const std::vector<float> gdec = ToFloats(g, pages.Download());
          pages.UploadAll();
          for (float v : gdec) REQUIRE(std::isfinite(v));
          const double rms = Rms(orig);
          const double dec_rel = RmsDiff(gdec, cdec) / rms;
          INFO("gpu-vs-cpu decode rel rms " << dec_rel);
          REQUIRE(dec_rel <= mb.max_decode_rel);
          if (mb.mode == KvtcGemmMode::kFp32) {
            // Element-wise: at most about one step of the page dtype.
            const float ulp = DTypeUlp(dt);
            for (size_t i = 0; i < gdec.size(); ++i) {
              const float tol = 1.01f * ulp * std::fabs(cdec[i]) +
                                1e-4f * float(rms) +
                                (dt == DType::kFP8E4M3 ? 0.002f : 0.0f);
              INFO("element " << i << " gpu " << gdec[i] << " cpu " << cdec[i]);
              REQUIRE(std::fabs(gdec[i] - cdec[i]) <= tol);
            }
          }
          const double gpu_err = RmsDiff(gpu_err_pages, orig);
          INFO("end-to-end error gpu " << gpu_err << " cpu " << cpu_err);
          REQUIRE(gpu_err <= mb.max_err_ratio * cpu_err + 1e-6 * rms);
        }
      }
    }
  }
}

// Synthetic KV with PCA structure: x = A z + noise, z with decaying scales.
std::vector<float> LowRankRows(size_t rows, size_t f, size_t rank,
                               const std::vector<float>& a,
                               std::mt19937_64& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(rows * f);
  std::vector<float> z(rank);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t k = 0; k < rank; ++k) z[k] = n(rng) / (1.0f + 0.15f * k);
    for (size_t i = 0; i < f; ++i) {
      float v = 0.05f * n(rng);
      for (size_t k = 0; k < rank; ++k) v += a[i * rank + k] * z[k];
      x[r * f + i] = v;
    }
  }
  return x;
}

TEST_CASE("Accuracy of the FP32, TF32 and BF16 modes (printed)",
          "[cuda][codec][accuracy]") {
  std::mt19937_64 rng(2024);
  Geometry g;
  g.num_layers = 4;
  g.num_kv_heads = 2;
  g.head_dim = 32;
  g.page_size = 16;
  g.dtype = DType::kBF16;
  const size_t f = 256, rank = 48, c = 128, pages_n = 64;
  const size_t tokens = pages_n * g.page_size;
  std::normal_distribution<float> n(0.0f, 0.3f);
  std::vector<float> a(2 * f * rank);
  for (float& v : a) v = n(rng);
  const std::vector<KvtcRange> ranges = {{KvtcQuantType::kFp8, 0, 0, 32},
                                         {KvtcQuantType::kIntX, 4, 32, 80},
                                         {KvtcQuantType::kIntX, 2, 80, 128}};
  auto cal = std::make_shared<KvtcCalibration>();
  cal->row_kind = KvtcRowKind::kPerToken;
  cal->num_layers = g.num_layers;
  cal->num_kv_heads = g.num_kv_heads;
  cal->head_dim = g.head_dim;
  cal->page_size = g.page_size;
  cal->sink_tokens = 4;
  std::vector<float> kv_rows[2];
  for (int kv = 0; kv < 2; ++kv) {
    const std::vector<float> ak(a.begin() + kv * f * rank,
                                a.begin() + (kv + 1) * f * rank);
    const std::vector<float> train = LowRankRows(4096, f, rank, ak, rng);
    auto basis = PcaBasis(train, 4096, f, c, ranges);
    KVH_STATUS_REQUIRE(basis.status());
    (kv == 0 ? cal->keys : cal->values) = std::move(*basis);
    kv_rows[kv] = LowRankRows(tokens, f, rank, ak, rng);
  }
  // Pages from the rows: per-token features [layer][head][dim].
  PageSet pages = MakePages(g, {}, rng);
  pages.positions.clear();
  pages.host.clear();
  pages.offsets.clear();
  pages.arena = std::make_unique<DeviceBuf>(pages_n * pages.stride());
  const KvtcPageShape shape{g.num_layers, g.num_kv_heads, g.head_dim,
                            g.page_size,  int(g.dtype),   int(g.layout)};
  for (size_t p = 0; p < pages_n; ++p) {
    std::vector<uint8_t> page(g.PageBytes());
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t t = 0; t < g.page_size; ++t) {
        const float* row = &kv_rows[kv][(p * g.page_size + t) * f];
        for (uint32_t l = 0; l < g.num_layers; ++l) {
          for (uint32_t e = 0; e < 64; ++e) {
            FloatToElement(g.dtype, row[l * 64 + e],
                           page.data() + (shape.RunIndex(kv, l, t) + e) * 2);
          }
        }
      }
    }
    pages.host.push_back(page);
    pages.positions.push_back(p * g.page_size);
    pages.offsets.push_back((pages_n - 1 - p) * pages.stride() + 256);
  }
  pages.UploadAll();
  CodecParams params;
  params.geometry = g;
  params.calibration = cal;
  auto cpu = KvtcCodec::Create(params);
  KVH_STATUS_REQUIRE(cpu.status());
  const auto cbuf = (*cpu)->EncodeToString(pages.HostRefs(), nullptr);
  KVH_STATUS_REQUIRE(cbuf.status());
  auto cpu_dec = SentinelPages(pages, 0);
  KVH_STATUS_REQUIRE(
      (*cpu)->Decode(Span(*cbuf), Refs(cpu_dec, pages.positions), nullptr));
  const std::vector<float> orig = ToFloats(g, pages.host);
  const std::vector<float> cdec = ToFloats(g, cpu_dec);
  const double rms = Rms(orig);
  std::printf(
      "\nKVTC accuracy, per-token rows, 256 features -> 128 components "
      "(FP8 32 | int4 48 | int2 48), %zu tokens, bf16 pages, synthetic "
      "rank-48 data; compression %.2fx\n",
      tokens, double(tokens * f * 2 * 2) / cbuf->size());
  std::printf("%-5s %14s %14s %14s %14s %14s\n", "mode", "coef_rel_err",
              "bytes!=cpu", "gpu_vs_cpu_dec", "gpu_recon_err", "cpu_recon_err");
  for (const ModeBounds& mb : kModes) {
    KvtcGpuOptions opt;
    opt.gemm_mode = mb.mode;
    auto gpu = KvtcGpuCodec::Create(params, opt);
    KVH_STATUS_REQUIRE(gpu.status());
    const auto gbuf = (*gpu)->EncodeToString(pages.DeviceRefs(), nullptr);
    KVH_STATUS_REQUIRE(gbuf.status());
    const double diff = CompareBuffers(**cpu, pages.positions, *gbuf, *cbuf);
    pages.arena->Fill(0);
    KVH_STATUS_REQUIRE((*gpu)->Decode(Span(*gbuf), pages.DeviceOut(), nullptr));
    const std::vector<float> gdec = ToFloats(g, pages.Download());
    pages.UploadAll();
    // The projection alone: keys' centered rows (from the bf16 pages) times
    // the basis, against a float64 product.
    const KvtcBasis& kb = cal->keys;
    const size_t rows = 1024;
    std::vector<float> x(rows * f);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t i = 0; i < f; ++i) {
        x[r * f + i] =
            Bf16ToFloat(FloatToBf16(kv_rows[0][r * f + i])) - kb.mean[i];
      }
    }
    DeviceBuf dx(x.size() * 4), dp(kb.projection.size() * 4), dy(rows * c * 4),
        bx(x.size() * 2), bp(kb.projection.size() * 2), cw(32 << 20);
    dx.Upload(x.data(), x.size() * 4);
    dp.Upload(kb.projection.data(), kb.projection.size() * 4);
    ProjectArgs pa{mb.mode, rows, f, c, dx.bytes(), dp.bytes(), dy.as<float>()};
    if (mb.mode == KvtcGemmMode::kBf16) {
      KVH_STATUS_REQUIRE(LaunchConvertToBf16(
          {dx.as<float>(), bx.as<uint16_t>(), x.size()}, nullptr));
      KVH_STATUS_REQUIRE(LaunchConvertToBf16(
          {dp.as<float>(), bp.as<uint16_t>(), kb.projection.size()}, nullptr));
      pa.x = bx.bytes();
      pa.projection = bp.bytes();
    }
    cublasHandle_t h;
    REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    KVH_STATUS_REQUIRE(LaunchProject(pa, h, cw.bytes(), cw.size(), nullptr));
    std::vector<float> y(rows * c);
    dy.Download(y.data(), y.size() * 4);
    cublasDestroy(h);
    double num = 0, den = 0;
    for (size_t r = 0; r < rows; ++r) {
      for (size_t j = 0; j < c; ++j) {
        double ref = 0;
        for (size_t i = 0; i < f; ++i) {
          ref += double(x[r * f + i]) * kb.projection[i * c + j];
        }
        num += (y[r * c + j] - ref) * (y[r * c + j] - ref);
        den += ref * ref;
      }
    }
    const double coef_err = std::sqrt(num / den);
    const double dec_rel = RmsDiff(gdec, cdec) / rms;
    const double gpu_err = RmsDiff(gdec, orig) / rms;
    const double cpu_err = RmsDiff(cdec, orig) / rms;
    std::printf("%-5s %14.3e %14.3e %14.3e %14.3e %14.3e\n",
                std::string(KvtcGemmModeName(mb.mode)).c_str(), coef_err, diff,
                dec_rel, gpu_err, cpu_err);
    REQUIRE(diff <= mb.max_byte_diff);
    REQUIRE(gpu_err <= mb.max_err_ratio * cpu_err);
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace gpu
}  // namespace kvharbor
