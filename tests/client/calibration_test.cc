// Online calibration and the calibration API end to end through the SDK
// against an in-process daemon: a kvtc namespace without a calibration
// stores evicted pages as fp8, calibrates in the background after
// min_tokens, switches to KVTC; COMPRESSED fetches of pages of both codecs
// decode in the SDK exactly as the daemon decodes them; upload (bad bytes
// are INVALID_ARGUMENT naming the field), list, get by fingerprint, pin.
// Warm restarts from disk_dir keep fp8, online and uploaded pages decodable
// and the active calibration and pin; a corrupt persisted calibration drops
// its pages.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/base/byte_io.h"
#include "core/calibration/calibration_store.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "tests/client/client_test_util.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

using client::FetchFormat;
using client::FetchSource;
using testing::Connect;
using testing::StartTestDaemon;
using testing::TokenRange;

constexpr uint32_t kLayers = 2, kHeads = 2, kHeadDim = 8, kPageSize = 4;
constexpr uint64_t kPageBytes = 2 * kLayers * kPageSize * kHeads * kHeadDim * 4;

client::NamespaceStats StatsOf(Client& c, const std::string& ns) {
  auto s = c.Stats(ns);
  REQUIRE(s.ok());
  REQUIRE(s->namespaces.size() == 1);
  return s->namespaces[0];
}

bool WaitReady(Client& c, const std::string& ns) {
  for (int i = 0; i < 600; ++i) {
    if (StatsOf(c, ns).calibration.state == client::CalibrationState::kReady)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Fetches `tokens` RAW (decoded by the daemon) and COMPRESSED (decoded by
// the SDK) and checks both agree; returns each page's codec, and its
// calibration fingerprint and RAW bytes when asked.
std::vector<std::string> FetchBoth(
    Client& c, const std::string& ns, const std::vector<int32_t>& tokens,
    std::vector<uint64_t>* fingerprints = nullptr,
    std::vector<std::vector<uint8_t>>* raw_pages = nullptr) {
  auto m = c.Match(ns, tokens, /*lock=*/false);
  REQUIRE(m.ok());
  REQUIRE(m->pages.size() == tokens.size() / kPageSize);
  const FetchSource src = FetchSource::FromPages(m->pages);
  auto raw = c.Fetch(ns, src, FetchFormat::kRaw);
  REQUIRE(raw.ok());
  auto decoded = c.Fetch(ns, src, FetchFormat::kCompressed);
  INFO(decoded.status().ToString());
  REQUIRE(decoded.ok());
  CHECK(*decoded == *raw);
  auto buffers = c.FetchCompressed(ns, src);
  REQUIRE(buffers.ok());
  std::vector<std::string> codecs;
  for (const client::CompressedPage& p : *buffers) {
    codecs.push_back(p.codec);
    if (fingerprints != nullptr) {
      fingerprints->push_back(p.calibration_fingerprint);
    }
  }
  if (raw_pages != nullptr) *raw_pages = *raw;
  return codecs;
}

client::NamespaceSpec OnlineSpec(const std::string& name,
                                 const std::string& disk_dir) {
  client::NamespaceSpec spec =
      testing::MakeSpec(name, kLayers, kHeads, kHeadDim, kPageSize,
                        client::DType::kFP32, 8 * kPageBytes);
  spec.codec = "kvtc";
  spec.host_compressed_bytes = 1 << 20;
  spec.disk_dir = disk_dir;
  spec.online_calibration.enabled = true;
  spec.online_calibration.min_tokens = 16;
  spec.online_calibration.target_ratio = 2;
  return spec;
}

// A valid KVTC calibration other than any online one: identity bases, FP8.
std::string IdentityCalibrationBytes() {
  const Geometry g = testing::SmallGeometry();
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  auto cal = testing::MakeCalibration(g, KvtcRowKind::kPerToken,
                                      IdentityBasis(f, f, testing::Fp8All(f)),
                                      IdentityBasis(f, f, testing::Fp8All(f)));
  REQUIRE(cal != nullptr);
  auto bytes = SerializeKvtcCalibration(*cal);
  REQUIRE(bytes.ok());
  return *bytes;
}

TEST_CASE("SDK calibration: online fp8 -> KVTC switch, upload, list, pin",
          "[client][calibration]") {
  auto daemon = StartTestDaemon();
  auto c = Connect(*daemon);
  const client::NamespaceSpec spec = OnlineSpec("oc", "");
  auto created = c->CreateNamespace(spec);
  INFO(created.status().ToString());
  REQUIRE(created.ok());
  CHECK(created->info.spec.online_calibration.enabled);
  CHECK(created->info.spec.online_calibration.min_tokens == 16);
  // Unset sink_tokens comes back as the daemon's default; a set one as set.
  CHECK(created->info.spec.online_calibration.sink_tokens == 4u);
  client::NamespaceSpec sinks = OnlineSpec("oc_sinks", "");
  sinks.online_calibration.sink_tokens = 0;
  auto with_sinks = c->CreateNamespace(sinks);
  REQUIRE(with_sinks.ok());
  CHECK(with_sinks->info.spec.online_calibration.sink_tokens == 0u);
  CHECK(created->info.stats.calibration.state ==
        client::CalibrationState::kSampling);
  CHECK(created->info.stats.calibration.codec == "fp8");

  // Bad specs name the field.
  client::NamespaceSpec bad = spec;
  bad.name = "bad";
  bad.online_calibration.max_sample_tokens = 1;
  auto r = c->CreateNamespace(bad);
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(
      r.status().message().find("spec.online_calibration.max_sample_tokens") !=
      absl::string_view::npos);

  const auto a = TokenRange(2 * kPageSize, 100);
  REQUIRE(c->Insert("oc", a, testing::FloatPages(2, kPageBytes, 1), kPageBytes)
              .ok());
  REQUIRE(c->Demote("oc", client::Tier::kHostCompressed).ok());
  CHECK(StatsOf(*c, "oc").calibration.tokens_seen == 8);
  CHECK(FetchBoth(*c, "oc", a) == std::vector<std::string>{"fp8", "fp8"});
  auto list = c->ListCalibrations("oc");
  REQUIRE(list.ok());
  CHECK(list->empty());

  // Bad uploads: INVALID_ARGUMENT naming the field; nothing changes.
  auto up = c->UploadCalibration("oc", "not a calibration", false);
  REQUIRE(up.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(up.status().message().find("calibration: ") == 0);
  CHECK(StatsOf(*c, "oc").calibration.codec == "fp8");

  const auto b = TokenRange(2 * kPageSize, 200);  // 16 tokens: calibrates
  REQUIRE(c->Insert("oc", b, testing::FloatPages(2, kPageBytes, 2), kPageBytes)
              .ok());
  REQUIRE(WaitReady(*c, "oc"));
  const client::NamespaceStats ready = StatsOf(*c, "oc");
  CHECK(ready.calibration.codec == "kvtc");
  REQUIRE(ready.calibration.fingerprint != 0);
  const auto d = TokenRange(2 * kPageSize, 300);
  REQUIRE(c->Insert("oc", d, testing::FloatPages(2, kPageBytes, 3), kPageBytes)
              .ok());
  REQUIRE(c->Demote("oc", client::Tier::kHostCompressed).ok());
  // Old fp8 pages and new KVTC pages, each decoded with its own codec.
  CHECK(FetchBoth(*c, "oc", a) == std::vector<std::string>{"fp8", "fp8"});
  CHECK(FetchBoth(*c, "oc", d) == std::vector<std::string>{"kvtc", "kvtc"});

  list = c->ListCalibrations("oc");
  REQUIRE(list.ok());
  REQUIRE(list->size() == 1);
  const uint64_t online_fp = (*list)[0].fingerprint;
  CHECK(online_fp == ready.calibration.fingerprint);
  CHECK((*list)[0].source == "online");
  CHECK((*list)[0].active);
  CHECK((*list)[0].pages == 4);  // b and d
  auto got = c->GetCalibration("oc", online_fp);
  REQUIRE(got.ok());
  CHECK(got->codec == "kvtc");
  CHECK(ParseKvtcCalibration(
            absl::MakeConstSpan(
                reinterpret_cast<const uint8_t*>(got->bytes.data()),
                got->bytes.size()))
            .ok());
  CHECK(c->GetCalibration("oc", online_fp + 1).status().code() ==
        absl::StatusCode::kNotFound);

  // Pin: uploads are refused until unpinned.
  REQUIRE(c->PinCalibration("oc", 0, true).ok());
  CHECK(StatsOf(*c, "oc").calibration.pinned);
  const std::string bytes = IdentityCalibrationBytes();
  CHECK(c->UploadCalibration("oc", bytes, false).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE(c->PinCalibration("oc", online_fp, false).ok());
  up = c->UploadCalibration("oc", bytes, true);
  REQUIRE(up.ok());
  auto parsed = ParseKvtcCalibration(AsBytes(bytes));
  REQUIRE(parsed.ok());
  CHECK(*up == parsed->Fingerprint());
  list = c->ListCalibrations("oc");
  REQUIRE(list.ok());
  REQUIRE(list->size() == 2);  // the online one: pages still use it
  CHECK((*list)[0].source == "uploaded");
  CHECK((*list)[0].pinned);
  CHECK((*list)[1].fingerprint == online_fp);
  CHECK(FetchBoth(*c, "oc", d) == std::vector<std::string>{"kvtc", "kvtc"});
  CHECK(c->PinCalibration("oc", online_fp, true).code() ==
        absl::StatusCode::kFailedPrecondition);
}

// Page bytes as float32.
std::vector<float> Floats(const std::vector<uint8_t>& bytes) {
  std::vector<float> f(bytes.size() / sizeof(float));
  std::memcpy(f.data(), bytes.data(), f.size() * sizeof(float));
  return f;
}

// The fp8 codec's bound: 1/16 of the (kv, layer) block's largest
// magnitude, at most 1 for FloatPages' values in [-1, 1].
void CheckFp8Bound(const std::vector<std::vector<uint8_t>>& got,
                   const std::vector<uint8_t>& original) {
  REQUIRE(got.size() * kPageBytes == original.size());
  for (size_t p = 0; p < got.size(); ++p) {
    const std::vector<float> g = Floats(got[p]);
    const std::vector<float> o =
        Floats(std::vector<uint8_t>(original.begin() + p * kPageBytes,
                                    original.begin() + (p + 1) * kPageBytes));
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      worst = std::max(worst, std::fabs(double{g[i]} - o[i]));
    }
    CHECK(worst > 0);  // fp8 is lossy: these are not the raw bytes
    CHECK(worst <= 1.0 / 16 + 1e-6);
  }
}

std::string CalibrationFile(const std::string& dir, uint64_t fp) {
  char name[64];
  std::snprintf(name, sizeof(name), "/calibration-%016llx.kvhcal",
                static_cast<unsigned long long>(fp));
  return dir + name;
}

TEST_CASE(
    "SDK calibration: fp8, online and uploaded pages survive warm restarts; "
    "a corrupt persisted calibration drops its pages",
    "[client][calibration][restart]") {
  testing::TempDir tmp;
  const std::string dir = tmp.path + "/disk";
  const client::NamespaceSpec spec = OnlineSpec("oc", dir);
  const auto a = TokenRange(2 * kPageSize, 100);  // fp8, before the switch
  const auto b = TokenRange(2 * kPageSize, 200);  // completes the sample
  const auto d = TokenRange(2 * kPageSize, 300);  // online KVTC
  const auto e = TokenRange(2 * kPageSize, 400);  // uploaded KVTC
  const auto data_a = testing::FloatPages(2, kPageBytes, 1);
  std::vector<std::vector<uint8_t>> raw_a, raw_d, raw_e, got;
  std::vector<uint64_t> fps;
  uint64_t online_fp = 0, uploaded_fp = 0;
  std::string online_bytes;
  const std::vector<std::string> fp8 = {"fp8", "fp8"}, kvtc = {"kvtc", "kvtc"};
  {
    auto daemon = StartTestDaemon();
    auto c = Connect(*daemon);
    REQUIRE(c->CreateNamespace(spec).ok());
    REQUIRE(c->Insert("oc", a, data_a, kPageBytes).ok());
    REQUIRE(c->Demote("oc", client::Tier::kDisk).ok());
    REQUIRE(
        c->Insert("oc", b, testing::FloatPages(2, kPageBytes, 2), kPageBytes)
            .ok());
    REQUIRE(WaitReady(*c, "oc"));
    online_fp = StatsOf(*c, "oc").calibration.fingerprint;
    REQUIRE(online_fp != 0);
    REQUIRE(
        c->Insert("oc", d, testing::FloatPages(2, kPageBytes, 3), kPageBytes)
            .ok());
    REQUIRE(c->Demote("oc", client::Tier::kDisk).ok());
    CHECK(FetchBoth(*c, "oc", a, nullptr, &raw_a) == fp8);
    CheckFp8Bound(raw_a, data_a);
    CHECK(FetchBoth(*c, "oc", d, nullptr, &raw_d) == kvtc);
    auto cal = c->GetCalibration("oc", online_fp);
    REQUIRE(cal.ok());
    online_bytes = cal->bytes;
  }
  CHECK(std::filesystem::exists(CalibrationFile(dir, online_fp)));
  {
    auto daemon = StartTestDaemon();
    auto c = Connect(*daemon);
    auto created = c->CreateNamespace(spec);
    INFO(created.status().ToString());
    REQUIRE(created.ok());
    // Still calibrated: the online calibration is active, nothing samples.
    const client::NamespaceStats st = StatsOf(*c, "oc");
    CHECK(st.calibration.codec == "kvtc");
    CHECK(st.calibration.fingerprint == online_fp);
    CHECK(st.calibration.state == client::CalibrationState::kReady);
    CHECK(FetchBoth(*c, "oc", a, &fps, &got) == fp8);
    CHECK(got == raw_a);
    CHECK(fps == std::vector<uint64_t>{0, 0});
    fps.clear();
    CHECK(FetchBoth(*c, "oc", d, &fps, &got) == kvtc);
    CHECK(got == raw_d);
    CHECK(fps == std::vector<uint64_t>{online_fp, online_fp});
    auto cal = c->GetCalibration("oc", online_fp);
    REQUIRE(cal.ok());
    CHECK(cal->bytes == online_bytes);
    auto list = c->ListCalibrations("oc");
    REQUIRE(list.ok());
    REQUIRE(list->size() == 1);
    CHECK((*list)[0].source == "online");
    CHECK((*list)[0].active);
    CHECK((*list)[0].pages == 4);  // b and d
    // An uploaded, pinned calibration and pages encoded with it.
    auto up = c->UploadCalibration("oc", IdentityCalibrationBytes(), true);
    REQUIRE(up.ok());
    uploaded_fp = *up;
    REQUIRE(
        c->Insert("oc", e, testing::FloatPages(2, kPageBytes, 4), kPageBytes)
            .ok());
    REQUIRE(c->Demote("oc", client::Tier::kDisk).ok());
    CHECK(FetchBoth(*c, "oc", e, nullptr, &raw_e) == kvtc);
  }
  {
    auto daemon = StartTestDaemon();
    auto c = Connect(*daemon);
    REQUIRE(c->CreateNamespace(spec).ok());
    const client::NamespaceStats st = StatsOf(*c, "oc");
    CHECK(st.calibration.fingerprint == uploaded_fp);
    CHECK(st.calibration.pinned);
    fps.clear();
    CHECK(FetchBoth(*c, "oc", e, &fps, &got) == kvtc);
    CHECK(got == raw_e);
    CHECK(fps == std::vector<uint64_t>{uploaded_fp, uploaded_fp});
    CHECK(FetchBoth(*c, "oc", d, nullptr, &got) == kvtc);
    CHECK(got == raw_d);
    auto list = c->ListCalibrations("oc");
    REQUIRE(list.ok());
    CHECK(list->size() == 2);
  }
  // One flipped byte in the online calibration's file.
  {
    std::fstream f(CalibrationFile(dir, online_fp),
                   std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f.good());
    f.seekg(100);
    char ch = 0;
    f.read(&ch, 1);
    f.seekp(100);
    ch ^= 0x40;
    f.write(&ch, 1);
  }
  // An intact envelope around bytes that are no calibration: refused by
  // the full validation, not only by the checksum.
  const std::string junk = CalibrationFile(dir, 0xdeadbeef);
  {
    PersistedCalibration p;
    p.codec = "kvtc";
    p.fingerprint = 0xdeadbeef;
    p.source = 1;
    p.bytes = "not a calibration";
    std::ofstream(junk, std::ios::binary) << SerializePersistedCalibration(p);
  }
  {
    auto daemon = StartTestDaemon();
    auto c = Connect(*daemon);
    REQUIRE(c->CreateNamespace(spec).ok());
    CHECK(!std::filesystem::exists(CalibrationFile(dir, online_fp)));
    CHECK(!std::filesystem::exists(junk));
    // Its pages are gone, never served with another calibration.
    for (const auto& t : {b, d}) {
      auto m = c->Match("oc", t, /*lock=*/false);
      REQUIRE(m.ok());
      CHECK(m->matched_tokens == 0);
    }
    CHECK(c->GetCalibration("oc", online_fp).status().code() ==
          absl::StatusCode::kNotFound);
    const client::NamespaceStats st = StatsOf(*c, "oc");
    CHECK(st.calibration.fingerprint == uploaded_fp);
    CHECK(st.calibration.pinned);
    CHECK(FetchBoth(*c, "oc", a, nullptr, &got) == fp8);
    CHECK(got == raw_a);
    CHECK(FetchBoth(*c, "oc", e, nullptr, &got) == kvtc);
    CHECK(got == raw_e);
    auto list = c->ListCalibrations("oc");
    REQUIRE(list.ok());
    REQUIRE(list->size() == 1);
    CHECK((*list)[0].fingerprint == uploaded_fp);
  }
}

}  // namespace
}  // namespace kvharbor
