#include "core/codec/codec.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/codec/envelope.h"
#include "core/codec/kvtc/kvtc_codec.h"
#include "core/codec/kvtc/kvtc_format.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"

namespace kvharbor {
namespace {

using testing::PageSet;

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()),
                             s.size());
}

TEST_CASE("Identity codec round trip is byte-exact", "[codec]") {
  for (DType dtype :
       {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3}) {
    for (PageLayout layout :
         {PageLayout::kKvLayerTokenHeadDim, PageLayout::kLayerKvTokenHeadDim}) {
      for (bool zstd : {false, true}) {
        INFO(DTypeName(dtype)
             << " " << PageLayoutName(layout) << " zstd " << zstd);
        CodecParams p;
        p.geometry = testing::SmallGeometry(dtype, layout);
        p.zstd = zstd;
        auto codec = CodecRegistry::Default().Create("identity", p);
        REQUIRE(codec.ok());
        PageSet in(p.geometry, {0, 4, 1000});
        in.FillRandom(3, 1.0f);
        for (uint64_t i = 0; i < in.Elements() / 2; ++i) in.Set(1, i, 0.0f);
        auto buf = (*codec)->EncodeToString(in.Refs(), nullptr);
        REQUIRE(buf.ok());
        CHECK(buf->size() <= *(*codec)->MaxEncodedSize(3));
        PageSet out(p.geometry, in.positions);
        auto refs = out.MutableRefs();
        REQUIRE((*codec)->Decode(Bytes(*buf), refs, nullptr).ok());
        CHECK(out.data == in.data);
        // Identity buffers are checked like any other.
        std::string bad = *buf;
        bad[bad.size() / 2] ^= 1;
        CHECK(!(*codec)->Decode(Bytes(bad), refs, nullptr).ok());
        for (size_t len : {size_t{0}, size_t{100}, buf->size() - 1}) {
          CHECK(!(*codec)
                     ->Decode(Bytes(buf->substr(0, len)), refs, nullptr)
                     .ok());
        }
      }
    }
  }
}

TEST_CASE("Codec registry", "[codec]") {
  CodecRegistry& r = CodecRegistry::Default();
  const std::vector<std::string> names = r.Names();
  CHECK(std::find(names.begin(), names.end(), "identity") != names.end());
  CHECK(std::find(names.begin(), names.end(), "kvtc") != names.end());
  CodecParams p;
  p.geometry = testing::SmallGeometry();
  auto unknown = r.Create("lz77", p);
  CHECK(unknown.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(unknown.status().message()).find("identity") !=
        std::string::npos);
  CHECK(r.Register("identity", CreateIdentityCodec).code() ==
        absl::StatusCode::kAlreadyExists);
  CHECK(!r.Register("", CreateIdentityCodec).ok());
  CHECK(!r.Create("kvtc", p).ok());  // no calibration
  const uint64_t f = testing::FeaturesFor(p.geometry, KvtcRowKind::kPerToken);
  p.calibration =
      testing::MakeCalibration(p.geometry, KvtcRowKind::kPerToken,
                               IdentityBasis(f, f, testing::Fp8All(f)),
                               IdentityBasis(f, f, testing::Fp8All(f)));
  auto kvtc = r.Create("kvtc", p);
  REQUIRE(kvtc.ok());
  CHECK((*kvtc)->id() == CodecId::kKvtc);
  CHECK((*kvtc)->name() == "kvtc");
  p.geometry.head_dim = 0;
  CHECK(!r.Create("identity", p).ok());
}

std::unique_ptr<Codec> SmallKvtc(DType dtype = DType::kBF16) {
  CodecParams p;
  p.geometry = testing::SmallGeometry(dtype);
  const uint64_t f = testing::FeaturesFor(p.geometry, KvtcRowKind::kPerToken);
  const std::vector<KvtcRange> ranges = {{KvtcQuantType::kFp8, 0, 0, 4},
                                         {KvtcQuantType::kIntX, 2, 4, f}};
  p.calibration =
      testing::MakeCalibration(p.geometry, KvtcRowKind::kPerToken,
                               RandomOrthonormalBasis(f, f, 1, ranges),
                               RandomOrthonormalBasis(f, f, 2, ranges), 4);
  return *CodecRegistry::Default().Create("kvtc", p);
}

TEST_CASE("Encode checks its inputs and output space", "[codec]") {
  auto codec = SmallKvtc();
  PageSet in(codec->geometry(), {0, 4});
  in.FillRandom(1, 1.0f);
  auto refs = in.Refs();
  const size_t need = *codec->EncodedSize(refs);
  std::vector<uint8_t> out(need - 1);
  CHECK(codec->Encode(refs, absl::MakeSpan(out), nullptr).status().code() ==
        absl::StatusCode::kResourceExhausted);
  out.resize(need);
  auto n = codec->Encode(refs, absl::MakeSpan(out), nullptr);
  REQUIRE(n.ok());
  CHECK(*n == need);

  CHECK(!codec->Encode({}, absl::MakeSpan(out), nullptr).ok());
  std::vector<PageRef> bad = refs;
  bad[1].data = nullptr;
  CHECK(std::string(
            codec->Encode(bad, absl::MakeSpan(out), nullptr).status().message())
            .find("pages[1].data") != std::string::npos);
  bad = refs;
  bad[0].first_position = std::numeric_limits<uint64_t>::max();
  CHECK(std::string(codec->EncodedSize(bad).status().message())
            .find("pages[0].first_position") != std::string::npos);
}

TEST_CASE("CheckEnvelopeMatches needs page data only where it writes",
          "[codec]") {
  auto codec = SmallKvtc();
  PageSet in(codec->geometry(), {0, 4});
  in.FillRandom(2, 1.0f);
  auto buf = codec->EncodeToString(in.Refs(), nullptr);
  REQUIRE(buf.ok());
  auto env = ParseEnvelope(Bytes(*buf));
  REQUIRE(env.ok());
  std::vector<MutablePageRef> refs = {{nullptr, 0}, {nullptr, 4}};
  // A decode into the pages needs their pointers; one that writes elsewhere
  // (the GPU decode into an engine layout) checks only the positions.
  absl::Status s =
      CheckEnvelopeMatches(*env, CodecId::kKvtc, codec->geometry(), refs);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("pages[0].data") != std::string::npos);
  CHECK(CheckEnvelopeMatches(*env, CodecId::kKvtc, codec->geometry(), refs,
                             PageDataUse::kNotWritten)
            .ok());
  refs[1].first_position = 8;
  s = CheckEnvelopeMatches(*env, CodecId::kKvtc, codec->geometry(), refs,
                           PageDataUse::kNotWritten);
  CHECK(std::string(s.message()).find("pages[1].first_position") !=
        std::string::npos);
  refs.pop_back();
  CHECK(!CheckEnvelopeMatches(*env, CodecId::kKvtc, codec->geometry(), refs,
                              PageDataUse::kNotWritten)
             .ok());
}

TEST_CASE("KVTC refuses non-finite input", "[codec]") {
  auto codec = SmallKvtc(DType::kFP32);
  const Geometry& g = codec->geometry();
  for (float v : {std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::infinity()}) {
    for (uint32_t token : {0u, 3u}) {  // page at 2: token 0 is a sink
      PageSet in(g, {2, 8});
      in.FillRandom(2, 1.0f);
      in.Set(0, testing::ElementIndex(g, 1, 1, token, 1, 3), v);
      auto s = codec->EncodeToString(in.Refs(), nullptr).status();
      INFO(s.ToString());
      CHECK(s.code() == absl::StatusCode::kInvalidArgument);
      CHECK(std::string(s.message()).find("pages[0]") != std::string::npos);
    }
  }
  // Finite values whose IntX span overflows float.
  CodecParams p;
  p.geometry = g;
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  p.calibration = testing::MakeCalibration(
      g, KvtcRowKind::kPerToken, IdentityBasis(f, f, testing::IntXAll(f, 4)),
      IdentityBasis(f, f, testing::IntXAll(f, 4)));
  auto identity_basis = *KvtcCodec::Create(p);
  PageSet huge(g, {8});
  huge.FillRandom(2, 1.0f);
  REQUIRE(identity_basis->EncodeToString(huge.Refs(), nullptr).ok());
  huge.Set(0, 5, 3e38f);
  huge.Set(0, 6, -3e38f);
  auto s = identity_basis->EncodeToString(huge.Refs(), nullptr).status();
  CHECK(std::string(s.message()).find("span") != std::string::npos);
}

TEST_CASE("Codecs are safe to share across threads with own workspaces",
          "[codec]") {
  auto codec = SmallKvtc();
  PageSet in(codec->geometry(), {0, 4, 8, 12});
  in.FillRandom(4, 1.0f);
  const std::string want = *codec->EncodeToString(in.Refs(), nullptr);
  std::vector<std::string> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      CodecWorkspace ws;
      for (int i = 0; i < 20; ++i)
        got[t] = *codec->EncodeToString(in.Refs(), &ws);
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& s : got) CHECK(s == want);
  // A reused workspace stops growing.
  CodecWorkspace ws;
  REQUIRE(codec->EncodeToString(in.Refs(), &ws).ok());
  const size_t reserved = ws.ReservedBytes();
  CHECK(reserved > 0);
  REQUIRE(codec->EncodeToString(in.Refs(), &ws).ok());
  CHECK(ws.ReservedBytes() == reserved);
}

}  // namespace
}  // namespace kvharbor
