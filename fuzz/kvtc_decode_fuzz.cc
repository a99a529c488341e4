// libFuzzer target: the codec decoders (KVTC per token, KVTC per page,
// identity) and the calibration file parser on arbitrary bytes.
//
// Input: byte 0 selects what runs, the rest is the buffer.
//   bits 0-1: 0 = KVTC per token (RoPE, sinks), 1 = KVTC per page,
//             2 = identity, 3 = calibration file parser
//   bit 2:    recompute the envelope checksums before decoding, so that
//             mutations reach the checks behind them
// Pages are allocated to match the envelope's page count and positions
// (up to 8 pages) so that valid buffers decode fully.
//
// KVTC_FUZZ_WRITE_CORPUS=DIR makes the binary write the seed corpus (valid
// buffers of each kind, with and without zstd, and a calibration file) into
// DIR and exit; scripts/run_fuzz.sh does not need it, the seeds are checked
// in under fuzz/corpus/kvtc_decode/.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/base/float_formats.h"
#include "core/codec/codec.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/codec/kvtc/kvtc_codec.h"
#include "core/codec/kvtc/kvtc_format.h"

namespace kvharbor {
namespace {

constexpr size_t kMaxFuzzPages = 8;

Geometry FuzzGeometry() {
  Geometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  g.page_size = 4;
  g.dtype = DType::kBF16;
  return g;
}

std::shared_ptr<KvtcCalibration> FuzzCalibration(KvtcRowKind kind) {
  const Geometry g = FuzzGeometry();
  auto cal = std::make_shared<KvtcCalibration>();
  cal->row_kind = kind;
  cal->num_layers = g.num_layers;
  cal->num_kv_heads = g.num_kv_heads;
  cal->head_dim = g.head_dim;
  cal->page_size = g.page_size;
  cal->sink_tokens = 4;
  const uint64_t f =
      uint64_t{g.num_kv_heads} * g.head_dim *
      (kind == KvtcRowKind::kPerToken ? g.num_layers : g.page_size);
  const std::vector<KvtcRange> ranges = {{KvtcQuantType::kFp8, 0, 0, 4},
                                         {KvtcQuantType::kIntX, 4, 4, 12},
                                         {KvtcQuantType::kIntX, 2, 12, 20},
                                         {KvtcQuantType::kIntX, 1, 22, 24}};
  cal->keys = RandomOrthonormalBasis(f, 24, 1, ranges);
  cal->values =
      RandomOrthonormalBasis(f, 24, 2, {{KvtcQuantType::kIntX, 8, 0, 24}});
  if (kind == KvtcRowKind::kPerToken) {
    cal->rope_style = RopeStyle::kHalfSplit;
    cal->rope_theta = 10000.0f;
  }
  return cal;
}

struct Codecs {
  std::unique_ptr<Codec> codec[3];
  std::unique_ptr<Codec> zstd[3];
};

const Codecs& GetCodecs() {
  static const Codecs* const codecs = [] {
    auto* c = new Codecs();
    for (int z = 0; z < 2; ++z) {
      CodecParams p;
      p.geometry = FuzzGeometry();
      p.zstd = z == 1;
      auto& dst = z == 0 ? c->codec : c->zstd;
      p.calibration = FuzzCalibration(KvtcRowKind::kPerToken);
      dst[0] = *CodecRegistry::Default().Create("kvtc", p);
      p.calibration = FuzzCalibration(KvtcRowKind::kPerPage);
      dst[1] = *CodecRegistry::Default().Create("kvtc", p);
      dst[2] = *CodecRegistry::Default().Create("identity", p);
    }
    return c;
  }();
  return *codecs;
}

void DecodeOne(const Codec& codec, std::vector<uint8_t>& buf, bool reseal) {
  if (reseal) ResealEnvelopeForTesting(absl::MakeSpan(buf));
  static CodecWorkspace workspace;
  std::vector<uint64_t> positions = {0};
  auto env = ParseEnvelope(buf);
  if (env.ok() && env->header.num_pages <= kMaxFuzzPages) {
    positions.clear();
    for (size_t i = 0; i < env->header.num_pages; ++i) {
      positions.push_back(env->position(i));
    }
  }
  const size_t page_bytes = codec.geometry().PageBytes();
  std::vector<std::vector<uint8_t>> pages(positions.size(),
                                          std::vector<uint8_t>(page_bytes));
  std::vector<MutablePageRef> refs;
  for (size_t i = 0; i < pages.size(); ++i) {
    refs.push_back({pages[i].data(), positions[i]});
  }
  codec.Decode(buf, refs, &workspace).IgnoreError();
}

void WriteFile(const std::string& path, uint8_t selector,
               const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fputc(selector, f);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

void WriteCorpus(const std::string& dir) {
  const Codecs& c = GetCodecs();
  const Geometry g = FuzzGeometry();
  const std::vector<std::vector<uint64_t>> batches = {{0}, {2, 8}, {100, 0, 4}};
  int n = 0;
  for (int kind = 0; kind < 3; ++kind) {
    for (int z = 0; z < 2; ++z) {
      for (const auto& positions : batches) {
        std::vector<std::vector<uint8_t>> pages;
        std::vector<PageRef> refs;
        for (size_t i = 0; i < positions.size(); ++i) {
          pages.emplace_back(g.PageBytes());
          for (size_t e = 0; e < g.ElementsPerPage(); ++e) {
            // Smooth content so that zstd applies to some of the seeds.
            const float v =
                z ? 0.5f : 0.01f * float((e * 7 + i * 13) % 97) - 0.4f;
            const uint16_t b = FloatToBf16(v);
            pages.back()[2 * e] = static_cast<uint8_t>(b);
            pages.back()[2 * e + 1] = static_cast<uint8_t>(b >> 8);
          }
          refs.push_back({pages.back().data(), positions[i]});
        }
        const Codec& codec = z ? *c.zstd[kind] : *c.codec[kind];
        auto buf = codec.EncodeToString(refs, nullptr);
        if (!buf.ok()) {
          std::fprintf(stderr, "encode failed: %s\n",
                       buf.status().ToString().c_str());
          std::exit(1);
        }
        // Seeds must be valid: decode each one back.
        std::vector<std::vector<uint8_t>> out(
            pages.size(), std::vector<uint8_t>(g.PageBytes()));
        std::vector<MutablePageRef> out_refs;
        for (size_t i = 0; i < out.size(); ++i) {
          out_refs.push_back({out[i].data(), positions[i]});
        }
        const absl::Status s = codec.Decode(
            absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(buf->data()),
                                buf->size()),
            out_refs, nullptr);
        if (!s.ok()) {
          std::fprintf(stderr, "seed does not decode: %s\n",
                       s.ToString().c_str());
          std::exit(1);
        }
        static const char* const kKinds[] = {"token", "page", "identity"};
        WriteFile(dir + "/" + kKinds[kind] + (z ? "_zstd_" : "_") +
                      std::to_string(n++),
                  4 | kind, *buf);
      }
    }
  }
  auto cal = SerializeKvtcCalibration(*FuzzCalibration(KvtcRowKind::kPerToken));
  WriteFile(dir + "/calibration", 3, *cal);
  std::printf("wrote %d seeds to %s\n", n + 1, dir.c_str());
}

}  // namespace
}  // namespace kvharbor

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (const char* dir = std::getenv("KVTC_FUZZ_WRITE_CORPUS")) {
    kvharbor::WriteCorpus(dir);
    std::exit(0);
  }
  kvharbor::GetCodecs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  std::vector<uint8_t> buf(data + 1, data + size);
  const int kind = selector & 3;
  if (kind == 3) {
    kvharbor::ParseKvtcCalibration(buf).status().IgnoreError();
    return 0;
  }
  const kvharbor::Codecs& c = kvharbor::GetCodecs();
  kvharbor::DecodeOne(*c.codec[kind], buf, (selector & 4) != 0);
  return 0;
}
