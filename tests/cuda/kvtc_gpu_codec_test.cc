// KvtcGpuCodec against the CPU KvtcCodec. With an identity basis the FP32
// projection is exact on both sides (each coefficient is one product by 1
// plus exact zeros), so every byte of the GPU's buffer must equal the CPU's
// and each decoder must reproduce the other's pages bit for bit: that checks
// gather, RoPE, mean, quantization, sinks, layout and envelope end to end
// over a sweep of geometries, dtypes, row kinds and range layouts. Also:
// output kinds (pinned, device, pageable), chunking, zstd, and errors.
#include "cuda/codec/kvtc_gpu_codec.h"

#include <cstring>
#include <random>
#include <vector>

#include "core/codec/envelope.h"
#include "core/codec/kvtc/kvtc_codec.h"
#include "tests/cuda/codec_test_util.h"

namespace kvharbor {
namespace gpu {
namespace {

using namespace testing;  // NOLINT: test helpers

struct Sweep {
  Geometry g;
  KvtcRowKind kind;
  RopeStyle rope;
  int ranges;
};

std::vector<Sweep> Sweeps() {
  std::vector<Sweep> out;
  int i = 0;
  for (DType dt : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3}) {
    for (PageLayout lay :
         {PageLayout::kKvLayerTokenHeadDim, PageLayout::kLayerKvTokenHeadDim}) {
      for (KvtcRowKind kind : {KvtcRowKind::kPerToken, KvtcRowKind::kPerPage}) {
        for (RopeStyle rope : {RopeStyle::kNone, RopeStyle::kInterleaved,
                               RopeStyle::kHalfSplit}) {
          Sweep s;
          s.g.num_layers = 2 + i % 2;
          s.g.num_kv_heads = 2;
          s.g.head_dim = rope == RopeStyle::kNone ? 10 : 16;
          s.g.page_size = kind == KvtcRowKind::kPerToken ? 6 : 4;
          s.g.dtype = dt;
          s.g.layout = lay;
          s.kind = kind;
          s.rope = rope;
          s.ranges = i % 3;
          out.push_back(s);
          ++i;
        }
      }
    }
  }
  return out;
}

std::string Name(const Sweep& s) {
  return absl::StrCat(DTypeName(s.g.dtype), "/", PageLayoutName(s.g.layout),
                      "/", KvtcRowKindName(s.kind), "/", RopeStyleName(s.rope),
                      "/ranges", s.ranges);
}

// Encodes with the GPU codec through the async API into `out` (pinned or
// device memory) and returns the finished host buffer.
std::vector<uint8_t> GpuEncode(const KvtcGpuCodec& codec, const PageSet& p,
                               bool pinned) {
  const std::vector<PageRef> refs = p.DeviceRefs();
  const auto size = codec.EncodedSize(refs);
  REQUIRE(size.ok());
  auto holder = KvtcGpuWorkspaceHolder::Create(codec, refs.size() + 3);
  KVH_STATUS_REQUIRE(holder.status());
  const KvtcGpuWorkspace& ws = (*holder)->get();
  cudaStream_t stream;
  KVH_CUDA_REQUIRE(cudaStreamCreate(&stream));
  std::vector<uint8_t> host(*size);
  // Sentinel-filled outputs: a byte the codec does not write shows up as a
  // difference from the CPU buffer (both sentinels are tried).
  for (uint8_t sentinel : {uint8_t{0xA5}, uint8_t{0x5A}}) {
    PinnedBuf pout(*size);
    DeviceBuf dout(*size);
    pout.Fill(sentinel);
    dout.Fill(sentinel);
    uint8_t* out = pinned ? pout.bytes() : dout.bytes();
    const auto n = codec.EncodeAsync(refs, out, *size, ws, stream);
    KVH_STATUS_REQUIRE(n.status());
    REQUIRE(*n == *size);
    absl::Span<uint8_t> span(pout.bytes(), *size);
    if (!pinned) {
      KVH_CUDA_REQUIRE(cudaStreamSynchronize(stream));
      dout.Download(pout.bytes(), *size);
    }
    const auto fin = codec.FinishEncode(refs, span, ws, nullptr);
    KVH_STATUS_REQUIRE(fin.status());
    REQUIRE(*fin == *size);
    if (sentinel == 0x5A) {
      REQUIRE(std::memcmp(host.data(), pout.bytes(), *size) == 0);
    }
    std::memcpy(host.data(), pout.bytes(), *size);
  }
  KVH_CUDA_REQUIRE(cudaStreamDestroy(stream));
  return host;
}

TEST_CASE("GPU buffers equal CPU buffers byte for byte (identity basis)",
          "[cuda][codec]") {
  std::mt19937_64 rng(21);
  for (const Sweep& s : Sweeps()) {
    INFO(Name(s));
    const uint64_t f =
        (s.kind == KvtcRowKind::kPerToken ? s.g.num_layers : s.g.page_size) *
        s.g.num_kv_heads * s.g.head_dim;
    CodecParams params;
    params.geometry = s.g;
    params.calibration = MakeCalibration(
        s.g, s.kind, s.rope, 4, BasisKind::kIdentity, s.ranges, f * 3 / 4, rng);
    auto cpu = KvtcCodec::Create(params);
    KVH_STATUS_REQUIRE(cpu.status());
    KvtcGpuOptions opt;
    opt.max_rows_per_chunk = 7;  // several chunks per section
    auto gpu = KvtcGpuCodec::Create(params, opt);
    KVH_STATUS_REQUIRE(gpu.status());
    // Pages at 0 and 2 hold sinks; large positions exercise RoPE angles.
    PageSet pages = MakePages(s.g, {0, 6, 2, 1000001, uint64_t{1} << 45}, rng);
    const auto want = (*cpu)->EncodeToString(pages.HostRefs(), nullptr);
    KVH_STATUS_REQUIRE(want.status());
    for (bool pinned : {true, false}) {
      const std::vector<uint8_t> got = GpuEncode(**gpu, pages, pinned);
      REQUIRE(got.size() == want->size());
      size_t first = got.size();
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] != static_cast<uint8_t>((*want)[i])) {
          first = i;
          break;
        }
      }
      INFO("pinned " << pinned << ": first differing byte " << first << " of "
                     << got.size());
      REQUIRE(first == got.size());
    }
    // Pageable output through the Codec interface.
    const auto via_codec = (*gpu)->EncodeToString(pages.DeviceRefs(), nullptr);
    KVH_STATUS_REQUIRE(via_codec.status());
    REQUIRE(*via_codec == *want);

    // Decoding: GPU decodes the CPU's buffer into sentinel device pages; the
    // CPU decodes the same buffer; every page byte must agree.
    const absl::Span<const uint8_t> buf(
        reinterpret_cast<const uint8_t*>(want->data()), want->size());
    auto cpu_pages = SentinelPages(pages, 0x77);
    KVH_STATUS_REQUIRE(
        (*cpu)->Decode(buf, Refs(cpu_pages, pages.positions), nullptr));
    // 0: pageable input (Codec::Decode); 1: pinned input copied chunk by
    // chunk on the workspace's copy stream; 2: pinned input read in place.
    for (int input = 0; input < 3; ++input) {
      pages.arena->Fill(0x77);
      if (input > 0) {
        PinnedBuf pin(buf.size());
        std::memcpy(pin.bytes(), buf.data(), buf.size());
        auto holder = KvtcGpuWorkspaceHolder::Create(**gpu, pages.host.size());
        KVH_STATUS_REQUIRE(holder.status());
        KvtcGpuWorkspace ws = (*holder)->get();
        if (input == 2) ws.copy_stream = nullptr;
        const auto span = absl::MakeConstSpan(pin.bytes(), buf.size());
        KVH_STATUS_REQUIRE(
            (*gpu)->DecodeAsync(span, pages.DeviceOut(), ws, nullptr, nullptr));
        KVH_STATUS_REQUIRE((*gpu)->FinishDecode(span, ws));
      } else {
        KVH_STATUS_REQUIRE((*gpu)->Decode(buf, pages.DeviceOut(), nullptr));
      }
      const auto got_pages = pages.Download();
      for (size_t p = 0; p < got_pages.size(); ++p) {
        INFO("page " << p << " input " << input);
        REQUIRE(got_pages[p] == cpu_pages[p]);
      }
    }
  }
}

TEST_CASE("A block-diagonal basis: GPU buffers equal CPU buffers",
          "[cuda][codec]") {
  // Identity blocks (as kvharbor-calibrate --layer-groups writes
  // block-diagonal bases): the GPU's dense GEMM over the expanded matrix and
  // the CPU's per-block sgemms are both exact, so the bytes must agree.
  std::mt19937_64 rng(5);
  Geometry g;
  g.num_layers = 4;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  g.page_size = 4;
  g.dtype = DType::kBF16;
  std::shared_ptr<KvtcCalibration> cal =
      MakeCalibration(g, KvtcRowKind::kPerToken, RopeStyle::kNone, 2,
                      BasisKind::kIdentity, 1, 48, rng);
  KvtcBasis& b = cal->keys;
  b.blocks = {{32, 20}, {32, 12}};
  b.components = 32;
  b.projection.clear();
  for (const KvtcBlock& k : b.blocks) {
    const KvtcBasis id = IdentityBasis(k.features, k.components, {});
    b.projection.insert(b.projection.end(), id.projection.begin(),
                        id.projection.end());
  }
  b.ranges = {{KvtcQuantType::kFp8, 0, 0, 10},
              {KvtcQuantType::kIntX, 4, 10, 32}};
  cal->values = b;
  KVH_STATUS_REQUIRE(cal->Validate());
  CodecParams params;
  params.geometry = g;
  params.calibration = cal;
  auto cpu = KvtcCodec::Create(params);
  KVH_STATUS_REQUIRE(cpu.status());
  auto gpu = KvtcGpuCodec::Create(params, KvtcGpuOptions{});
  KVH_STATUS_REQUIRE(gpu.status());
  PageSet pages = MakePages(g, {0, 4, 8, 12}, rng);
  const auto want = (*cpu)->EncodeToString(pages.HostRefs(), nullptr);
  KVH_STATUS_REQUIRE(want.status());
  const auto got = (*gpu)->EncodeToString(pages.DeviceRefs(), nullptr);
  KVH_STATUS_REQUIRE(got.status());
  REQUIRE(*got == *want);
  const absl::Span<const uint8_t> buf(
      reinterpret_cast<const uint8_t*>(want->data()), want->size());
  auto cpu_pages = SentinelPages(pages, 0x77);
  KVH_STATUS_REQUIRE(
      (*cpu)->Decode(buf, Refs(cpu_pages, pages.positions), nullptr));
  pages.arena->Fill(0x77);
  KVH_STATUS_REQUIRE((*gpu)->Decode(buf, pages.DeviceOut(), nullptr));
  const auto got_pages = pages.Download();
  for (size_t p = 0; p < got_pages.size(); ++p) {
    INFO("page " << p);
    REQUIRE(got_pages[p] == cpu_pages[p]);
  }
}

TEST_CASE("GPU codec with zstd matches the CPU codec with zstd",
          "[cuda][codec]") {
  std::mt19937_64 rng(5);
  const Sweep s = Sweeps()[4];
  CodecParams params;
  params.geometry = s.g;
  params.zstd = true;
  params.calibration =
      MakeCalibration(s.g, s.kind, s.rope, 4, BasisKind::kIdentity, 2, 32, rng);
  auto cpu = KvtcCodec::Create(params);
  auto gpu = KvtcGpuCodec::Create(params);
  KVH_STATUS_REQUIRE(gpu.status());
  // Tiers compare a buffer's fingerprint with the codec's.
  REQUIRE((*cpu)->calibration_fingerprint() != 0);
  REQUIRE((*gpu)->calibration_fingerprint() ==
          (*cpu)->calibration_fingerprint());
  PageSet pages = MakePages(s.g, {0, 4, 8}, rng);
  const auto want = (*cpu)->EncodeToString(pages.HostRefs(), nullptr);
  const auto got = (*gpu)->EncodeToString(pages.DeviceRefs(), nullptr);
  KVH_STATUS_REQUIRE(got.status());
  REQUIRE(*got == *want);
  pages.arena->Fill(0);
  const absl::Span<const uint8_t> buf(
      reinterpret_cast<const uint8_t*>(got->data()), got->size());
  KVH_STATUS_REQUIRE((*gpu)->Decode(buf, pages.DeviceOut(), nullptr));
  auto cpu_pages = SentinelPages(pages, 0);
  KVH_STATUS_REQUIRE(
      (*cpu)->Decode(buf, Refs(cpu_pages, pages.positions), nullptr));
  REQUIRE(pages.Download() == cpu_pages);
}

TEST_CASE("GPU codec errors", "[cuda][codec]") {
  std::mt19937_64 rng(8);
  const Sweep s = Sweeps()[0];  // bf16, per token
  CodecParams params;
  params.geometry = s.g;
  params.calibration =
      MakeCalibration(s.g, s.kind, s.rope, 4, BasisKind::kIdentity, 0, 16, rng);
  auto gpu = KvtcGpuCodec::Create(params);
  KVH_STATUS_REQUIRE(gpu.status());
  const KvtcGpuCodec& codec = **gpu;
  PageSet pages = MakePages(s.g, {0, 6, 12}, rng);
  auto holder = KvtcGpuWorkspaceHolder::Create(codec, 3);
  KVH_STATUS_REQUIRE(holder.status());
  const KvtcGpuWorkspace& ws = (*holder)->get();
  const auto refs = pages.DeviceRefs();
  const size_t size = *codec.EncodedSize(refs);

  SECTION("pageable output is refused by EncodeAsync") {
    std::vector<uint8_t> out(size);
    const auto r = codec.EncodeAsync(refs, out.data(), size, ws, nullptr);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(r.status().message().find("out") != absl::string_view::npos);
  }
  SECTION("host page pointers are refused") {
    const auto r = codec.EncodeToString(pages.HostRefs(), nullptr);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(r.status().message().find("pages[0].data") !=
            absl::string_view::npos);
  }
  SECTION("too many pages for the workspace") {
    PageSet more = MakePages(s.g, {0, 6, 12, 18}, rng);
    PinnedBuf out(*codec.EncodedSize(more.DeviceRefs()));
    const auto r = codec.EncodeAsync(more.DeviceRefs(), out.bytes(), out.size(),
                                     ws, nullptr);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("short output") {
    PinnedBuf out(size);
    const auto r = codec.EncodeAsync(refs, out.bytes(), size - 1, ws, nullptr);
    REQUIRE(r.status().code() == absl::StatusCode::kResourceExhausted);
  }
  SECTION("a non-finite value is reported with its page and token") {
    for (bool sink : {false, true}) {
      const uint16_t nan = 0x7FC0;
      // Page 1 (position 6), token 3 of layer 1's values; or page 0 token 1
      // (a sink).
      const size_t page = sink ? 0 : 1, token = sink ? 1 : 3;
      const KvtcPageShape shape{s.g.num_layers,
                                s.g.num_kv_heads,
                                s.g.head_dim,
                                s.g.page_size,
                                static_cast<int>(s.g.dtype),
                                static_cast<int>(s.g.layout)};
      pages.UploadAll();
      pages.arena->Upload(
          &nan, 2,
          pages.offsets[page] + shape.RunIndex(1, 1, uint32_t(token)) * 2 + 4);
      PinnedBuf out(size);
      KVH_STATUS_REQUIRE(
          codec.EncodeAsync(refs, out.bytes(), size, ws, nullptr).status());
      const auto r = codec.FinishEncode(refs, absl::MakeSpan(out.bytes(), size),
                                        ws, nullptr);
      INFO(r.status().ToString());
      REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
      const std::string where = absl::StrCat("pages[", page, "] token ", token);
      REQUIRE(r.status().message().find(where) != absl::string_view::npos);
    }
  }
  SECTION("corrupt buffers are refused") {
    // (tests/cuda/kvtc_gpu_decode_check_test.cc corrupts the data bytes.)
    auto buf = codec.EncodeToString(refs, nullptr);
    KVH_STATUS_REQUIRE(buf.status());
    auto span = [](const std::string& b) {
      return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(b.data()),
                                 b.size());
    };
    std::string bad = *buf;
    bad[bad.size() / 2] ^= 0x10;  // body checksum mismatch
    const absl::Status s = codec.Decode(span(bad), pages.DeviceOut(), nullptr);
    REQUIRE(s.code() == absl::StatusCode::kDataLoss);
    REQUIRE(s.message().find("body_checksum") != absl::string_view::npos);
    // Host-checked errors refuse before anything is enqueued: the pages
    // stay untouched (stronger than the contract, which leaves pages
    // unspecified after any failed decode).
    pages.arena->Fill(0x42);
    const auto before = pages.Download();
    const absl::Status t = codec.Decode(span(buf->substr(0, buf->size() - 1)),
                                        pages.DeviceOut(), nullptr);
    REQUIRE(t.message().find("length") != absl::string_view::npos);
    auto out = pages.DeviceOut();
    out.pop_back();
    REQUIRE(codec.Decode(span(*buf), out, nullptr).code() ==
            absl::StatusCode::kInvalidArgument);
    REQUIRE(pages.Download() == before);
  }
}

TEST_CASE("The registry creates kvtc_gpu", "[cuda][codec]") {
  CodecRegistry registry;
  KVH_STATUS_REQUIRE(RegisterKvtcGpuCodec(registry));
  std::mt19937_64 rng(2);
  const Sweep s = Sweeps()[1];
  CodecParams params;
  params.geometry = s.g;
  params.calibration =
      MakeCalibration(s.g, s.kind, s.rope, 4, BasisKind::kRandom, 0, 16, rng);
  auto c = registry.Create("kvtc_gpu", params);
  KVH_STATUS_REQUIRE(c.status());
  REQUIRE((*c)->id() == CodecId::kKvtc);
}

}  // namespace
}  // namespace gpu
}  // namespace kvharbor
