// The built `kvharbor` CLI against an in-process daemon: namespace, insert
// from a file, match, fetch to a file, stats, errors and exit codes.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "kvharbor/client.h"
#include "tests/client/cli_test_util.h"
#include "tests/client/client_test_util.h"
#include "tests/core/codec/kvtc/kvtc_test_util.h"
#include "tests/tls_test_util.h"

namespace kvharbor {
namespace {

using testing::Cli;
using testing::CliResult;
using testing::ReadAll;

using testing::Field;

// 2 * 2 layers * 4 tokens * 2 heads * 32 dim * 2 bytes = 2 KiB pages, room
// for 512.
constexpr uint64_t kPageBytes = 2048;
constexpr const char* kCreate =
    "ns create cli --layers 2 --kv_heads 2 --head_dim 32 --page_size 4 "
    "--dtype fp16 --capacity_bytes 1048576";

// Fetches the lease's pages every way the CLI offers; each output file must
// equal (a part of) pages.bin.
void FetchBack(const Cli& cli, const std::string& lease,
               const std::string& handles) {
  const std::string pages = ReadAll(cli.Path("pages.bin"));
  CliResult r = cli.Run(absl::StrCat("fetch cli --lease ", lease, " --out ",
                                     cli.Path("by_lease.bin")));
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("fetched 3 pages") != std::string::npos);
  CHECK(ReadAll(cli.Path("by_lease.bin")) == pages);
  r = cli.Run(absl::StrCat("fetch cli --lease ", lease,
                           " --start 1 --count 2 --out ",
                           cli.Path("tail.bin")));
  REQUIRE(r.exit_code == 0);
  CHECK(ReadAll(cli.Path("tail.bin")) == pages.substr(kPageBytes));
  r = cli.Run(absl::StrCat("fetch cli --pages ", handles, " --out ",
                           cli.Path("by_pages.bin")));
  REQUIRE(r.exit_code == 0);
  CHECK(ReadAll(cli.Path("by_pages.bin")) == pages);
}

void CheckStats(const Cli& cli) {
  CliResult r = cli.Run("stats");
  REQUIRE(r.exit_code == 0);
  CHECK(Field(r.out, "namespaces") == "1");
  CHECK(Field(r.out, "cached_pages") == "3");
  CHECK(Field(r.out, "active_leases") == "1");
  // The table row: NAME PAGE_BYTES CAPACITY FREE CACHED ...
  std::vector<std::string> row =
      absl::StrSplit(Field(r.out, "cli"), ' ', absl::SkipEmpty());
  REQUIRE(row.size() >= 4);
  CHECK(row[0] == "2048");
  CHECK(row[1] == "512");
  CHECK(row[2] == "509");
  CHECK(row[3] == "3");

  r = cli.Run("ns list");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.rfind("NAME", 0) == 0);
  CHECK(r.out.find("cli") != std::string::npos);
  r = cli.Run("ns describe cli");
  REQUIRE(r.exit_code == 0);
  CHECK(Field(r.out, "dtype") == "fp16");
  CHECK(Field(r.out, "cached_pages") == "3");
  r = cli.Run("tree cli");
  CHECK(r.exit_code == 0);
}

TEST_CASE("kvharbor CLI: insert from a file, match, fetch to files, stats",
          "[client][cli]") {
  std::unique_ptr<Daemon> daemon = testing::StartTestDaemon();
  Cli cli(daemon->address());
  CliResult r = cli.Run(kCreate);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("created namespace cli") != std::string::npos);

  const std::vector<uint8_t> pages = testing::RandomBytes(3 * kPageBytes, 42);
  {
    std::ofstream f(cli.Path("pages.bin"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(pages.data()), pages.size());
  }
  const std::vector<int32_t> tokens = testing::TokenRange(12, 10);
  {
    std::ofstream f(cli.Path("tokens.txt"));
    f << absl::StrJoin(tokens, " ") << "\n";
  }
  r = cli.Run(absl::StrCat("insert cli --tokens_file ", cli.Path("tokens.txt"),
                           " --file ", cli.Path("pages.bin")));
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("3 stored") != std::string::npos);

  r = cli.Run(absl::StrCat("match cli --tokens ", absl::StrJoin(tokens, ","),
                           ",99 --lock --ttl_ms 60000"));
  REQUIRE(r.exit_code == 0);
  CHECK(Field(r.out, "matched_tokens") == "12 of 13");
  const std::string lease_line = Field(r.out, "lease");
  const std::string lease = lease_line.substr(0, lease_line.find(' '));
  REQUIRE(!lease.empty());
  const std::string handles = Field(r.out, "handles");
  REQUIRE(std::vector<std::string>(absl::StrSplit(handles, ',')).size() == 3);

  FetchBack(cli, lease, handles);
  CheckStats(cli);

  // A host-pool daemon has no device handles to give.
  r = cli.Run(absl::StrCat("device-handles cli ", lease));
  CHECK(r.exit_code == 1);
  CHECK(r.err.rfind("error: FAILED_PRECONDITION: store.device_pool_bytes: ",
                    0) == 0);
  r = cli.Run(absl::StrCat("release ", lease));
  CHECK(r.exit_code == 0);
  r = cli.Run(absl::StrCat("release ", lease));
  CHECK(r.exit_code == 1);
  CHECK(r.err.rfind("error: NOT_FOUND: ", 0) == 0);
  r = cli.Run("evict cli --all");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("evicted 3 pages") != std::string::npos);
  r = cli.Run("ns delete cli");
  CHECK(r.exit_code == 0);
}

TEST_CASE("kvharbor CLI: help, errors and exit codes", "[client][cli]") {
  std::unique_ptr<Daemon> daemon = testing::StartTestDaemon();
  Cli cli(daemon->address());
  CliResult r = cli.Run("--help", false);
  CHECK(r.exit_code == 0);
  for (const char* cmd :
       {"ns create", "ns list", "ns describe", "ns delete", "match", "insert",
        "fetch", "release", "evict", "stats", "tree"}) {
    CHECK(r.out.find(cmd) != std::string::npos);
  }
  REQUIRE(cli.Run(kCreate).exit_code == 0);

  // Errors: "error: CODE: message" on stderr; 1 for a failed command, 2 for
  // bad usage caught before any call.
  r = cli.Run("match nope --tokens 1,2,3,4");
  CHECK(r.exit_code == 1);
  CHECK(r.err.rfind("error: NOT_FOUND: ", 0) == 0);
  // A file that is not a whole number of pages is refused before sending.
  {
    std::ofstream f(cli.Path("short.bin"), std::ios::binary);
    f << "not a page";
  }
  r = cli.Run(absl::StrCat("insert cli --tokens 1,2,3,4 --file ",
                           cli.Path("short.bin")));
  CHECK(r.exit_code == 1);
  CHECK(r.err.rfind("error: INVALID_ARGUMENT: --file", 0) == 0);
  r = cli.Run("evict cli --all --bytes 5");
  CHECK(r.exit_code == 1);
  CHECK(r.err.rfind("error: INVALID_ARGUMENT: ", 0) == 0);
  r = cli.Run("release 12345");
  CHECK(r.exit_code == 1);
  CHECK(r.err.rfind("error: NOT_FOUND: ", 0) == 0);
  r = cli.Run("match cli --tokens 1,-2");
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("--tokens[1]") != std::string::npos);
  r = cli.Run("frobnicate");
  CHECK(r.exit_code == 2);
  CHECK(r.err.rfind("error: INVALID_ARGUMENT: ", 0) == 0);
  r = cli.Run("ns create x --bogus 1");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--bogus") != std::string::npos);
  r = cli.Run("fetch cli --lock");
  CHECK(r.exit_code == 2);

  // No daemon there: UNAVAILABLE, promptly.
  r = cli.Run("--addr=127.0.0.1:1 --timeout_ms=3000 ns list", false);
  CHECK(r.exit_code == 1);
  CHECK(r.err.rfind("error: UNAVAILABLE: ", 0) == 0);
}

TEST_CASE(
    "kvharbor CLI: tiers (kvtc namespace, match tiers, demote, "
    "compressed fetch, per-tier stats)",
    "[client][cli][tiers]") {
  std::unique_ptr<Daemon> daemon = testing::StartTestDaemon();
  Cli cli(daemon->address());
  // fp32, 2 layers, 2 heads, head_dim 8, 4 tokens: 1 KiB pages.
  Geometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  g.page_size = 4;
  g.dtype = DType::kFP32;
  const uint64_t f = testing::FeaturesFor(g, KvtcRowKind::kPerToken);
  auto cal = testing::MakeCalibration(g, KvtcRowKind::kPerToken,
                                      IdentityBasis(f, f, testing::Fp8All(f)),
                                      IdentityBasis(f, f, testing::Fp8All(f)));
  REQUIRE(WriteKvtcCalibrationFile(*cal, cli.Path("cal.kvtc")).ok());
  CliResult r = cli.Run(absl::StrCat(
      "ns create kv --layers 2 --kv_heads 2 --head_dim 8 --page_size 4 "
      "--dtype fp32 --capacity_bytes 65536 --host_compressed_bytes 1048576 "
      "--codec kvtc --calibration ",
      cli.Path("cal.kvtc"), " --disk_dir ", cli.Path("kv_disk"),
      " --disk_bytes 1048576"));
  REQUIRE(r.exit_code == 0);
  r = cli.Run("ns describe kv");
  REQUIRE(r.exit_code == 0);
  CHECK(Field(r.out, "codec") == "kvtc");
  CHECK(Field(r.out, "disk_dir") == cli.Path("kv_disk"));
  CHECK(Field(r.out, "tier raw") == "0 pages, 0");

  // fp32 values in [-1, 1] (KVTC refuses non-finite keys).
  std::vector<uint8_t> pages(2 * 1024);
  for (size_t i = 0; i < pages.size(); i += 4) {
    const float v = static_cast<float>((i * 37) % 200) / 100.0f - 1.0f;
    std::memcpy(&pages[i], &v, 4);
  }
  {
    std::ofstream out(cli.Path("kv.bin"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(pages.data()), pages.size());
  }
  const std::string toks = absl::StrJoin(testing::TokenRange(8, 3), ",");
  r = cli.Run(absl::StrCat("insert kv --tokens ", toks, " --file ",
                           cli.Path("kv.bin")));
  REQUIRE(r.exit_code == 0);
  r = cli.Run(absl::StrCat("match kv --tokens ", toks));
  REQUIRE(r.exit_code == 0);
  CHECK(Field(r.out, "tiers") == "raw,raw");
  const std::string handles = Field(r.out, "handles");

  r = cli.Run("demote kv --tier disk");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("moved 4 pages down to disk") != std::string::npos);
  r = cli.Run(absl::StrCat("match kv --tokens ", toks));
  CHECK(Field(r.out, "tiers") == "disk,disk");
  r = cli.Run("demote kv --tier warm");
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("--tier") != std::string::npos);

  // Compressed and raw fetches give the same (lossy, decoded) bytes.
  r = cli.Run(absl::StrCat("fetch kv --pages ", handles,
                           " --format compressed --out ", cli.Path("c.bin")));
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("fetched 2 pages") != std::string::npos);
  r = cli.Run(
      absl::StrCat("fetch kv --pages ", handles, " --out ", cli.Path("r.bin")));
  REQUIRE(r.exit_code == 0);
  const std::string raw = ReadAll(cli.Path("r.bin"));
  CHECK(raw.size() == 2 * 1024);
  CHECK(ReadAll(cli.Path("c.bin")) == raw);
  r = cli.Run(absl::StrCat("fetch kv --pages ", handles, " --format zip --out ",
                           cli.Path("z.bin")));
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("--format") != std::string::npos);

  r = cli.Run("stats kv");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("kv tier disk: 2 pages") != std::string::npos);
  CHECK(r.out.find("kv tier raw: 0 pages, 0\n") != std::string::npos);
  // The stored ratio: 2 raw pages of 1 KiB over the bytes the disk holds.
  const size_t disk = r.out.find("kv tier disk: 2 pages, ");
  REQUIRE(disk != std::string::npos);
  const std::string line = r.out.substr(disk, r.out.find('\n', disk) - disk);
  uint64_t stored = 0;
  REQUIRE(absl::SimpleAtoi(line.substr(23, line.find_first_of(" ,", 23) - 23),
                           &stored));
  REQUIRE(stored > 0);
  CHECK(absl::EndsWith(
      line, absl::StrFormat(", stored ratio %.2f", 2048.0 / stored)));
  CHECK(2048.0 / stored > 1.0);  // fp32 stored as KVTC's fp8
  CHECK(r.out.find("kv demoted 4,") != std::string::npos);
}

TEST_CASE("kvharbor CLI: TLS flags, --token and KVHARBOR_TOKEN",
          "[client][cli][security]") {
  testing::TestPki pki;
  DaemonOptions o;
  o.listen = "127.0.0.1:0";
  o.store.pool_budget_bytes = 64 << 20;
  o.security.tls_cert_file = pki.server_cert();
  o.security.tls_key_file = pki.server_key();
  o.security.tokens_file = pki.dir().Write(
      "tokens.yaml",
      "tokens:\n  - token: cli-reader-0123456789\n    tenant: t\n    role: "
      "read\n");
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(o);
  REQUIRE(daemon.ok());
  Cli cli((*daemon)->address());
  const std::string tls = absl::StrCat("--tls_ca=", pki.ca());

  CliResult r = cli.Run("--timeout_ms=3000 ns list");  // plaintext
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("UNAVAILABLE"));
  r = cli.Run(tls + " ns list");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("UNAUTHENTICATED"));
  r = cli.Run(tls + " --token=cli-reader-0123456789 ns list");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("NAME"));
  r = cli.Run(tls +
              " --token=cli-reader-0123456789 --tls_server_name="
              "kvharbor.test ns list");
  CHECK(r.exit_code == 0);
  r = cli.Run(tls +
              " --token=cli-reader-0123456789 ns create n --layers 1 "
              "--kv_heads 1 --head_dim 8 --page_size 4 --dtype fp16");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("PERMISSION_DENIED"));

  REQUIRE(setenv("KVHARBOR_TOKEN", "cli-reader-0123456789", 1) == 0);
  r = cli.Run(tls + " ns list");
  CHECK(r.exit_code == 0);
  r = cli.Run(tls + " --token=wrong-token-0123456789 ns list");  // flag wins
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("UNAUTHENTICATED"));
  REQUIRE(unsetenv("KVHARBOR_TOKEN") == 0);

  r = cli.Run(tls + " --tls_cert=" + pki.client_cert() + " ns list");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("tls_key_file"));
  r = cli.Run("--tls_ca=" + pki.dir().path + "/missing.crt ns list");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("tls_ca_file: cannot read"));
}

TEST_CASE("kvharbor CLI: calibration list, get, upload, pin", "[client][cli]") {
  std::unique_ptr<Daemon> daemon = testing::StartTestDaemon();
  Cli cli(daemon->address());
  CliResult r = cli.Run(
      "ns create oc --layers 2 --kv_heads 2 --head_dim 8 --page_size 4 "
      "--dtype fp32 --capacity_bytes 8192 --codec kvtc "
      "--host_compressed_bytes 1048576 --online_calibration "
      "--online_min_tokens 8 --online_target_ratio 2");
  REQUIRE(r.exit_code == 0);
  r = cli.Run("ns describe oc");
  CHECK(Field(r.out, "online_calibration").find("target ratio 2.00") == 0);
  // Ratios below 1 are refused naming the field, and so is a ratio these
  // 1 KiB pages cannot reach.
  for (const char* bad : {"0.5", "16", "x"}) {
    CliResult refused = cli.Run(absl::StrCat(
        "ns create oc2 --layers 2 --kv_heads 2 --head_dim 8 --page_size 4 "
        "--dtype fp32 --capacity_bytes 8192 --codec kvtc "
        "--host_compressed_bytes 1048576 --online_calibration "
        "--online_target_ratio ",
        bad));
    CHECK(refused.exit_code != 0);
    CHECK_THAT(refused.err, Catch::Contains("target_ratio"));
  }
  r = cli.Run("calibration list oc");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("(no calibrations)") != std::string::npos);
  {
    std::ofstream f(cli.Path("bad.cal"), std::ios::binary);
    f << "not a calibration";
  }
  r = cli.Run(
      absl::StrCat("calibration upload oc --file ", cli.Path("bad.cal")));
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("calibration: ") != std::string::npos);

  const std::vector<uint8_t> pages = testing::FloatPages(2, 1024, 5);
  {
    std::ofstream f(cli.Path("pages.bin"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(pages.data()), pages.size());
  }
  r = cli.Run(absl::StrCat("insert oc --tokens 1,2,3,4,5,6,7,8 --file ",
                           cli.Path("pages.bin")));
  REQUIRE(r.exit_code == 0);
  bool ready = false;
  for (int i = 0; i < 300 && !ready; ++i) {
    r = cli.Run("ns describe oc");
    ready = Field(r.out, "calibration_state").find("ready") == 0;
    if (!ready) usleep(100000);
  }
  REQUIRE(ready);
  CHECK(Field(r.out, "active_codec").find("kvtc") == 0);
  // The calibration's expectation, and the stored ratio per codec once kvtc
  // holds cold pages.
  CHECK(Field(r.out, "calibration_expected").find("ratio ") == 0);
  CHECK_THAT(Field(r.out, "calibration_expected"),
             Catch::Contains("(asked 2.00), relative error keys "));
  REQUIRE(cli.Run("demote oc --tier host_compressed").exit_code == 0);
  r = cli.Run("stats oc");
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("oc codec kvtc: 2 cold pages, "));
  CHECK_THAT(r.out, Catch::Contains("oc calibration kvtc expected ratio "));
  r = cli.Run("ns describe oc");
  CHECK(Field(r.out, "codec kvtc").find("2 cold pages, ") == 0);
  CHECK_THAT(Field(r.out, "codec kvtc"), Catch::Contains("stored ratio "));
  r = cli.Run("calibration list oc");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find(" online ") != std::string::npos);
  CHECK(r.out.find(" active") != std::string::npos);
  r = cli.Run(absl::StrCat("calibration get oc --out ", cli.Path("got.cal")));
  REQUIRE(r.exit_code == 0);
  CHECK(ReadKvtcCalibrationFile(cli.Path("got.cal")).ok());

  r = cli.Run("calibration pin oc");
  REQUIRE(r.exit_code == 0);
  CHECK(cli.Run("calibration list oc").out.find(" pinned") !=
        std::string::npos);
  r = cli.Run(
      absl::StrCat("calibration upload oc --file ", cli.Path("got.cal")));
  CHECK(r.exit_code == 0);  // the active one itself: accepted
  r = cli.Run("calibration pin oc --unpin");
  REQUIRE(r.exit_code == 0);
  CHECK(cli.Run("calibration list oc").out.find(" pinned") ==
        std::string::npos);
  r = cli.Run("calibration pin oc --fingerprint 0x1234");
  CHECK(r.exit_code != 0);
}

}  // namespace
}  // namespace kvharbor
