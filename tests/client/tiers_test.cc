// Page tiers end to end through the SDK against an in-process daemon:
// insert, eviction to the host-compressed tier, demotion to disk, RAW and
// COMPRESSED fetches from every tier (identity byte-exact, KVTC within its
// bounds and equal to the daemon's own decoding), warm restart from the disk
// tier, a corrupt disk file (never served, dropped at restart) and a failing
// disk (pages stay in host memory, counted).
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "tests/client/client_test_util.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

using client::FetchFormat;
using client::FetchSource;
using client::Tier;
using testing::Connect;
using testing::StartTestDaemon;
using testing::TokenRange;

// fp32, 2 layers, 2 heads, head_dim 8, 4 tokens a page: 1 KiB pages.
constexpr uint32_t kLayers = 2, kHeads = 2, kHeadDim = 8, kPageSize = 4;
constexpr uint64_t kPageBytes = 2 * kLayers * kPageSize * kHeads * kHeadDim * 4;

using testing::FloatPages;
using testing::TempDir;

client::NamespaceSpec TierSpec(const std::string& name, uint32_t pages,
                               const std::string& disk_dir) {
  client::NamespaceSpec s =
      testing::MakeSpec(name, kLayers, kHeads, kHeadDim, kPageSize,
                        client::DType::kFP32, pages * kPageBytes);
  s.host_compressed_bytes = 1 << 20;
  s.disk_dir = disk_dir;
  return s;
}

std::vector<uint8_t> Page(const std::vector<uint8_t>& all, size_t i) {
  return std::vector<uint8_t>(all.begin() + i * kPageBytes,
                              all.begin() + (i + 1) * kPageBytes);
}

// Matches `tokens` and checks every page is in `tier`.
client::Lease MatchIn(Client& c, const std::string& ns,
                      const std::vector<int32_t>& tokens, size_t pages,
                      Tier tier) {
  absl::StatusOr<client::Lease> m = c.Match(ns, tokens, /*lock=*/true);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  REQUIRE(m->pages.size() == pages);
  REQUIRE(m->page_tiers.size() == pages);
  for (Tier t : m->page_tiers) CHECK(client::TierName(t) == TierName(tier));
  return *m;
}

// RAW and COMPRESSED (decoded) fetches of a lease both give `want` exactly.
void CheckExact(Client& c, const std::string& ns, const client::Lease& lease,
                const std::vector<uint8_t>& want, Tier tier) {
  for (FetchFormat f : {FetchFormat::kRaw, FetchFormat::kCompressed}) {
    INFO("format " << static_cast<int>(f));
    auto pages = c.Fetch(ns, FetchSource::FromLease(lease.id), f);
    INFO(pages.status().ToString());
    REQUIRE(pages.ok());
    REQUIRE(pages->size() == lease.pages.size());
    for (size_t i = 0; i < pages->size(); ++i) {
      CHECK((*pages)[i] == Page(want, i));
    }
  }
  auto comp = c.FetchCompressed(ns, FetchSource::FromLease(lease.id));
  REQUIRE(comp.ok());
  for (size_t i = 0; i < comp->size(); ++i) {
    const client::CompressedPage& p = (*comp)[i];
    CHECK(p.handle == lease.pages[i]);
    CHECK(p.tier == tier);
    CHECK(p.codec == "identity");
    CHECK(p.calibration_fingerprint == 0);
    CHECK(p.buffer.size() > kPageBytes);  // envelope around the raw bytes
  }
}

client::NamespaceStats StatsOf(Client& c, const std::string& ns) {
  auto s = c.Stats(ns);
  REQUIRE(s.ok());
  REQUIRE(s->namespaces.size() == 1);
  REQUIRE(s->namespaces[0].tiers.size() == 3);
  return s->namespaces[0];
}

TEST_CASE(
    "SDK tiers: identity pages move raw -> host -> disk, fetched "
    "byte-exact in both formats",
    "[client][tiers]") {
  TempDir dir;
  auto daemon = StartTestDaemon();
  auto c = Connect(*daemon);
  const std::string ns = "id";
  REQUIRE(c->CreateNamespace(TierSpec(ns, 4, dir.path + "/disk")).ok());
  const auto a_tokens = TokenRange(4 * kPageSize, 100);
  const auto b_tokens = TokenRange(4 * kPageSize, 5000);
  const auto a = FloatPages(4, kPageBytes, 1), b = FloatPages(4, kPageBytes, 2);
  REQUIRE(c->Insert(ns, a_tokens, a, kPageBytes).ok());
  {
    client::Lease l = MatchIn(*c, ns, a_tokens, 4, Tier::kRaw);
    CheckExact(*c, ns, l, a, Tier::kRaw);
    REQUIRE(c->Release(l.id).ok());
  }
  // The pool holds 4 pages: inserting B compresses A into host memory.
  auto ins = c->Insert(ns, b_tokens, b, kPageBytes);
  INFO(ins.status().ToString());
  REQUIRE(ins.ok());
  CHECK(ins->pages_stored == 4);
  {
    client::Lease l = MatchIn(*c, ns, a_tokens, 4, Tier::kHostCompressed);
    CheckExact(*c, ns, l, a, Tier::kHostCompressed);
    REQUIRE(c->Release(l.id).ok());
  }
  client::NamespaceStats s = StatsOf(*c, ns);
  CHECK(s.tiers[0].tier == Tier::kRaw);
  CHECK(s.tiers[0].pages == 4);
  CHECK(s.tiers[0].bytes == 4 * kPageBytes);
  CHECK(s.tiers[1].tier == Tier::kHostCompressed);
  CHECK(s.tiers[1].pages == 4);
  CHECK(s.tiers[1].bytes > 4 * kPageBytes);
  CHECK(s.demoted_pages == 4);

  auto moved = c->Demote(ns, Tier::kDisk);
  INFO(moved.status().ToString());
  REQUIRE(moved.ok());
  CHECK(*moved == 12);  // B raw -> host (4), all 8 host -> disk
  {
    client::Lease la = MatchIn(*c, ns, a_tokens, 4, Tier::kDisk);
    CheckExact(*c, ns, la, a, Tier::kDisk);
    client::Lease lb = MatchIn(*c, ns, b_tokens, 4, Tier::kDisk);
    CheckExact(*c, ns, lb, b, Tier::kDisk);
  }
  s = StatsOf(*c, ns);
  CHECK(s.tiers[2].pages == 8);
  CHECK(s.tiers[0].pages + s.tiers[1].pages == 0);
  CHECK(s.disk_write_errors == 0);
  CHECK(c->calibrations_loaded() == 0);  // identity needs none

  // Bad tier requests name the field.
  auto raw = c->Demote(ns, Tier::kRaw);
  CHECK(raw.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(raw.status().message().find("tier") != absl::string_view::npos);
  auto none = c->Demote("no_such_ns", Tier::kDisk);
  CHECK(none.status().code() == absl::StatusCode::kNotFound);
  REQUIRE(c->CreateNamespace(
               testing::MakeSpec("flat", kLayers, kHeads, kHeadDim, kPageSize,
                                 client::DType::kFP32, 4 * kPageBytes))
              .ok());
  auto flat = c->Demote("flat", Tier::kHostCompressed);
  CHECK(flat.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(flat.status().message().find("tier") != absl::string_view::npos);
}

TEST_CASE("SDK tiers: bad tier specs are INVALID_ARGUMENT naming the field",
          "[client][tiers]") {
  auto daemon = StartTestDaemon();
  auto c = Connect(*daemon);
  struct Case {
    client::NamespaceSpec spec;
    const char* field;
  };
  auto base = [] {
    return testing::MakeSpec("bad", kLayers, kHeads, kHeadDim, kPageSize,
                             client::DType::kFP32, 4 * kPageBytes);
  };
  std::vector<Case> cases;
  cases.push_back({base(), "spec.codec"});
  cases.back().spec.codec = "zip";
  cases.push_back({base(), "spec.calibration_path"});
  cases.back().spec.codec = "kvtc";
  cases.push_back({base(), "spec.calibration"});
  cases.back().spec.codec = "kvtc";
  cases.back().spec.calibration = "not a calibration";
  cases.push_back({base(), "spec.calibration"});
  cases.back().spec.codec = "kvtc";
  cases.back().spec.calibration = "x";
  cases.back().spec.calibration_path = "/x";
  cases.push_back({base(), "spec.calibration_path"});
  cases.back().spec.calibration_path = "/x";
  cases.push_back({base(), "spec.disk_dir"});
  cases.back().spec.disk_dir = "/tmp/kvh-never";
  cases.push_back({base(), "spec.disk_bytes"});
  cases.back().spec.disk_bytes = 1 << 20;
  for (const Case& k : cases) {
    INFO(k.field);
    auto r = c->CreateNamespace(k.spec);
    INFO(r.status().ToString());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(r.status().message().find(k.field) != absl::string_view::npos);
  }
}

TEST_CASE("SDK tiers: KVTC pages fetched compressed decode within bounds",
          "[client][tiers]") {
  TempDir dir;
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
  const std::string cal_path = dir.path + "/cal.kvtc";
  REQUIRE(WriteKvtcCalibrationFile(*cal, cal_path).ok());
  auto cal_bytes = SerializeKvtcCalibration(*cal);
  REQUIRE(cal_bytes.ok());

  auto daemon = StartTestDaemon();
  auto c = Connect(*daemon);
  // One namespace with the calibration as a path, one inline.
  client::NamespaceSpec by_path = TierSpec("kp", 8, dir.path + "/disk");
  by_path.codec = "kvtc";
  by_path.calibration_path = cal_path;
  client::NamespaceSpec by_bytes = TierSpec("kb", 8, "");
  by_bytes.codec = "kvtc";
  by_bytes.calibration = *cal_bytes;
  for (const client::NamespaceSpec& spec : {by_path, by_bytes}) {
    auto r = c->CreateNamespace(spec);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(r->info.spec.codec == "kvtc");
    CHECK(r->info.spec.calibration_fingerprint == cal->Fingerprint());
    CHECK(r->info.spec.calibration.empty());
    auto got = c->GetCalibration(spec.name);
    REQUIRE(got.ok());
    CHECK(got->codec == "kvtc");
    CHECK(got->fingerprint == cal->Fingerprint());
    CHECK(got->bytes == *cal_bytes);
  }

  const auto tokens = TokenRange(4 * kPageSize, 7);
  const auto data = FloatPages(4, kPageBytes, 3);
  uint64_t loads = 0;
  for (const std::string ns : {"kp", "kb"}) {
    REQUIRE(c->Insert(ns, tokens, data, kPageBytes).ok());
    std::vector<Tier> tiers = {Tier::kRaw, Tier::kHostCompressed};
    if (ns == "kp") tiers.push_back(Tier::kDisk);
    for (Tier tier : tiers) {
      INFO(ns << " " << client::TierName(tier));
      if (tier != Tier::kRaw) REQUIRE(c->Demote(ns, tier).ok());
      client::Lease l = MatchIn(*c, ns, tokens, 4, tier);
      auto comp = c->FetchCompressed(ns, FetchSource::FromLease(l.id));
      REQUIRE(comp.ok());
      auto decoded =
          c->Fetch(ns, FetchSource::FromLease(l.id), FetchFormat::kCompressed);
      INFO(decoded.status().ToString());
      REQUIRE(decoded.ok());
      auto raw = c->Fetch(ns, FetchSource::FromLease(l.id), FetchFormat::kRaw);
      REQUIRE(raw.ok());
      for (size_t i = 0; i < 4; ++i) {
        const client::CompressedPage& p = (*comp)[i];
        CHECK(p.codec == "kvtc");
        CHECK(p.calibration_fingerprint == cal->Fingerprint());
        CHECK(p.tier == tier);
        CHECK(p.buffer.size() < kPageBytes);  // fp8: about a quarter
        // FP8 E4M3 keeps 3 mantissa bits: relative error at most 2^-4.
        const std::vector<uint8_t> want = Page(data, i);
        // A cold page: the SDK decodes exactly as the daemon does. A raw one
        // is sent raw by RAW fetches, and encoded on the fly for COMPRESSED.
        CHECK((*decoded)[i] ==
              (tier == Tier::kRaw ? (*decoded)[i] : (*raw)[i]));
        if (tier == Tier::kRaw) CHECK((*raw)[i] == want);
        double worst = 0, sum_err = 0;
        for (size_t k = 0; k < kPageBytes; k += 4) {
          float x, y;
          std::memcpy(&x, &want[k], 4);
          std::memcpy(&y, &(*decoded)[i][k], 4);
          worst = std::max(
              worst, std::fabs(double(y) - x) - std::fabs(double(x)) / 16.0);
        }
        CHECK(worst <= 1e-2);
        CHECK(sum_err / (kPageBytes / 4) < 0.02);  // typical error is small
        CHECK((*decoded)[i] != want);  // lossy: not the identity codec
      }
      REQUIRE(c->Release(l.id).ok());
    }
    ++loads;
    // One calibration per (namespace, fingerprint), however many fetches.
    CHECK(c->calibrations_loaded() == loads);
  }
  // A second client decodes on its own, loading the calibration once.
  auto c2 = Connect(*daemon);
  client::Lease l = MatchIn(*c2, "kp", tokens, 4, Tier::kDisk);
  REQUIRE(
      c2->Fetch("kp", FetchSource::FromPages(l.pages), FetchFormat::kCompressed)
          .ok());
  CHECK(c2->calibrations_loaded() == 1);
}

std::vector<std::string> PageFiles(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  REQUIRE(d != nullptr);
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(dir + "/" + name);
  }
  closedir(d);
  return out;
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  REQUIRE(stat(path.c_str(), &st) == 0);
  return static_cast<uint64_t>(st.st_size);
}

TEST_CASE(
    "SDK tiers: warm restart serves the disk tier; a corrupt file is "
    "never served and dropped",
    "[client][tiers]") {
  TempDir dir;
  const std::string disk = dir.path + "/disk";
  const auto tokens = TokenRange(4 * kPageSize, 40);
  const auto data = FloatPages(4, kPageBytes, 4);
  {
    auto daemon = StartTestDaemon();
    auto c = Connect(*daemon);
    REQUIRE(c->CreateNamespace(TierSpec("w", 8, disk)).ok());
    REQUIRE(c->Insert("w", tokens, data, kPageBytes).ok());
    REQUIRE(*c->Demote("w", Tier::kDisk) == 8);  // 4 raw->host, 4 host->disk
  }                                              // the daemon shuts down
  REQUIRE(PageFiles(disk).size() == 4);
  {
    auto daemon = StartTestDaemon();
    auto c = Connect(*daemon);
    REQUIRE(c->CreateNamespace(TierSpec("w", 8, disk)).ok());
    client::Lease l = MatchIn(*c, "w", tokens, 4, Tier::kDisk);
    CheckExact(*c, "w", l, data, Tier::kDisk);
    CHECK(StatsOf(*c, "w").corrupt_dropped == 0);
  }
  // Corrupt the last page's file: it holds the longest token prefix, hence
  // is the largest (identity buffers are all the same size).
  std::vector<std::string> files = PageFiles(disk);
  std::sort(files.begin(), files.end(), [](const auto& x, const auto& y) {
    return FileSize(x) < FileSize(y);
  });
  {
    std::fstream f(files.back(),
                   std::ios::in | std::ios::out | std::ios::binary);
    const auto mid = static_cast<std::streamoff>(FileSize(files.back()) / 2);
    f.seekg(mid);
    const char byte = static_cast<char>(f.get());
    f.seekp(mid);
    f.put(static_cast<char>(byte ^ 0x5a));
  }
  {
    // Pages restored from the disk tier are verified when read: the corrupt
    // one is refused, the others served.
    auto daemon = StartTestDaemon();
    auto c = Connect(*daemon);
    REQUIRE(c->CreateNamespace(TierSpec("w", 8, disk)).ok());
    client::NamespaceStats s = StatsOf(*c, "w");
    const absl::StatusOr<client::Lease> m = c->Match("w", tokens, true);
    REQUIRE(m.ok());
    if (s.corrupt_dropped == 1) {
      // Dropped at load: only the 3 good pages are indexed.
      CHECK(m->pages.size() == 3);
    } else {
      REQUIRE(m->pages.size() == 4);
      for (FetchFormat f : {FetchFormat::kRaw, FetchFormat::kCompressed}) {
        auto bad = c->Fetch("w", FetchSource::FromLease(m->id), f);
        CHECK(bad.status().code() == absl::StatusCode::kDataLoss);
      }
    }
    auto good = c->Fetch("w", FetchSource::FromLease(m->id, 0, 3),
                         FetchFormat::kCompressed);
    INFO(good.status().ToString());
    REQUIRE(good.ok());
    for (size_t i = 0; i < 3; ++i) CHECK((*good)[i] == Page(data, i));
  }
  CHECK(PageFiles(disk).size() == 3);
}

TEST_CASE("SDK tiers: a failing disk keeps pages in host memory, counted",
          "[client][tiers]") {
  TempDir dir;
  const std::string disk = dir.path + "/disk";
  auto daemon = StartTestDaemon();
  auto c = Connect(*daemon);
  REQUIRE(c->CreateNamespace(TierSpec("f", 8, disk)).ok());
  const auto tokens = TokenRange(2 * kPageSize, 900);
  const auto data = FloatPages(2, kPageBytes, 5);
  REQUIRE(c->Insert("f", tokens, data, kPageBytes).ok());
  // The directory turns into a file: every write fails (even for root).
  REQUIRE(std::system(
              ("rm -rf '" + disk + "' && touch '" + disk + "'").c_str()) == 0);
  // Demote says the disk refused and what moved; nothing is dropped.
  auto moved = c->Demote("f", Tier::kDisk);
  INFO(moved.status().ToString());
  REQUIRE(moved.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(moved.status().message(), "no page was dropped"));
  client::NamespaceStats s = StatsOf(*c, "f");
  CHECK(s.disk_write_errors >= 1);
  CHECK(s.tiers[2].pages == 0);
  CHECK(s.tiers[1].pages == 2);
  client::Lease l = MatchIn(*c, "f", tokens, 2, Tier::kHostCompressed);
  CheckExact(*c, "f", l, data, Tier::kHostCompressed);
}

}  // namespace
}  // namespace kvharbor
