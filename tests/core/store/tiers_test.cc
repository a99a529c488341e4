// The tier state machine of core/store/namespace.h: raw -> host-compressed ->
// disk -> gone, with the path invariant of types/tier.h.
#include <stdlib.h>
#include <unistd.h>
#include <xxh3.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/codec/codec.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/index/radix_index.h"
#include "core/store/namespace.h"
#include "core/store/store.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"
#include "tests/core/store/tiers_test_util.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

using namespace testing;  // NOLINT: the tier test helpers

TEST_CASE("tiers: pool pressure compresses LRU pages, fetched byte-exact") {
  auto ns = Make(Config(1 << 20), 4);
  const std::string a = Pages(2, 1), b = Pages(2, 2), c = Pages(2, 3);
  Insert(*ns, Seq(0, 8), a);
  Insert(*ns, Seq(100, 8), b);
  Insert(*ns, Seq(200, 8), c);  // needs room: the LRU pages (a) compress
  REQUIRE(ns->CheckInvariants().ok());
  NamespaceStats k = ns->Counters();
  CHECK(k.tiers[0].pages + k.tiers[1].pages == 6);
  CHECK(k.tiers[1].pages >= 2);
  CHECK(k.tiers[1].bytes > 0);
  std::vector<Tier> tiers;
  CHECK(Fetch(*ns, Seq(0, 8), FetchFormat::kRaw, &tiers) == a);
  CHECK(tiers ==
        std::vector<Tier>{Tier::kHostCompressed, Tier::kHostCompressed});
  CHECK(Fetch(*ns, Seq(200, 8), FetchFormat::kRaw, &tiers) == c);
  CHECK(tiers == std::vector<Tier>{Tier::kRaw, Tier::kRaw});
  // COMPRESSED from both tiers decodes to the same bytes.
  CodecParams p;
  p.geometry = Geo();
  auto identity = CreateIdentityCodec(p);
  REQUIRE(identity.ok());
  CHECK(DecodeAll(*ns, Seq(0, 8), **identity) == a);
  CHECK(DecodeAll(*ns, Seq(200, 8), **identity) == c);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("tiers: an insert extending a cold prefix promotes the prefix") {
  auto ns = Make(Config(1 << 20), 8);
  const std::string a = Pages(3, 4);
  Insert(*ns, Seq(0, 8), a.substr(0, 2 * ns->page_bytes()));
  REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 2);
  REQUIRE(ns->CheckInvariants().ok());
  Insert(*ns, Seq(0, 12), a);
  REQUIRE(ns->CheckInvariants().ok());
  std::vector<Tier> tiers;
  CHECK(Fetch(*ns, Seq(0, 12), FetchFormat::kRaw, &tiers) == a);
  CHECK(tiers == std::vector<Tier>(3, Tier::kRaw));
  CHECK(ns->Counters().promoted_pages == 2);
}

// Found by tests/stress/core_stress.cc: pages another upload stored during
// this one and that were demoted before it committed must not end up above
// the raw pages it appends.
TEST_CASE("tiers: pages stored and demoted during an upload are promoted") {
  auto ns = Make(Config(1 << 20), 8);
  const size_t pb = ns->page_bytes();
  const std::string a = Pages(4, 21);
  Insert(*ns, Seq(0, 4), a.substr(0, pb));
  auto up = ns->BeginInsert(Seq(0, 16), {});  // locks page 0, its prefix
  REQUIRE(up.ok());
  REQUIRE((*up)->skip_pages() == 1);
  REQUIRE((*up)->Write(0, a).ok());
  Insert(*ns, Seq(0, 12), a.substr(0, 3 * pb));  // pages 1 and 2
  REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 2);
  REQUIRE(ns->Counters().tiers[1].pages == 2);
  auto done = (*up)->Commit();
  REQUIRE(done.ok());
  CHECK(done->pages_stored == 1);
  REQUIRE(ns->CheckInvariants().ok());
  std::vector<Tier> tiers;
  CHECK(Fetch(*ns, Seq(0, 16), FetchFormat::kRaw, &tiers) == a);
  CHECK(tiers == std::vector<Tier>(4, Tier::kRaw));
  CHECK(ns->Counters().promoted_pages == 2);
  CHECK(ns->Counters().free_pages == 4);
}

TEST_CASE("tiers: a leased page is not moved; demotion works tail first") {
  auto ns = Make(Config(1 << 20), 8);
  Insert(*ns, Seq(0, 8), Pages(2, 5));
  Insert(*ns, Seq(0, 16), Pages(4, 5));  // extends: pages 2,3 below 0,1
  auto m = ns->Match(Seq(0, 8), true, absl::ZeroDuration());
  REQUIRE(m.ok());
  REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 2);
  REQUIRE(ns->CheckInvariants().ok());
  std::vector<Tier> tiers;
  Fetch(*ns, Seq(0, 16), FetchFormat::kRaw, &tiers);
  CHECK(tiers == std::vector<Tier>{Tier::kRaw, Tier::kRaw,
                                   Tier::kHostCompressed,
                                   Tier::kHostCompressed});
  REQUIRE(ns->Release(m->lease_id).ok());
  REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 2);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("tiers: without a disk, over the host budget pages are dropped") {
  const uint64_t pb = Geo().PageBytes();
  auto ns = Make(Config(3 * pb), 8);  // identity buffers are a bit > pb
  Insert(*ns, Seq(0, 16), Pages(4, 6));
  REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 4);
  REQUIRE(ns->CheckInvariants().ok());
  NamespaceStats k = ns->Counters();
  CHECK(k.tiers[1].bytes <= 3 * pb);
  CHECK(k.tiers[1].pages >= 1);
  CHECK(k.tiers[1].pages < 4);
  // Dropped from the tail: what is left is still a prefix.
  auto m = ns->Match(Seq(0, 16), false, absl::ZeroDuration());
  CHECK(m->matched_tokens == k.tiers[1].pages * 4);
}

TEST_CASE("tiers: disk tier round-trip and warm restart") {
  TempDir dir;
  const uint64_t pb = Geo().PageBytes();
  const std::string a = Pages(3, 7), b = Pages(1, 8);
  {
    auto ns = Make(Config(2 * pb, dir.path), 8);
    Insert(*ns, Seq(0, 12), a);
    Insert(*ns, Seq(0, 4), a.substr(0, pb));
    Insert(*ns, Seq(50, 4), b);
    REQUIRE(*ns->tiers().DemoteAll(Tier::kDisk) > 0);
    REQUIRE(ns->CheckInvariants().ok());
    NamespaceStats k = ns->Counters();
    CHECK(k.tiers[2].pages == 4);
    std::vector<Tier> tiers;
    CHECK(Fetch(*ns, Seq(0, 12), FetchFormat::kRaw, &tiers) == a);
    CHECK(tiers == std::vector<Tier>(3, Tier::kDisk));
    CodecParams p;
    p.geometry = Geo();
    auto identity = CreateIdentityCodec(p);
    CHECK(DecodeAll(*ns, Seq(0, 12), **identity) == a);
  }
  std::vector<std::string> log;
  auto ns = Make(Config(2 * pb, dir.path), 8, &log);
  CHECK(log.empty());
  REQUIRE(ns->CheckInvariants().ok());
  CHECK(ns->Counters().tiers[2].pages == 4);
  CHECK(Fetch(*ns, Seq(0, 12), FetchFormat::kRaw) == a);
  CHECK(Fetch(*ns, Seq(50, 4), FetchFormat::kRaw) == b);
  // Extending a restored prefix promotes it back to raw.
  Insert(*ns, Seq(50, 8), b + Pages(1, 9));
  REQUIRE(ns->CheckInvariants().ok());
  CHECK(Fetch(*ns, Seq(50, 4), FetchFormat::kRaw) == b);
}

TEST_CASE("tiers: a disk file corrupted while stopped is dropped at restart") {
  TempDir dir;
  const uint64_t pb = Geo().PageBytes();
  const std::string a = Pages(2, 10), b = Pages(1, 11);
  auto ns = Make(Config(pb, dir.path), 8);
  Insert(*ns, Seq(0, 8), a);
  Insert(*ns, Seq(70, 4), b);
  REQUIRE(*ns->tiers().DemoteAll(Tier::kDisk) > 0);
  REQUIRE(PageFiles(dir.path).size() == 3);
  // Find b's file by content and corrupt it in the buffer.
  fs::path b_file;
  for (const auto& p : PageFiles(dir.path)) {
    std::ifstream f(p, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(f)), {});
    if (s.find(b.substr(0, 64)) != std::string::npos) b_file = p;
  }
  REQUIRE(!b_file.empty());
  ns.reset();
  FlipByte(b_file, 20);  // (corruption found at fetch: faults_test.cc)
  // Restart: the corrupt file is dropped with a log line, the rest served.
  std::vector<std::string> log;
  ns = Make(Config(pb, dir.path), 8, &log);
  REQUIRE(log.size() == 1);
  CHECK(log[0].find("corrupt") != std::string::npos);
  CHECK(!fs::exists(b_file));
  CHECK(ns->Match(Seq(70, 4), false, absl::ZeroDuration())->matched_tokens ==
        0);
  CHECK(Fetch(*ns, Seq(0, 8), FetchFormat::kRaw) == a);
  CHECK(ns->Counters().corrupt_dropped == 1);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("tiers: a failing disk write keeps the page or drops it cleanly") {
  TempDir dir;
  const uint64_t pb = Geo().PageBytes();
  const std::string a = Pages(2, 12);
  SECTION("within the host budget the page stays in the host tier") {
    auto ns = Make(Config(8 * pb, dir.path), 8);
    Insert(*ns, Seq(0, 8), a);
    fs::remove_all(dir.path);  // every write now fails
    REQUIRE(ns->tiers().DemoteAll(Tier::kDisk).ok());
    REQUIRE(ns->CheckInvariants().ok());
    NamespaceStats k = ns->Counters();
    CHECK(k.disk_write_errors > 0);
    CHECK(k.tiers[1].pages == 2);
    CHECK(k.tiers[2].pages == 0);
    CHECK(Fetch(*ns, Seq(0, 8), FetchFormat::kRaw) == a);
  }
  SECTION("over the host budget the page is dropped") {
    auto ns = Make(Config(pb, dir.path), 8);
    Insert(*ns, Seq(0, 8), a);
    fs::remove_all(dir.path);
    REQUIRE(ns->tiers().DemoteAll(Tier::kDisk).ok());
    REQUIRE(ns->CheckInvariants().ok());
    NamespaceStats k = ns->Counters();
    CHECK(k.tiers[2].pages == 0);
    CHECK(k.tiers[1].bytes <= pb);
    auto m = ns->Match(Seq(0, 8), false, absl::ZeroDuration());
    if (m->matched_tokens > 0) {
      CHECK(Fetch(*ns, Seq(0, 8), FetchFormat::kRaw) ==
            a.substr(0, m->matched_tokens / 4 * pb));
    }
  }
}

TEST_CASE("tiers: KVTC pages decode within the codec's bounds") {
  const Geometry g = Geo();
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  auto cal = testing::MakeCalibration(g, KvtcRowKind::kPerToken,
                                      IdentityBasis(f, f, testing::Fp8All(f)),
                                      IdentityBasis(f, f, testing::Fp8All(f)));
  REQUIRE(cal->Validate().ok());
  CodecParams p;
  p.geometry = g;
  p.calibration = cal;
  auto codec = CodecRegistry::Default().Create("kvtc", p);
  REQUIRE(codec.ok());
  NamespaceConfig c = Config(1 << 20);
  c.tier_codec = std::shared_ptr<const Codec>(std::move(*codec));
  c.calibration_fingerprint = cal->Fingerprint();
  auto ns = Make(c, 8);
  const std::string a = Pages(2, 13);
  Insert(*ns, Seq(0, 8), a);
  REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 2);
  CHECK(ns->Counters().tiers[1].bytes < 2 * g.PageBytes());
  const auto check = [&](const std::string& got) {
    REQUIRE(got.size() == a.size());
    for (size_t i = 0; i < a.size(); i += 4) {
      float x, y;
      std::memcpy(&x, &a[i], 4);
      std::memcpy(&y, &got[i], 4);
      // FP8 E4M3 keeps 3 mantissa bits: relative error <= 1/16.
      REQUIRE(std::fabs(x - y) <= std::fabs(x) / 16 + 1e-2f);
    }
  };
  check(Fetch(*ns, Seq(0, 8), FetchFormat::kRaw));
  check(DecodeAll(*ns, Seq(0, 8), *c.tier_codec));
}

TEST_CASE("radix index: tiers keep the path invariant") {
  RadixIndex idx(2);
  REQUIRE(idx.Insert(Seq(0, 6), {1, 2, 3}).ok());
  REQUIRE(idx.Insert(Seq(0, 8), {0, 0, 0, 4}).ok());
  REQUIRE(idx.Insert({0, 1, 9, 9}, {0, 5}).ok());  // splits after page 1
  // A page may not get colder than a page extending it.
  CHECK(idx.SetTier(2, Tier::kDisk).code() ==
        absl::StatusCode::kFailedPrecondition);
  std::vector<RadixIndex::TierCandidate> c;
  idx.TierCandidates(Tier::kRaw, 10, &c);
  std::vector<PageHandle> hs;
  for (const auto& x : c) hs.push_back(x.handle);
  std::sort(hs.begin(), hs.end());
  // Page 3 is extended by raw page 4, so only the tails qualify.
  CHECK(hs == std::vector<PageHandle>{4, 5});
  for (const auto& x : c) {
    if (x.handle == 4) CHECK(x.first_position == 6);
    if (x.handle == 5) CHECK(x.first_position == 2);
  }
  REQUIRE(idx.SetTier(4, Tier::kHostCompressed).ok());
  REQUIRE(idx.SetTier(3, Tier::kHostCompressed).ok());
  CHECK(idx.SetTier(4, Tier::kRaw).code() ==
        absl::StatusCode::kFailedPrecondition);  // would be below a cold page
  REQUIRE(idx.CheckInvariants().ok());
  CHECK(idx.tier_pages(Tier::kHostCompressed) == 2);
  std::vector<Token> prefix;
  REQUIRE(idx.PrefixTokens(4, &prefix).ok());
  CHECK(prefix == Seq(0, 8));
  REQUIRE(idx.ReplaceHandle(4, 40).ok());
  CHECK(*idx.TierOf(40) == Tier::kHostCompressed);
  std::vector<PageHandle> gone;
  idx.EvictAll(&gone);
  CHECK(idx.tier_pages(Tier::kHostCompressed) == 0);
  REQUIRE(idx.CheckInvariants().ok());
}

}  // namespace
}  // namespace kvharbor

namespace kvharbor {
namespace {

using testing::Geo;

absl::Status CreateWith(NamespaceSpec spec) {
  Store store(StoreOptions{});
  spec.name = "s";
  spec.geometry = Geo();
  spec.capacity_bytes = 8 * Geo().PageBytes();
  return store.CreateNamespace(spec, false).status();
}

TEST_CASE("store: tier settings are checked, errors name the field") {
  NamespaceSpec s;
  s.codec = "kvtc";
  CHECK(CreateWith(s).message().find("spec.calibration_path") !=
        std::string::npos);
  s.calibration_path = "/nonexistent/cal.kvtc";
  CHECK(CreateWith(s).message().find("spec.calibration_path") !=
        std::string::npos);
  s = NamespaceSpec{};
  s.codec = "zip";
  CHECK(CreateWith(s).message().find("spec.codec") != std::string::npos);
  s = NamespaceSpec{};
  s.calibration_path = "/x";
  CHECK(CreateWith(s).message().find("spec.calibration_path") !=
        std::string::npos);
  s = NamespaceSpec{};
  s.disk_dir = "/tmp";
  CHECK(CreateWith(s).message().find("spec.disk_dir") != std::string::npos);
  s = NamespaceSpec{};
  s.host_compressed_bytes = 1 << 20;
  s.disk_dir = "/proc/kvh-no-such-dir/x";
  CHECK(CreateWith(s).message().find("spec.disk_dir") != std::string::npos);
}

TEST_CASE("store: namespace warnings go to StoreOptions::warn with the name") {
  TempDir dir;
  // A leftover temp file of an interrupted write: removed at creation, with
  // a warning.
  const std::string leftover = dir.path + "/page-0000000000000001.kvh.tmp";
  std::ofstream(leftover) << "torn";
  std::vector<std::pair<std::string, std::string>> warnings;
  StoreOptions options;
  options.warn = [&warnings](const std::string& ns, const std::string& line) {
    warnings.emplace_back(ns, line);
  };
  Store store(options);
  NamespaceSpec spec;
  spec.name = "warned";
  spec.geometry = Geo();
  spec.capacity_bytes = 8 * Geo().PageBytes();
  spec.host_compressed_bytes = 1 << 20;
  spec.disk_dir = dir.path;
  REQUIRE(store.CreateNamespace(spec, false).ok());
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].first == "warned");
  CHECK(warnings[0].second.find("unfinished write") != std::string::npos);
  CHECK(!fs::exists(leftover));
}

TEST_CASE("store: a kvtc namespace from a calibration file") {
  TempDir dir;
  const Geometry g = Geo();
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  auto cal = testing::MakeCalibration(g, KvtcRowKind::kPerToken,
                                      IdentityBasis(f, f, testing::Fp8All(f)),
                                      IdentityBasis(f, f, testing::Fp8All(f)));
  const std::string path = dir.path + "/cal.kvtc";
  REQUIRE(WriteKvtcCalibrationFile(*cal, path).ok());
  Store store(StoreOptions{});
  NamespaceSpec spec;
  spec.name = "k";
  spec.geometry = g;
  spec.capacity_bytes = 8 * g.PageBytes();
  spec.codec = "kvtc";
  spec.calibration_path = path;
  spec.host_compressed_bytes = 1 << 20;
  spec.disk_dir = dir.path + "/disk";
  auto r = store.CreateNamespace(spec, false);
  REQUIRE(r.ok());
  auto ns = r->first;
  CHECK(ns->config().calibration_fingerprint == cal->Fingerprint());
  auto parsed = ParseKvtcCalibration(absl::MakeConstSpan(
      reinterpret_cast<const uint8_t*>(ns->config().calibration.data()),
      ns->config().calibration.size()));
  REQUIRE(parsed.ok());
  CHECK(parsed->Fingerprint() == cal->Fingerprint());
  Insert(*ns, Seq(0, 8), Pages(2, 14));
  REQUIRE(*ns->tiers().DemoteAll(Tier::kDisk) == 4);  // 2 to host, 2 on to disk
  CHECK(ns->Counters().tiers[2].pages == 2);
  REQUIRE(ns->CheckInvariants().ok());
}

TEST_CASE("store: one disk directory serves one live namespace at a time") {
  TempDir dir;
  Store store(StoreOptions{});
  NamespaceSpec spec;
  spec.name = "a";
  spec.geometry = Geo();
  spec.capacity_bytes = 8 * Geo().PageBytes();
  spec.host_compressed_bytes = 1 << 20;
  spec.disk_dir = dir.path;
  auto a = store.CreateNamespace(spec, false);
  REQUIRE(a.ok());
  std::shared_ptr<Namespace> held = a->first;  // a request still in flight

  spec.name = "b";
  spec.disk_dir = dir.path + "/./";  // the same directory, spelled otherwise
  absl::Status s = store.CreateNamespace(spec, false).status();
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(s.message().find("spec.disk_dir") != std::string::npos);
  CHECK(s.message().find("'a'") != std::string::npos);

  // Deleted, but the held namespace may still write and remove page files
  // there: a new namespace in that directory must wait for it.
  REQUIRE(store.DeleteNamespace("a", false).ok());
  s = store.CreateNamespace(spec, false).status();
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(s.message().find("deleted") != std::string::npos);
  held.reset();
  a = decltype(a)();
  CHECK(store.CreateNamespace(spec, false).ok());
}

}  // namespace
}  // namespace kvharbor
