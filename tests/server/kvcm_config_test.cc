// The namespaces' kvcm_path config key: the example config sets it, a file
// that fits the geometry gives the namespace its KVCM compressor at startup,
// and bad values are rejected naming the key (an empty or non-scalar value
// when the file is loaded, a missing or misfitting weights file when the
// daemon creates the namespace).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "core/transform/kvcm_format.h"
#include "server/daemon/config.h"
#include "server/daemon/daemon.h"
#include "spdlog/spdlog.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

using testing::TempDir;

// Text-only weights for `layers` layers of head_dim 8, factor 2, every
// value 0.01 (the config only needs a valid file).
std::string WriteWeights(const TempDir& dir, uint32_t layers) {
  KvcmWeights w;
  w.header.num_layers = layers;
  w.header.head_dim = 8;
  w.header.compression_factor = 2;
  w.header.min_seq_len = 1;
  w.header.weight_count_per_layer = kKvcmTextOnlyBlocks;
  const uint32_t dims[4] = {16, 4, 4, 8};
  w.layers.resize(layers);
  for (auto& layer : w.layers) {
    for (uint32_t b = 0; b < kKvcmTextOnlyBlocks; ++b) {
      KvcmLinear lin;
      lin.cols = dims[b % 3];
      lin.rows = dims[b % 3 + 1];
      lin.weight.assign(size_t{lin.rows} * lin.cols, 0.01f);
      layer.push_back(std::move(lin));
    }
  }
  const std::string path = dir.path + "/kvcm" + std::to_string(layers) + ".bin";
  REQUIRE(WriteKvcmWeightsFile(w, path).ok());
  return path;
}

std::string Config(const std::string& kvcm_line) {
  return R"(
listen: 127.0.0.1:0
store: {pool_budget_bytes: 1MiB}
namespaces:
  - name: small
    geometry: {num_layers: 1, num_kv_heads: 2, head_dim: 8, page_size: 2,
               dtype: bf16}
    capacity_bytes: 64KiB
)" + kvcm_line;
}

TEST_CASE("A config namespace with kvcm_path starts with its compressor",
          "[server][config][kvcm]") {
  spdlog::set_level(spdlog::level::warn);
  TempDir dir;
  const std::string weights = WriteWeights(dir, 1);
  const std::string file =
      dir.Write("ok.yaml", Config("    kvcm_path: " + weights + "\n"));
  DaemonOptions o;
  REQUIRE(LoadConfigFile(file, &o).ok());
  REQUIRE(o.namespaces.size() == 1);
  CHECK(o.namespaces[0].kvcm_path == weights);
  auto d = Daemon::Start(o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  auto ns = (*d)->store().Get("small");
  REQUIRE(ns.ok());
  CHECK((*ns)->config().kvcm_path == weights);
  REQUIRE((*ns)->config().kvcm != nullptr);
  CHECK((*ns)->config().kvcm->lossy());
  CHECK((*ns)->config().kvcm->changes_length());
  auto out = (*ns)->config().kvcm->OutputTokens(10);
  REQUIRE(out.ok());
  CHECK(*out == 5);

  // Without the key there is no compressor.
  DaemonOptions plain;
  REQUIRE(LoadConfigFile(dir.Write("plain.yaml", Config("")), &plain).ok());
  CHECK(plain.namespaces[0].kvcm_path.empty());
  auto d2 = Daemon::Start(plain);
  REQUIRE(d2.ok());
  auto ns2 = (*d2)->store().Get("small");
  REQUIRE(ns2.ok());
  CHECK((*ns2)->config().kvcm == nullptr);
}

TEST_CASE("Bad kvcm_path config values are rejected naming the key",
          "[server][config][kvcm]") {
  spdlog::set_level(spdlog::level::off);
  TempDir dir;
  // Loading: the value itself.
  for (const char* line : {"    kvcm_path: ''\n", "    kvcm_path: [a, b]\n"}) {
    INFO(line);
    DaemonOptions o;
    const absl::Status s =
        LoadConfigFile(dir.Write("bad.yaml", Config(line)), &o);
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find("config: namespaces[0].kvcm_path: ") == 0);
  }
  // Startup: the file is missing, or is for another number of layers.
  const std::vector<std::string> paths = {dir.path + "/missing.bin",
                                          WriteWeights(dir, 3)};
  for (const std::string& path : paths) {
    INFO(path);
    DaemonOptions o;
    REQUIRE(
        LoadConfigFile(
            dir.Write("late.yaml", Config("    kvcm_path: " + path + "\n")), &o)
            .ok());
    auto d = Daemon::Start(o);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().message().find("namespaces[0]") !=
          absl::string_view::npos);
    CHECK(d.status().message().find("spec.kvcm_path") !=
          absl::string_view::npos);
  }
}

}  // namespace
}  // namespace kvharbor
