// The GPU decoder's deferred checks: corrupt data bytes (FP8 NaN codes, IntX
// min / max) found by the dequantize kernels and a body checksum verified
// by FinishDecode while the GPU works. Each corrupt buffer must come back as
// an error naming the field the CPU decoder names, through Decode and
// through DecodeAsync + FinishDecode (pinned input copied chunk by chunk,
// and read in place), and the workspace must decode a good buffer right
// after. Also the DecodeAsync / FinishDecode protocol itself.
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/codec/kvtc/kvtc_codec.h"
#include "core/codec/kvtc/kvtc_format.h"
#include "cuda/codec/kvtc_gpu_codec.h"
#include "tests/cuda/codec_test_util.h"

namespace kvharbor {
namespace gpu {
namespace {

using namespace testing;  // NOLINT: test helpers

using Bytes = std::vector<uint8_t>;

bool Has(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

// bf16 pages, per-token rows, half-split RoPE, 4 sinks, the seed's FP8 /
// int4 / int2 ranges; three pages, the first with sinks. The identity basis
// makes the projection exact, so good buffers decode to the CPU's bits.
struct Fixture {
  Geometry g;
  CodecParams params;
  std::unique_ptr<KvtcCodec> cpu;
  std::unique_ptr<KvtcGpuCodec> gpu;
  std::unique_ptr<PageSet> pages;
  Bytes good;
  KvtcPayloadLayout layout;
  size_t payload_at = 0;

  Fixture() {
    std::mt19937_64 rng(17);
    g.num_layers = 2;
    g.num_kv_heads = 2;
    g.head_dim = 16;
    g.page_size = 6;
    g.dtype = DType::kBF16;
    params.geometry = g;
    params.calibration =
        MakeCalibration(g, KvtcRowKind::kPerToken, RopeStyle::kHalfSplit, 4,
                        BasisKind::kIdentity, 0, 40, rng);
    auto c = KvtcCodec::Create(params);
    KVH_STATUS_REQUIRE(c.status());
    cpu = std::move(*c);
    KvtcGpuOptions opt;
    opt.max_rows_per_chunk = 5;  // several chunks per section
    auto gc = KvtcGpuCodec::Create(params, opt);
    KVH_STATUS_REQUIRE(gc.status());
    gpu = std::move(*gc);
    pages = std::make_unique<PageSet>(MakePages(g, {0, 6, 12}, rng));
    const auto s = cpu->EncodeToString(pages->HostRefs(), nullptr);
    KVH_STATUS_REQUIRE(s.status());
    good.assign(s->begin(), s->end());
    const auto l = cpu->PayloadLayout(pages->positions);
    KVH_STATUS_REQUIRE(l.status());
    layout = *l;
    payload_at = kEnvelopeHeaderBytes + 8 * pages->positions.size();
    REQUIRE(layout.sink_rows == 4);
    REQUIRE(layout.sections[0].ranges.size() == 3);
    REQUIRE(layout.sections[0].ranges[0].range.quant_type ==
            KvtcQuantType::kFp8);
  }

  const KvtcRangeLayout& Range(int s, int r) const {
    return layout.sections[s].ranges[r];
  }
  uint8_t* Data(Bytes& b, int s, int r) {
    return b.data() + payload_at + Range(s, r).data_offset;
  }
  // Stores min (which = 0) or max (which = 1) of `row` of an IntX range.
  void SetMeta(Bytes& b, int s, int r, uint64_t row, int which, float v) {
    const uint64_t at = payload_at + Range(s, r).metadata_offset +
                        4 * (which * layout.sections[s].rows + row);
    std::memcpy(b.data() + at, &v, 4);
  }
  float GetMeta(const Bytes& b, int s, int r, uint64_t row, int which) const {
    float v;
    std::memcpy(&v,
                b.data() + payload_at + Range(s, r).metadata_offset +
                    4 * (which * layout.sections[s].rows + row),
                4);
    return v;
  }

  // The CPU decoder's verdict on `b`, with the pages it decodes.
  absl::Status CpuDecode(const Bytes& b,
                         std::vector<std::vector<uint8_t>>* out) const {
    *out = SentinelPages(*pages, 0x77);
    return cpu->Decode(b, Refs(*out, pages->positions), nullptr);
  }

  // Decodes `b` on the GPU by `path` (0: Decode; 1: pinned input, copy
  // stream; 2: pinned input read in place) on workspace `ws`.
  absl::Status GpuDecode(const Bytes& b, int path,
                         const KvtcGpuWorkspace& ws) const {
    if (path == 0) return gpu->Decode(b, pages->DeviceOut(), nullptr);
    PinnedBuf pin(b.size());
    std::memcpy(pin.bytes(), b.data(), b.size());
    KvtcGpuWorkspace w = ws;
    if (path == 2) w.copy_stream = nullptr;
    const absl::Span<const uint8_t> span(pin.bytes(), b.size());
    const absl::Status s =
        gpu->DecodeAsync(span, pages->DeviceOut(), w, nullptr, nullptr);
    if (!s.ok()) return s;
    return gpu->FinishDecode(span, w);
  }
};

TEST_CASE("The GPU decoder refuses corrupt data that only the kernels see",
          "[cuda][codec][decode_check]") {
  Fixture f;
  std::vector<std::vector<uint8_t>> want;
  KVH_STATUS_REQUIRE(f.CpuDecode(f.good, &want));
  auto holder = KvtcGpuWorkspaceHolder::Create(*f.gpu, 3);
  KVH_STATUS_REQUIRE(holder.status());
  const KvtcGpuWorkspace& ws = (*holder)->get();
  const uint64_t rows = f.layout.sections[0].rows;
  const uint64_t fp8_width = f.Range(0, 0).range.end_idx;
  const uint64_t sink_width = f.Range(2, 0).data_bytes / 4;

  struct Corruption {
    std::string name;
    std::function<void(Bytes&)> edit;
    std::string field;  // the error must contain this
    bool reseal = true;
    absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  };
  const std::vector<Corruption> cases = {
      {"keys FP8 NaN code 0x7F",
       [&](Bytes& b) { f.Data(b, 0, 0)[7 * fp8_width + 3] = 0x7F; },
       "buffer: sections[0].ranges[0]: FP8 NaN code in row 7"},
      {"values FP8 NaN code 0xFF in the last byte",
       [&](Bytes& b) { f.Data(b, 1, 0)[rows * fp8_width - 1] = 0xFF; },
       absl::StrCat("buffer: sections[1].ranges[0]: FP8 NaN code in row ",
                    rows - 1)},
      {"sink FP8 NaN code",
       [&](Bytes& b) { f.Data(b, 2, 0)[2 * sink_width + 1] = 0xFF; },
       "buffer: sections[2].ranges[0]: FP8 NaN code in row 2"},
      {"NaN min",
       [&](Bytes& b) {
         f.SetMeta(b, 1, 1, 9, 0, std::numeric_limits<float>::quiet_NaN());
       },
       "buffer: sections[1].ranges[1].metadata: row 9 "},
      {"infinite max",
       [&](Bytes& b) {
         f.SetMeta(b, 0, 2, 0, 1, std::numeric_limits<float>::infinity());
       },
       "buffer: sections[0].ranges[2].metadata: row 0 "},
      {"min above max",
       [&](Bytes& b) {
         const float mx = f.GetMeta(b, 0, 1, 11, 1);
         f.SetMeta(b, 0, 1, 11, 0, mx + 1.0f);
       },
       "buffer: sections[0].ranges[1].metadata: row 11 "},
      {"span over float",
       [&](Bytes& b) {
         f.SetMeta(b, 0, 1, 3, 0, -std::numeric_limits<float>::max());
         f.SetMeta(b, 0, 1, 3, 1, std::numeric_limits<float>::max());
       },
       "buffer: sections[0].ranges[1].metadata: row 3 "},
      {"two errors: the first in the CPU's order wins",
       [&](Bytes& b) {
         f.SetMeta(b, 0, 2, 1, 0, std::numeric_limits<float>::infinity());
         f.Data(b, 0, 0)[12 * fp8_width] = 0x7F;
         f.Data(b, 1, 0)[0] = 0x7F;
       },
       "buffer: sections[0].ranges[0]: FP8 NaN code in row 12"},
      {"body checksum", [&](Bytes& b) { f.Data(b, 0, 1)[5] ^= 0x20; },
       "body_checksum", false, absl::StatusCode::kDataLoss},
      {"body checksum before data errors",
       [&](Bytes& b) { f.Data(b, 0, 0)[0] = 0x7F; }, "body_checksum", false,
       absl::StatusCode::kDataLoss},
  };
  for (const Corruption& c : cases) {
    Bytes bad = f.good;
    c.edit(bad);
    if (c.reseal) ResealEnvelopeForTesting(absl::MakeSpan(bad));
    std::vector<std::vector<uint8_t>> unused;
    const absl::Status cpu = f.CpuDecode(bad, &unused);
    INFO(c.name << "; CPU: " << cpu.ToString());
    REQUIRE(cpu.code() == c.code);
    // The CPU names the same field (it says "at byte" for FP8 codes).
    const std::string prefix = c.field.substr(0, c.field.find(" in row"));
    REQUIRE(Has(cpu, prefix));
    for (int path = 0; path < 3; ++path) {
      const absl::Status got = f.GpuDecode(bad, path, ws);
      INFO("path " << path << ": " << got.ToString());
      REQUIRE(got.code() == c.code);
      REQUIRE(Has(got, c.field));
      // The workspace is free again and decodes a good buffer exactly.
      f.pages->arena->Fill(0x33);
      KVH_STATUS_REQUIRE(f.GpuDecode(f.good, path, ws));
      REQUIRE(f.pages->Download() == want);
    }
  }
}

TEST_CASE("DecodeAsync must be completed by FinishDecode",
          "[cuda][codec][decode_check]") {
  Fixture f;
  auto holder = KvtcGpuWorkspaceHolder::Create(*f.gpu, 3);
  KVH_STATUS_REQUIRE(holder.status());
  const KvtcGpuWorkspace& ws = (*holder)->get();
  PinnedBuf pin(f.good.size());
  std::memcpy(pin.bytes(), f.good.data(), f.good.size());
  const absl::Span<const uint8_t> buf(pin.bytes(), f.good.size());
  const auto out = f.pages->DeviceOut();

  REQUIRE(f.gpu->FinishDecode(buf, ws).code() ==
          absl::StatusCode::kFailedPrecondition);
  KVH_STATUS_REQUIRE(f.gpu->DecodeAsync(buf, out, ws, nullptr, nullptr));
  // Until FinishDecode, the workspace holds the decode's result: every other
  // call on it is refused.
  const absl::Status again = f.gpu->DecodeAsync(buf, out, ws, nullptr, nullptr);
  REQUIRE(again.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(Has(again, "FinishDecode"));
  const auto refs = f.pages->DeviceRefs();
  PinnedBuf enc(*f.gpu->EncodedSize(refs));
  REQUIRE(f.gpu->EncodeAsync(refs, enc.bytes(), enc.size(), ws, nullptr)
              .status()
              .code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(f.gpu
              ->FinishEncode(refs, absl::MakeSpan(enc.bytes(), enc.size()), ws,
                             nullptr)
              .status()
              .code() == absl::StatusCode::kFailedPrecondition);
  // Another buffer (even with the same bytes) is not the pending one.
  PinnedBuf other(f.good.size());
  std::memcpy(other.bytes(), f.good.data(), f.good.size());
  const absl::Status wrong =
      f.gpu->FinishDecode(absl::MakeConstSpan(other.bytes(), other.size()), ws);
  REQUIRE(wrong.code() == absl::StatusCode::kInvalidArgument);
  KVH_STATUS_REQUIRE(f.gpu->FinishDecode(buf, ws));
  REQUIRE(f.gpu->FinishDecode(buf, ws).code() ==
          absl::StatusCode::kFailedPrecondition);
  // Host-checked errors enqueue nothing and leave no decode pending.
  Bytes bad = f.good;
  bad.pop_back();
  std::memcpy(pin.bytes(), bad.data(), bad.size());
  REQUIRE(!f.gpu
               ->DecodeAsync(absl::MakeConstSpan(pin.bytes(), bad.size()), out,
                             ws, nullptr, nullptr)
               .ok());
  REQUIRE(f.gpu->FinishDecode(buf, ws).code() ==
          absl::StatusCode::kFailedPrecondition);
  std::memcpy(pin.bytes(), f.good.data(), f.good.size());
  KVH_STATUS_REQUIRE(f.gpu->DecodeAsync(buf, out, ws, nullptr, nullptr));
  KVH_STATUS_REQUIRE(f.gpu->FinishDecode(buf, ws));
  // Encoding works again once the decode is finished.
  const auto n = f.gpu->EncodeAsync(refs, enc.bytes(), enc.size(), ws, nullptr);
  KVH_STATUS_REQUIRE(n.status());
  KVH_STATUS_REQUIRE(f.gpu
                         ->FinishEncode(refs,
                                        absl::MakeSpan(enc.bytes(), enc.size()),
                                        ws, nullptr)
                         .status());
}

}  // namespace
}  // namespace gpu
}  // namespace kvharbor
