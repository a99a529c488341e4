// SplitKvtcBatch: a batch buffer cut into per-page buffers equals, byte for
// byte, each page encoded alone (identity bases make the projection exact,
// so the batch and the single-page encodes quantize equal coefficients),
// for both row kinds, FP8 and IntX ranges, attention sinks and zstd.
#include "core/kvtc_split.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/kvtc.h"
#include "tests/core/kvtc_test_util.h"

namespace kvharbor {
namespace {

using testing::PageSet;

TEST_CASE("kvtc split: per-page buffers equal one-page encodes",
          "[kvtc][split]") {
  const Geometry g = testing::SmallGeometry();
  for (KvtcRowKind kind : {KvtcRowKind::kPerToken, KvtcRowKind::kPerPage}) {
    for (bool zstd : {false, true}) {
      INFO("kind " << static_cast<int>(kind) << " zstd " << zstd);
      const uint64_t f = testing::FeaturesFor(g, kind);
      // FP8 for the first half of the components, 4-bit IntX after.
      std::vector<KvtcRange> ranges = {{KvtcQuantType::kFp8, 0, 0, f / 2},
                                       {KvtcQuantType::kIntX, 4, f / 2, f}};
      CodecParams params;
      params.geometry = g;
      params.calibration = testing::MakeCalibration(
          g, kind, IdentityBasis(f, f, ranges), IdentityBasis(f, f, ranges),
          /*sink_tokens=*/6);
      params.zstd = zstd;
      auto codec = KvtcCodec::Create(params);
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

}  // namespace
}  // namespace kvharbor
