// The CLI's engine options (cli/cli_handlers.h) against a daemon: a
// page-key namespace (ns create --key_kind, insert/match --keys), an append
// (insert --skip_pages with every page or only the new ones in the file), a
// layer-range fetch (fetch --layers) and their bad input.
#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/client/cli_test_util.h"
#include "tests/client/client_test_util.h"
#include "types/layer_range.h"

namespace kvharbor {
namespace {

using testing::Cli;
using testing::CliResult;
using testing::Field;
using testing::ReadAll;

// 2 * 2 layers * 4 tokens * 2 heads * 32 dim * 2 bytes = 2 KiB pages.
constexpr uint64_t kPageBytes = 2048;

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), bytes.size());
}

std::string Bytes(size_t pages, uint64_t seed) {
  const std::vector<uint8_t> b = testing::RandomBytes(pages * kPageBytes, seed);
  return std::string(b.begin(), b.end());
}

TEST_CASE("kvharbor CLI: a page-key namespace", "[client][cli]") {
  std::unique_ptr<Daemon> daemon = testing::StartTestDaemon();
  Cli cli(daemon->address());
  CliResult r = cli.Run(
      "ns create keys --layers 2 --kv_heads 2 --head_dim 32 --page_size 4 "
      "--dtype fp16 --capacity_bytes 65536 --key_kind page_keys");
  REQUIRE(r.exit_code == 0);
  r = cli.Run("ns describe keys");
  CHECK(Field(r.out, "key_kind") == "page_keys");
  const std::string pages = Bytes(3, 1);
  Write(cli.Path("pages.bin"), pages);
  Write(cli.Path("keys.txt"), "a1b2\nc3d4\n0000\n");
  r = cli.Run(absl::StrCat("insert keys --keys_file ", cli.Path("keys.txt"),
                           " --file ", cli.Path("pages.bin")));
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("3 stored") != std::string::npos);
  r = cli.Run("match keys --keys a1b2,c3d4,ffff");
  REQUIRE(r.exit_code == 0);
  CHECK(Field(r.out, "matched_pages") == "2 of 3 keys");
  CHECK(Field(r.out, "matched_tokens") == "8");
  // Keys that are not hex, token ids for a page-key namespace.
  r = cli.Run("match keys --keys a1b");
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("--keys[0]") != std::string::npos);
  r = cli.Run("match keys --tokens 1,2,3,4");
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("INVALID_ARGUMENT: token_ids:") != std::string::npos);
  r = cli.Run(
      "ns create bad --layers 1 --kv_heads 1 --head_dim 8 "
      "--page_size 4 --dtype fp16 --key_kind hashes");
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("--key_kind") != std::string::npos);
}

TEST_CASE("kvharbor CLI: a page-hash namespace", "[client][cli]") {
  std::unique_ptr<Daemon> daemon = testing::StartTestDaemon();
  Cli cli(daemon->address());
  CliResult r = cli.Run(
      "ns create hashes --layers 2 --kv_heads 2 --head_dim 32 --page_size 4 "
      "--dtype fp16 --capacity_bytes 65536 --key_kind page_hashes");
  REQUIRE(r.exit_code == 0);
  r = cli.Run("ns describe hashes");
  CHECK(Field(r.out, "key_kind") == "page_hashes");
  CHECK(Field(r.out, "topology") ==
        "model '', layers [0, 2) of 2, KV heads [0, 2) of 2");
  // The second and third pages alone, without the first: found alone.
  Write(cli.Path("pages.bin"), Bytes(2, 2));
  r = cli.Run(absl::StrCat("insert hashes --keys c3d4,0000 --file ",
                           cli.Path("pages.bin")));
  REQUIRE(r.exit_code == 0);
  r = cli.Run("match hashes --keys c3d4,0000");
  REQUIRE(r.exit_code == 0);
  CHECK(Field(r.out, "matched_pages") == "2 of 2 keys");
  r = cli.Run("match hashes --keys a1b2,c3d4,0000");
  REQUIRE(r.exit_code == 0);
  CHECK(Field(r.out, "matched_pages") == "0 of 3 keys");
}

TEST_CASE("kvharbor CLI: insert --skip_pages and fetch --layers",
          "[client][cli]") {
  std::unique_ptr<Daemon> daemon = testing::StartTestDaemon();
  Cli cli(daemon->address());
  REQUIRE(cli.Run("ns create chat --layers 2 --kv_heads 2 --head_dim 32 "
                  "--page_size 4 --dtype fp16 --capacity_bytes 65536")
              .exit_code == 0);
  const std::string pages = Bytes(4, 2);
  const std::vector<int32_t> tokens = testing::TokenRange(16, 5);
  const std::string all = absl::StrJoin(tokens, ",");
  const std::string first = absl::StrJoin(
      std::vector<int32_t>(tokens.begin(), tokens.begin() + 8), ",");
  Write(cli.Path("first.bin"), pages.substr(0, 2 * kPageBytes));
  Write(cli.Path("all.bin"), pages);
  Write(cli.Path("new.bin"), pages.substr(2 * kPageBytes));
  REQUIRE(cli.Run(absl::StrCat("insert chat --tokens ", first, " --file ",
                               cli.Path("first.bin")))
              .exit_code == 0);
  // The file with only the new pages.
  CliResult r =
      cli.Run(absl::StrCat("insert chat --tokens ", all,
                           " --skip_pages 2 --file ", cli.Path("new.bin")));
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("2 stored") != std::string::npos);
  CHECK(r.out.find("2 skipped (not sent)") != std::string::npos);
  r = cli.Run("ns describe chat");
  CHECK(Field(r.out, "bytes_in") == absl::StrCat(4 * kPageBytes, " (8.0 KiB)"));
  // A file of the wrong size names --file with both sizes it may have.
  r = cli.Run(absl::StrCat("insert chat --tokens ", all,
                           " --skip_pages 1 --file ", cli.Path("new.bin")));
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("--file") != std::string::npos);

  // Layers 1..2 of each page: the second layer's K then V.
  r = cli.Run(absl::StrCat("match chat --tokens ", all, " --lock"));
  REQUIRE(r.exit_code == 0);
  const std::string lease_line = Field(r.out, "lease");
  const std::string lease = lease_line.substr(0, lease_line.find(' '));
  r = cli.Run(absl::StrCat("fetch chat --lease ", lease, " --layers 1:2 --out ",
                           cli.Path("layer1.bin")));
  REQUIRE(r.exit_code == 0);
  Geometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 32;
  g.page_size = 4;
  g.dtype = DType::kFP16;
  const uint64_t kvb = KvLayerBytes(g);
  std::string want;
  for (size_t p = 0; p < 4; ++p) {
    for (int kv = 0; kv < 2; ++kv) {
      want += pages.substr(p * kPageBytes + KvLayerOffset(g, 1, kv), kvb);
    }
  }
  CHECK(ReadAll(cli.Path("layer1.bin")) == want);
  r = cli.Run(absl::StrCat("fetch chat --lease ", lease, " --layers 1:3 --out ",
                           cli.Path("x.bin")));
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("INVALID_ARGUMENT: layer_end:") != std::string::npos);
  r = cli.Run(absl::StrCat("fetch chat --lease ", lease, " --layers 2 --out ",
                           cli.Path("x.bin")));
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("--layers") != std::string::npos);
}

}  // namespace
}  // namespace kvharbor
