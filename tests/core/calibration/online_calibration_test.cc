// Online calibration (core/calibration/online_calibration.h,
// core/store/online_calibrator.h, core/store/namespace_calibrations.h): the fp8
// fallback codec, the bounded row sampler, the background calibration and codec
// switch, pinning, uploads, and deletion or shutdown while a calibration runs.
#include "core/calibration/online_calibration.h"

#include <xxh3.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "core/codec/codec.h"
#include "core/codec/fp8/fp8_codec.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/store/namespace.h"
#include "core/store/store.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"

namespace kvharbor {
namespace {

Geometry Geo() { return testing::SmallGeometry(DType::kFP32); }

std::vector<Token> Seq(int start, int n) {
  std::vector<Token> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

// FP32 pages whose values have a few dominant directions per token (like
// real KV), so a PCA calibration has something to find.
std::string Pages(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const Geometry g = Geo();
  std::string s(n * g.PageBytes(), '\0');
  for (size_t i = 0; i + 4 <= s.size(); i += 4) {
    const float v = dist(rng) * (1.0f + static_cast<float>((i / 4) % 3));
    std::memcpy(&s[i], &v, 4);
  }
  return s;
}

float At(const std::string& s, size_t i) {
  float v;
  std::memcpy(&v, &s[4 * i], 4);
  return v;
}

void Insert(Namespace& ns, const std::vector<Token>& t,
            const std::string& bytes) {
  auto up = ns.BeginInsert(t, {});
  REQUIRE(up.ok());
  REQUIRE((*up)->Write(0, bytes).ok());
  REQUIRE((*up)->Commit().ok());
}

Namespace::PinnedPages Pin(Namespace& ns, const std::vector<Token>& t,
                           FetchFormat format) {
  auto m = ns.Match(t, false, absl::ZeroDuration());
  REQUIRE(m.ok());
  REQUIRE(m->matched_tokens == t.size());
  auto pinned = ns.PinPages(m->pages, format);
  REQUIRE(pinned.ok());
  return *std::move(pinned);
}

std::string FetchRaw(Namespace& ns, const std::vector<Token>& t) {
  Namespace::PinnedPages p = Pin(ns, t, FetchFormat::kRaw);
  std::string out;
  for (size_t i = 0; i < p.size(); ++i) {
    const absl::string_view b = p.bytes(i);
    out.append(b.data(), b.size());
  }
  return out;
}

// Every element within FP8's bound: 1/16 of its block's absolute maximum.
void CheckFp8Bound(const std::string& want, const std::string& got) {
  const Geometry g = Geo();
  REQUIRE(got.size() == want.size());
  const size_t block = size_t{g.page_size} * g.num_kv_heads * g.head_dim;
  for (size_t b = 0; b < want.size() / 4 / block; ++b) {
    float amax = 0;
    for (size_t e = 0; e < block; ++e) {
      amax = std::max(amax, std::fabs(At(want, b * block + e)));
    }
    for (size_t e = 0; e < block; ++e) {
      REQUIRE(std::fabs(At(want, b * block + e) - At(got, b * block + e)) <=
              amax / 16);
    }
  }
}

NamespaceSpec OnlineSpec(uint64_t min_tokens) {
  NamespaceSpec spec;
  spec.name = "online";
  spec.geometry = Geo();
  spec.codec = "kvtc";
  spec.capacity_bytes = 8 * Geo().PageBytes();
  spec.host_compressed_bytes = 64 << 20;
  spec.online_calibration.enabled = true;
  spec.online_calibration.min_tokens = min_tokens;
  spec.online_calibration.max_sample_tokens = 256;
  spec.online_calibration.target_ratio = 2;
  return spec;
}

bool WaitForState(const Namespace& ns, CalibrationState want) {
  for (int i = 0; i < 600; ++i) {
    if (ns.calibrations().status().state == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// An injected calibration that blocks until released (or cancelled), then
// runs the real one.
struct GatedCalibration {
  absl::Notification started, release;
  std::atomic<bool> saw_cancel{false};
  OnlineCalibrateFn Fn() {
    return [this](const KvSamples& s, const OnlineCalibrationOptions& o,
                  const Geometry& g, const std::function<bool()>& cancelled)
               -> absl::StatusOr<std::string> {
      started.Notify();
      while (!release.WaitForNotificationWithTimeout(absl::Milliseconds(5))) {
        if (cancelled()) {
          saw_cancel = true;
          return absl::CancelledError("cancelled");
        }
      }
      return RunOnlineKvtcCalibration(s, o, g, cancelled);
    };
  }
};

TEST_CASE("fp8 codec: round trip within 1/16 of each block's maximum") {
  const Geometry g = Geo();
  CodecParams p;
  p.geometry = g;
  auto codec = CodecRegistry::Default().Create("fp8", p);
  REQUIRE(codec.ok());
  CHECK((*codec)->id() == CodecId::kFp8);
  const std::string a = Pages(3, 1);
  std::vector<PageRef> refs;
  for (int i = 0; i < 3; ++i) {
    refs.push_back({reinterpret_cast<const uint8_t*>(&a[i * g.PageBytes()]),
                    uint64_t(i) * g.page_size});
  }
  auto buf = (*codec)->EncodeToString(refs, nullptr);
  REQUIRE(buf.ok());
  CHECK(buf->size() < a.size() / 3);
  std::string out(a.size(), '\0');
  std::vector<MutablePageRef> dst;
  for (int i = 0; i < 3; ++i) {
    dst.push_back({reinterpret_cast<uint8_t*>(&out[i * g.PageBytes()]),
                   uint64_t(i) * g.page_size});
  }
  const auto bytes = [](const std::string& s) {
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()),
                               s.size());
  };
  REQUIRE((*codec)->Decode(bytes(*buf), dst, nullptr).ok());
  CheckFp8Bound(a, out);
  // Truncated or corrupt buffers are refused, pages untouched.
  std::string bad = *buf;
  bad[bad.size() - 3] ^= 0x40;
  const std::string before = out;
  CHECK(!(*codec)->Decode(bytes(bad), dst, nullptr).ok());
  CHECK(!(*codec)
             ->Decode(bytes(buf->substr(0, buf->size() - 1)), dst, nullptr)
             .ok());
  CHECK(out == before);
  // Non-finite input is refused with the page named.
  std::string nan = a;
  const float inf = INFINITY;
  std::memcpy(&nan[4 * 7], &inf, 4);
  refs[0].data = reinterpret_cast<const uint8_t*>(nan.data());
  auto r = (*codec)->EncodeToString(refs, nullptr);
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("pages[0]") != absl::string_view::npos);
}

TEST_CASE("online calibration: options are validated, errors name the field") {
  const Geometry g = Geo();
  const auto message = [&](OnlineCalibrationOptions o) {
    return std::string(
        ValidateOnlineCalibration(o, g, "spec.online_calibration").message());
  };
  // Pages of 4 fp32 tokens of 32 features: 1 KiB raw, of which one buffer's
  // fixed 272 bytes leave at most 3.76x.
  const OnlineCalibrationOptions base = [] {
    OnlineCalibrationOptions b;
    b.target_ratio = 2;
    return b;
  }();
  OnlineCalibrationOptions o = base;
  CHECK(ValidateOnlineCalibration(o, g, "x").ok());
  o.target_ratio = 16;
  CHECK(message(o).find("spec.online_calibration.target_ratio: 16x leaves") ==
        0);
  CHECK(message(o).find("the largest reachable ratio is 3.76x") !=
        std::string::npos);
  o = base;
  o.min_tokens = 0;
  CHECK(message(o).find("spec.online_calibration.min_tokens") == 0);
  o = base;
  o.max_sample_tokens = 1;
  CHECK(message(o).find("spec.online_calibration.max_sample_tokens") == 0);
  o = base;
  o.max_sample_tokens = uint64_t{1} << 40;
  CHECK(message(o).find("spec.online_calibration.max_sample_tokens") == 0);
  o = base;
  o.target_ratio = 0.5;
  CHECK(message(o).find("spec.online_calibration.target_ratio") == 0);
  o = base;
  o.target_ratio = NAN;
  CHECK(message(o).find("spec.online_calibration.target_ratio") == 0);
  o = base;
  o.rope_style = RopeStyle::kHalfSplit;  // geometry has no rope_theta
  CHECK(message(o).find("spec.online_calibration.rope_style") == 0);
  o = base;
  o.row_kind = static_cast<KvtcRowKind>(9);
  CHECK(message(o).find("spec.online_calibration.row_kind") == 0);

  Store store(StoreOptions{});
  NamespaceSpec spec = OnlineSpec(64);
  spec.codec = "identity";
  auto r = store.CreateNamespace(spec, false);
  REQUIRE(!r.ok());
  CHECK(r.status().message().find("spec.online_calibration") == 0);
  spec = OnlineSpec(64);
  spec.online_calibration.target_ratio = 0;
  r = store.CreateNamespace(spec, false);
  REQUIRE(!r.ok());
  CHECK(r.status().message().find("spec.online_calibration.target_ratio") == 0);
}

TEST_CASE("online calibration: the sampler keeps a bounded reservoir") {
  const Geometry g = Geo();
  OnlineCalibrationOptions o;
  o.max_sample_tokens = 8 * g.page_size + 3;  // 8 whole pages
  PageSampler sampler(g, o);
  REQUIRE(sampler.capacity_pages() == 8);
  const std::string pages = Pages(100, 7);
  for (size_t i = 0; i < 100; ++i) {
    sampler.Offer(reinterpret_cast<const uint8_t*>(&pages[i * g.PageBytes()]),
                  i * g.page_size);
    CHECK(sampler.tokens_sampled() <= 8 * g.page_size);
  }
  CHECK(sampler.tokens_offered() == 100 * g.page_size);
  CHECK(sampler.tokens_sampled() == 8 * g.page_size);
  const KvSamples s = sampler.Snapshot();
  REQUIRE(s.Validate().ok());
  REQUIRE(s.tokens == 8 * g.page_size);
  // Each kept page is one of the offered ones, converted to [token][layer]:
  // token t of page p, layer l, head h, dim d = element (0, l, t, h, d).
  std::vector<bool> seen(100, false);
  for (uint64_t p = 0; p < 8; ++p) {
    const int64_t pos0 = s.positions[p * g.page_size];
    REQUIRE(pos0 % g.page_size == 0);
    const size_t src = static_cast<size_t>(pos0 / g.page_size);
    CHECK(!seen[src]);
    seen[src] = true;
    const uint8_t* page =
        reinterpret_cast<const uint8_t*>(&pages[src * g.PageBytes()]);
    for (uint32_t t = 0; t < g.page_size; ++t) {
      CHECK(s.positions[p * g.page_size + t] == pos0 + t);
      for (uint32_t l = 0; l < g.num_layers; ++l) {
        for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            const uint64_t at = ((p * g.page_size + t) * g.num_layers + l) *
                                    g.num_kv_heads * g.head_dim +
                                h * g.head_dim + d;
            REQUIRE(s.k[at] ==
                    testing::ReadElement(
                        g, page, testing::ElementIndex(g, 0, l, t, h, d)));
            REQUIRE(s.v[at] ==
                    testing::ReadElement(
                        g, page, testing::ElementIndex(g, 1, l, t, h, d)));
          }
        }
      }
    }
  }
}

// Decodes one page fetched COMPRESSED with the codec and calibration its
// buffer names, as a remote client would.
std::string DecodeLikeAClient(const Namespace& ns,
                              const Namespace::PinnedPages& p, size_t i) {
  CodecParams params;
  params.geometry = Geo();
  auto cal = ns.calibrations().Get(p.calibration_fingerprint(i));
  REQUIRE(cal.ok());
  CHECK(cal->first == (p.codec_name(i) == "fp8" ? "kvtc" : p.codec_name(i)));
  if (p.calibration_fingerprint(i) != 0) params.calibration_bytes = cal->second;
  auto codec =
      CodecRegistry::Default().Create(std::string(p.codec_name(i)), params);
  REQUIRE(codec.ok());
  CHECK((*codec)->calibration_fingerprint() == p.calibration_fingerprint(i));
  std::string out(Geo().PageBytes(), '\0');
  const absl::string_view b = p.bytes(i);
  const MutablePageRef ref{reinterpret_cast<uint8_t*>(&out[0]),
                           uint64_t(i % 2) * Geo().page_size};
  REQUIRE(
      (*codec)
          ->Decode(absl::MakeConstSpan(
                       reinterpret_cast<const uint8_t*>(b.data()), b.size()),
                   absl::MakeConstSpan(&ref, 1), nullptr)
          .ok());
  return out;
}

TEST_CASE("online calibration: fp8 until min_tokens, then KVTC; both decode") {
  Store store(StoreOptions{});
  auto created = store.CreateNamespace(OnlineSpec(64), false);
  REQUIRE(created.ok());
  Namespace& ns = *created->first;
  CHECK(ns.calibrations().tier_codec()->name() == "fp8");
  CHECK(ns.calibrations().status().state == CalibrationState::kSampling);
  // 16 pages of 2-page sequences; the pool holds 8, the rest go cold.
  std::vector<std::string> data;
  for (int s = 0; s < 7; ++s) {
    data.push_back(Pages(2, 100 + s));
    Insert(ns, Seq(1000 * s, 8), data.back());
  }
  REQUIRE(ns.tiers().DemoteAll(Tier::kHostCompressed).ok());
  REQUIRE(ns.Counters().tiers[1].pages == 14);
  CHECK(ns.calibrations().status().state == CalibrationState::kSampling);
  CHECK(ns.calibrations().status().expected.expected_ratio == 0);  // fp8
  {
    const NamespaceStats c = ns.Counters();
    REQUIRE(c.codecs.size() == 1);
    CHECK(c.codecs[0].codec == "fp8");
    CHECK(c.codecs[0].pages == 14);
    CHECK(c.codecs[0].bytes == c.tiers[1].bytes);
  }
  CHECK(ns.calibrations().status().tokens_seen == 56);
  CHECK(ns.ListCalibrations().empty());
  data.push_back(Pages(2, 107));
  Insert(ns, Seq(7000, 8), data.back());  // 64 tokens: calibration starts
  REQUIRE(WaitForState(ns, CalibrationState::kReady));
  const std::shared_ptr<const Codec> kvtc = ns.calibrations().tier_codec();
  REQUIRE(kvtc->name() == "kvtc");
  CHECK(ns.calibrations().status().fingerprint ==
        kvtc->calibration_fingerprint());
  // fp8 pages stored before the switch still decode within fp8's bound.
  for (int s = 0; s < 7; ++s) {
    CheckFp8Bound(data[s], FetchRaw(ns, Seq(1000 * s, 8)));
  }
  // Pages evicted now use KVTC and decode exactly as the codec's own
  // round trip does.
  REQUIRE(ns.tiers().DemoteAll(Tier::kHostCompressed).ok());
  REQUIRE(ns.Counters().tiers[1].pages == 16);
  {
    // Stats per codec, not blended: fp8's 14 pages and kvtc's 2, each with
    // its own bytes; and what the online calibration expected.
    const NamespaceStats c = ns.Counters();
    REQUIRE(c.codecs.size() == 2);
    CHECK(c.codecs[0].codec == "fp8");
    CHECK(c.codecs[0].pages == 14);
    CHECK(c.codecs[1].codec == "kvtc");
    CHECK(c.codecs[1].pages == 2);
    CHECK(c.codecs[0].bytes + c.codecs[1].bytes == c.tiers[1].bytes);
    const CalibrationEstimate e = ns.calibrations().status().expected;
    CHECK(e.target_ratio == 2);
    CHECK(e.expected_ratio >= 0.97 * 2);
    CHECK(e.keys_rel_error >= 0);
    CHECK(e.keys_rel_error <= 1);
    CHECK(e.values_rel_error >= 0);
    CHECK(e.values_rel_error <= 1);
  }
  {
    std::string expect(data[7].size(), '\0');
    const size_t pb = Geo().PageBytes();
    for (int i = 0; i < 2; ++i) {
      const PageRef in{reinterpret_cast<const uint8_t*>(&data[7][i * pb]),
                       uint64_t(i) * Geo().page_size};
      auto buf = kvtc->EncodeToString(absl::MakeConstSpan(&in, 1), nullptr);
      REQUIRE(buf.ok());
      const MutablePageRef out{reinterpret_cast<uint8_t*>(&expect[i * pb]),
                               in.first_position};
      REQUIRE(kvtc->Decode(absl::MakeConstSpan(
                               reinterpret_cast<const uint8_t*>(buf->data()),
                               buf->size()),
                           absl::MakeConstSpan(&out, 1), nullptr)
                  .ok());
    }
    CHECK(FetchRaw(ns, Seq(7000, 8)) == expect);
  }
  // COMPRESSED fetches carry each page's own codec and calibration.
  for (int s : {0, 7}) {
    Namespace::PinnedPages p =
        Pin(ns, Seq(1000 * s, 8), FetchFormat::kCompressed);
    const std::string raw = FetchRaw(ns, Seq(1000 * s, 8));
    for (size_t i = 0; i < p.size(); ++i) {
      CHECK(p.codec_name(i) == (s == 0 ? "fp8" : "kvtc"));
      CHECK(DecodeLikeAClient(ns, p, i) ==
            raw.substr(i * Geo().PageBytes(), Geo().PageBytes()));
    }
  }
  const auto cals = ns.ListCalibrations();
  REQUIRE(cals.size() == 1);
  CHECK(cals[0].source == CalibrationSource::kOnline);
  CHECK(cals[0].active);
  CHECK(cals[0].pages == 2);
  REQUIRE(ns.CheckInvariants().ok());
}

TEST_CASE("online calibration: requests are served while it runs") {
  GatedCalibration gate;
  StoreOptions options;
  options.online_calibrate = gate.Fn();
  Store store(options);
  auto created = store.CreateNamespace(OnlineSpec(16), false);
  REQUIRE(created.ok());
  Namespace& ns = *created->first;
  const std::string a = Pages(4, 3);
  Insert(ns, Seq(0, 16), a);
  REQUIRE(gate.started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(ns.calibrations().status().state == CalibrationState::kCalibrating);
  // The calibration is blocked: inserts, matches, fetches and evictions
  // all complete meanwhile, with the fallback codec.
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 1; s < 6; ++s) Insert(ns, Seq(1000 * s, 8), Pages(2, s));
  CHECK(FetchRaw(ns, Seq(0, 16)).size() == a.size());
  REQUIRE(ns.tiers().DemoteAll(Tier::kHostCompressed).ok());
  CheckFp8Bound(a, FetchRaw(ns, Seq(0, 16)));
  CHECK(ns.calibrations().tier_codec()->name() == "fp8");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  CHECK(seconds < 10);
  CHECK(ns.calibrations().status().state == CalibrationState::kCalibrating);
  gate.release.Notify();
  REQUIRE(WaitForState(ns, CalibrationState::kReady));
  CHECK(ns.calibrations().tier_codec()->name() == "kvtc");
  CheckFp8Bound(a, FetchRaw(ns, Seq(0, 16)));
}

TEST_CASE("online calibration: a pinned calibration is never replaced") {
  Store store(StoreOptions{});
  auto created = store.CreateNamespace(OnlineSpec(16), false);
  REQUIRE(created.ok());
  Namespace& ns = *created->first;
  const Geometry g = Geo();
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  auto cal = testing::MakeCalibration(g, KvtcRowKind::kPerToken,
                                      IdentityBasis(f, f, testing::Fp8All(f)),
                                      IdentityBasis(f, f, testing::Fp8All(f)));
  auto bytes = SerializeKvtcCalibration(*cal);
  REQUIRE(bytes.ok());
  // Bad uploads are refused with the field named, nothing changes.
  auto bad =
      ns.calibrations().Upload(bytes->substr(0, 100), true, "calibration");
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("calibration: ") == 0);
  Geometry other = g;
  other.head_dim = 16;
  const uint64_t f2 = testing::FeaturesFor(other, KvtcRowKind::kPerToken);
  auto wrong = SerializeKvtcCalibration(*testing::MakeCalibration(
      other, KvtcRowKind::kPerToken, IdentityBasis(f2, f2, testing::Fp8All(f2)),
      IdentityBasis(f2, f2, testing::Fp8All(f2))));
  REQUIRE(wrong.ok());
  bad = ns.calibrations().Upload(*wrong, true, "calibration");
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ns.calibrations().tier_codec()->name() == "fp8");
  // A good upload becomes active (pinned); online calibration still runs
  // but keeps it.
  auto fp = ns.calibrations().Upload(*bytes, /*pin=*/true, "calibration");
  REQUIRE(fp.ok());
  CHECK(*fp == cal->Fingerprint());
  CHECK(ns.calibrations().tier_codec()->calibration_fingerprint() == *fp);
  CHECK(ns.calibrations().Upload(*bytes + "", true, "calibration").ok());
  Insert(ns, Seq(0, 16), Pages(4, 9));
  REQUIRE(WaitForState(ns, CalibrationState::kReady));
  CHECK(ns.calibrations().tier_codec()->calibration_fingerprint() == *fp);
  auto cals = ns.ListCalibrations();
  REQUIRE(cals.size() == 1);
  CHECK(cals[0].pinned);
  CHECK(cals[0].source == CalibrationSource::kUploaded);
  auto got = ns.calibrations().Get(0);
  REQUIRE(got.ok());
  CHECK(*got->second == *bytes);
  CHECK(ns.calibrations().Get(*fp + 1).status().code() ==
        absl::StatusCode::kNotFound);
  // Pinning names the active calibration only; unpinning allows uploads.
  CHECK(ns.calibrations().Pin(*fp + 1, true).code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE(ns.calibrations().Pin(*fp, false).ok());
  CHECK(!ns.calibrations().status().pinned);
}

TEST_CASE("online calibration: unpinned uploads are replaced by online ones") {
  GatedCalibration gate;
  StoreOptions options;
  options.online_calibrate = gate.Fn();
  Store store(options);
  auto created = store.CreateNamespace(OnlineSpec(16), false);
  REQUIRE(created.ok());
  Namespace& ns = *created->first;
  Insert(ns, Seq(0, 16), Pages(4, 4));
  REQUIRE(gate.started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  const Geometry g = Geo();
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  auto bytes = SerializeKvtcCalibration(*testing::MakeCalibration(
      g, KvtcRowKind::kPerToken, IdentityBasis(f, f, testing::Fp8All(f)),
      IdentityBasis(f, f, testing::Fp8All(f))));
  REQUIRE(bytes.ok());
  auto fp = ns.calibrations().Upload(*bytes, /*pin=*/false, "calibration");
  REQUIRE(fp.ok());
  Insert(ns, Seq(100, 8), Pages(2, 5));
  // Every page goes cold now, encoded with the uploaded calibration.
  REQUIRE(ns.tiers().DemoteAll(Tier::kHostCompressed).ok());
  REQUIRE(ns.Counters().tiers[1].pages == 6);
  gate.release.Notify();
  REQUIRE(WaitForState(ns, CalibrationState::kReady));
  CHECK(ns.calibrations().tier_codec()->calibration_fingerprint() != *fp);
  // The uploaded calibration stays listed while pages reference it.
  auto cals = ns.ListCalibrations();
  REQUIRE(cals.size() == 2);
  CHECK(cals[0].source == CalibrationSource::kOnline);
  CHECK(cals[1].fingerprint == *fp);
  CHECK(cals[1].pages == 6);
  CHECK(ns.calibrations().Get(*fp).ok());
}

TEST_CASE("online calibration: delete or shutdown during calibration") {
  GatedCalibration gate;
  std::weak_ptr<Namespace> weak;
  {
    StoreOptions options;
    options.online_calibrate = gate.Fn();
    Store store(options);
    auto created = store.CreateNamespace(OnlineSpec(16), false);
    REQUIRE(created.ok());
    weak = created->first;
    Insert(*created->first, Seq(0, 16), Pages(4, 5));
    created->first.reset();
    REQUIRE(gate.started.WaitForNotificationWithTimeout(absl::Seconds(30)));
    REQUIRE(store.DeleteNamespace("online", false).ok());
    // The job sees the deletion and stops; nothing is installed.
    for (int i = 0; i < 400 && store.calibrations_pending() > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(store.calibrations_pending() == 0);
    CHECK(gate.saw_cancel);
    CHECK(weak.expired());
  }
  // Shutdown (store destroyed) with a job blocked in the calibration.
  GatedCalibration gate2;
  StoreOptions options;
  options.online_calibrate = gate2.Fn();
  auto store = std::make_unique<Store>(options);
  auto created = store->CreateNamespace(OnlineSpec(16), false);
  REQUIRE(created.ok());
  Insert(*created->first, Seq(0, 16), Pages(4, 6));
  REQUIRE(gate2.started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  store.reset();  // cancels and joins
  CHECK(gate2.saw_cancel);
  CHECK(created->first->calibrations().tier_codec()->name() == "fp8");
}

TEST_CASE("online calibration: Llama-3-8B is accepted with every default") {
  Geometry g;
  g.num_layers = 32;
  g.num_kv_heads = 8;
  g.head_dim = 128;
  g.page_size = 16;
  g.dtype = DType::kBF16;
  g.rope_theta = 500000.0f;
  // 4096 tokens of 2 x 32768 float32 fit the 1 GiB default reservoir.
  CHECK(DefaultOnlineSampleTokens(g) == 4096);
  for (KvtcRowKind kind : {KvtcRowKind::kPerToken, KvtcRowKind::kPerPage}) {
    INFO(KvtcRowKindName(kind));
    OnlineCalibrationOptions o;
    o.enabled = true;
    o.row_kind = kind;
    o.rope_style = RopeStyle::kHalfSplit;
    CHECK(ValidateOnlineCalibration(o, g, "x").ok());
    // The stated bound: the reservoir, its copy and the PCA's working set.
    const uint64_t bytes = OnlineCalibrationMemoryBytes(o, g);
    CHECK(bytes > (uint64_t{2} << 30));
    CHECK(bytes < (uint64_t{7} << 29));  // 3.5 GiB
    Store store(StoreOptions{});
    NamespaceSpec spec;
    spec.name = "llama3-8b";
    spec.geometry = g;
    spec.codec = "kvtc";
    spec.capacity_bytes = 2 * g.PageBytes();
    spec.host_compressed_bytes = 2 * g.PageBytes();
    spec.online_calibration = o;
    auto created = store.CreateNamespace(spec, false);
    REQUIRE(created.ok());
    CHECK(created->first->config().online.max_sample_tokens == 4096);
  }
  // An explicit reservoir over the 4 GiB limit says what fits.
  OnlineCalibrationOptions big;
  big.max_sample_tokens = 32768;
  CHECK_THAT(std::string(ValidateOnlineCalibration(big, g, "x").message()),
             Catch::Contains("at most 16384 tokens for this geometry"));
}

}  // namespace
}  // namespace kvharbor
