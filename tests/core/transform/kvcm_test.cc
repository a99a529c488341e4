#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/base/byte_io.h"
#include "core/base/float_formats.h"
#include "core/transform/kvcm_compressor.h"
#include "core/transform/kvcm_format.h"

namespace kvharbor {
namespace {

// Random weights: per prefix Linear(f*hd -> h1) -> Linear(h1 -> h2) ->
// Linear(h2 -> hd), biases on all but the middle layer.
KvcmWeights RandomWeights(uint32_t layers, uint32_t hd, uint32_t f,
                          uint32_t blocks, uint32_t seed,
                          KvcmDType dtype = KvcmDType::kFP32) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  KvcmWeights w;
  w.header.dtype = dtype;
  w.header.num_layers = layers;
  w.header.num_heads = 2;
  w.header.head_dim = hd;
  w.header.hidden_size = 2 * hd;
  w.header.compression_factor = f;
  w.header.min_seq_len = 2;
  w.header.weight_count_per_layer = blocks;
  w.header.metadata = "{\"note\": \"test\"}";
  const uint32_t dims[4] = {f * hd, 12, 10, hd};
  w.layers.resize(layers);
  for (auto& layer : w.layers) {
    for (uint32_t b = 0; b < blocks; ++b) {
      KvcmLinear lin;
      lin.cols = dims[b % 3];
      lin.rows = dims[b % 3 + 1];
      for (uint32_t i = 0; i < lin.rows * lin.cols; ++i) {
        lin.weight.push_back(nd(rng));
      }
      if (b % 3 != 1) {
        for (uint32_t i = 0; i < lin.rows; ++i) lin.bias.push_back(nd(rng));
      }
      layer.push_back(std::move(lin));
    }
  }
  return w;
}

std::string Bytes(const KvcmWeights& w) {
  auto s = SerializeKvcmWeights(w);
  REQUIRE(s.ok());
  return *s;
}

std::string ParseError(const std::string& bytes) {
  auto w = ParseKvcmWeights(AsBytes(bytes));
  REQUIRE_FALSE(w.ok());
  CHECK(w.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(w.status().message());
}

template <typename T>
std::string Patched(std::string bytes, size_t offset, T value) {
  std::memcpy(&bytes[offset], &value, sizeof(T));
  return bytes;
}

bool SameWeights(const KvcmWeights& a, const KvcmWeights& b) {
  if (a.header.num_layers != b.header.num_layers ||
      a.header.metadata != b.header.metadata ||
      a.header.compression_factor != b.header.compression_factor ||
      a.header.min_seq_len != b.header.min_seq_len ||
      a.layers.size() != b.layers.size()) {
    return false;
  }
  for (size_t l = 0; l < a.layers.size(); ++l) {
    for (size_t i = 0; i < a.layers[l].size(); ++i) {
      const KvcmLinear &x = a.layers[l][i], &y = b.layers[l][i];
      if (x.rows != y.rows || x.cols != y.cols || x.weight != y.weight ||
          x.bias != y.bias) {
        return false;
      }
    }
  }
  return true;
}

TEST_CASE("kvcm: files written and read back", "[kvcm]") {
  for (uint32_t blocks : {kKvcmFullBlocks, kKvcmTextOnlyBlocks}) {
    const KvcmWeights w = RandomWeights(2, 4, 3, blocks, 1);
    const std::string bytes = Bytes(w);
    auto back = ParseKvcmWeights(AsBytes(bytes));
    REQUIRE(back.ok());
    CHECK(SameWeights(w, *back));
    CHECK(back->has_image() == (blocks == 12));
    uint32_t magic;
    std::memcpy(&magic, bytes.data(), 4);
    CHECK(magic == 0x4B56434D);
  }
  // fp16 and bf16 store rounded values.
  for (KvcmDType dt : {KvcmDType::kFP16, KvcmDType::kBF16}) {
    KvcmWeights w = RandomWeights(1, 4, 2, 6, 2, dt);
    auto back = ParseKvcmWeights(AsBytes(Bytes(w)));
    REQUIRE(back.ok());
    const float x = w.layers[0][0].weight[5];
    const float want = dt == KvcmDType::kFP16 ? Fp16ToFloat(FloatToFp16(x))
                                              : Bf16ToFloat(FloatToBf16(x));
    CHECK(back->layers[0][0].weight[5] == want);
    CHECK(Bytes(w).size() < Bytes(RandomWeights(1, 4, 2, 6, 2)).size());
  }
  // head_dim 0 in the header: taken from compress_tk's last layer.
  KvcmWeights w = RandomWeights(1, 4, 2, 6, 3);
  w.header.head_dim = 0;
  auto back = ParseKvcmWeights(AsBytes(Bytes(w)));
  REQUIRE(back.ok());
  CHECK(back->EffectiveHeadDim() == 4);
}

TEST_CASE("kvcm: every header field is checked", "[kvcm]") {
  const std::string ok = Bytes(RandomWeights(2, 4, 3, 12, 4));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 0, 0x4D43564B)),
             Catch::Contains("header.magic"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 4, 2)),
             Catch::Contains("header.version"));
  CHECK_THAT(ParseError(Patched<uint16_t>(ok, 8, 3)),
             Catch::Contains("header.dtype_code"));
  CHECK_THAT(ParseError(Patched<uint16_t>(ok, 10, 1)),
             Catch::Contains("header.reserved"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 12, 0)),
             Catch::Contains("header.num_layers"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 12, 5000)),
             Catch::Contains("header.num_layers"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 12, 3)),
             Catch::Contains("layer 2 compress_tk[slot 0].rows"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 16, 1u << 20)),
             Catch::Contains("header.num_heads"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 20, 5)),
             Catch::Contains("compress_tk[slot 0].cols") &&
                 Catch::Contains("head_dim 5"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 20, 5000)),
             Catch::Contains("header.head_dim"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 24, 1u << 30)),
             Catch::Contains("header.hidden_size"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 28, 1)),
             Catch::Contains("header.compression_factor"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 28, 0)),
             Catch::Contains("header.compression_factor"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 28, 4)),
             Catch::Contains("compress_tk[slot 0].cols") &&
                 Catch::Contains("compression_factor 4"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 36, 5)),
             Catch::Contains("header.weight_count_per_layer"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 36, 6)),
             Catch::Contains("trailing bytes"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 40, 1u << 30)),
             Catch::Contains("header.metadata_size_bytes"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, 40, 1u << 23)),
             Catch::Contains("metadata") && Catch::Contains("remain"));
  // min_seq_len has no invalid value: any threshold parses.
  CHECK(ParseKvcmWeights(AsBytes(Patched<uint32_t>(ok, 32, 0xffffffffu))).ok());
}

TEST_CASE("kvcm: weight blocks are checked", "[kvcm]") {
  const KvcmWeights w = RandomWeights(1, 4, 3, 6, 5);
  const std::string ok = Bytes(w);
  const size_t meta0 = kKvcmHeaderBytes + w.header.metadata.size();
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, meta0, 0)),
             Catch::Contains("layer 0 compress_tk[slot 0].rows"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, meta0 + 4, 0)),
             Catch::Contains("layer 0 compress_tk[slot 0].cols"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, meta0 + 8, 2)),
             Catch::Contains("layer 0 compress_tk[slot 0].has_bias"));
  // Sizes that run past the end, and products that would overflow.
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, meta0, 1000)),
             Catch::Contains("compress_tk[slot 0].weight_data") &&
                 Catch::Contains("remain"));
  std::string huge = Patched<uint32_t>(ok, meta0, 1u << 20);
  huge = Patched<uint32_t>(huge, meta0 + 4, 1u << 20);
  CHECK_THAT(ParseError(huge), Catch::Contains("over the limit"));
  CHECK_THAT(ParseError(Patched<uint32_t>(ok, meta0, 0xffffffffu)),
             Catch::Contains("rows"));
  // Bias flag flipped: the reader then runs off its alignment and fails.
  CHECK_FALSE(
      ParseKvcmWeights(AsBytes(Patched<uint32_t>(ok, meta0 + 8, 0))).ok());
  // Every truncation fails; trailing bytes fail.
  for (size_t n = 0; n < ok.size(); ++n) {
    REQUIRE_FALSE(ParseKvcmWeights(AsBytes(ok.substr(0, n))).ok());
  }
  CHECK_THAT(ParseError(ok + "x"), Catch::Contains("trailing bytes"));
  // Non-finite values.
  const size_t first_weight = meta0 + kKvcmWeightMetaBytes;
  CHECK_THAT(ParseError(Patched<float>(ok, first_weight + 4 * 7,
                                       std::numeric_limits<float>::infinity())),
             Catch::Contains("compress_tk[slot 0].weight[0][7]") &&
                 Catch::Contains("not finite"));
}

TEST_CASE("kvcm: in-memory weights are validated before writing", "[kvcm]") {
  KvcmWeights w = RandomWeights(1, 4, 3, 6, 6);
  w.layers[0][4].cols = 11;  // compress_tv slot 3 must take 12 inputs
  w.layers[0][4].weight.resize(11 * w.layers[0][4].rows);
  auto s = SerializeKvcmWeights(w);
  CHECK_THAT(std::string(s.status().message()),
             Catch::Contains("layer 0 compress_tv[slot 3].cols"));
  w = RandomWeights(1, 4, 3, 6, 6);
  w.layers[0][5].bias.pop_back();
  CHECK_THAT(std::string(SerializeKvcmWeights(w).status().message()),
             Catch::Contains("compress_tv[slot 6].bias"));
}

// ---------------------------------------------------------------- forward

// Plain loops in double: the reference the BLAS version is checked against.
std::vector<double> NaiveMlp(const KvcmWeights& w, uint32_t layer,
                             KvcmPrefix prefix, std::vector<double> x) {
  for (uint32_t i = 0; i < 3; ++i) {
    const KvcmLinear& lin = w.linear(layer, prefix, i);
    std::vector<double> y(lin.rows);
    for (uint32_t r = 0; r < lin.rows; ++r) {
      double s = lin.bias.empty() ? 0.0 : lin.bias[r];
      for (uint32_t c = 0; c < lin.cols; ++c) {
        s += double{lin.weight[r * lin.cols + c]} * x[c];
      }
      y[r] = i < 2 ? std::max(s, 0.0) : s;
    }
    x = std::move(y);
  }
  return x;
}

// Reference compressor on [kv][layer][token][head][dim] floats.
std::vector<double> NaiveCompress(const KvcmWeights& w,
                                  const KvSequenceShape& s,
                                  const std::vector<float>& in,
                                  uint64_t image_tokens, uint64_t* out_tokens) {
  const uint32_t f = w.header.compression_factor, hd = s.head_dim,
                 nh = s.num_kv_heads;
  std::vector<std::vector<std::vector<std::vector<double>>>> out(
      2 * s.num_layers);  // [kv*L+l][token][head] -> hd values
  for (int kv = 0; kv < 2; ++kv) {
    for (uint32_t l = 0; l < s.num_layers; ++l) {
      auto& dst = out[kv * s.num_layers + l];
      auto at = [&](uint64_t t, uint32_t h, uint32_t d) {
        return double{
            in[((uint64_t(kv) * s.num_layers + l) * s.num_tokens + t) * nh *
                   hd +
               h * hd + d]};
      };
      const uint64_t image = std::min(image_tokens, s.num_tokens);
      const uint64_t seg_start[2] = {0, image};
      const uint64_t seg_len[2] = {image, s.num_tokens - image};
      for (int seg = 0; seg < 2; ++seg) {
        const bool mlp = seg == 1 || w.has_image();
        const KvcmPrefix prefix =
            static_cast<KvcmPrefix>((seg == 0 ? 2 : 0) + kv);
        const uint64_t n = seg_len[seg], m = n / f;
        const bool compress = mlp && m >= w.header.min_seq_len;
        const uint64_t merged = compress ? m : 0;
        for (uint64_t i = 0; i < merged; ++i) {
          std::vector<std::vector<double>> tok(nh);
          for (uint32_t h = 0; h < nh; ++h) {
            std::vector<double> x;
            for (uint32_t j = 0; j < f; ++j) {
              for (uint32_t d = 0; d < hd; ++d) {
                x.push_back(at(seg_start[seg] + i * f + j, h, d));
              }
            }
            tok[h] = NaiveMlp(w, l, prefix, x);
          }
          dst.push_back(tok);
        }
        for (uint64_t t = merged * f; t < n; ++t) {
          std::vector<std::vector<double>> tok(nh, std::vector<double>(hd));
          for (uint32_t h = 0; h < nh; ++h) {
            for (uint32_t d = 0; d < hd; ++d)
              tok[h][d] = at(seg_start[seg] + t, h, d);
          }
          dst.push_back(tok);
        }
      }
    }
  }
  *out_tokens = out[0].size();
  std::vector<double> flat;
  for (auto& block : out) {
    for (auto& tok : block) {
      for (auto& head : tok) flat.insert(flat.end(), head.begin(), head.end());
    }
  }
  return flat;
}

TEST_CASE("kvcm: forward pass matches plain loops", "[kvcm]") {
  const uint32_t layers = 2, heads = 3, hd = 4, f = 3;
  for (uint32_t blocks : {kKvcmFullBlocks, kKvcmTextOnlyBlocks}) {
    auto w =
        std::make_shared<KvcmWeights>(RandomWeights(layers, hd, f, blocks, 7));
    for (uint64_t image : {uint64_t{0}, uint64_t{7}, uint64_t{100}}) {
      for (uint64_t tokens : {uint64_t{0}, uint64_t{5}, uint64_t{6},
                              uint64_t{20}, uint64_t{31}}) {
        auto comp = KvcmCompressor::Create(w, layers, heads, hd, {image});
        REQUIRE(comp.ok());
        CHECK((*comp)->lossy());
        CHECK((*comp)->changes_length());
        KvSequenceShape s{layers, heads, hd, tokens};
        std::vector<float> in(s.Elements());
        std::mt19937 rng(static_cast<uint32_t>(tokens + 31 * image));
        std::normal_distribution<float> nd;
        for (float& x : in) x = nd(rng);
        uint64_t want_tokens = 0;
        const std::vector<double> want =
            NaiveCompress(*w, s, in, image, &want_tokens);
        auto out_tokens = (*comp)->OutputTokens(tokens);
        REQUIRE(out_tokens.ok());
        REQUIRE(*out_tokens == want_tokens);
        KvSequenceShape os = s;
        os.num_tokens = *out_tokens;
        std::vector<float> out(os.Elements(), -7.0f);
        REQUIRE((*comp)->Apply({s, in.data()}, {os, out.data()}).ok());
        REQUIRE(out.size() == want.size());
        for (size_t i = 0; i < out.size(); ++i) {
          REQUIRE(std::fabs(out[i] - want[i]) <=
                  1e-4 * (1 + std::fabs(want[i])));
        }
      }
    }
  }
}

TEST_CASE("kvcm: lengths, thresholds and shape checks", "[kvcm]") {
  auto w = std::make_shared<KvcmWeights>(RandomWeights(1, 4, 5, 12, 8));
  w->header.min_seq_len = 3;  // at least 3 merged tokens
  auto comp = KvcmCompressor::Create(w, 1, 2, 4);
  REQUIRE(comp.ok());
  CHECK(*(*comp)->OutputTokens(14) == 14);  // 2 groups < 3: left alone
  CHECK(*(*comp)->OutputTokens(15) == 3);
  CHECK(*(*comp)->OutputTokens(17) == 5);  // 3 merged + 2 tail
  CHECK(*(*comp)->OutputTokens(0) == 0);
  auto with_image = KvcmCompressor::Create(w, 1, 2, 4, {15});
  CHECK(*(*with_image)->OutputTokens(30) == 6);
  CHECK(*(*with_image)->OutputTokens(20) == 3 + 5);  // text 5 < 15 left alone
  // Below the threshold the output is the input, bit for bit.
  KvSequenceShape s{1, 2, 4, 14};
  std::vector<float> in(s.Elements());
  for (size_t i = 0; i < in.size(); ++i) in[i] = 0.25f * i;
  std::vector<float> out(s.Elements());
  REQUIRE((*comp)->Apply({s, in.data()}, {s, out.data()}).ok());
  CHECK(out == in);
  KvSequenceShape bad = s;
  bad.num_tokens = 13;
  CHECK_THAT(
      std::string((*comp)->Apply({s, in.data()}, {bad, out.data()}).message()),
      Catch::Contains("out.shape"));
  bad = s;
  bad.head_dim = 8;
  CHECK_THAT(
      std::string((*comp)->Apply({bad, in.data()}, {s, out.data()}).message()),
      Catch::Contains("in.shape"));
  CHECK_THAT(std::string(KvcmCompressor::Create(w, 2, 2, 4).status().message()),
             Catch::Contains("num_layers"));
  CHECK_THAT(std::string(KvcmCompressor::Create(w, 1, 2, 8).status().message()),
             Catch::Contains("head_dim"));
  CHECK_FALSE(KvcmCompressor::Create(nullptr, 1, 2, 4).ok());
}

TEST_CASE("kvcm: file on disk", "[kvcm]") {
  const std::string path = "/tmp/kvharbor_kvcm_test.bin";
  const KvcmWeights w = RandomWeights(1, 4, 2, 12, 9);
  REQUIRE(WriteKvcmWeightsFile(w, path).ok());
  auto back = ReadKvcmWeightsFile(path);
  REQUIRE(back.ok());
  CHECK(SameWeights(w, *back));
  std::remove(path.c_str());
  CHECK(ReadKvcmWeightsFile(path).status().code() ==
        absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvharbor
