#include "core/codec/commvq/commvq_format.h"

#include <xxh3.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/base/byte_io.h"
#include "core/codec/commvq/commvq_codec.h"
#include "core/codec/envelope.h"
#include "core/codec/kvtc/kvtc_stages.h"
#include "tests/core/codec/commvq/commvq_test_util.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"

namespace kvharbor {
namespace {

using testing::RandomCodebooks;
using testing::SmallCommVqConfig;

std::string Serialize(const CommVqCodebooks& cb) {
  auto s = SerializeCommVqCodebooks(cb);
  REQUIRE(s.ok());
  return *s;
}

// Rewrites the trailing checksum so a deliberate edit reaches the field
// checks instead of failing on the checksum.
std::string Resealed(std::string b) {
  const uint64_t h = XXH3_64bits(b.data(), b.size() - 8);
  std::memcpy(&b[b.size() - 8], &h, 8);
  return b;
}

template <typename T>
std::string Patched(std::string b, size_t off, T v) {
  std::memcpy(&b[off], &v, sizeof(T));
  return Resealed(std::move(b));
}

std::string ParseError(const std::string& b) {
  auto cb = ParseCommVqCodebooks(AsBytes(b));
  REQUIRE_FALSE(cb.ok());
  return std::string(cb.status().message());
}

TEST_CASE("commvq file: written and read back", "[commvq]") {
  for (RopeStyle style : {RopeStyle::kNone, RopeStyle::kHalfSplit}) {
    const CommVqCodebooks cb = RandomCodebooks(SmallCommVqConfig(style), 1);
    const std::string b = Serialize(cb);
    CHECK(b.size() == 64 + 4 * (cb.key.size() + cb.value.size()) + 8);
    CHECK(b.compare(0, 8, "KVHCMVQ1") == 0);
    auto back = ParseCommVqCodebooks(AsBytes(b));
    REQUIRE(back.ok());
    CHECK(back->key == cb.key);
    CHECK(back->value == cb.value);
    CHECK(back->config.rope_style == style);
    CHECK(back->Fingerprint() == cb.Fingerprint());
    // The fingerprint is the file's checksum.
    uint64_t stored;
    std::memcpy(&stored, b.data() + b.size() - 8, 8);
    CHECK(stored == cb.Fingerprint());
  }
  const std::string path = "/tmp/kvharbor_commvq_format_test.cvq";
  const CommVqCodebooks cb = RandomCodebooks(SmallCommVqConfig(), 2);
  REQUIRE(WriteCommVqCodebooksFile(cb, path).ok());
  auto back = ReadCommVqCodebooksFile(path);
  REQUIRE(back.ok());
  CHECK(back->key == cb.key);
  std::remove(path.c_str());
  CHECK(ReadCommVqCodebooksFile(path).status().code() ==
        absl::StatusCode::kNotFound);
  CommVqCodebooks bad = cb;
  bad.value[0] = std::nanf("");
  CHECK_FALSE(SerializeCommVqCodebooks(bad).ok());
}

TEST_CASE("commvq file: every header field is checked", "[commvq]") {
  const std::string ok = Serialize(RandomCodebooks(SmallCommVqConfig(), 3));
  CHECK_THAT(ParseError(Patched<char>(ok, 7, '2')),
             Catch::Contains("header.magic"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 8, 2)),
             Catch::Contains("header.format_version"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 12, 60)),
             Catch::Contains("header.header_bytes"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 16, 0)),
             Catch::Contains("header.num_layers"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 16, 3)),
             Catch::Contains("length") && Catch::Contains("header describes"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 20, 0)),
             Catch::Contains("header.num_kv_heads"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 24, 7)),
             Catch::Contains("header.head_dim"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 28, 3)),
             Catch::Contains("header.rope_style"));
  CHECK_THAT(ParseError(Patched<float>(ok, 32, 500.0f)),
             Catch::Contains("header.rope_theta"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 36, 12)),
             Catch::Contains("header.key_levels"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 40, 3)),
             Catch::Contains("header.key_group_pairs"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 44, 0)),
             Catch::Contains("header.key_stages"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 48, 0)),
             Catch::Contains("header.value_stage_rows"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 52, 0xffffffffu)),
             Catch::Contains("header.value_stages"));
  CHECK_THAT(ParseError(Patched<uint64_t>(ok, 56, 1)),
             Catch::Contains("header.reserved"));
  // Sizes that would overflow or exceed the limits are refused before any
  // allocation.
  std::string huge = Patched<uint32_t>(ok, 20, 1024);
  huge = Patched<uint32_t>(huge, 24, 4096);
  huge = Patched<uint32_t>(huge, 44, 64);
  CHECK_THAT(ParseError(huge), Catch::Contains("over the limit"));
}

TEST_CASE("commvq file: length, checksum and values", "[commvq]") {
  const std::string ok = Serialize(RandomCodebooks(SmallCommVqConfig(), 4));
  for (size_t n = 0; n < ok.size(); n += (n < 80 ? 1 : 97)) {
    REQUIRE_FALSE(ParseCommVqCodebooks(AsBytes(ok.substr(0, n))).ok());
  }
  CHECK_THAT(ParseError(ok.substr(0, 10)), Catch::Contains("length"));
  CHECK_THAT(ParseError(ok + "x"), Catch::Contains("length"));
  std::string flipped = ok;
  flipped[100] ^= 0x10;
  auto st = ParseCommVqCodebooks(AsBytes(flipped));
  CHECK(st.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(st.status().message()), Catch::Contains("checksum"));
  CHECK_THAT(ParseError(Patched<float>(ok, 64 + 4 * 5,
                                       std::numeric_limits<float>::infinity())),
             Catch::Contains("key_codebooks[5]"));
  const size_t value0 = 64 + 4 * SmallCommVqConfig().key_floats() + 4 * 2;
  CHECK_THAT(ParseError(Patched<float>(ok, value0, std::nanf(""))),
             Catch::Contains("value_codebooks[2]"));
}

// ---------------------------------------------------------------- codec
// Buffers carry envelope codec id 4 (kCodecIdCommVq).

Geometry GeometryFor(const CommVqConfig& c, DType dtype, PageLayout layout) {
  Geometry g;
  g.num_layers = c.num_layers;
  g.num_kv_heads = c.num_kv_heads;
  g.head_dim = c.head_dim;
  g.page_size = 4;
  g.dtype = dtype;
  g.layout = layout;
  g.rope_theta = c.rope_theta;
  return g;
}

TEST_CASE("commvq codec: creation and sizes", "[commvq]") {
  const CommVqConfig c = SmallCommVqConfig(RopeStyle::kInterleaved);
  auto cb = std::make_shared<CommVqCodebooks>(RandomCodebooks(c, 5));
  CodecParams params;
  params.geometry =
      GeometryFor(c, DType::kBF16, PageLayout::kKvLayerTokenHeadDim);
  auto codec = CommVqCodec::Create(params, cb);
  REQUIRE(codec.ok());
  CHECK((*codec)->KeyRecordBytes() == (c.key_bits_per_token() + 7) / 8);
  CHECK((*codec)->ValueRecordBytes() == 2);
  CHECK(*(*codec)->MaxEncodedSize(3) ==
        128 + 3 * (8 + 2 * 4 * ((*codec)->KeyRecordBytes() + 2)));
  params.geometry.rope_theta = 500000.0f;
  CHECK_THAT(std::string(CommVqCodec::Create(params, cb).status().message()),
             Catch::Contains("rope_theta"));
  params.geometry.rope_theta = 0.0f;  // unstated: the codebook's is used
  CHECK(CommVqCodec::Create(params, cb).ok());
  params.geometry.head_dim = 16;
  CHECK_FALSE(CommVqCodec::Create(params, cb).ok());
  CHECK_FALSE(CommVqCodec::Create(params, nullptr).ok());
  CodecRegistry registry;
  REQUIRE(registry.Register(kCommVqCodecName, CommVqCodecFactory(cb)).ok());
  params.geometry.head_dim = 8;
  auto made = registry.Create("commvq", params);
  REQUIRE(made.ok());
  CHECK((*made)->id() == kCodecIdCommVq);
}

TEST_CASE("commvq codec: round trip through pages", "[commvq_codec]") {
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    for (PageLayout layout :
         {PageLayout::kKvLayerTokenHeadDim, PageLayout::kLayerKvTokenHeadDim}) {
      const CommVqConfig c = SmallCommVqConfig(style);
      auto cb = std::make_shared<CommVqCodebooks>(RandomCodebooks(c, 6));
      CodecParams params;
      params.geometry = GeometryFor(c, DType::kFP32, layout);
      params.zstd = layout == PageLayout::kLayerKvTokenHeadDim;
      auto codec = CommVqCodec::Create(params, cb);
      REQUIRE(codec.ok());
      auto enc = CommVqEncoder::Create(cb);
      REQUIRE(enc.ok());
      testing::PageSet in(params.geometry, {0, 4, 1000});
      in.FillRandom(7, 1.0f);
      CodecWorkspace ws;
      auto buf = (*codec)->EncodeToString(in.Refs(), &ws);
      REQUIRE(buf.ok());
      testing::PageSet out(params.geometry, {0, 4, 1000});
      REQUIRE((*codec)->Decode(AsBytes(*buf), out.MutableRefs(), &ws).ok());
      // Each token equals the reference: un-rotate, encode, decode, rotate.
      const Geometry& g = params.geometry;
      const uint32_t half = c.head_dim / 2;
      std::vector<float> scratch((*enc)->ScratchFloats()), v(c.dim()),
          dec(c.dim());
      std::vector<float> cos(half), sin(half);
      std::vector<uint16_t> codes(c.key_codes());
      std::vector<uint8_t> bits(2);
      for (size_t p = 0; p < 3; ++p) {
        for (uint32_t l = 0; l < g.num_layers; ++l) {
          for (uint32_t t = 0; t < g.page_size; ++t) {
            RopeCosSin(in.positions[p] + t, g.head_dim, c.rope_theta,
                       cos.data(), sin.data());
            for (int kv = 0; kv < 2; ++kv) {
              for (uint32_t e = 0; e < c.dim(); ++e) {
                v[e] =
                    in.At(p, testing::ElementIndex(g, kv, l, t, e / 8, e % 8));
              }
              if (kv == 0) {
                for (uint32_t h = 0; h < 2; ++h) {
                  RotateRope(v.data() + 8 * h, 8, style, cos.data(), sin.data(),
                             true);
                }
                (*enc)->EncodeKey(l, v.data(), codes.data(), scratch.data());
                DecodeCommVqKey(*cb, l, codes.data(), dec.data());
                for (uint32_t h = 0; h < 2; ++h) {
                  RotateRope(dec.data() + 8 * h, 8, style, cos.data(),
                             sin.data(), false);
                }
              } else {
                (*enc)->EncodeValue(l, v.data(), bits.data(), scratch.data());
                DecodeCommVqValue(*cb, l, bits.data(), dec.data());
              }
              for (uint32_t e = 0; e < c.dim(); ++e) {
                REQUIRE(out.At(p, testing::ElementIndex(g, kv, l, t, e / 8,
                                                        e % 8)) == dec[e]);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("commvq codec: refuses foreign and corrupt buffers",
          "[commvq_codec]") {
  const CommVqConfig c = SmallCommVqConfig();
  auto cb = std::make_shared<CommVqCodebooks>(RandomCodebooks(c, 8));
  auto other = std::make_shared<CommVqCodebooks>(RandomCodebooks(c, 9));
  CodecParams params;
  params.geometry =
      GeometryFor(c, DType::kFP16, PageLayout::kKvLayerTokenHeadDim);
  auto codec = CommVqCodec::Create(params, cb);
  auto codec2 = CommVqCodec::Create(params, other);
  REQUIRE(codec.ok());
  REQUIRE(codec2.ok());
  testing::PageSet in(params.geometry, {12});
  in.FillRandom(1, 1.0f);
  auto buf = (*codec)->EncodeToString(in.Refs(), nullptr);
  REQUIRE(buf.ok());
  testing::PageSet out(params.geometry, {12});
  const auto before = out.data[0];
  CHECK((*codec2)->Decode(AsBytes(*buf), out.MutableRefs(), nullptr).code() ==
        absl::StatusCode::kFailedPrecondition);
  testing::PageSet moved(params.geometry, {16});
  CHECK_THAT(
      std::string((*codec)
                      ->Decode(AsBytes(*buf), moved.MutableRefs(), nullptr)
                      .message()),
      Catch::Contains("first_position"));
  // A set padding bit (key records are 36 bits: 4 unused) is refused even
  // with a valid checksum.
  std::string padded = *buf;
  const size_t payload = 128 + 8;
  padded[payload + (*codec)->KeyRecordBytes() - 1] |= 0x80;
  ResealEnvelopeForTesting(
      absl::MakeSpan(reinterpret_cast<uint8_t*>(padded.data()), padded.size()));
  CHECK_THAT(
      std::string((*codec)
                      ->Decode(AsBytes(padded), out.MutableRefs(), nullptr)
                      .message()),
      Catch::Contains("padding"));
  CHECK(out.data[0] == before);
  in.Set(0, 3, std::nanf(""));
  CHECK_THAT(
      std::string(
          (*codec)->EncodeToString(in.Refs(), nullptr).status().message()),
      Catch::Contains("pages[0]") && Catch::Contains("non-finite"));
}

}  // namespace
}  // namespace kvharbor
