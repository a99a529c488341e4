// Namespaces with the int8_c8 and commvq codecs
// (core/codec/codec_calibrations.h): creation from their calibration files,
// refusal of bad files naming the spec field, and pages evicted to the cold
// tiers fetched back raw and compressed.
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/base/byte_io.h"
#include "core/codec/c8/int8_c8_codec.h"
#include "core/codec/c8/msmodelslim_c8.h"
#include "core/codec/codec.h"
#include "core/codec/codec_calibrations.h"
#include "core/codec/commvq/commvq_codec.h"
#include "core/codec/commvq/commvq_format.h"
#include "core/store/namespace.h"
#include "core/store/store.h"
#include "tests/core/codec/commvq/commvq_test_util.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

namespace fs = std::filesystem;

// Matches testing::SmallCommVqConfig (2 layers, 2 KV heads of 8 dims).
Geometry Geo() {
  Geometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  g.page_size = 4;
  g.dtype = DType::kFP32;
  return g;
}

using testing::TempDir;

C8Scales Scales(const Geometry& g, uint32_t seed) {
  std::mt19937 rng(seed);
  // |x| <= 2 over scale >= 0.02, offset within 4: |t| <= 104, unsaturated.
  std::uniform_real_distribution<float> scale(0.02f, 0.05f);
  std::uniform_int_distribution<int> offset(-4, 4);
  C8Scales s;
  s.num_layers = g.num_layers;
  s.kv_channels = g.num_kv_heads * g.head_dim;
  const size_t n = size_t{s.num_layers} * s.kv_channels;
  for (auto* v : {&s.k_scale, &s.v_scale}) {
    for (size_t i = 0; i < n; ++i) v->push_back(scale(rng));
  }
  for (auto* v : {&s.k_offset, &s.v_offset}) {
    for (size_t i = 0; i < n; ++i) v->push_back(offset(rng));
  }
  return s;
}

// An msmodelslim export of `s` in a new directory under `root`.
std::string WriteExport(const std::string& root, const std::string& name,
                        const MsModelSlimC8Files& files) {
  const std::string dir = root + "/" + name;
  fs::create_directories(dir);
  REQUIRE(WriteMsModelSlimC8Files(dir, files).ok());
  return dir;
}

MsModelSlimC8Files Export(const C8Scales& s) {
  auto f = BuildMsModelSlimC8Files(s, C8NameStyle::kMergedQkv, StDType::kF32);
  REQUIRE(f.ok());
  return *std::move(f);
}

std::string WriteCodebooks(const std::string& root, const std::string& name,
                           const CommVqCodebooks& cb) {
  const std::string path = root + "/" + name;
  REQUIRE(WriteCommVqCodebooksFile(cb, path).ok());
  return path;
}

NamespaceSpec Spec(const std::string& codec, const std::string& path) {
  NamespaceSpec spec;
  spec.name = "n";
  spec.geometry = Geo();
  spec.codec = codec;
  spec.calibration_path = path;
  return spec;
}

// Values in [-2, 2]: inside every C8 range above, so no saturation.
std::string Pages(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::string s(n * Geo().PageBytes(), '\0');
  for (size_t i = 0; i + 4 <= s.size(); i += 4) {
    const float v = dist(rng);
    std::memcpy(&s[i], &v, 4);
  }
  return s;
}

std::vector<Token> Seq(Token start, int n) {
  std::vector<Token> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

void Insert(Namespace& ns, const std::vector<Token>& t,
            const std::string& bytes) {
  auto up = ns.BeginInsert(t, {});
  REQUIRE(up.ok());
  REQUIRE((*up)->Write(0, bytes).ok());
  REQUIRE((*up)->Commit().ok());
}

// What `codec` makes of `raw` (pages back to back, the first at position 0).
std::string Reconstruct(const Codec& codec, const std::string& raw) {
  const size_t pb = codec.geometry().PageBytes();
  std::string out(raw.size(), '\0');
  CodecWorkspace ws;
  for (size_t p = 0; p * pb < raw.size(); ++p) {
    const PageRef in{reinterpret_cast<const uint8_t*>(raw.data()) + p * pb,
                     p * codec.geometry().page_size};
    auto buf = codec.EncodeToString(absl::MakeConstSpan(&in, 1), &ws);
    REQUIRE(buf.ok());
    const MutablePageRef o{reinterpret_cast<uint8_t*>(&out[p * pb]),
                           in.first_position};
    REQUIRE(codec.Decode(AsBytes(*buf), absl::MakeConstSpan(&o, 1), &ws).ok());
  }
  return out;
}

// Fetches the match of `t` in `format`; compressed buffers are decoded with
// a codec built, as a client does, from the namespace's calibration bytes.
std::string FetchRaw(Namespace& ns, const std::vector<Token>& t,
                     FetchFormat format, std::vector<Tier>* tiers) {
  auto m = ns.Match(t, false, absl::ZeroDuration());
  REQUIRE(m.ok());
  *tiers = m->tiers;
  auto pinned = ns.PinPages(m->pages, format);
  REQUIRE(pinned.ok());
  if (format == FetchFormat::kRaw) {
    std::string out;
    for (size_t i = 0; i < pinned->size(); ++i) {
      const absl::string_view b = pinned->bytes(i);
      out.append(b.data(), b.size());
    }
    return out;
  }
  CodecParams params;
  params.geometry = ns.config().geometry;
  params.calibration_bytes =
      std::make_shared<const std::string>(ns.config().calibration);
  auto codec = CodecRegistry::Default().Create(ns.config().codec, params);
  REQUIRE(codec.ok());
  std::string out(pinned->size() * ns.page_bytes(), '\0');
  for (size_t i = 0; i < pinned->size(); ++i) {
    const MutablePageRef o{
        reinterpret_cast<uint8_t*>(&out[i * ns.page_bytes()]),
        i * ns.config().geometry.page_size};
    REQUIRE((*codec)
                ->Decode(AsBytes(pinned->bytes(i)), absl::MakeConstSpan(&o, 1),
                         nullptr)
                .ok());
  }
  return out;
}

// Pages of one sequence evicted by an insert (capacity of two pages), then
// demoted to disk; every fetch returns the codec's reconstruction exactly.
void CheckTierRoundTrip(NamespaceSpec spec, const Codec& reference) {
  TempDir disk;
  spec.capacity_bytes = 2 * Geo().PageBytes();
  spec.host_compressed_bytes = 1 << 20;
  spec.disk_dir = disk.path + "/pages";
  Store store(StoreOptions{});
  auto made = store.CreateNamespace(spec, false);
  REQUIRE(made.ok());
  Namespace& ns = *made->first;
  const std::string a = Pages(2, 1);
  Insert(ns, Seq(0, 8), a);
  Insert(ns, Seq(100, 8), Pages(2, 2));  // evicts `a` to host_compressed
  const std::string want = Reconstruct(reference, a);
  CHECK(want != a);  // lossy: the check below is not trivial
  std::vector<Tier> tiers;
  CHECK(FetchRaw(ns, Seq(0, 8), FetchFormat::kRaw, &tiers) == want);
  CHECK(tiers == std::vector<Tier>(2, Tier::kHostCompressed));
  CHECK(FetchRaw(ns, Seq(0, 8), FetchFormat::kCompressed, &tiers) == want);
  // Raw pages fetched compressed are encoded on the fly.
  CHECK(FetchRaw(ns, Seq(100, 8), FetchFormat::kCompressed, &tiers) ==
        Reconstruct(reference, Pages(2, 2)));
  CHECK(tiers == std::vector<Tier>(2, Tier::kRaw));
  REQUIRE(ns.tiers().DemoteAll(Tier::kDisk).ok());
  CHECK(FetchRaw(ns, Seq(0, 8), FetchFormat::kRaw, &tiers) == want);
  CHECK(tiers == std::vector<Tier>(2, Tier::kDisk));
  CHECK(FetchRaw(ns, Seq(0, 8), FetchFormat::kCompressed, &tiers) == want);
  REQUIRE(ns.CheckInvariants().ok());
}

void CheckRefused(const NamespaceSpec& spec, const std::string& prefix,
                  const std::string& detail = "") {
  Store store(StoreOptions{});
  auto made = store.CreateNamespace(spec, false);
  REQUIRE_FALSE(made.ok());
  INFO(made.status().message());
  CHECK(made.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(made.status().message().rfind(prefix, 0) == 0);
  CHECK(made.status().message().find(detail) != absl::string_view::npos);
}

TEST_CASE("int8_c8 namespace: msmodelslim export, calibration served") {
  TempDir dir;
  const C8Scales scales = Scales(Geo(), 3);
  const std::string path = WriteExport(dir.path, "c8", Export(scales));
  Store store(StoreOptions{});
  auto made = store.CreateNamespace(Spec("int8_c8", path), false);
  REQUIRE(made.ok());
  const NamespaceConfig& config = made->first->config();
  CHECK(config.codec == "int8_c8");
  CHECK(config.calibration_fingerprint == scales.Fingerprint());
  CHECK(config.tier_codec->name() == "int8_c8");
  // The served bytes parse back to the same scales ...
  auto parsed = ParseC8Calibration(AsBytes(config.calibration), Geo());
  REQUIRE(parsed.ok());
  CHECK(parsed->k_scale == scales.k_scale);
  CHECK(parsed->v_offset == scales.v_offset);
  // ... and create an equal namespace inline.
  NamespaceSpec spec = Spec("int8_c8", "");
  spec.name = "inline";
  spec.calibration = config.calibration;
  auto again = store.CreateNamespace(spec, false);
  REQUIRE(again.ok());
  CHECK(again->first->config().calibration_fingerprint == scales.Fingerprint());
}

TEST_CASE("commvq namespace: codebook file, calibration served") {
  TempDir dir;
  const CommVqCodebooks cb =
      testing::RandomCodebooks(testing::SmallCommVqConfig(), 4);
  const std::string path = WriteCodebooks(dir.path, "cb.bin", cb);
  Store store(StoreOptions{});
  auto made = store.CreateNamespace(Spec("commvq", path), false);
  REQUIRE(made.ok());
  const NamespaceConfig& config = made->first->config();
  CHECK(config.calibration_fingerprint == cb.Fingerprint());
  auto file = ReadWholeFile(path, 1 << 20);
  REQUIRE(file.ok());
  CHECK(config.calibration == *file);
}

TEST_CASE("int8_c8 namespace: bad exports are refused naming the field") {
  TempDir dir;
  const C8Scales scales = Scales(Geo(), 5);
  const std::string field = "spec.calibration_path: ";
  CheckRefused(Spec("int8_c8", dir.path + "/missing"), field,
               kMsModelSlimDescriptionFile);
  CheckRefused(Spec("int8_c8", ""), field, "required by the int8_c8 codec");
  MsModelSlimC8Files files = Export(scales);
  files.description["kv_cache_type"] = "C16";
  CheckRefused(Spec("int8_c8", WriteExport(dir.path, "type", files)), field,
               "kv_cache_type");
  // Scales of another geometry: more layers, wider heads.
  Geometry wide = Geo();
  wide.head_dim = 16;
  NamespaceSpec spec =
      Spec("int8_c8", WriteExport(dir.path, "wide", Export(Scales(wide, 6))));
  CheckRefused(spec, field);
  Geometry deep = Geo();
  deep.num_layers = 3;
  spec =
      Spec("int8_c8", WriteExport(dir.path, "deep", Export(Scales(deep, 7))));
  CheckRefused(spec, field, "layer");
  // A negative scale (the writer refuses to make one: patch the tensor).
  MsModelSlimC8Files negative = Export(scales);
  bool patched = false;
  for (SafetensorsTensorData& t : negative.tensors) {
    if (t.name.find("kv_cache_scale") == std::string::npos) continue;
    const float minus_one = -1.0f;
    std::memcpy(&t.data[4], &minus_one, 4);
    patched = true;
    break;
  }
  REQUIRE(patched);
  CheckRefused(Spec("int8_c8", WriteExport(dir.path, "neg", negative)), field,
               "scale");
  spec = Spec("int8_c8", "");
  spec.calibration = "not a safetensors file";
  CheckRefused(spec, "spec.calibration: ");
}

TEST_CASE("commvq namespace: bad codebook files are refused naming the field") {
  TempDir dir;
  const CommVqCodebooks cb =
      testing::RandomCodebooks(testing::SmallCommVqConfig(), 8);
  const std::string good = WriteCodebooks(dir.path, "good", cb);
  auto bytes = ReadWholeFile(good, 1 << 20);
  REQUIRE(bytes.ok());
  const std::string field = "spec.calibration_path: ";
  const std::string truncated = dir.path + "/truncated";
  REQUIRE(WriteWholeFile(truncated, bytes->substr(0, bytes->size() - 9)).ok());
  CheckRefused(Spec("commvq", truncated), field);
  std::string flipped = *bytes;
  flipped[100] ^= 1;
  REQUIRE(WriteWholeFile(dir.path + "/flipped", flipped).ok());
  CheckRefused(Spec("commvq", dir.path + "/flipped"), field, "checksum");
  CheckRefused(Spec("commvq", dir.path + "/none"), field);
  NamespaceSpec spec = Spec("commvq", good);
  spec.geometry.num_kv_heads = 4;  // codebooks are for 2
  CheckRefused(spec, field);
  spec = Spec("commvq", "");
  spec.calibration = bytes->substr(0, 80);
  CheckRefused(spec, "spec.calibration: ");
  spec = Spec("identity", good);
  CheckRefused(spec, field, "takes no calibration");
  spec = Spec("zip", "");
  CheckRefused(spec, "spec.codec: ", "int8_c8");
}

TEST_CASE("int8_c8 namespace: evicted pages round-trip within scale / 2") {
  TempDir dir;
  const C8Scales scales = Scales(Geo(), 9);
  const std::string path = WriteExport(dir.path, "c8", Export(scales));
  CodecParams params;
  params.geometry = Geo();
  auto reference =
      Int8C8Codec::Create(params, std::make_shared<const C8Scales>(scales));
  REQUIRE(reference.ok());
  CheckTierRoundTrip(Spec("int8_c8", path), **reference);
  // The reconstruction itself is within the codec's bound.
  const std::string a = Pages(2, 1);
  const std::string back = Reconstruct(**reference, a);
  const Geometry g = Geo();
  const uint32_t c = scales.kv_channels;
  // Default layout [kv][layer][token][head][dim]: channel = head * dim + d.
  for (size_t i = 0; i < a.size() / 4; ++i) {
    const size_t in_page = i % (g.PageBytes() / 4);
    const uint32_t ch = in_page % c;
    const uint32_t layer = (in_page / (c * g.page_size)) % g.num_layers;
    const int kv = static_cast<int>(in_page / (c * g.page_size * g.num_layers));
    float x, y;
    std::memcpy(&x, &a[i * 4], 4);
    std::memcpy(&y, &back[i * 4], 4);
    REQUIRE(std::fabs(x - y) <= scales.scale(kv, layer)[ch] * 0.5001f);
  }
}

TEST_CASE("commvq namespace: evicted pages decode as the codec reconstructs") {
  TempDir dir;
  const CommVqCodebooks cb =
      testing::RandomCodebooks(testing::SmallCommVqConfig(), 10);
  CodecParams params;
  params.geometry = Geo();
  auto reference =
      CommVqCodec::Create(params, std::make_shared<const CommVqCodebooks>(cb));
  REQUIRE(reference.ok());
  CheckTierRoundTrip(Spec("commvq", WriteCodebooks(dir.path, "cb", cb)),
                     **reference);
}

}  // namespace
}  // namespace kvharbor
