// RAW fetches of cold pages and what follows them on the CPU:
//  * promote_on_fetch: decoded cold pages go back into free pool slots (the
//    host pool is tier 0 here, the same code path as a device pool), the
//    index records the tier change, nothing is evicted for them and the
//    path invariant holds;
//  * the device-tier plumbing, with a fake DeviceTier whose encoder and
//    decoder run the CPU codec (the decoder over MergeKvtcPages batches, as
//    the GPU one): fetches decode cold pages in batches through the decoder
//    of each page's calibration, the CPU codec takes over a page the
//    decoder refuses, and after a calibration switch the new calibration's
//    encoder and decoder are used (tests/cuda/gpu_tier_e2e.cc runs the real
//    ones).
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/codec/kvtc/kvtc_split.h"
#include "core/store/device_tier.h"
#include "core/store/namespace.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"
#include "tests/core/store/tiers_test_util.h"

namespace kvharbor {
namespace {

using namespace testing;  // NOLINT: the tier test helpers

std::vector<Tier> TiersOf(Namespace& ns, const std::vector<Token>& t) {
  auto m = ns.Match(t, false, absl::ZeroDuration());
  REQUIRE(m.ok());
  return m->tiers;
}

TEST_CASE("promote_on_fetch: fetched cold pages return to the pool") {
  TempDir dir;
  NamespaceConfig c = Config(1 << 20, dir.path + "/disk");
  c.promote_on_fetch = true;
  auto ns = Make(c, 4);
  const std::string a = Pages(2, 1), b = Pages(2, 2), d = Pages(2, 3);
  Insert(*ns, Seq(0, 8), a);
  Insert(*ns, Seq(100, 8), b);
  REQUIRE(*ns->tiers().DemoteAll(Tier::kDisk) == 8);  // 4 raw -> host -> disk
  REQUIRE(ns->Counters().tiers[2].pages == 4);

  // A leased fetch: bytes exact, pages raw again under new handles, the
  // lease follows them.
  auto m = ns->Match(Seq(0, 8), /*lock=*/true, absl::ZeroDuration());
  REQUIRE(m.ok());
  {
    auto pinned = ns->PinLease(m->lease_id, 0, 0, FetchFormat::kRaw);
    REQUIRE(pinned.ok());
    REQUIRE(pinned->size() == 2);
    CHECK(std::string(pinned->bytes(0)) + std::string(pinned->bytes(1)) == a);
    CHECK(pinned->tier(0) == Tier::kDisk);  // where it was read from
    CHECK(pinned->handle(0) != m->pages[0]);
    CHECK(*ns->TierOf(pinned->handle(1)) == Tier::kRaw);
    CHECK(!ns->TierOf(m->pages[0]).ok());  // the cold handle is gone
  }
  NamespaceStats k = ns->Counters();
  CHECK(k.promoted_pages == 2);
  CHECK(k.tiers[0].pages == 2);
  CHECK(k.tiers[2].pages == 2);
  CHECK(PageFiles(dir.path + "/disk").size() == 2);
  CHECK(TiersOf(*ns, Seq(0, 8)) == std::vector<Tier>{Tier::kRaw, Tier::kRaw});
  {
    auto again = ns->PinLease(m->lease_id, 0, 0, FetchFormat::kRaw);
    REQUIRE(again.ok());
    CHECK(again->tier(0) == Tier::kRaw);
    CHECK(std::string(again->bytes(0)) + std::string(again->bytes(1)) == a);
  }
  REQUIRE(ns->Release(m->lease_id).ok());
  REQUIRE(ns->CheckInvariants().ok());

  // The second page of b alone: its predecessor is cold, so the path
  // invariant keeps it cold (the free slot goes back).
  auto mb = ns->Match(Seq(100, 8), false, absl::ZeroDuration());
  REQUIRE(mb.ok());
  {
    auto tail = ns->PinPages({mb->pages[1]}, FetchFormat::kRaw);
    REQUIRE(tail.ok());
    CHECK(std::string(tail->bytes(0)) == b.substr(b.size() / 2));
  }
  CHECK(TiersOf(*ns, Seq(100, 8)) ==
        std::vector<Tier>{Tier::kDisk, Tier::kDisk});
  CHECK(ns->Counters().free_pages == 2);

  // A full pool: nothing is evicted or demoted to make room.
  Insert(*ns, Seq(200, 8), d);
  REQUIRE(ns->Counters().free_pages == 0);
  CHECK(Fetch(*ns, Seq(100, 8), FetchFormat::kRaw) == b);
  k = ns->Counters();
  CHECK(k.promoted_pages == 2);
  CHECK(k.tiers[0].pages == 4);
  CHECK(TiersOf(*ns, Seq(100, 8)) ==
        std::vector<Tier>{Tier::kDisk, Tier::kDisk});
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("promote_on_fetch off (default): fetched cold pages stay cold") {
  auto ns = Make(Config(1 << 20), 4);
  const std::string a = Pages(2, 4);
  Insert(*ns, Seq(0, 8), a);
  REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 2);
  CHECK(Fetch(*ns, Seq(0, 8), FetchFormat::kRaw) == a);
  CHECK(ns->Counters().promoted_pages == 0);
  CHECK(TiersOf(*ns, Seq(0, 8)) ==
        std::vector<Tier>{Tier::kHostCompressed, Tier::kHostCompressed});
}

// What the fake tier's codecs did, by calibration fingerprint.
struct FakeLog {
  std::map<uint64_t, uint64_t> encoded_pages, decoded_pages, decode_calls;
  uint64_t refuse_position = UINT64_MAX;  // the decoder fails this page
};

std::shared_ptr<const Codec> CpuCodec(const DeviceEncoderParams& p) {
  CodecParams cp;
  cp.geometry = p.geometry;
  cp.calibration_bytes = p.calibration_bytes;
  auto codec = CodecRegistry::Default().Create(p.codec, cp);
  REQUIRE(codec.ok());
  return std::shared_ptr<const Codec>(*std::move(codec));
}

class FakeEncoder final : public PageBatchEncoder {
 public:
  FakeEncoder(std::shared_ptr<const Codec> c, FakeLog* log)
      : codec_(std::move(c)), log_(log) {}
  std::vector<absl::StatusOr<std::string>> EncodeEach(
      absl::Span<const PageRef> pages) override {
    std::vector<absl::StatusOr<std::string>> out;
    for (const PageRef& p : pages) {
      out.push_back(codec_->EncodeToString(absl::MakeConstSpan(&p, 1), &ws_));
    }
    log_->encoded_pages[codec_->calibration_fingerprint()] += pages.size();
    return out;
  }

 private:
  std::shared_ptr<const Codec> codec_;
  FakeLog* log_;
  CodecWorkspace ws_;
};

// The GPU decoder's steps on the CPU: merge the page buffers into one
// batch, decode the batch.
class FakeDecoder final : public PageBatchDecoder {
 public:
  FakeDecoder(std::shared_ptr<const Codec> c, const DeviceEncoderParams& p,
              FakeLog* log)
      : codec_(std::move(c)), geometry_(p.geometry), log_(log) {
    auto cal = ParseKvtcCalibration(absl::MakeConstSpan(
        reinterpret_cast<const uint8_t*>(p.calibration_bytes->data()),
        p.calibration_bytes->size()));
    REQUIRE(cal.ok());
    cal_ = *std::move(cal);
  }
  std::vector<absl::Status> DecodeEach(
      absl::Span<const absl::Span<const uint8_t>> buffers,
      absl::Span<const MutablePageRef> pages) override {
    const uint64_t fp = codec_->calibration_fingerprint();
    ++log_->decode_calls[fp];
    std::vector<absl::Status> out(pages.size());
    std::vector<absl::Span<const uint8_t>> bufs;
    std::vector<MutablePageRef> refs;
    for (size_t i = 0; i < pages.size(); ++i) {
      if (pages[i].first_position == log_->refuse_position) {
        out[i] = absl::InternalError("refused by the fake decoder");
        continue;
      }
      bufs.push_back(buffers[i]);
      refs.push_back(pages[i]);
    }
    std::vector<uint8_t> merged(
        *codec_->MaxEncodedSize(std::max<size_t>(refs.size(), 1)));
    auto n = MergeKvtcPages(cal_, fp, geometry_, bufs, absl::MakeSpan(merged));
    REQUIRE(n.ok());
    REQUIRE(codec_->Decode(absl::MakeConstSpan(merged.data(), *n), refs, &ws_)
                .ok());
    log_->decoded_pages[fp] += refs.size();
    return out;
  }

 private:
  std::shared_ptr<const Codec> codec_;
  Geometry geometry_;
  KvtcCalibration cal_;
  FakeLog* log_;
  CodecWorkspace ws_;
};

class FakeTier final : public DeviceTier {
 public:
  explicit FakeTier(FakeLog* log) : log_(log) {}
  std::string Describe() const override { return "fake"; }
  uint64_t arena_bytes() const override { return 0; }
  absl::StatusOr<std::unique_ptr<PagePool>> CreatePool(size_t,
                                                       uint32_t) override {
    return absl::UnimplementedError("the test makes the pool");
  }
  absl::StatusOr<std::unique_ptr<PageBatchEncoder>> CreateEncoder(
      const DeviceEncoderParams& p) override {
    return std::make_unique<FakeEncoder>(CpuCodec(p), log_);
  }
  absl::StatusOr<std::unique_ptr<PageBatchDecoder>> CreateDecoder(
      const DeviceEncoderParams& p) override {
    return std::make_unique<FakeDecoder>(CpuCodec(p), p, log_);
  }

 private:
  FakeLog* log_;
};

std::string CalibrationBytes(float scale) {
  const Geometry g = Geo();
  const uint64_t f = FeaturesFor(g, KvtcRowKind::kPerToken);
  auto cal =
      MakeCalibration(g, KvtcRowKind::kPerToken, IdentityBasis(f, f, Fp8All(f)),
                      IdentityBasis(f, f, Fp8All(f)));
  for (float& m : cal->keys.mean) m = scale;  // a distinct fingerprint
  auto bytes = SerializeKvtcCalibration(*cal);
  REQUIRE(bytes.ok());
  return *bytes;
}

TEST_CASE("device tier plumbing: batched decoders follow calibrations") {
  FakeLog log;
  NamespaceConfig c = Config(1 << 20);
  c.codec = "kvtc";
  c.calibration = CalibrationBytes(0.0f);
  DeviceEncoderParams p1{"kvtc", Geo(),
                         std::make_shared<const std::string>(c.calibration)};
  c.tier_codec = CpuCodec(p1);
  c.calibration_fingerprint = c.tier_codec->calibration_fingerprint();
  c.device_tier = std::make_shared<FakeTier>(&log);
  auto ns = Make(c, 8);
  const uint64_t fp1 = c.calibration_fingerprint;

  const std::string a = Pages(3, 21), b = Pages(2, 22);
  Insert(*ns, Seq(0, 12), a);
  REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 3);
  CHECK(log.encoded_pages[fp1] == 3);
  const std::string a_cpu = DecodeAll(*ns, Seq(0, 12), *c.tier_codec);
  CHECK(Fetch(*ns, Seq(0, 12), FetchFormat::kRaw) == a_cpu);
  CHECK(log.decode_calls[fp1] == 1);  // one batch for the three pages
  CHECK(log.decoded_pages[fp1] == 3);

  // A page the decoder refuses is decoded by the CPU codec instead.
  log.refuse_position = 4;
  CHECK(Fetch(*ns, Seq(0, 12), FetchFormat::kRaw) == a_cpu);
  CHECK(log.decoded_pages[fp1] == 5);
  log.refuse_position = UINT64_MAX;

  // A calibration switch: new evictions encode, and their pages decode,
  // with the new calibration's GPU twins; old pages keep theirs.
  auto fp2 = ns->calibrations().Upload(CalibrationBytes(0.5f), false, "cal");
  REQUIRE(fp2.ok());
  REQUIRE(*fp2 != fp1);
  Insert(*ns, Seq(500, 8), b);
  REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 2);
  CHECK(log.encoded_pages[*fp2] == 2);
  CHECK(log.encoded_pages[fp1] == 3);
  const std::string b_cpu =
      DecodeAll(*ns, Seq(500, 8), *ns->calibrations().tier_codec());
  CHECK(Fetch(*ns, Seq(500, 8), FetchFormat::kRaw) == b_cpu);
  CHECK(log.decoded_pages[*fp2] == 2);
  CHECK(Fetch(*ns, Seq(0, 12), FetchFormat::kRaw) == a_cpu);
  CHECK(log.decoded_pages[fp1] == 8);
  const auto cals = ns->ListCalibrations();
  REQUIRE(cals.size() == 2);
  for (const auto& info : cals) CHECK(info.gpu);
  REQUIRE(ns->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvharbor
