// SplitKvtcBatch: a batch buffer cut into per-page buffers equals, byte for
// byte, each page encoded alone (identity bases make the projection exact,
// so the batch and the single-page encodes quantize equal coefficients),
// for both row kinds, FP8 and IntX ranges, attention sinks and zstd; and
// MergeKvtcPages joins those buffers back into the batch, byte for byte.
#include "core/codec/kvtc/kvtc_split.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/codec/kvtc/kvtc_codec.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"

namespace kvharbor {
namespace {

using testing::PageSet;

// Identity bases with sinks: FP8 for the first 1/fp8_part of the
// components, `bits`-bit IntX after.
CodecParams Params(const Geometry& g, KvtcRowKind kind, uint64_t fp8_part,
                   int bits, bool zstd) {
  const uint64_t f = testing::FeaturesFor(g, kind);
  std::vector<KvtcRange> ranges = {
      {KvtcQuantType::kFp8, 0, 0, f / fp8_part},
      {KvtcQuantType::kIntX, bits, f / fp8_part, f}};
  CodecParams params;
  params.geometry = g;
  params.calibration = testing::MakeCalibration(
      g, kind, IdentityBasis(f, f, ranges), IdentityBasis(f, f, ranges),
      /*sink_tokens=*/6);
  params.zstd = zstd;
  return params;
}

TEST_CASE("kvtc split: per-page buffers equal one-page encodes",
          "[kvtc][split]") {
  const Geometry g = testing::SmallGeometry();
  for (KvtcRowKind kind : {KvtcRowKind::kPerToken, KvtcRowKind::kPerPage}) {
    for (bool zstd : {false, true}) {
      INFO("kind " << static_cast<int>(kind) << " zstd " << zstd);
      // FP8 for the first half of the components, 4-bit IntX after.
      auto codec = KvtcCodec::Create(Params(g, kind, 2, 4, zstd));
      REQUIRE(codec.ok());
      // Pages 0 and 1 hold sinks (4 + 2 tokens), the others none.
      PageSet pages(g, {0, 4, 8, 100, 12});
      pages.FillRandom(7, 1.0f);
      auto batch = (*codec)->EncodeToString(pages.Refs(), nullptr);
      REQUIRE(batch.ok());
      auto split = SplitKvtcBatch(
          (*codec)->calibration(), g,
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(batch->data()),
                              batch->size()),
          zstd);
      INFO(split.status().ToString());
      REQUIRE(split.ok());
      REQUIRE(split->size() == 5);
      const std::vector<PageRef> refs = pages.Refs();
      for (size_t p = 0; p < refs.size(); ++p) {
        INFO("page " << p);
        auto one =
            (*codec)->EncodeToString(absl::MakeConstSpan(&refs[p], 1), nullptr);
        REQUIRE(one.ok());
        CHECK((*split)[p] == *one);
      }
    }
  }
}

TEST_CASE("kvtc split: a foreign buffer is refused", "[kvtc][split]") {
  const Geometry g = testing::SmallGeometry();
  CodecParams params;
  params.geometry = g;
  auto identity = CreateIdentityCodec(params);
  REQUIRE(identity.ok());
  PageSet pages(g, {0});
  auto buf = (*identity)->EncodeToString(pages.Refs(), nullptr);
  REQUIRE(buf.ok());
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  auto cal = testing::MakeCalibration(g, KvtcRowKind::kPerToken,
                                      IdentityBasis(f, f, testing::Fp8All(f)),
                                      IdentityBasis(f, f, testing::Fp8All(f)));
  auto split = SplitKvtcBatch(
      *cal, g,
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(buf->data()),
                          buf->size()));
  CHECK(split.status().code() == absl::StatusCode::kInvalidArgument);
  std::string garbage(64, 'x');
  CHECK(!SplitKvtcBatch(*cal, g,
                        absl::MakeConstSpan(
                            reinterpret_cast<const uint8_t*>(garbage.data()),
                            garbage.size()))
             .ok());
}

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()),
                             s.size());
}

TEST_CASE("kvtc merge: split then merge gives the batch back",
          "[kvtc][split]") {
  const Geometry g = testing::SmallGeometry();
  for (KvtcRowKind kind : {KvtcRowKind::kPerToken, KvtcRowKind::kPerPage}) {
    for (bool zstd : {false, true}) {
      INFO("kind " << static_cast<int>(kind) << " zstd " << zstd);
      // FP8 for the first quarter, 2-bit IntX after; batches without zstd.
      auto codec = KvtcCodec::Create(Params(g, kind, 4, 2, false));
      REQUIRE(codec.ok());
      PageSet pages(g, {0, 4, 8, 100, 12, 44});
      pages.FillRandom(11, 2.0f);
      auto batch = (*codec)->EncodeToString(pages.Refs(), nullptr);
      REQUIRE(batch.ok());
      auto split =
          SplitKvtcBatch((*codec)->calibration(), g, Bytes(*batch), zstd);
      REQUIRE(split.ok());
      std::vector<absl::Span<const uint8_t>> parts;
      for (const std::string& b : *split) parts.push_back(Bytes(b));
      const uint64_t fp = (*codec)->calibration_fingerprint();
      std::vector<uint8_t> out(batch->size() + 64, 0xAB);
      auto n = MergeKvtcPages((*codec)->calibration(), fp, g, parts,
                              absl::MakeSpan(out));
      INFO(n.status().ToString());
      REQUIRE(n.ok());
      CHECK(std::string(out.begin(), out.begin() + *n) == *batch);

      // A subset merges to the batch encode of that subset.
      auto sub = MergeKvtcPages((*codec)->calibration(), fp, g,
                                absl::MakeConstSpan(parts).subspan(2, 3),
                                absl::MakeSpan(out));
      REQUIRE(sub.ok());
      const std::vector<PageRef> refs = pages.Refs();
      auto want = (*codec)->EncodeToString(
          absl::MakeConstSpan(refs).subspan(2, 3), nullptr);
      REQUIRE(want.ok());
      CHECK(std::string(out.begin(), out.begin() + *sub) == *want);

      // Errors name the page; the output must hold the batch.
      std::string bad = (*split)[3];
      bad[bad.size() - 1] ^= 1;
      parts[3] = Bytes(bad);
      auto e = MergeKvtcPages((*codec)->calibration(), fp, g, parts,
                              absl::MakeSpan(out));
      CHECK(e.status().code() == absl::StatusCode::kDataLoss);
      CHECK(e.status().message().find("pages[3]") != absl::string_view::npos);
      parts[3] = Bytes((*split)[3]);
      auto f2 = MergeKvtcPages((*codec)->calibration(), fp + 1, g, parts,
                               absl::MakeSpan(out));
      CHECK(f2.status().message().find("pages[0]: calibration_fingerprint") !=
            absl::string_view::npos);
      auto small = MergeKvtcPages((*codec)->calibration(), fp, g, parts,
                                  absl::MakeSpan(out.data(), 100));
      CHECK(small.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(!MergeKvtcPages((*codec)->calibration(), fp, g, {},
                            absl::MakeSpan(out))
                 .ok());
    }
  }
}

}  // namespace
}  // namespace kvharbor
