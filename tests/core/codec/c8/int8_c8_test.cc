#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/base/byte_io.h"
#include "core/base/safetensors.h"
#include "core/codec/c8/int8_c8_codec.h"
#include "core/codec/c8/msmodelslim_c8.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"

namespace kvharbor {
namespace {

using testing::PageSet;
using testing::SmallGeometry;

// Scales with values exactly representable in fp16 (so F16 files round
// trip exactly): scale = k/64, offset an integer in [-8, 8].
C8Scales MakeScales(uint32_t layers, uint32_t channels, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> sc(1, 64), off(-8, 8);
  C8Scales s;
  s.num_layers = layers;
  s.kv_channels = channels;
  for (auto* v : {&s.k_scale, &s.v_scale}) {
    for (uint32_t i = 0; i < layers * channels; ++i)
      v->push_back(sc(rng) / 64.0f);
  }
  for (auto* v : {&s.k_offset, &s.v_offset}) {
    for (uint32_t i = 0; i < layers * channels; ++i) v->push_back(off(rng));
  }
  return s;
}

bool SameScales(const C8Scales& a, const C8Scales& b) {
  return a.num_layers == b.num_layers && a.kv_channels == b.kv_channels &&
         a.k_scale == b.k_scale && a.k_offset == b.k_offset &&
         a.v_scale == b.v_scale && a.v_offset == b.v_offset;
}

TEST_CASE("c8: quantize/dequantize error is at most scale/2", "[c8]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> scale_d(1e-3f, 2.0f), off_d(-20, 20),
      u(0, 1);
  for (int i = 0; i < 200000; ++i) {
    const float scale = scale_d(rng);
    const float offset = std::round(off_d(rng)) + (i % 3 == 0 ? 0.37f : 0.0f);
    // Inside the representable range [(-128 - o) s, (127 - o) s].
    const float lo = (kC8Min - offset) * scale, hi = (kC8Max - offset) * scale;
    const float x = lo + (hi - lo) * u(rng);
    const int8_t q = QuantizeC8(x, scale, offset);
    const float y = DequantizeC8(q, scale, offset);
    const float bound =
        scale * 0.5f * (1.0f + 1e-5f) +
        4 * std::numeric_limits<float>::epsilon() * std::fabs(x);
    REQUIRE(std::fabs(y - x) <= bound);
  }
}

TEST_CASE("c8: saturation and round-half-even", "[c8]") {
  CHECK(QuantizeC8(1e30f, 0.5f, 0.0f) == 127);
  CHECK(QuantizeC8(-1e30f, 0.5f, 0.0f) == -128);
  CHECK(QuantizeC8(std::numeric_limits<float>::infinity(), 1.0f, 3.0f) == 127);
  CHECK(QuantizeC8(200.0f, 1.0f, -10.0f) == 127);
  CHECK(QuantizeC8(-140.0f, 1.0f, 10.0f) == -128);
  CHECK(DequantizeC8(127, 0.5f, 2.0f) == (127.0f - 2.0f) * 0.5f);
  // Ties go to the even integer, like torch.round.
  CHECK(QuantizeC8(2.5f, 1.0f, 0.0f) == 2);
  CHECK(QuantizeC8(3.5f, 1.0f, 0.0f) == 4);
  CHECK(QuantizeC8(-2.5f, 1.0f, 0.0f) == -2);
  CHECK(QuantizeC8(0.25f, 0.5f, 1.5f) == 2);  // 0.5 + 1.5 = 2
  // The run form matches the scalar form.
  const float x[3] = {1.0f, -7.25f, 300.0f}, s[3] = {0.1f, 0.5f, 1.0f},
              o[3] = {0.0f, 3.0f, -1.0f};
  int8_t q[3];
  QuantizeC8Run(x, s, o, 3, q);
  for (int i = 0; i < 3; ++i) CHECK(q[i] == QuantizeC8(x[i], s[i], o[i]));
  float y[3];
  DequantizeC8Run(q, s, o, 3, y);
  for (int i = 0; i < 3; ++i) CHECK(y[i] == DequantizeC8(q[i], s[i], o[i]));
}

TEST_CASE("c8: scales validation names the field", "[c8]") {
  C8Scales s = MakeScales(2, 4, 1);
  REQUIRE(s.Validate().ok());
  auto err = [](const C8Scales& bad) {
    return std::string(bad.Validate().message());
  };
  C8Scales b = s;
  b.k_scale[5] = 0.0f;
  CHECK_THAT(err(b), Catch::Contains("k_scale[layer 1][channel 1]"));
  b = s;
  b.v_scale[0] = std::nanf("");
  CHECK_THAT(err(b), Catch::Contains("v_scale[layer 0][channel 0]"));
  b = s;
  b.v_offset[3] = 128.0f;
  CHECK_THAT(err(b), Catch::Contains("v_offset[layer 0][channel 3]"));
  b = s;
  b.k_offset.pop_back();
  CHECK_THAT(err(b), Catch::Contains("k_offset"));
  b = s;
  b.num_layers = 0;
  CHECK_THAT(err(b), Catch::Contains("num_layers"));
  Geometry g = SmallGeometry();  // 2 layers, 2 heads x 8 dims
  CHECK_THAT(std::string(s.CheckGeometry(g).message()),
             Catch::Contains("kv_channels"));
  CHECK(s.Fingerprint() != b.Fingerprint());
  C8Scales same = s;
  CHECK(s.Fingerprint() == same.Fingerprint());
}

// ---------------------------------------------------------------- loader

struct Files {
  std::string desc;
  std::string weights;
};

Files Serialize(const MsModelSlimC8Files& f) {
  auto w = SerializeSafetensors(f.tensors, {});
  REQUIRE(w.ok());
  return {f.DescriptionJson(), *w};
}

absl::StatusOr<C8Scales> Load(const Files& f, uint32_t layers,
                              uint32_t channels) {
  auto st = SafetensorsFile::FromBytes(f.weights);
  if (!st.ok()) return st.status();
  return ParseC8ScalesFromMsModelSlim(f.desc, *st, layers, channels);
}

std::string LoadError(const Files& f, uint32_t layers = 2,
                      uint32_t channels = 16) {
  auto r = Load(f, layers, channels);
  REQUIRE_FALSE(r.ok());
  return std::string(r.status().message());
}

TEST_CASE("c8: msmodelslim files written and read back", "[c8]") {
  const C8Scales s = MakeScales(2, 16, 3);
  for (auto style : {C8NameStyle::kMergedQkv, C8NameStyle::kSeparateKv}) {
    for (auto dtype : {StDType::kF32, StDType::kF16}) {
      auto files = BuildMsModelSlimC8Files(s, style, dtype);
      REQUIRE(files.ok());
      // Unrelated weights are ignored.
      files->tensors.push_back(
          {"transformer.encoder.layers.0.mlp.weight", StDType::kI8, {2}, "ab"});
      files->description["transformer.encoder.layers.0.mlp.weight"] = "W8A16";
      auto got = Load(Serialize(*files), 2, 16);
      REQUIRE(got.ok());
      CHECK(SameScales(*got, s));
      CHECK(got->model_quant_type == "W8A16");
    }
  }
}

TEST_CASE("c8: loading from a directory", "[c8]") {
  const std::string dir = "/tmp/kvharbor_c8_test_" + std::to_string(getpid());
  REQUIRE(std::system(("mkdir -p " + dir).c_str()) == 0);
  const C8Scales s = MakeScales(2, 16, 5);
  auto files =
      BuildMsModelSlimC8Files(s, C8NameStyle::kSeparateKv, StDType::kF32);
  REQUIRE(files.ok());
  REQUIRE(WriteMsModelSlimC8Files(dir, *files).ok());
  Geometry g = SmallGeometry();
  auto got = LoadC8ScalesFromMsModelSlim(dir, g);
  REQUIRE(got.ok());
  CHECK(SameScales(*got, s));
  g.num_layers = 3;
  auto bad = LoadC8ScalesFromMsModelSlim(dir, g);
  CHECK_THAT(std::string(bad.status().message()),
             Catch::Contains(dir) && Catch::Contains("layer 2"));
  std::remove((dir + "/" + kMsModelSlimDescriptionFile).c_str());
  CHECK(LoadC8ScalesFromMsModelSlim(dir, SmallGeometry()).status().code() ==
        absl::StatusCode::kNotFound);
  std::remove((dir + "/" + kMsModelSlimWeightFile).c_str());
  std::remove(dir.c_str());
}

TEST_CASE("c8: description fields are checked", "[c8]") {
  const C8Scales s = MakeScales(2, 16, 9);
  auto base =
      BuildMsModelSlimC8Files(s, C8NameStyle::kMergedQkv, StDType::kF32);
  REQUIRE(base.ok());
  auto with = [&](auto edit) {
    MsModelSlimC8Files f = *base;
    edit(f);
    return Serialize(f);
  };
  CHECK_THAT(
      LoadError(with([](auto& f) { f.description.erase("kv_cache_type"); })),
      Catch::Contains("kv_cache_type: is missing"));
  CHECK_THAT(
      LoadError(with([](auto& f) { f.description["kv_cache_type"] = "C4"; })),
      Catch::Contains("kv_cache_type") && Catch::Contains("C4"));
  CHECK_THAT(
      LoadError(with([](auto& f) { f.description.erase("model_quant_type"); })),
      Catch::Contains("model_quant_type: is missing"));
  CHECK_THAT(LoadError(with(
                 [](auto& f) { f.description["model_quant_type"] = "W8 A8"; })),
             Catch::Contains("model_quant_type"));
  const std::string k0 =
      "transformer.encoder.layers.0.self_attention.query_key_value.k_proj."
      "kv_cache_scale";
  CHECK_THAT(LoadError(with([&](auto& f) { f.description.erase(k0); })),
             Catch::Contains(kMsModelSlimDescriptionFile) &&
                 Catch::Contains(k0) && Catch::Contains("needs an entry"));
  CHECK_THAT(
      LoadError(with([](auto& f) {
        f.description["model.layers.0.self_attn.v_proj.kv_cache_offset"] =
            "W8A16";
      })),
      Catch::Contains("listed in the description but missing"));
  Files f = Serialize(*base);
  f.desc = R"({"model_quant_type": "W8A16", "kv_cache_type": 8})";
  CHECK_THAT(LoadError(f), Catch::Contains("'kv_cache_type'") &&
                               Catch::Contains("must be a string"));
  f.desc = R"(["C8"])";
  CHECK_THAT(LoadError(f), Catch::Contains("must be a JSON object"));
  f.desc = R"({"kv_cache_type": "C8", "kv_cache_type": "C8"})";
  CHECK_THAT(LoadError(f), Catch::Contains("duplicate key"));
  f.desc = "{";
  CHECK_THAT(LoadError(f), Catch::Contains("not valid JSON"));
}

TEST_CASE("c8: weight tensors are checked", "[c8]") {
  const C8Scales s = MakeScales(2, 16, 11);
  auto base =
      BuildMsModelSlimC8Files(s, C8NameStyle::kSeparateKv, StDType::kF32);
  REQUIRE(base.ok());
  const std::string v1 = "model.layers.1.self_attn.v_proj.kv_cache_offset";
  auto find = [](MsModelSlimC8Files& f, const std::string& name) {
    for (auto& t : f.tensors) {
      if (t.name == name) return &t;
    }
    FAIL("no tensor " << name);
    return &f.tensors[0];
  };
  auto with = [&](auto edit) {
    MsModelSlimC8Files f = *base;
    edit(f);
    return Serialize(f);
  };
  // Missing tensor (and its description entry).
  CHECK_THAT(LoadError(with([&](auto& f) {
               f.tensors.erase(f.tensors.begin() + 7);
               f.description.erase(v1);
             })),
             Catch::Contains("layer 1 v_offset") && Catch::Contains("missing"));
  // Wrong dtypes.
  CHECK_THAT(LoadError(with([&](auto& f) {
               auto* t = find(f, v1);
               t->dtype = StDType::kBF16;
               t->data = *EncodeFloatTensor(std::vector<float>(16, 1.0f),
                                            StDType::kBF16);
             })),
             Catch::Contains(v1 + "'.dtype") && Catch::Contains("BF16"));
  CHECK_THAT(LoadError(with([&](auto& f) {
               auto* t = find(f, v1);
               t->dtype = StDType::kI32;
             })),
             Catch::Contains(v1 + "'.dtype") && Catch::Contains("I32"));
  // Shape mismatch against the geometry.
  CHECK_THAT(LoadError(with([&](auto& f) {
               auto* t = find(f, v1);
               t->shape = {4, 4};
             })),
             Catch::Contains(v1 + "'.shape") && Catch::Contains("[4, 4]"));
  CHECK_THAT(LoadError(Serialize(*base), 2, 8),
             Catch::Contains(".shape") && Catch::Contains("8 channels"));
  // Layers beyond the geometry, duplicates, inconsistent prefixes.
  CHECK_THAT(LoadError(Serialize(*base), 1, 16),
             Catch::Contains("layer 1 is beyond the geometry's 1 layers"));
  CHECK_THAT(LoadError(with([&](auto& f) {
               auto t = *find(f, v1);
               t.name = "transformer.layers.1.attn.v_proj.kv_cache_offset";
               f.description[t.name] = "W8A16";
               f.tensors.push_back(t);
             })),
             Catch::Contains("layer 1's v_offset is also given by"));
  CHECK_THAT(LoadError(with([&](auto& f) {
               auto* t = find(f, v1);
               f.description.erase(t->name);
               t->name = "model.layers.1.attn.v_proj.kv_cache_offset";
               f.description[t->name] = "W8A16";
             })),
             Catch::Contains("does not share the prefix"));
  CHECK_THAT(LoadError(with([&](auto& f) {
               auto* t = find(f, v1);
               f.description.erase(t->name);
               t->name = "model.layer_1.self_attn.v_proj.kv_cache_offset";
               f.description[t->name] = "W8A16";
             })),
             Catch::Contains("no layer index"));
  // Values.
  CHECK_THAT(
      LoadError(with([&](auto& f) {
        auto* t = find(f, "model.layers.0.self_attn.k_proj.kv_cache_scale");
        std::vector<float> v(16, 0.5f);
        v[3] = 0.0f;
        t->data = *EncodeFloatTensor(v, StDType::kF32);
      })),
      Catch::Contains("k_proj.kv_cache_scale'[3]") && Catch::Contains("> 0"));
  CHECK_THAT(LoadError(with([&](auto& f) {
               std::vector<float> v(16, 1.0f);
               v[15] = 200.0f;  // an unsigned-style offset
               find(f, v1)->data = *EncodeFloatTensor(v, StDType::kF32);
             })),
             Catch::Contains(v1 + "'[15]") && Catch::Contains("[-128, 127]"));
  // A broken safetensors file fails in the safetensors layer.
  Files f = Serialize(*base);
  f.weights.resize(f.weights.size() - 1);
  CHECK_THAT(LoadError(f), Catch::Contains("safetensors header"));
}

// ---------------------------------------------------------------- codec
// Buffers carry envelope codec id 3 (kCodecIdInt8C8).

std::shared_ptr<const C8Scales> ScalesFor(const Geometry& g, uint32_t seed) {
  return std::make_shared<C8Scales>(
      MakeScales(g.num_layers, g.num_kv_heads * g.head_dim, seed));
}

TEST_CASE("c8 codec: round trip within scale/2", "[c8_codec]") {
  for (DType dtype : {DType::kFP32, DType::kBF16, DType::kFP16}) {
    for (PageLayout layout :
         {PageLayout::kKvLayerTokenHeadDim, PageLayout::kLayerKvTokenHeadDim}) {
      const Geometry g = SmallGeometry(dtype, layout);
      auto scales = ScalesFor(g, 21);
      CodecParams params;
      params.geometry = g;
      params.zstd = dtype == DType::kBF16;
      auto codec = Int8C8Codec::Create(params, scales);
      REQUIRE(codec.ok());
      PageSet in(g, {0, 4, 100});
      in.FillRandom(5, 1.0f);
      in.Set(1, 3, 1000.0f);  // saturates
      CodecWorkspace ws;
      auto buf = (*codec)->EncodeToString(in.Refs(), &ws);
      REQUIRE(buf.ok());
      CHECK(buf->size() <= *(*codec)->MaxEncodedSize(3));
      PageSet out(g, {0, 4, 100});
      REQUIRE((*codec)->Decode(AsBytes(*buf), out.MutableRefs(), &ws).ok());
      const uint32_t c = g.num_kv_heads * g.head_dim;
      for (size_t p = 0; p < 3; ++p) {
        for (int kv = 0; kv < 2; ++kv) {
          for (uint32_t l = 0; l < g.num_layers; ++l) {
            for (uint32_t t = 0; t < g.page_size; ++t) {
              for (uint32_t ch = 0; ch < c; ++ch) {
                const uint64_t i = testing::ElementIndex(
                    g, kv, l, t, ch / g.head_dim, ch % g.head_dim);
                const float x = in.At(p, i);
                const float s = scales->scale(kv, l)[ch];
                const float o = scales->offset(kv, l)[ch];
                const float want = DequantizeC8(QuantizeC8(x, s, o), s, o);
                // Exactly the reference, rounded to the page dtype.
                testing::PageSet one(g, {0});
                one.Set(0, 0, want);
                REQUIRE(out.At(p, i) == one.At(0, 0));
                if (x >= (kC8Min - o) * s && x <= (kC8Max - o) * s &&
                    dtype == DType::kFP32) {
                  REQUIRE(std::fabs(out.At(p, i) - x) <= s * 0.50001f);
                }
              }
            }
          }
        }
      }
      CHECK(out.At(1, 3) < 1000.0f);  // saturated
    }
  }
}

TEST_CASE("c8 codec: refuses foreign, corrupt and non-finite input",
          "[c8_codec]") {
  const Geometry g = SmallGeometry(DType::kBF16);
  CodecParams params;
  params.geometry = g;
  auto codec = Int8C8Codec::Create(params, ScalesFor(g, 1));
  auto other = Int8C8Codec::Create(params, ScalesFor(g, 2));
  REQUIRE(codec.ok());
  REQUIRE(other.ok());
  PageSet in(g, {8});
  in.FillRandom(3, 2.0f);
  auto buf = (*codec)->EncodeToString(in.Refs(), nullptr);
  REQUIRE(buf.ok());
  PageSet out(g, {8});
  const std::vector<uint8_t> before = out.data[0];
  auto st = (*other)->Decode(AsBytes(*buf), out.MutableRefs(), nullptr);
  CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(st.message()),
             Catch::Contains("calibration_fingerprint"));
  for (size_t cut : {size_t{0}, size_t{100}, buf->size() - 1}) {
    CHECK_FALSE((*codec)
                    ->Decode(AsBytes(absl::string_view(*buf).substr(0, cut)),
                             out.MutableRefs(), nullptr)
                    .ok());
  }
  std::string flipped = *buf;
  flipped[flipped.size() - 5] ^= 1;
  CHECK((*codec)->Decode(AsBytes(flipped), out.MutableRefs(), nullptr).code() ==
        absl::StatusCode::kDataLoss);
  CHECK(out.data[0] == before);  // nothing written on failure
  in.Set(0, 17, std::numeric_limits<float>::infinity());
  auto bad = (*codec)->EncodeToString(in.Refs(), nullptr);
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad.status().message()),
             Catch::Contains("pages[0]") && Catch::Contains("inf"));
}

TEST_CASE("c8 codec: creation checks and registry selection", "[c8]") {
  const Geometry g = SmallGeometry();
  CodecParams params;
  params.geometry = g;
  CHECK_FALSE(Int8C8Codec::Create(params, nullptr).ok());
  auto wrong = std::make_shared<C8Scales>(MakeScales(2, 8, 1));
  CHECK_THAT(std::string(Int8C8Codec::Create(params, wrong).status().message()),
             Catch::Contains("kv_channels"));
  CodecRegistry registry;
  REQUIRE(
      registry.Register(kInt8C8CodecName, Int8C8CodecFactory(ScalesFor(g, 4)))
          .ok());
  auto c = registry.Create(kInt8C8CodecName, params);
  REQUIRE(c.ok());
  CHECK((*c)->name() == "int8_c8");
  CHECK((*c)->id() == kCodecIdInt8C8);
  CHECK(*(*c)->MaxEncodedSize(2) == 128 + 2 * (8 + g.ElementsPerPage()));
  CHECK_FALSE((*c)->MaxEncodedSize(0).ok());
}

}  // namespace
}  // namespace kvharbor
