// Buffer parsing and rejection: truncation at every offset, every header byte,
// overflowing sizes, overlapping ranges, foreign calibrations, bad data.
#include "core/codec/kvtc/kvtc_format.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/codec/kvtc/kvtc_codec.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"

namespace kvharbor {
namespace {

using testing::PageSet;

struct Fixture {
  Geometry g = testing::SmallGeometry(DType::kBF16);
  std::shared_ptr<KvtcCalibration> cal;
  std::unique_ptr<KvtcCodec> codec;
  std::vector<uint64_t> positions = {2, 8};
  std::vector<uint8_t> buffer;

  explicit Fixture(bool zstd = false, float value = -1.0f) {
    const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
    const std::vector<KvtcRange> ranges = {{KvtcQuantType::kFp8, 0, 0, 8},
                                           {KvtcQuantType::kIntX, 4, 8, 20},
                                           {KvtcQuantType::kIntX, 1, 20, 24}};
    cal = testing::MakeCalibration(g, KvtcRowKind::kPerToken,
                                   RandomOrthonormalBasis(f, 24, 1, ranges),
                                   RandomOrthonormalBasis(f, 24, 2, ranges), 4);
    CodecParams p;
    p.geometry = g;
    p.calibration = cal;
    p.zstd = zstd;
    codec = *KvtcCodec::Create(p);
    PageSet in(g, positions);
    in.FillRandom(1, 1.0f);
    if (value >= 0) {
      for (size_t i = 0; i < in.data.size(); ++i)
        for (uint64_t e = 0; e < in.Elements(); ++e) in.Set(i, e, value);
    }
    auto s = codec->EncodeToString(in.Refs(), nullptr);
    REQUIRE(s.ok());
    buffer.assign(s->begin(), s->end());
  }

  absl::Status Decode(absl::Span<const uint8_t> b) const {
    PageSet out(g, positions);
    const std::vector<uint8_t> before = out.data[0];
    auto refs = out.MutableRefs();
    absl::Status s = codec->Decode(b, refs, nullptr);
    if (!s.ok()) {
      // A refused buffer leaves the pages untouched.
      REQUIRE(out.data[0] == before);
    }
    return s;
  }
  // Applies `edit` to a copy, reseals the checksums and decodes.
  template <typename Edit>
  absl::Status DecodeEdited(Edit edit) const {
    std::vector<uint8_t> b = buffer;
    edit(b.data());
    ResealEnvelopeForTesting(absl::MakeSpan(b));
    return Decode(b);
  }
  size_t PayloadStart() const {
    return kEnvelopeHeaderBytes + 8 * positions.size();
  }
  KvtcPayloadLayout Layout() const { return *codec->PayloadLayout(positions); }
};

template <typename T>
void PutAt(uint8_t* p, size_t off, T v) {
  std::memcpy(p + off, &v, sizeof(T));
}

bool Mentions(const absl::Status& s, const std::string& word) {
  return !s.ok() && std::string(s.message()).find(word) != std::string::npos;
}

TEST_CASE("A valid buffer decodes", "[kvtc_format]") {
  Fixture f;
  CHECK(f.Decode(f.buffer).ok());
  auto env = ParseEnvelope(f.buffer);
  REQUIRE(env.ok());
  CHECK(env->header.codec_id == CodecId::kKvtc);
  CHECK(env->header.num_pages == 2);
  CHECK(env->position(1) == 8);
  CHECK(env->header.calibration_fingerprint == f.cal->Fingerprint());
}

TEST_CASE("Truncation at every offset is refused", "[kvtc_format]") {
  for (bool zstd : {false, true}) {
    Fixture f(zstd, zstd ? 0.5f : -1.0f);
    if (zstd) REQUIRE((f.buffer[12] & kEnvelopeFlagZstd) != 0);
    for (size_t len = 0; len < f.buffer.size(); ++len) {
      INFO("zstd " << zstd << " length " << len);
      REQUIRE(!f.Decode(absl::MakeConstSpan(f.buffer.data(), len)).ok());
      // Even with checksums recomputed over the truncated buffer.
      std::vector<uint8_t> cut(f.buffer.begin(), f.buffer.begin() + len);
      ResealEnvelopeForTesting(absl::MakeSpan(cut));
      REQUIRE(!f.Decode(cut).ok());
    }
    std::vector<uint8_t> longer = f.buffer;
    longer.push_back(0);
    CHECK(Mentions(f.Decode(longer), "length"));
  }
}

TEST_CASE("Any flipped bit fails the checksums", "[kvtc_format]") {
  Fixture f;
  for (size_t i = 0; i < f.buffer.size(); ++i) {
    std::vector<uint8_t> b = f.buffer;
    b[i] ^= 0x10;
    INFO("offset " << i);
    REQUIRE(!f.Decode(b).ok());
  }
}

TEST_CASE("Every envelope header byte is checked", "[kvtc_format]") {
  Fixture f;
  for (size_t i = 0; i < 120; ++i) {
    if (i >= 80 && i < 88) continue;  // body checksum: recomputed by reseal
    INFO("header offset " << i);
    REQUIRE(!f.DecodeEdited([&](uint8_t* p) { p[i] ^= 0x01; }).ok());
  }
  CHECK(Mentions(f.DecodeEdited([](uint8_t* p) { p[0] = 'X'; }), "magic"));
  CHECK(Mentions(f.DecodeEdited([](uint8_t* p) { PutAt<uint16_t>(p, 4, 2); }),
                 "format_version"));
  CHECK(Mentions(
      f.DecodeEdited([](uint8_t* p) { PutAt<uint32_t>(p, 40, 0xFFFFFFFFu); }),
      "num_pages"));
  CHECK(Mentions(f.DecodeEdited([](uint8_t* p) {
    PutAt<uint64_t>(p, 64, std::numeric_limits<uint64_t>::max() - 7);
    PutAt<uint64_t>(p, 72, std::numeric_limits<uint64_t>::max() - 7);
  }),
                 "length"));
  CHECK(Mentions(f.DecodeEdited([](uint8_t* p) {
    PutAt<uint64_t>(p, 72, std::numeric_limits<uint64_t>::max());
  }),
                 "raw_payload_bytes"));
  CHECK(Mentions(f.DecodeEdited([](uint8_t* p) { PutAt<uint32_t>(p, 12, 2); }),
                 "flags"));
  CHECK(Mentions(f.DecodeEdited([](uint8_t* p) { PutAt<uint32_t>(p, 32, 0); }),
                 "head_dim"));
  std::vector<uint8_t> bad_header = f.buffer;
  bad_header[30] ^= 1;
  CHECK(Mentions(f.Decode(bad_header), "header_checksum"));
  std::vector<uint8_t> bad_body = f.buffer;
  bad_body.back() ^= 1;
  CHECK(Mentions(f.Decode(bad_body), "body_checksum"));
}

TEST_CASE("The body checksum can be checked apart from the parse",
          "[kvtc_format]") {
  Fixture f;
  std::vector<uint8_t> bad = f.buffer;
  bad.back() ^= 1;
  // Everything but the body checksum is still checked...
  auto env = ParseEnvelopeDeferBodyChecksum(bad);
  REQUIRE(env.ok());
  CHECK(env->header.body_checksum ==
        ParseEnvelope(f.buffer)->header.body_checksum);
  CHECK(env->payload.size() == f.buffer.size() - f.PayloadStart());
  std::vector<uint8_t> bad_header = f.buffer;
  bad_header[30] ^= 1;
  CHECK(Mentions(ParseEnvelopeDeferBodyChecksum(bad_header).status(),
                 "header_checksum"));
  CHECK(Mentions(
      ParseEnvelopeDeferBodyChecksum(
          absl::MakeConstSpan(f.buffer).subspan(0, f.buffer.size() - 1))
          .status(),
      "length"));
  // ...and the separate check catches the flipped byte.
  CHECK(CheckBodyChecksum(f.buffer, env->header.body_checksum).ok());
  const absl::Status s = CheckBodyChecksum(bad, env->header.body_checksum);
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(Mentions(s, "body_checksum"));
  CHECK(!CheckBodyChecksum(absl::MakeConstSpan(f.buffer).subspan(0, 100), 0)
             .ok());
}

TEST_CASE("Every payload header byte is checked", "[kvtc_format]") {
  Fixture f;
  const KvtcPayloadLayout l = f.Layout();
  std::vector<size_t> offsets;
  for (const KvtcSectionLayout& s : l.sections) {
    for (size_t i = 0; i < kKvtcSectionHeaderBytes; ++i)
      offsets.push_back(s.offset + i);
    for (const KvtcRangeLayout& r : s.ranges)
      for (size_t i = 0; i < kKvtcRangeHeaderBytes; ++i)
        offsets.push_back(r.header_offset + i);
  }
  for (size_t off : offsets) {
    INFO("payload offset " << off);
    REQUIRE(!f.DecodeEdited([&](uint8_t* p) {
                p[f.PayloadStart() + off] ^= 0x80;
              }).ok());
  }
  const size_t r0 = f.PayloadStart() + l.sections[0].ranges[0].header_offset;
  const size_t r1 = f.PayloadStart() + l.sections[0].ranges[1].header_offset;
  const size_t r2 = f.PayloadStart() + l.sections[0].ranges[2].header_offset;
  // Sizes that overflow.
  CHECK(Mentions(f.DecodeEdited([&](uint8_t* p) {
    PutAt<uint64_t>(p, r1 + 24, std::numeric_limits<uint64_t>::max());
  }),
                 "packed_data_bytes"));
  CHECK(Mentions(f.DecodeEdited([&](uint8_t* p) {
    PutAt<uint64_t>(p, r1 + 32, uint64_t{1} << 63);
  }),
                 "metadata_bytes"));
  // Overlapping ranges and ranges past the components.
  CHECK(Mentions(
      f.DecodeEdited([&](uint8_t* p) { PutAt<uint64_t>(p, r1 + 8, 4); }),
      "start_idx"));
  CHECK(Mentions(
      f.DecodeEdited([&](uint8_t* p) { PutAt<uint64_t>(p, r2 + 16, 1000); }),
      "end_idx"));
  CHECK(Mentions(f.DecodeEdited([&](uint8_t* p) { PutAt<int32_t>(p, r0, 7); }),
                 "quant_type"));
  CHECK(Mentions(
      f.DecodeEdited([&](uint8_t* p) { PutAt<int32_t>(p, r1 + 4, 3); }),
      "int_bits"));
  const size_t s0 = f.PayloadStart() + l.sections[0].offset;
  CHECK(Mentions(f.DecodeEdited([&](uint8_t* p) {
    PutAt<uint64_t>(p, s0 + 8, 1ull << 40);
  }),
                 "rows"));
}

TEST_CASE("Bad data inside ranges is refused", "[kvtc_format]") {
  Fixture f;
  const KvtcPayloadLayout l = f.Layout();
  const KvtcRangeLayout& fp8 = l.sections[1].ranges[0];
  const KvtcRangeLayout& intx = l.sections[0].ranges[1];
  const KvtcRangeLayout& sinks = l.sections[2].ranges[0];
  CHECK(Mentions(f.DecodeEdited([&](uint8_t* p) {
    p[f.PayloadStart() + fp8.data_offset + 3] = 0x7F;
  }),
                 "NaN"));
  CHECK(Mentions(f.DecodeEdited([&](uint8_t* p) {
    p[f.PayloadStart() + sinks.data_offset] = 0xFF;
  }),
                 "NaN"));
  // min above max for row 0.
  CHECK(Mentions(f.DecodeEdited([&](uint8_t* p) {
    PutAt<float>(p, f.PayloadStart() + intx.metadata_offset, 1e30f);
  }),
                 "metadata"));
  CHECK(Mentions(f.DecodeEdited([&](uint8_t* p) {
    PutAt<float>(p, f.PayloadStart() + intx.metadata_offset,
                 std::numeric_limits<float>::quiet_NaN());
  }),
                 "metadata"));
}

TEST_CASE("Foreign calibration, codec, geometry and pages are refused",
          "[kvtc_format]") {
  Fixture f;
  // Same shapes, one projection value changed: another fingerprint.
  auto other = std::make_shared<KvtcCalibration>(*f.cal);
  other->keys.projection[5] += 0.25f;
  CodecParams p;
  p.geometry = f.g;
  p.calibration = other;
  auto codec2 = *KvtcCodec::Create(p);
  PageSet out(f.g, f.positions);
  auto refs = out.MutableRefs();
  absl::Status s = codec2->Decode(f.buffer, refs, nullptr);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Mentions(s, "calibration_fingerprint"));

  auto identity = *CreateIdentityCodec(p);
  CHECK(Mentions(identity->Decode(f.buffer, refs, nullptr), "codec_id"));

  p.geometry.dtype = DType::kFP16;
  p.calibration = f.cal;
  auto fp16 = *KvtcCodec::Create(p);
  CHECK(Mentions(fp16->Decode(f.buffer, refs, nullptr), "geometry"));

  refs[1].first_position = 9;
  CHECK(Mentions(f.codec->Decode(f.buffer, refs, nullptr), "first_position"));
  refs.pop_back();
  CHECK(Mentions(f.codec->Decode(f.buffer, refs, nullptr), "pages"));
}

}  // namespace
}  // namespace kvharbor
