// Online calibration and the calibration API end to end through the SDK
// against an in-process daemon: a kvtc namespace without a calibration
// stores evicted pages as fp8, calibrates in the background after
// min_tokens, switches to KVTC; COMPRESSED fetches of pages of both codecs
// decode in the SDK exactly as the daemon decodes them; upload (bad bytes
// are INVALID_ARGUMENT naming the field), list, get by fingerprint, pin.
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/kvtc_calibration.h"
#include "tests/client/client_test_util.h"
#include "tests/core/kvtc_test_util.h"

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
    if (StatsOf(c, ns).calibration_state == 3) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Fetches `tokens` RAW (decoded by the daemon) and COMPRESSED (decoded by
// the SDK) and checks both agree; returns each page's codec.
std::vector<std::string> FetchBoth(Client& c, const std::string& ns,
                                   const std::vector<int32_t>& tokens) {
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
  for (const client::CompressedPage& p : *buffers) codecs.push_back(p.codec);
  return codecs;
}

TEST_CASE("SDK calibration: online fp8 -> KVTC switch, upload, list, pin",
          "[client][calibration]") {
  auto daemon = StartTestDaemon();
  auto c = Connect(*daemon);
  client::NamespaceSpec spec =
      testing::MakeSpec("oc", kLayers, kHeads, kHeadDim, kPageSize,
                        client::DType::kFP32, 8 * kPageBytes);
  spec.codec = "kvtc";
  spec.host_compressed_bytes = 1 << 20;
  spec.online_calibration.enabled = true;
  spec.online_calibration.min_tokens = 16;
  spec.online_calibration.target_ratio = 2;
  auto created = c->CreateNamespace(spec);
  INFO(created.status().ToString());
  REQUIRE(created.ok());
  CHECK(created->info.spec.online_calibration.enabled);
  CHECK(created->info.spec.online_calibration.min_tokens == 16);
  CHECK(created->info.stats.calibration_state == 1);
  CHECK(created->info.stats.active_codec == "fp8");

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
  CHECK(StatsOf(*c, "oc").calibration_tokens_seen == 8);
  CHECK(FetchBoth(*c, "oc", a) == std::vector<std::string>{"fp8", "fp8"});
  auto list = c->ListCalibrations("oc");
  REQUIRE(list.ok());
  CHECK(list->empty());

  // Bad uploads: INVALID_ARGUMENT naming the field; nothing changes.
  auto up = c->UploadCalibration("oc", "not a calibration", false);
  REQUIRE(up.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(up.status().message().find("calibration: ") == 0);
  CHECK(StatsOf(*c, "oc").active_codec == "fp8");

  const auto b = TokenRange(2 * kPageSize, 200);  // 16 tokens: calibrates
  REQUIRE(c->Insert("oc", b, testing::FloatPages(2, kPageBytes, 2), kPageBytes)
              .ok());
  REQUIRE(WaitReady(*c, "oc"));
  const client::NamespaceStats ready = StatsOf(*c, "oc");
  CHECK(ready.active_codec == "kvtc");
  REQUIRE(ready.active_fingerprint != 0);
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
  CHECK(online_fp == ready.active_fingerprint);
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
  CHECK(StatsOf(*c, "oc").calibration_pinned);
  Geometry g;
  g.num_layers = kLayers;
  g.num_kv_heads = kHeads;
  g.head_dim = kHeadDim;
  g.page_size = kPageSize;
  g.dtype = DType::kFP32;
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  auto cal = testing::MakeCalibration(g, KvtcRowKind::kPerToken,
                                      IdentityBasis(f, f, testing::Fp8All(f)),
                                      IdentityBasis(f, f, testing::Fp8All(f)));
  auto bytes = SerializeKvtcCalibration(*cal);
  REQUIRE(bytes.ok());
  CHECK(c->UploadCalibration("oc", *bytes, false).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE(c->PinCalibration("oc", online_fp, false).ok());
  up = c->UploadCalibration("oc", *bytes, true);
  REQUIRE(up.ok());
  CHECK(*up == cal->Fingerprint());
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

}  // namespace
}  // namespace kvharbor
