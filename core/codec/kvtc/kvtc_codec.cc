#include "core/codec/kvtc/kvtc_codec.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/float_formats.h"
#include "core/base/status_macros.h"
#include "core/codec/kvtc/kvtc_stages.h"
#include "core/codec/page_elements.h"

namespace kvharbor {
namespace {

// Workspace slots (CodecWorkspace::Floats).
constexpr int kSlotRows = 0;    // X: [rows][features], gathered/centered rows
constexpr int kSlotCoeffs = 1;  // Y: [rows][components], PCA coefficients
constexpr int kSlotRope = 2;    // cos then sin: [page_size][head_dim / 2] each
constexpr int kSlotTemp = 3;    // min/max rows, one head run of floats

constexpr const char* kKvName[2] = {"keys", "values"};
constexpr uint64_t kMaxBlasDim = 0x7FFFFFFF;

absl::Status CheckRowsFitBlas(uint64_t rows) {
  if (rows <= kMaxBlasDim) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "pages: the batch has %u rows, over the BLAS limit %u; split it", rows,
      kMaxBlasDim));
}

bool AllFinite(const float* v, size_t n) {
  // Summing 0*v propagates NaN for inf and NaN alike, without branches.
  float acc = 0.0f;
  for (size_t i = 0; i < n; ++i) acc += 0.0f * v[i];
  return acc == 0.0f;
}

// Calls fn(features, components, f0, c0, p) for each diagonal block of the
// basis: its size, its first feature and component, its projection rows.
// A full basis is one block of every feature and component.
template <typename Fn>
void ForEachBlock(const KvtcBasis& b, Fn fn) {
  if (b.blocks.empty()) {
    fn(static_cast<int>(b.features), static_cast<int>(b.components), 0, 0,
       b.projection.data());
    return;
  }
  const float* p = b.projection.data();
  uint64_t f0 = 0, c0 = 0;
  for (const KvtcBlock& k : b.blocks) {
    fn(static_cast<int>(k.features), static_cast<int>(k.components), f0, c0, p);
    p += k.features * k.components;
    f0 += k.features;
    c0 += k.components;
  }
}

// Y[m][C] = X[m][F] * P, block by block for a block-diagonal basis.
void Project(const KvtcBasis& b, int m, const float* x, float* y) {
  const int f = static_cast<int>(b.features);
  const int c = static_cast<int>(b.components);
  ForEachBlock(b,
               [&](int fb, int cb, uint64_t f0, uint64_t c0, const float* p) {
                 cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, cb,
                             fb, 1.0f, x + f0, f, p, cb, 0.0f, y + c0, c);
               });
}

// X[m][F] = Y[m][C] * P^T (the inverse of Project).
void Reconstruct(const KvtcBasis& b, int m, const float* y, float* x) {
  const int f = static_cast<int>(b.features);
  const int c = static_cast<int>(b.components);
  ForEachBlock(b,
               [&](int fb, int cb, uint64_t f0, uint64_t c0, const float* p) {
                 cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, fb, cb,
                             1.0f, y + c0, c, p, cb, 0.0f, x + f0, f);
               });
}

// Everything the per-batch loops need, resolved once per call.
struct Batch {
  const Geometry* g;
  const KvtcCalibration* cal;
  size_t num_pages;
  const uint64_t* positions;  // first position of each page
  uint64_t hd;                // num_kv_heads * head_dim: one token's run
  size_t elem;                // bytes per element

  // Tokens of page p that are attention sinks (its first ones).
  uint32_t SinksIn(size_t p) const {
    const uint64_t pos = positions[p];
    if (pos >= cal->sink_tokens) return 0;
    return static_cast<uint32_t>(
        std::min<uint64_t>(g->page_size, cal->sink_tokens - pos));
  }
  // Byte offset in a page of token 0 of layer `l`'s K (kv=0) or V (kv=1).
  uint64_t BlockOffset(int kv, uint32_t l) const {
    const uint64_t block = uint64_t{g->page_size} * hd;
    const uint64_t index = g->layout == PageLayout::kKvLayerTokenHeadDim
                               ? uint64_t(kv) * g->num_layers + l
                               : uint64_t{l} * 2 + kv;
    return index * block * elem;
  }
  bool Rope(int kv) const {
    return kv == 0 && cal->rope_style != RopeStyle::kNone;
  }
  // Fills the RoPE cos/sin tables for every token of page p.
  void RopeTables(size_t p, float* cos, float* sin) const {
    const uint32_t half = g->head_dim / 2;
    for (uint32_t t = 0; t < g->page_size; ++t) {
      RopeCosSin(positions[p] + t, g->head_dim, cal->rope_theta,
                 cos + size_t{t} * half, sin + size_t{t} * half);
    }
  }
  void RotateRun(float* run, uint32_t t, const float* cos, const float* sin,
                 bool inverse) const {
    const uint32_t half = g->head_dim / 2;
    for (uint32_t h = 0; h < g->num_kv_heads; ++h) {
      RotateRope(run + size_t{h} * g->head_dim, g->head_dim, cal->rope_style,
                 cos + size_t{t} * half, sin + size_t{t} * half, inverse);
    }
  }
  // Row and column in X of token t of layer l of page p, for the page's
  // `row_base` (per token: projected rows before page p).
  void RowCol(size_t p, uint32_t l, uint32_t t, uint32_t sinks,
              uint64_t row_base, uint64_t* row, uint64_t* col) const {
    if (cal->row_kind == KvtcRowKind::kPerToken) {
      *row = row_base + (t - sinks);
      *col = uint64_t{l} * hd;
    } else {
      *row = uint64_t{p} * g->num_layers + l;
      *col = uint64_t{t} * hd;
    }
  }
};

Batch MakeBatch(const Geometry& g, const KvtcCalibration& cal,
                absl::Span<const uint64_t> positions) {
  return Batch{&g,
               &cal,
               positions.size(),
               positions.data(),
               uint64_t{g.num_kv_heads} * g.head_dim,
               DTypeSize(g.dtype)};
}

// The float buffers of an Encode or Decode of `rows` projected rows, from the
// workspace: X [rows][features], Y [rows][max components], RoPE tables of
// one page, and the quantizers' temporaries.
struct Scratch {
  float* x;
  float* y;
  float* rope;
  float* temp;
};

Scratch CarveScratch(const Batch& b, uint64_t rows, CodecWorkspace* ws) {
  const KvtcCalibration& cal = *b.cal;
  const uint64_t max_c = std::max(cal.keys.components, cal.values.components);
  Scratch s;
  s.x = ws->Floats(kSlotRows, rows * cal.keys.features);
  s.y = ws->Floats(kSlotCoeffs, rows * max_c);
  s.rope = ws->Floats(kSlotRope, size_t{b.g->page_size} * b.g->head_dim);
  s.temp = ws->Floats(kSlotTemp, std::max<uint64_t>(2 * rows, b.hd));
  return s;
}

// Calls fn(p, l, t, sink, x_run, mean_run, cos, sin) for the token runs of
// section `kv` in X (x: [rows][basis.features]): every run of a per-page row
// (sink tokens included, sink = true), the non-sink runs of per-token rows. cos
// / sin are page p's RoPE tables in `rope` when b.Rope(kv).
template <typename Fn>
void ForEachRun(const Batch& b, int kv, const KvtcBasis& basis, float* x,
                float* rope, Fn&& fn) {
  const uint32_t half = b.g->head_dim / 2;
  float* cos = rope;
  float* sin = rope + size_t{b.g->page_size} * half;
  const bool per_token = b.cal->row_kind == KvtcRowKind::kPerToken;
  uint64_t row_base = 0;
  for (size_t p = 0; p < b.num_pages; ++p) {
    const uint32_t sinks = b.SinksIn(p);
    if (b.Rope(kv)) b.RopeTables(p, cos, sin);
    for (uint32_t l = 0; l < b.g->num_layers; ++l) {
      for (uint32_t t = per_token ? sinks : 0; t < b.g->page_size; ++t) {
        uint64_t row, col;
        b.RowCol(p, l, t, sinks, row_base, &row, &col);
        fn(p, l, t, t < sinks, x + row * basis.features + col,
           basis.mean.data() + col, cos, sin);
      }
    }
    if (per_token) row_base += b.g->page_size - sinks;
  }
}

// X[row][col..] = unrope(page values) - mean for every projected token.
// Per-page rows get 0 (the mean) at sink tokens.
void GatherRows(const Batch& b, absl::Span<const PageRef> pages, int kv,
                const KvtcBasis& basis, float* x, float* rope) {
  ForEachRun(b, kv, basis, x, rope,
             [&](size_t p, uint32_t l, uint32_t t, bool sink, float* dst,
                 const float* mean, const float* cos, const float* sin) {
               if (sink) {  // per page: the sink is stored separately
                 std::fill(dst, dst + b.hd, 0.0f);
                 return;
               }
               const uint8_t* block = pages[p].data + b.BlockOffset(kv, l);
               LoadElements(b.g->dtype, block + t * b.hd * b.elem, b.hd, dst);
               if (b.Rope(kv)) b.RotateRun(dst, t, cos, sin, /*inverse=*/true);
               for (uint64_t i = 0; i < b.hd; ++i) dst[i] -= mean[i];
             });
}

// Pages = rope(X + mean) for every projected token (inverse of GatherRows).
void ScatterRows(const Batch& b, absl::Span<const MutablePageRef> pages, int kv,
                 const KvtcBasis& basis, float* x, float* rope) {
  ForEachRun(b, kv, basis, x, rope,
             [&](size_t p, uint32_t l, uint32_t t, bool sink, float* src,
                 const float* mean, const float* cos, const float* sin) {
               if (sink) return;  // restored from the sinks section
               uint8_t* block = pages[p].data + b.BlockOffset(kv, l);
               for (uint64_t i = 0; i < b.hd; ++i) src[i] += mean[i];
               if (b.Rope(kv)) {
                 b.RotateRun(src, t, cos, sin, /*inverse=*/false);
               }
               StoreElements(b.g->dtype, src, b.hd, block + t * b.hd * b.elem);
             });
}

// Calls fn(p, kv, layer, t, page_offset, sink_offset) for every run of a
// sink token (token t of page p, K or V of one layer): page_offset is its
// byte offset in the page, sink_offset its byte offset in the sinks section
// (row = sink token, features [K|V][layer][kv_head][head_dim], FP8).
// Stops at the first error fn returns.
template <typename Fn>
absl::Status ForEachSinkRun(const Batch& b, Fn&& fn) {
  const uint64_t row_bytes = uint64_t{2} * b.g->num_layers * b.hd;
  uint64_t row = 0;
  for (size_t p = 0; p < b.num_pages; ++p) {
    const uint32_t sinks = b.SinksIn(p);
    for (uint32_t t = 0; t < sinks; ++t, ++row) {
      for (int kv = 0; kv < 2; ++kv) {
        for (uint32_t l = 0; l < b.g->num_layers; ++l) {
          KVH_RETURN_IF_ERROR(fn(
              p, kv, l, t, b.BlockOffset(kv, l) + t * b.hd * b.elem,
              row * row_bytes + (uint64_t(kv) * b.g->num_layers + l) * b.hd));
        }
      }
    }
  }
  return absl::OkStatus();
}

// Writes the sinks section's FP8 data.
absl::Status WriteSinks(const Batch& b, absl::Span<const PageRef> pages,
                        float* run, uint8_t* out) {
  return ForEachSinkRun(b, [&](size_t p, int kv, uint32_t l, uint32_t t,
                               uint64_t page_offset, uint64_t sink_offset) {
    LoadElements(b.g->dtype, pages[p].data + page_offset, b.hd, run);
    if (!AllFinite(run, b.hd)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pages[%u]: %s of layer %u at token %u (position %u) hold a "
          "non-finite value",
          p, kKvName[kv], l, t, b.positions[p] + t));
    }
    uint8_t* dst = out + sink_offset;
    for (uint64_t i = 0; i < b.hd; ++i) dst[i] = FloatToFp8E4M3(run[i]);
    return absl::OkStatus();
  });
}

// Restores the sink tokens from the sinks section (checked: cannot fail).
void ReadSinks(const Batch& b, absl::Span<const MutablePageRef> pages,
               const uint8_t* in, float* run) {
  ForEachSinkRun(b, [&](size_t p, int, uint32_t, uint32_t, uint64_t page_offset,
                        uint64_t sink_offset) {
    const uint8_t* src = in + sink_offset;
    for (uint64_t i = 0; i < b.hd; ++i) run[i] = Fp8E4M3ToFloat(src[i]);
    StoreElements(b.g->dtype, run, b.hd, pages[p].data + page_offset);
    return absl::OkStatus();
  }).IgnoreError();
}

// Locates projected row `row` for an error message.
std::string DescribeRow(const Batch& b, uint64_t row) {
  if (b.cal->row_kind == KvtcRowKind::kPerPage) {
    return absl::StrFormat("pages[%u] layer %u", row / b.g->num_layers,
                           row % b.g->num_layers);
  }
  for (size_t p = 0; p < b.num_pages; ++p) {
    const uint64_t n = b.g->page_size - b.SinksIn(p);
    if (row < n) {
      const uint64_t t = b.SinksIn(p) + row;
      return absl::StrFormat("pages[%u] token %u (position %u)", p, t,
                             b.positions[p] + t);
    }
    row -= n;
  }
  return "unknown row";
}

// Quantizes every range of section `s` from Y ([rows][ld]) into `payload`.
absl::Status QuantizeSection(const Batch& b, const KvtcSectionLayout& s, int kv,
                             const float* y, uint64_t ld, uint8_t* payload,
                             float* minmax) {
  for (uint64_t r = 0; r < s.rows; ++r) {
    if (!AllFinite(y + r * ld, ld)) {
      return absl::InvalidArgumentError(absl::StrCat(
          DescribeRow(b, r), ": ", kKvName[kv],
          " hold a non-finite value (or values too large to project)"));
    }
  }
  for (const KvtcRangeLayout& rl : s.ranges) {
    const KvtcRange& range = rl.range;
    uint8_t* data = payload + rl.data_offset;
    if (range.quant_type == KvtcQuantType::kFp8) {
      QuantizeFp8Range(y, s.rows, ld, range.start_idx, range.end_idx, data);
      continue;
    }
    float* mins = minmax;
    float* maxs = minmax + s.rows;
    MinMaxRange(y, s.rows, ld, range.start_idx, range.end_idx, mins, maxs);
    for (uint64_t r = 0; r < s.rows; ++r) {
      if (!std::isfinite(maxs[r] - mins[r])) {
        return absl::InvalidArgumentError(
            absl::StrCat(DescribeRow(b, r), ": ", kKvName[kv],
                         " coefficients span more than float can hold"));
      }
    }
    std::memcpy(payload + rl.metadata_offset, mins, s.rows * 4);
    std::memcpy(payload + rl.metadata_offset + s.rows * 4, maxs, s.rows * 4);
    QuantizeIntXRange(y, s.rows, ld, range.start_idx, range.end_idx,
                      range.int_bits, mins, maxs, data);
  }
  return absl::OkStatus();
}

// Checks a section's data before anything is decoded: IntX min/max finite
// and ordered, and no FP8 NaN code (the encoder never writes either).
absl::Status CheckSectionData(const KvtcSectionLayout& s, int section,
                              const uint8_t* payload) {
  for (size_t ri = 0; ri < s.ranges.size(); ++ri) {
    const KvtcRangeLayout& rl = s.ranges[ri];
    if (rl.range.quant_type == KvtcQuantType::kFp8) {
      const uint8_t* d = payload + rl.data_offset;
      for (uint64_t i = 0; i < rl.data_bytes; ++i) {
        if (IsFp8E4M3NaN(d[i])) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "buffer: sections[%d].ranges[%u]: FP8 NaN code at byte %u",
              section, ri, i));
        }
      }
      continue;
    }
    const uint8_t* meta = payload + rl.metadata_offset;
    for (uint64_t r = 0; r < s.rows; ++r) {
      float mn, mx;
      std::memcpy(&mn, meta + 4 * r, 4);
      std::memcpy(&mx, meta + 4 * (s.rows + r), 4);
      if (!std::isfinite(mn) || !std::isfinite(mx) || mn > mx ||
          !std::isfinite(mx - mn)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "buffer: sections[%d].ranges[%u].metadata: row %u has min %g, "
            "max %g",
            section, ri, r, mn, mx));
      }
    }
  }
  return absl::OkStatus();
}

void DequantizeSection(const KvtcSectionLayout& s, const uint8_t* payload,
                       float* y, uint64_t ld, float* minmax) {
  std::fill(y, y + s.rows * ld, 0.0f);  // components in no range are 0
  for (const KvtcRangeLayout& rl : s.ranges) {
    const KvtcRange& range = rl.range;
    const uint8_t* data = payload + rl.data_offset;
    if (range.quant_type == KvtcQuantType::kFp8) {
      DequantizeFp8Range(data, s.rows, ld, range.start_idx, range.end_idx, y);
      continue;
    }
    std::memcpy(minmax, payload + rl.metadata_offset, rl.metadata_bytes);
    DequantizeIntXRange(data, s.rows, ld, range.start_idx, range.end_idx,
                        range.int_bits, minmax, minmax + s.rows, y);
  }
}

}  // namespace

KvtcCodec::KvtcCodec(const CodecParams& params, uint64_t fingerprint)
    : geometry_(params.geometry),
      calibration_(params.calibration),
      fingerprint_(fingerprint),
      zstd_(params.zstd),
      zstd_level_(params.zstd_level) {}

CalibrationEstimate KvtcCodec::calibration_estimate() const {
  const KvtcCalibrationEstimate& e = calibration_->estimate;
  return {e.target_ratio, e.expected_ratio, e.keys_rel_error,
          e.values_rel_error};
}

absl::StatusOr<std::unique_ptr<KvtcCodec>> KvtcCodec::Create(
    const CodecParams& params) {
  if (params.calibration == nullptr) {
    return absl::InvalidArgumentError(
        "calibration: the kvtc codec needs a calibration");
  }
  KVH_RETURN_IF_ERROR(params.calibration->Validate());
  KVH_RETURN_IF_ERROR(params.calibration->CheckGeometry(params.geometry));
  // cblas takes int dimensions.
  if (params.calibration->keys.features > kMaxBlasDim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "calibration.keys.features: %u is over the BLAS limit %u",
        params.calibration->keys.features, kMaxBlasDim));
  }
  return std::unique_ptr<KvtcCodec>(
      new KvtcCodec(params, params.calibration->Fingerprint()));
}

absl::StatusOr<KvtcPayloadLayout> KvtcCodec::PayloadLayout(
    absl::Span<const uint64_t> first_positions) const {
  const uint64_t sinks =
      CountSinkTokens(first_positions.data(), first_positions.size(),
                      geometry_.page_size, calibration_->sink_tokens);
  return ComputeKvtcPayloadLayout(*calibration_, first_positions.size(), sinks);
}

absl::StatusOr<size_t> KvtcCodec::MaxEncodedSize(size_t num_pages) const {
  if (num_pages == 0 || num_pages > kMaxPagesPerBuffer) {
    return absl::InvalidArgumentError(
        absl::StrFormat("num_pages: %u is out of range [1, %u]", num_pages,
                        kMaxPagesPerBuffer));
  }
  // The raw size is linear in the sink count: the extremes bound it.
  const uint64_t max_sinks =
      uint64_t{num_pages} *
      std::min<uint64_t>(geometry_.page_size, calibration_->sink_tokens);
  uint64_t most = 0;
  for (uint64_t sinks : {uint64_t{0}, max_sinks}) {
    KVH_ASSIGN_OR_RETURN(
        const KvtcPayloadLayout l,
        ComputeKvtcPayloadLayout(*calibration_, num_pages, sinks));
    most = std::max(most, l.raw_payload_bytes);
  }
  return kEnvelopeHeaderBytes + 8 * num_pages + most;
}

absl::StatusOr<size_t> KvtcCodec::EncodedSize(
    absl::Span<const PageRef> pages) const {
  KVH_RETURN_IF_ERROR(CheckPagesToEncode(pages));
  std::vector<uint64_t> positions(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    positions[i] = pages[i].first_position;
  }
  KVH_ASSIGN_OR_RETURN(const KvtcPayloadLayout l, PayloadLayout(positions));
  return kEnvelopeHeaderBytes + 8 * pages.size() + l.raw_payload_bytes;
}

absl::StatusOr<size_t> KvtcCodec::Encode(absl::Span<const PageRef> pages,
                                         absl::Span<uint8_t> out,
                                         CodecWorkspace* workspace) const {
  KVH_RETURN_IF_ERROR(CheckPagesToEncode(pages));
  CodecWorkspace local;
  CodecWorkspace* ws = workspace ? workspace : &local;
  std::vector<uint64_t> positions(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    positions[i] = pages[i].first_position;
  }
  KVH_ASSIGN_OR_RETURN(const KvtcPayloadLayout layout,
                       PayloadLayout(positions));
  const uint64_t need =
      kEnvelopeHeaderBytes + 8 * pages.size() + layout.raw_payload_bytes;
  if (out.size() < need) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("out: %u bytes, encoding needs %u", out.size(), need));
  }
  const KvtcCalibration& cal = *calibration_;
  const Batch b = MakeBatch(geometry_, cal, positions);
  uint8_t* payload = out.data() + kEnvelopeHeaderBytes + 8 * pages.size();
  WriteKvtcPayloadHeaders(layout, payload);
  const uint64_t rows = layout.projected_rows;
  KVH_RETURN_IF_ERROR(CheckRowsFitBlas(rows));
  const Scratch s = CarveScratch(b, rows, ws);
  for (int kv = 0; kv < 2 && rows > 0; ++kv) {
    const KvtcBasis& basis = kv == 0 ? cal.keys : cal.values;
    GatherRows(b, pages, kv, basis, s.x, s.rope);
    const int c = static_cast<int>(basis.components);
    Project(basis, static_cast<int>(rows), s.x, s.y);
    KVH_RETURN_IF_ERROR(
        QuantizeSection(b, layout.sections[kv], kv, s.y, c, payload, s.temp));
  }
  KVH_RETURN_IF_ERROR(WriteSinks(
      b, pages, s.temp, payload + layout.sections[2].ranges[0].data_offset));
  EnvelopeHeader h;
  h.codec_id = CodecId::kKvtc;
  h.geometry = geometry_;
  h.row_kind = static_cast<uint32_t>(cal.row_kind);
  h.num_sections = kKvtcNumSections;
  h.calibration_fingerprint = fingerprint_;
  return FinishEnvelope(h, pages, layout.raw_payload_bytes, zstd_, zstd_level_,
                        out, ws);
}

absl::Status KvtcCodec::Decode(absl::Span<const uint8_t> buffer,
                               absl::Span<const MutablePageRef> pages,
                               CodecWorkspace* workspace) const {
  KVH_ASSIGN_OR_RETURN(const ParsedEnvelope env, ParseEnvelope(buffer));
  KVH_RETURN_IF_ERROR(
      CheckEnvelopeMatches(env, CodecId::kKvtc, geometry_, pages));
  const KvtcCalibration& cal = *calibration_;
  const EnvelopeHeader& h = env.header;
  if (h.calibration_fingerprint != fingerprint_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "buffer: calibration_fingerprint %016x differs from this codec's "
        "calibration %016x (encoded with another calibration)",
        h.calibration_fingerprint, fingerprint_));
  }
  if (h.row_kind != static_cast<uint32_t>(cal.row_kind) ||
      h.num_sections != kKvtcNumSections) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "buffer: row_kind %u / num_sections %u, expected %u / %u", h.row_kind,
        h.num_sections, static_cast<uint32_t>(cal.row_kind), kKvtcNumSections));
  }
  std::vector<uint64_t> positions(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) positions[i] = env.position(i);
  KVH_ASSIGN_OR_RETURN(const KvtcPayloadLayout layout,
                       PayloadLayout(positions));
  CodecWorkspace local;
  CodecWorkspace* ws = workspace ? workspace : &local;
  KVH_ASSIGN_OR_RETURN(const absl::Span<const uint8_t> payload,
                       RawPayload(env, layout.raw_payload_bytes, ws));
  KVH_RETURN_IF_ERROR(CheckKvtcPayloadHeaders(layout, payload));
  for (int s = 0; s < static_cast<int>(kKvtcNumSections); ++s) {
    KVH_RETURN_IF_ERROR(
        CheckSectionData(layout.sections[s], s, payload.data()));
  }
  KVH_RETURN_IF_ERROR(CheckRowsFitBlas(layout.projected_rows));
  // Everything is checked: from here on nothing fails.
  const Batch b = MakeBatch(geometry_, cal, positions);
  const uint64_t rows = layout.projected_rows;
  const Scratch s = CarveScratch(b, rows, ws);
  for (int kv = 0; kv < 2 && rows > 0; ++kv) {
    const KvtcBasis& basis = kv == 0 ? cal.keys : cal.values;
    DequantizeSection(layout.sections[kv], payload.data(), s.y,
                      basis.components, s.temp);
    Reconstruct(basis, static_cast<int>(rows), s.y, s.x);
    ScatterRows(b, pages, kv, basis, s.x, s.rope);
  }
  ReadSinks(b, pages, payload.data() + layout.sections[2].ranges[0].data_offset,
            s.temp);
  return absl::OkStatus();
}

}  // namespace kvharbor
