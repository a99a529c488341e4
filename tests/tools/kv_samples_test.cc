#include "core/calibration/kv_samples.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/base/safetensors.h"

namespace kvharbor {
namespace {

KvSamples Small() {
  KvSamples s;
  s.num_layers = 2;
  s.num_kv_heads = 1;
  s.head_dim = 4;
  s.tokens = 3;
  s.rope_style = RopeStyle::kInterleaved;
  s.rope_theta = 10000.0f;
  s.keys_roped = true;
  for (int i = 0; i < 24; ++i) {
    s.k.push_back(0.25f * i);
    s.v.push_back(-0.5f * i);
  }
  s.positions = {0, 1, 2};
  s.extra["model"] = "test";
  return s;
}

struct Parts {
  std::map<std::string, std::string> meta;
  std::vector<SafetensorsTensorData> tensors;
};

Parts SmallParts() {
  const KvSamples s = Small();
  Parts p;
  p.meta = {{"format", "kvharbor.kv_samples"},
            {"format_version", "1"},
            {"num_layers", "2"},
            {"num_kv_heads", "1"},
            {"head_dim", "4"},
            {"rope_style", "interleaved"},
            {"rope_theta", "10000"},
            {"keys_roped", "true"}};
  p.tensors.resize(3);
  p.tensors[0] = {
      "k", StDType::kF32, {3, 2, 1, 4}, *EncodeFloatTensor(s.k, StDType::kF32)};
  p.tensors[1] = {
      "v", StDType::kF32, {3, 2, 1, 4}, *EncodeFloatTensor(s.v, StDType::kF32)};
  p.tensors[2] = {"positions", StDType::kI64, {3}, std::string(24, '\0')};
  for (int i = 0; i < 3; ++i) {
    const int64_t v = i;
    std::memcpy(&p.tensors[2].data[8 * i], &v, 8);
  }
  return p;
}

absl::Status ParseParts(const Parts& p) {
  auto bytes = SerializeSafetensors(p.tensors, p.meta);
  if (!bytes.ok()) return bytes.status();
  auto file = SafetensorsFile::FromBytes(*bytes);
  if (!file.ok()) return file.status();
  return ParseKvSamples(*file).status();
}

TEST_CASE("kv samples: round trip in every float dtype", "[kv_samples]") {
  const KvSamples s = Small();
  for (StDType dt : {StDType::kF32, StDType::kF16, StDType::kBF16}) {
    const std::string path = "kv_samples_test.safetensors";
    REQUIRE(WriteKvSamples(s, dt, path).ok());
    auto back = ReadKvSamples(path);
    std::remove(path.c_str());
    REQUIRE(back.ok());
    CHECK(back->tokens == 3);
    CHECK(back->positions == s.positions);
    CHECK(back->rope_style == RopeStyle::kInterleaved);
    CHECK(back->rope_theta == 10000.0f);
    CHECK(back->keys_roped);
    CHECK(back->extra.at("model") == "test");
    // These values are exact in all three dtypes.
    CHECK(back->k == s.k);
    CHECK(back->v == s.v);
  }
  CHECK(ParseParts(SmallParts()).ok());
}

TEST_CASE("kv samples: bad files are refused naming the field",
          "[kv_samples]") {
  struct Case {
    const char* field;
    std::function<void(Parts&)> mutate;
  };
  const std::vector<Case> cases = {
      {"__metadata__.format", [](Parts& p) { p.meta["format"] = "other"; }},
      {"__metadata__.format_version",
       [](Parts& p) { p.meta["format_version"] = "2"; }},
      {"__metadata__.num_layers", [](Parts& p) { p.meta.erase("num_layers"); }},
      {"__metadata__.head_dim", [](Parts& p) { p.meta["head_dim"] = "x"; }},
      {"__metadata__.rope_style",
       [](Parts& p) { p.meta["rope_style"] = "spiral"; }},
      {"__metadata__.rope_theta",
       [](Parts& p) { p.meta["rope_theta"] = "0.5"; }},
      {"__metadata__.keys_roped",
       [](Parts& p) { p.meta["keys_roped"] = "maybe"; }},
      {"tensors['k'].shape", [](Parts& p) { p.meta["num_layers"] = "1"; }},
      {"tensors['v']",
       [](Parts& p) { p.tensors.erase(p.tensors.begin() + 1); }},
      {"tensors['positions'].dtype",
       [](Parts& p) { p.tensors[2].dtype = StDType::kU64; }},
      {"tensors['positions'][1]",
       [](Parts& p) { std::memset(&p.tensors[2].data[8], 0xFF, 8); }},
      {"tensors['k'].dtype",
       [](Parts& p) { p.tensors[0].dtype = StDType::kI32; }},
      {"tensors['v'][2]",
       [](Parts& p) {
         const float nan = std::nanf("");
         std::memcpy(&p.tensors[1].data[4 * 17], &nan, 4);
       }},
      {"tensors",
       [](Parts& p) {
         p.tensors.push_back({"extra", StDType::kU8, {1}, std::string(1, 'x')});
       }},
  };
  for (const Case& c : cases) {
    Parts p = SmallParts();
    c.mutate(p);
    const absl::Status s = ParseParts(p);
    INFO(c.field << " -> " << s.message());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(c.field) != std::string::npos);
  }
  // A truncated file is a safetensors error, not a crash.
  auto bytes = SerializeSafetensors(SmallParts().tensors, SmallParts().meta);
  REQUIRE(bytes.ok());
  bytes->resize(bytes->size() - 5);
  CHECK(!SafetensorsFile::FromBytes(*bytes).ok());
  CHECK(ReadKvSamples("/nonexistent/kv.safetensors")
            .status()
            .message()
            .find("/nonexistent/kv.safetensors") != std::string::npos);
}

}  // namespace
}  // namespace kvharbor
