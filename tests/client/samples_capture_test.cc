// `kvharbor samples capture` against an in-process daemon: pages inserted
// for two prompts come back as KV samples rows with the right values and
// positions in both page layouts, --max_tokens cuts the dump, the file
// calibrates, and bad input gets errors naming the flag.
#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/calibration/kv_samples.h"
#include "core/calibration/kvtc_calibrate.h"
#include "core/codec/page_elements.h"
#include "kvharbor/client.h"
#include "tests/client/cli_test_util.h"
#include "tests/client/client_test_util.h"
#include "types/geometry.h"

namespace kvharbor {
namespace {

using testing::Cli;
using testing::CliResult;

constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 8, kPage = 4;

struct Prompt {
  std::vector<int32_t> tokens;  // cached pages plus a partial page
  std::vector<uint8_t> pages;   // the pages inserted for it
};

// The element a page holds for (kv, layer, token, head, dim), by the layout
// formulas of types/geometry.h written out independently of the code tested.
float Element(const std::vector<uint8_t>& pages, DType dtype, bool layer_kv,
              uint64_t page, int kv, uint32_t l, uint32_t t, uint32_t h,
              uint32_t d) {
  const uint64_t block = layer_kv ? l * 2 + kv : kv * kLayers + l;
  const uint64_t index = page * 2 * kLayers * kPage * kHeads * kDim +
                         ((block * kPage + t) * kHeads + h) * kDim + d;
  float out = 0;
  LoadElements(dtype, pages.data() + index * DTypeSize(dtype), 1, &out);
  return out;
}

// `n_pages` pages of values in [-1, 1] stored as `dtype` (finite, so the
// samples validate whatever the dtype).
std::vector<uint8_t> MakePages(size_t n_pages, DType dtype, uint64_t seed) {
  const uint64_t n = n_pages * 2 * kLayers * kPage * kHeads * kDim;
  const std::vector<uint8_t> f32 = testing::FloatPages(1, n * 4, seed);
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  StoreElements(dtype, reinterpret_cast<const float*>(f32.data()), n,
                out.data());
  return out;
}

// Checks every row of `s` against prompts[i]'s pages: rows come prompt by
// prompt, page by page, positions restart at 0 for each prompt.
void CheckRows(const KvSamples& s, const std::vector<Prompt>& prompts,
               DType dtype, bool layer_kv) {
  uint64_t row = 0;
  for (const Prompt& p : prompts) {
    const uint64_t tokens =
        p.pages.size() /
        (DTypeSize(dtype) * 2 * kLayers * kPage * kHeads * kDim) * kPage;
    for (uint64_t pos = 0; pos < tokens && row < s.tokens; ++pos, ++row) {
      REQUIRE(s.positions[row] == static_cast<int64_t>(pos));
      for (int kv = 0; kv < 2; ++kv) {
        const std::vector<float>& got = kv == 0 ? s.k : s.v;
        for (uint32_t l = 0; l < kLayers; ++l) {
          for (uint32_t h = 0; h < kHeads; ++h) {
            for (uint32_t d = 0; d < kDim; ++d) {
              const uint64_t i = ((row * kLayers + l) * kHeads + h) * kDim + d;
              INFO("row " << row << " kv " << kv << " layer " << l << " head "
                          << h << " dim " << d);
              REQUIRE(got[i] == Element(p.pages, dtype, layer_kv, pos / kPage,
                                        kv, l, pos % kPage, h, d));
            }
          }
        }
      }
    }
  }
  CHECK(row == s.tokens);
}

struct Setup {
  std::vector<Prompt> prompts;
  std::string tokens_file;
};

// Creates namespace `name` and inserts two prompts (10 and 6 pages); the
// tokens file has them on lines in both separator styles, a comment, a blank
// line and a prompt that matches nothing.
Setup Insert(Client& c, const Cli& cli, const std::string& name, DType dtype,
             bool layer_kv, float rope_theta) {
  client::NamespaceSpec spec = testing::MakeSpec(
      name, kLayers, kHeads, kDim, kPage, static_cast<client::DType>(dtype));
  spec.geometry.layout = layer_kv ? client::PageLayout::kLayerKvTokenHeadDim
                                  : client::PageLayout::kKvLayerTokenHeadDim;
  spec.geometry.rope_theta = rope_theta;
  const uint64_t page_bytes = testing::CreateNs(c, spec);
  Setup out;
  out.prompts = {{testing::TokenRange(42, 100), MakePages(10, dtype, 1)},
                 {testing::TokenRange(24, 5000), MakePages(6, dtype, 2)}};
  for (const Prompt& p : out.prompts) {
    const size_t cached = p.pages.size() / page_bytes * kPage;
    auto r = c.Insert(name, absl::MakeConstSpan(p.tokens).first(cached),
                      p.pages, page_bytes);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
  }
  out.tokens_file = cli.Path(name + ".tokens");
  std::ofstream f(out.tokens_file);
  f << "# prompts\n"
    << absl::StrJoin(out.prompts[0].tokens, " ") << "\n\n"
    << absl::StrJoin(out.prompts[1].tokens, ",") << "\n"
    << "7, 7 7,7 7\n";
  return out;
}

TEST_CASE("kvharbor samples capture: rows, positions, layouts, calibrate",
          "[client][cli][samples]") {
  std::unique_ptr<Daemon> daemon = testing::StartTestDaemon();
  std::unique_ptr<Client> c = testing::Connect(*daemon);
  Cli cli(daemon->address());
  struct Config {
    const char* name;
    DType dtype;
    bool layer_kv;
    float rope_theta;
  };
  // fp8 pages are converted (exactly) to float32 rows.
  for (const Config& cfg : {Config{"kvl", DType::kBF16, false, 0.0f},
                            Config{"lkv", DType::kFP32, true, 10000.0f},
                            Config{"fp8", DType::kFP8E4M3, false, 0.0f}}) {
    const DType dtype = cfg.dtype;
    const bool layer_kv = cfg.layer_kv;
    const std::string name = cfg.name;
    const Setup setup = Insert(*c, cli, name, dtype, layer_kv, cfg.rope_theta);
    const std::string out = cli.Path(name + ".safetensors");
    CliResult r = cli.Run(absl::StrCat(
        "samples capture ", name, " --tokens_file ", setup.tokens_file,
        " --out ", out, layer_kv ? " --rope_style half_split" : ""));
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("captured 64 tokens from 16 pages of 2 of 3 prompts") !=
          std::string::npos);
    absl::StatusOr<KvSamples> s = ReadKvSamples(out);
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    REQUIRE(s->tokens == 64);
    CHECK(s->num_layers == kLayers);
    CHECK(s->num_kv_heads == kHeads);
    CHECK(s->head_dim == kDim);
    CHECK(s->extra.at("namespace") == name);
    if (layer_kv) {
      CHECK(s->rope_style == RopeStyle::kHalfSplit);
      CHECK(s->rope_theta == 10000.0f);
      CHECK(s->keys_roped);
    } else {
      CHECK(s->rope_style == RopeStyle::kNone);
      CHECK(r.err.find("rope_style none") != std::string::npos);
    }
    CheckRows(*s, setup.prompts, dtype, layer_kv);

    // The dump is calibration input as it is.
    CalibrateOptions o;
    // Pages of kPage tokens of this tiny geometry cannot hold a KVTC buffer
    // once every stored byte counts (its headers are a fixed 272 bytes): the
    // calibration is for pages of 64 tokens, from the same per-token rows.
    o.page_size = 64;
    o.sink_tokens = 0;
    o.ratios = {2};
    o.group_sizes = {4, 8};
    o.raw_dtype = dtype;
    auto cal = CalibrateKvtc(*s, o);
    INFO(cal.status().ToString());
    CHECK(cal.ok());

    // --max_tokens stops inside the first prompt's third page.
    r = cli.Run(absl::StrCat("samples capture ", name, " --tokens_file ",
                             setup.tokens_file, " --out ", out,
                             " --max_tokens 10 --dtype f32"));
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("captured 10 tokens from 3 pages of 1 of 3") !=
          std::string::npos);
    s = ReadKvSamples(out);
    REQUIRE(s.ok());
    REQUIRE(s->tokens == 10);
    CheckRows(*s, setup.prompts, dtype, layer_kv);
  }
}

TEST_CASE("kvharbor samples capture: bad input names the flag",
          "[client][cli][samples]") {
  std::unique_ptr<Daemon> daemon = testing::StartTestDaemon();
  std::unique_ptr<Client> c = testing::Connect(*daemon);
  Cli cli(daemon->address());
  const Setup setup = Insert(*c, cli, "ns", DType::kFP16, false, 0.0f);
  const std::string out = cli.Path("x.safetensors");
  const std::string tokens = absl::StrCat(" --tokens_file ", setup.tokens_file);
  struct Case {
    std::string args;
    std::string error;
  };
  {
    std::ofstream f(cli.Path("bad.tokens"));
    f << "1 2 3\n4 five 6\n";
  }
  {
    std::ofstream f(cli.Path("miss.tokens"));
    f << "9 9 9 9 9\n";
  }
  const std::vector<Case> cases = {
      {absl::StrCat("ns --out ", out), "--tokens_file"},
      {absl::StrCat("ns", tokens), "--out"},
      {absl::StrCat("ns --tokens_file ", cli.Path("bad.tokens"), " --out ",
                    out),
       "--tokens_file line 2"},
      {absl::StrCat("ns --tokens_file ", cli.Path("none.tokens"), " --out ",
                    out),
       "--tokens_file"},
      {absl::StrCat("nope", tokens, " --out ", out), "namespace 'nope'"},
      {absl::StrCat("ns", tokens, " --out ", out, " --dtype fp8"), "--dtype"},
      {absl::StrCat("ns", tokens, " --out ", out, " --max_tokens 0"),
       "--max_tokens"},
      {absl::StrCat("ns", tokens, " --out ", out, " --rope_style interleaved"),
       "--rope_theta"},
      {absl::StrCat("ns", tokens, " --out ", out, " --rope_style sideways"),
       "--rope_style"},
      {absl::StrCat("ns --tokens_file ", cli.Path("miss.tokens"), " --out ",
                    out),
       "matched"},
  };
  for (const Case& k : cases) {
    CliResult r = cli.Run("samples capture " + k.args);
    CHECK(r.exit_code != 0);
    CHECK(r.err.find(k.error) != std::string::npos);
  }
  std::ifstream written(out);
  CHECK_FALSE(written.good());  // no failed capture left a file behind
}

}  // namespace
}  // namespace kvharbor
