// kvtc_cpu_bench: CPU KVTC encode/decode throughput beside its arithmetic
// floor, the bare cblas_sgemm projections of the same shapes, in one run.
//
// Geometry: Llama-3.1-8B-like (kv_heads 8, head_dim 128) with 32 layers and an
// 8-layer variant; per-token rows (features = layers * 8 * 128), pages of 16
// bf16 tokens, the batch starting at position 0 (so 4 attention-sink tokens).
// Components default to 1024 (not 4096: a 32768 x 4096 projection is 512 MiB
// per K/V and 4x the arithmetic; --components changes it) with the issue's
// range layout scaled by 1/4: fp8 [0, C/8), int4 [C/8, C/2), int2 [C/2, C).
//
// Data: synthetic but PCA-shaped. The basis is an orthonormal one that is free
// to build (StructuredBasis; components must divide features), the rows are
// mean +
// sum_c s_c z_c basis_c with s_c = 4 / (1 + c/16) (a fast-decaying PCA
// spectrum, as the paper reports for real KV caches) plus 1% noise. Throughput
// does not depend on the content; the zstd gain does, so it is indicative only.
//
// --layer_groups=N makes both bases block-diagonal (docs/kvtc_format.md): N
// blocks of features/N features and C/N components each, as
// kvharbor-calibrate --layer-groups=N writes them; the projection then costs
// 1/N of the dense one's at the same C.
//
// --per_page encodes and decodes every page as its own buffer, as the
// store's eviction does (rows per GEMM = page_size); otherwise the whole
// batch is one buffer.
//
// MB/s counts bf16 page bytes (K and V) per wall second, tokens/s the tokens
// in them. Floor: two sgemms (K and V, per block) [rows x features] x
// [features x C] for encode, and their transposes for decode, over the same
// rows per call as the codec; ratio = codec MB/s / floor MB/s.
// Each side is measured alternately `reps` times and the best kept, since the
// build machines are shared.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/base/float_formats.h"
#include "core/codec/codec.h"
#include "core/codec/kvtc/kvtc_codec.h"

ABSL_FLAG(std::string, layers, "32,8", "layer counts to run");
ABSL_FLAG(std::string, tokens, "256,1024", "tokens per batch");
ABSL_FLAG(uint64_t, components, 1024, "PCA components per K and V");
ABSL_FLAG(uint32_t, page_size, 16, "tokens per page");
ABSL_FLAG(int, reps, 2, "alternating measurements per side (best kept)");
ABSL_FLAG(int, zstd_level, 1, "zstd level of the lossless stage");
ABSL_FLAG(uint32_t, layer_groups, 1,
          "block-diagonal bases of this many layer groups (1: dense)");
ABSL_FLAG(bool, per_page, false, "one buffer per page (the store's eviction)");
ABSL_FLAG(double, budget_s, 100,
          "start no new case after this many seconds (keeps the run short)");

namespace kvharbor {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

std::vector<uint64_t> ParseList(const std::string& s) {
  std::vector<uint64_t> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    uint64_t v;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

// Orthonormal by construction: column j is +-1/sqrt(F/C) on features
// j, j + C, j + 2C, ... (disjoint supports, random signs), so every column
// mixes all layers. Stored dense: the codec's cost does not depend on it.
KvtcBasis StructuredBasis(uint64_t f, uint64_t c, uint64_t seed,
                          std::vector<KvtcRange> ranges) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  KvtcBasis b;
  b.features = f;
  b.components = c;
  b.mean.resize(f);
  for (float& m : b.mean) m = 0.1f * dist(rng);
  b.projection.assign(f * c, 0.0f);
  const uint64_t per_column = f / c;
  const float v = 1.0f / std::sqrt(static_cast<float>(per_column));
  for (uint64_t j = 0; j < c; ++j) {
    for (uint64_t k = 0; k < per_column; ++k) {
      b.projection[(j + k * c) * c + j] = (rng() & 1) ? v : -v;
    }
  }
  b.ranges = std::move(ranges);
  return b;
}

// rows x f values: mean + Z * diag(s) * P^T + noise, written into pages.
void FillPages(const Geometry& g, const KvtcBasis& basis, int kv,
               uint64_t tokens, std::vector<std::vector<uint8_t>>& pages,
               uint64_t seed) {
  const uint64_t f = basis.features, c = basis.components;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> z(tokens * c), x(tokens * f);
  for (uint64_t r = 0; r < tokens; ++r)
    for (uint64_t j = 0; j < c; ++j)
      z[r * c + j] = dist(rng) * 4.0f / (1.0f + j / 16.0f);
  const std::vector<float> dense = DenseProjection(basis);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tokens, f, c, 1.0f,
              z.data(), c, dense.data(), c, 0.0f, x.data(), f);
  const uint64_t hd = uint64_t{g.num_kv_heads} * g.head_dim;
  for (uint64_t r = 0; r < tokens; ++r) {
    std::vector<uint8_t>& page = pages[r / g.page_size];
    const uint64_t t = r % g.page_size;
    for (uint64_t l = 0; l < g.num_layers; ++l) {
      const uint64_t base = ((kv * g.num_layers + l) * g.page_size + t) * hd;
      for (uint64_t i = 0; i < hd; ++i) {
        const float v =
            x[r * f + l * hd + i] + basis.mean[l * hd + i] + 0.01f * dist(rng);
        const uint16_t b = FloatToBf16(v);
        page[2 * (base + i)] = static_cast<uint8_t>(b);
        page[2 * (base + i) + 1] = static_cast<uint8_t>(b >> 8);
      }
    }
  }
}

// The machine's load average: the build machines are shared, and wall-clock
// throughput falls with the neighbours' load (the ratios, measured
// alternately, much less).
void PrintLoad(const char* when) {
  double load[3] = {0, 0, 0};
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) {
      load[0] = -1;
    }
    std::fclose(f);
  }
  std::printf("load average at %s: %.2f %.2f %.2f\n", when, load[0], load[1],
              load[2]);
}

struct Best {
  double s = 1e30;
  void Add(double t) { s = std::min(s, t); }
};

// A dense StructuredBasis, or `groups` of them on consecutive feature
// blocks (each with c / groups components).
KvtcBasis BenchBasis(uint64_t f, uint64_t c, uint64_t groups, uint64_t seed,
                     std::vector<KvtcRange> ranges) {
  if (groups <= 1) return StructuredBasis(f, c, seed, std::move(ranges));
  KvtcBasis b;
  b.features = f;
  b.components = c;
  for (uint64_t g = 0; g < groups; ++g) {
    KvtcBasis part =
        StructuredBasis(f / groups, c / groups, seed * 131 + g, {});
    b.mean.insert(b.mean.end(), part.mean.begin(), part.mean.end());
    b.projection.insert(b.projection.end(), part.projection.begin(),
                        part.projection.end());
    b.blocks.push_back({f / groups, c / groups});
  }
  b.ranges = std::move(ranges);
  return b;
}

std::shared_ptr<KvtcCalibration> BenchCalibration(const Geometry& g) {
  const uint64_t f = g.ElementsPerTokenPerKv();
  const uint64_t groups = absl::GetFlag(FLAGS_layer_groups);
  uint64_t c = std::min<uint64_t>(absl::GetFlag(FLAGS_components), f);
  // StructuredBasis needs c | f (per block: c/groups | f/groups).
  while (f % c != 0 || c % groups != 0 || (f / groups) % (c / groups) != 0) {
    --c;
  }
  const std::vector<KvtcRange> ranges = {
      {KvtcQuantType::kFp8, 0, 0, c / 8},
      {KvtcQuantType::kIntX, 4, c / 8, c / 2},
      {KvtcQuantType::kIntX, 2, c / 2, c}};
  auto cal = std::make_shared<KvtcCalibration>();
  cal->row_kind = KvtcRowKind::kPerToken;
  cal->num_layers = g.num_layers;
  cal->num_kv_heads = g.num_kv_heads;
  cal->head_dim = g.head_dim;
  cal->page_size = g.page_size;
  cal->sink_tokens = 4;
  cal->keys = BenchBasis(f, c, groups, 1, ranges);
  cal->values = BenchBasis(f, c, groups, 2, ranges);
  return cal;
}

// The batch to encode (pages starting at position 0) and decode targets.
struct BenchPages {
  std::vector<std::vector<uint8_t>> in, out;
  std::vector<PageRef> refs;
  std::vector<MutablePageRef> out_refs;
};

BenchPages MakePages(const Geometry& g, const KvtcCalibration& cal,
                     uint64_t num_pages) {
  BenchPages b;
  b.in.assign(num_pages, std::vector<uint8_t>(g.PageBytes()));
  FillPages(g, cal.keys, 0, num_pages * g.page_size, b.in, 3);
  FillPages(g, cal.values, 1, num_pages * g.page_size, b.in, 4);
  b.out = b.in;
  for (uint64_t p = 0; p < num_pages; ++p) {
    b.refs.push_back({b.in[p].data(), p * g.page_size});
    b.out_refs.push_back({b.out[p].data(), p * g.page_size});
  }
  return b;
}

// L2 error of the decoded pages relative to the input (every 7th element).
double RelativeError(const Geometry& g, const BenchPages& b) {
  double err2 = 0, sig2 = 0;
  for (size_t p = 0; p < b.in.size(); ++p) {
    for (uint64_t i = 0; i < g.ElementsPerPage(); i += 7) {
      auto at = [&](const std::vector<uint8_t>& v) {
        return Bf16ToFloat(uint16_t(v[2 * i] | (v[2 * i + 1] << 8)));
      };
      const double x = at(b.in[p]), y = at(b.out[p]);
      err2 += (x - y) * (x - y);
      sig2 += x * x;
    }
  }
  return std::sqrt(err2 / sig2);
}

struct Timings {
  Best enc, dec, floor_enc, floor_dec, zenc, zdec;
  size_t size = 0, zsize = 0;
};

// One GEMM per diagonal block: Y = X P (encode) or X = Y P^T (decode).
void FloorGemm(const KvtcBasis& k, uint64_t rows, float* x, float* y,
               bool encode) {
  const uint64_t f = k.features, c = k.components;
  const std::vector<KvtcBlock> blocks =
      k.blocks.empty() ? std::vector<KvtcBlock>{{f, c}} : k.blocks;
  const float* p = k.projection.data();
  uint64_t f0 = 0, c0 = 0;
  for (const KvtcBlock& b : blocks) {
    if (encode) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, b.components,
                  b.features, 1.0f, x + f0, f, p, b.components, 0.0f, y + c0,
                  c);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, b.features,
                  b.components, 1.0f, y + c0, c, p, b.components, 0.0f, x + f0,
                  f);
    }
    p += b.features * b.components;
    f0 += b.features;
    c0 += b.components;
  }
}

// Alternates floor and codec measurements; the first round warms up. With
// --per_page every page is its own buffer (and floor call); `rows` is then
// the rows of one page.
Timings Measure(const KvtcCalibration& cal, const Codec& codec,
                const Codec& zcodec, BenchPages& b, uint64_t rows) {
  const uint64_t f = cal.keys.features, c = cal.keys.components;
  const bool per_page = absl::GetFlag(FLAGS_per_page);
  const size_t calls = per_page ? b.in.size() : 1;
  const size_t pages_per_call = per_page ? 1 : b.in.size();
  CodecWorkspace ws;
  std::vector<uint8_t> buf(*codec.MaxEncodedSize(pages_per_call) * calls);
  std::vector<size_t> sizes(calls);
  std::vector<float> x(rows * f, 0.5f), y(rows * c, 0.25f);
  auto floor_encode = [&] {
    for (size_t i = 0; i < calls; ++i)
      for (const KvtcBasis* k : {&cal.keys, &cal.values})
        FloorGemm(*k, rows, x.data(), y.data(), true);
  };
  auto floor_decode = [&] {
    for (size_t i = 0; i < calls; ++i)
      for (const KvtcBasis* k : {&cal.keys, &cal.values})
        FloorGemm(*k, rows, x.data(), y.data(), false);
  };
  const size_t stride = buf.size() / calls;
  auto encode = [&](const Codec& cd) {
    size_t total = 0;
    for (size_t i = 0; i < calls; ++i) {
      sizes[i] =
          *cd.Encode(absl::MakeConstSpan(b.refs).subspan(i * pages_per_call,
                                                         pages_per_call),
                     absl::MakeSpan(buf.data() + i * stride, stride), &ws);
      total += sizes[i];
    }
    return total;
  };
  auto decode = [&](const Codec& cd) {
    for (size_t i = 0; i < calls; ++i) {
      const absl::Status s =
          cd.Decode(absl::MakeConstSpan(buf.data() + i * stride, sizes[i]),
                    absl::MakeConstSpan(b.out_refs)
                        .subspan(i * pages_per_call, pages_per_call),
                    &ws);
      if (!s.ok()) std::printf("decode failed: %s\n", s.ToString().c_str());
    }
  };
  auto timed = [](Best* best, auto&& fn) {
    const auto t = Clock::now();
    fn();
    if (best != nullptr) best->Add(Seconds(t));
  };
  Timings t;
  const int reps = absl::GetFlag(FLAGS_reps);
  for (int r = 0; r <= reps; ++r) {
    const bool keep = r > 0;
    timed(keep ? &t.floor_enc : nullptr, floor_encode);
    timed(keep ? &t.enc : nullptr, [&] { t.size = encode(codec); });
    timed(keep ? &t.floor_dec : nullptr, floor_decode);
    timed(keep ? &t.dec : nullptr, [&] { decode(codec); });
  }
  for (int r = 0; r < std::max(1, reps - 1); ++r) {
    timed(&t.zenc, [&] { t.zsize = encode(zcodec); });
    timed(&t.zdec, [&] { decode(zcodec); });
  }
  return t;
}

void RunCase(uint32_t layers, uint64_t tokens) {
  Geometry g;
  g.num_layers = layers;
  g.num_kv_heads = 8;
  g.head_dim = 128;
  g.page_size = absl::GetFlag(FLAGS_page_size);
  g.dtype = DType::kBF16;
  auto cal = BenchCalibration(g);
  CodecParams params;
  params.geometry = g;
  params.calibration = cal;
  auto codec = KvtcCodec::Create(params);
  params.zstd = true;
  params.zstd_level = absl::GetFlag(FLAGS_zstd_level);
  auto zcodec = KvtcCodec::Create(params);
  if (!codec.ok() || !zcodec.ok()) {
    std::printf("codec: %s\n", codec.status().ToString().c_str());
    return;
  }
  const uint64_t num_pages = (tokens + g.page_size - 1) / g.page_size;
  tokens = num_pages * g.page_size;
  BenchPages b = MakePages(g, *cal, num_pages);
  const double mb = double(num_pages) * g.PageBytes() / 1e6;
  // The codec projects every token but the 4 sinks (per page: the rows of
  // one page).
  const Timings t =
      Measure(*cal, **codec, **zcodec, b,
              absl::GetFlag(FLAGS_per_page) ? g.page_size : tokens - 4);
  // zstd is lossless: the last decode's pages are the plain decode's.
  const double rel_error = RelativeError(g, b);
  std::printf(
      "layers=%u features=%llu components=%llu layer_groups=%u tokens=%llu "
      "pages=%llu %s bf16=%.1f MB\n",
      layers, (unsigned long long)cal->keys.features,
      (unsigned long long)cal->keys.components,
      absl::GetFlag(FLAGS_layer_groups), (unsigned long long)tokens,
      (unsigned long long)num_pages,
      absl::GetFlag(FLAGS_per_page) ? "(one buffer per page)" : "(one buffer)",
      mb);
  const double tok = double(tokens);
  std::printf(
      "  encode        %8.1f MB/s %9.0f tokens/s   floor(sgemm) %8.1f MB/s   "
      "ratio %.2f\n",
      mb / t.enc.s, tok / t.enc.s, mb / t.floor_enc.s, t.floor_enc.s / t.enc.s);
  std::printf(
      "  decode        %8.1f MB/s %9.0f tokens/s   floor(sgemm) %8.1f MB/s   "
      "ratio %.2f\n",
      mb / t.dec.s, tok / t.dec.s, mb / t.floor_dec.s, t.floor_dec.s / t.dec.s);
  std::printf("  encode+zstd%d  %8.1f MB/s   decode+zstd %8.1f MB/s\n",
              absl::GetFlag(FLAGS_zstd_level), mb / t.zenc.s, mb / t.zdec.s);
  std::printf(
      "  compression   %.2fx (%zu B)   with zstd %.2fx (%zu B, +%.1f%%)   "
      "rel. L2 error %.4f\n",
      mb * 1e6 / t.size, t.size, mb * 1e6 / t.zsize, t.zsize,
      100.0 * (double(t.size) / t.zsize - 1.0), rel_error);
  std::fflush(stdout);
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::printf(
      "kvtc_cpu_bench: kv_heads=8 head_dim=128 page_size=%u bf16 per-token "
      "rows, ranges fp8[0,C/8) int4[C/8,C/2) int2[C/2,C), sinks=4, "
      "openblas threads=%d, best of %d\n",
      absl::GetFlag(FLAGS_page_size), openblas_get_num_threads(),
      absl::GetFlag(FLAGS_reps));
  const auto start = kvharbor::Clock::now();
  kvharbor::PrintLoad("start");
  for (uint64_t layers : kvharbor::ParseList(absl::GetFlag(FLAGS_layers))) {
    for (uint64_t tokens : kvharbor::ParseList(absl::GetFlag(FLAGS_tokens))) {
      if (kvharbor::Seconds(start) > absl::GetFlag(FLAGS_budget_s)) {
        std::printf("layers=%llu tokens=%llu: skipped (over --budget_s)\n",
                    (unsigned long long)layers, (unsigned long long)tokens);
        continue;
      }
      kvharbor::RunCase(static_cast<uint32_t>(layers), tokens);
    }
  }
  kvharbor::PrintLoad("end");
  std::printf("total %.1f s\n", kvharbor::Seconds(start));
  return 0;
}
