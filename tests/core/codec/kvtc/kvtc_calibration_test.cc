#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/codec/kvtc/kvtc_codec.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

KvtcCalibration SmallCalibration() {
  const Geometry g = testing::SmallGeometry();
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  KvtcCalibration cal = *testing::MakeCalibration(
      g, KvtcRowKind::kPerToken,
      RandomOrthonormalBasis(
          f, 8, 1,
          {{KvtcQuantType::kFp8, 0, 0, 2}, {KvtcQuantType::kIntX, 2, 2, 8}}),
      RandomOrthonormalBasis(f, 6, 2, {{KvtcQuantType::kIntX, 8, 1, 6}}), 4);
  cal.rope_style = RopeStyle::kHalfSplit;
  cal.rope_theta = 500000.0f;
  for (size_t i = 0; i < cal.keys.mean.size(); ++i)
    cal.keys.mean[i] = 0.01f * i;
  return cal;
}

bool Mentions(const absl::Status& s, const std::string& word) {
  return !s.ok() && std::string(s.message()).find(word) != std::string::npos;
}

TEST_CASE("Calibration validation names the bad field", "[kvtc_calibration]") {
  REQUIRE(SmallCalibration().Validate().ok());
  struct Case {
    const char* field;
    void (*edit)(KvtcCalibration&);
  };
  const Case cases[] = {
      {"keys.ranges[1].start_idx",
       [](KvtcCalibration& c) { c.keys.ranges[1].start_idx = 1; }},
      {"keys.ranges[1].end_idx",
       [](KvtcCalibration& c) { c.keys.ranges[1].end_idx = 9; }},
      {"keys.ranges[1].int_bits",
       [](KvtcCalibration& c) { c.keys.ranges[1].int_bits = 3; }},
      {"keys.ranges[0].int_bits",
       [](KvtcCalibration& c) { c.keys.ranges[0].int_bits = 4; }},
      {"keys.ranges[0]",
       [](KvtcCalibration& c) { c.keys.ranges[0].end_idx = 0; }},
      {"keys.ranges[0].quant_type",
       [](KvtcCalibration& c) {
         c.keys.ranges[0].quant_type = static_cast<KvtcQuantType>(5);
       }},
      {"values.components",
       [](KvtcCalibration& c) { c.values.components = 1000; }},
      {"values.mean", [](KvtcCalibration& c) { c.values.mean.pop_back(); }},
      {"values.projection",
       [](KvtcCalibration& c) {
         c.values.projection[3] = std::numeric_limits<float>::infinity();
       }},
      {"keys.features",
       [](KvtcCalibration& c) {
         c.row_kind = KvtcRowKind::kPerPage;
         c.page_size = 8;
       }},
      {"rope_theta", [](KvtcCalibration& c) { c.rope_theta = 0.0f; }},
      {"head_dim", [](KvtcCalibration& c) { c.head_dim = 7; }},
      {"row_kind",
       [](KvtcCalibration& c) { c.row_kind = static_cast<KvtcRowKind>(9); }},
      {"rope_style",
       [](KvtcCalibration& c) { c.rope_style = static_cast<RopeStyle>(3); }},
  };
  for (const Case& c : cases) {
    KvtcCalibration cal = SmallCalibration();
    c.edit(cal);
    INFO(c.field);
    const absl::Status s = cal.Validate();
    CHECK(Mentions(s, c.field));
  }
}

TEST_CASE("Codec creation checks the calibration against the geometry",
          "[kvtc_calibration]") {
  CodecParams p;
  p.geometry = testing::SmallGeometry();
  p.calibration = std::make_shared<KvtcCalibration>(SmallCalibration());
  REQUIRE(KvtcCodec::Create(p).ok());
  p.geometry.num_layers = 3;
  CHECK(Mentions(KvtcCodec::Create(p).status(), "geometry.num_layers"));
  p.geometry = testing::SmallGeometry();
  p.geometry.rope_theta = 10000.0f;
  CHECK(Mentions(KvtcCodec::Create(p).status(), "geometry.rope_theta"));
  p.calibration = nullptr;
  CHECK(Mentions(KvtcCodec::Create(p).status(), "calibration"));
}

TEST_CASE("Fingerprint follows the content", "[kvtc_calibration]") {
  const KvtcCalibration base = SmallCalibration();
  const uint64_t fp = base.Fingerprint();
  CHECK(KvtcCalibration(base).Fingerprint() == fp);
  KvtcCalibration a = base;
  a.keys.projection[17] = std::nextafter(a.keys.projection[17], 2.0f);
  CHECK(a.Fingerprint() != fp);
  KvtcCalibration b = base;
  b.values.ranges[0].int_bits = 4;
  CHECK(b.Fingerprint() != fp);
  KvtcCalibration c = base;
  c.sink_tokens = 5;
  CHECK(c.Fingerprint() != fp);
  KvtcCalibration d = base;
  d.values.mean[0] = 1.0f;
  CHECK(d.Fingerprint() != fp);
}

TEST_CASE("Calibration file round trip and validation", "[kvtc_calibration]") {
  const KvtcCalibration cal = SmallCalibration();
  auto bytes = SerializeKvtcCalibration(cal);
  REQUIRE(bytes.ok());
  auto span = [](const std::string& s) {
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()),
                               s.size());
  };
  auto back = ParseKvtcCalibration(span(*bytes));
  REQUIRE(back.ok());
  CHECK(back->Fingerprint() == cal.Fingerprint());
  CHECK(back->keys.projection == cal.keys.projection);
  CHECK(back->values.ranges == cal.values.ranges);
  CHECK(back->rope_style == cal.rope_style);
  CHECK(back->rope_theta == cal.rope_theta);
  CHECK(back->sink_tokens == cal.sink_tokens);

  testing::TempDir dir;
  const std::string path = dir.path + "/cal.kvtccal";
  REQUIRE(WriteKvtcCalibrationFile(cal, path).ok());
  auto read = ReadKvtcCalibrationFile(path);
  REQUIRE(read.ok());
  CHECK(read->Fingerprint() == cal.Fingerprint());
  std::remove(path.c_str());
  CHECK(ReadKvtcCalibrationFile(path).status().code() ==
        absl::StatusCode::kNotFound);

  for (size_t len = 0; len < bytes->size(); ++len) {
    INFO("length " << len);
    REQUIRE(!ParseKvtcCalibration(span(bytes->substr(0, len))).ok());
  }
  for (size_t i = 0; i < bytes->size(); ++i) {
    std::string flipped = *bytes;
    flipped[i] ^= 0x04;
    INFO("offset " << i);
    REQUIRE(!ParseKvtcCalibration(span(flipped)).ok());
  }
  CHECK(!SerializeKvtcCalibration(KvtcCalibration()).ok());
}

TEST_CASE("Hostile calibration files are refused before allocating",
          "[kvtc_calibration]") {
  const std::string good = *SerializeKvtcCalibration(SmallCalibration());
  // Patches a u64 field and recomputes the trailing checksum.
  auto patch = [&](size_t off, uint64_t v) {
    std::string s = good;
    std::memcpy(&s[off], &v, 8);
    const uint64_t sum = XXH3_64bits(s.data(), s.size() - 8);
    std::memcpy(&s[s.size() - 8], &sum, 8);
    return s;
  };
  auto span = [](const std::string& s) {
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()),
                               s.size());
  };
  std::string v3 = good;
  v3[8] = 3;  // version
  CHECK(Mentions(ParseKvtcCalibration(span(v3)).status(), "version"));
  std::string magic = good;
  magic[0] = 'X';
  CHECK(Mentions(ParseKvtcCalibration(span(magic)).status(), "magic"));
  // keys.features at 48, keys.components at 56, keys.num_ranges at 64.
  CHECK(Mentions(
      ParseKvtcCalibration(span(patch(48, uint64_t{1} << 40))).status(),
      "projection shape"));
  CHECK(Mentions(ParseKvtcCalibration(span(patch(56, ~uint64_t{0}))).status(),
                 "projection shape"));
  CHECK(Mentions(ParseKvtcCalibration(span(patch(64, 100000))).status(),
                 "num_ranges"));
  CHECK(Mentions(ParseKvtcCalibration(span(patch(48, 40000))).status(),
                 "remain"));
  // Consistent sizes but a non-matching geometry still fail validation.
  CHECK(Mentions(ParseKvtcCalibration(span(patch(48, 31))).status(),
                 "calibration"));
  std::string sum = good;
  sum[60] ^= 1;
  CHECK(Mentions(ParseKvtcCalibration(span(sum)).status(), "checksum"));
}

}  // namespace
}  // namespace kvharbor
