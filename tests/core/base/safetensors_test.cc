#include "core/base/safetensors.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/base/byte_io.h"

namespace kvharbor {
namespace {

std::string F32Bytes(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// A file from a raw JSON header and data section.
std::string RawFile(const std::string& json, const std::string& data) {
  ByteWriter w;
  w.Put<uint64_t>(json.size());
  w.PutBytes(json.data(), json.size());
  w.PutBytes(data.data(), data.size());
  return w.Release();
}

// The error message of parsing `bytes` (which must fail).
std::string ParseError(const std::string& bytes) {
  auto f = SafetensorsFile::FromBytes(bytes);
  REQUIRE_FALSE(f.ok());
  CHECK(f.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(f.status().message());
}

std::vector<SafetensorsTensorData> SampleTensors() {
  std::vector<SafetensorsTensorData> t(3);
  t[0] = {"layers.0.scale", StDType::kF32, {3}, F32Bytes({1.5f, -2.0f, 0.25f})};
  t[1] = {"layers.0.weight",
          StDType::kI8,
          {2, 2},
          std::string("\x01\xff\x7f\x80", 4)};
  t[2] = {"empty", StDType::kF16, {0, 5}, ""};
  return t;
}

TEST_CASE("safetensors: written files read back", "[safetensors]") {
  const auto tensors = SampleTensors();
  auto bytes = SerializeSafetensors(tensors, {{"format", "pt"}});
  REQUIRE(bytes.ok());
  uint64_t n;
  std::memcpy(&n, bytes->data(), 8);
  CHECK((8 + n) % 8 == 0);  // padded like the reference writer
  auto f = SafetensorsFile::FromBytes(*bytes);
  REQUIRE(f.ok());
  const SafetensorsHeader& h = f->header();
  CHECK(h.metadata.at("format") == "pt");
  REQUIRE(h.tensors.size() == 3);
  for (const auto& t : tensors) {
    const SafetensorsTensor* got = h.Find(t.name);
    REQUIRE(got != nullptr);
    CHECK(got->dtype == t.dtype);
    CHECK(got->shape == t.shape);
    auto data = f->ReadTensorBytes(t.name);
    REQUIRE(data.ok());
    CHECK(*data == t.data);
  }
  auto floats = f->ReadTensorAsFloat("layers.0.scale");
  REQUIRE(floats.ok());
  CHECK(*floats == std::vector<float>{1.5f, -2.0f, 0.25f});
  CHECK_FALSE(f->ReadTensorAsFloat("layers.0.weight").ok());  // I8
  CHECK(f->ReadTensorBytes("nope").status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(h.Find("nope") == nullptr);
}

TEST_CASE("safetensors: file on disk, tensors read on demand",
          "[safetensors]") {
  const std::string path =
      "/tmp/kvharbor_safetensors_test_" + std::to_string(getpid()) + ".st";
  std::vector<SafetensorsTensorData> t(2);
  auto f16 = EncodeFloatTensor({0.5f, 3.0f}, StDType::kF16);
  auto bf16 = EncodeFloatTensor({-1.0f, 256.0f, 7.0f}, StDType::kBF16);
  REQUIRE(f16.ok());
  REQUIRE(bf16.ok());
  t[0] = {"a", StDType::kF16, {2}, *f16};
  t[1] = {"b", StDType::kBF16, {1, 3}, *bf16};
  REQUIRE(WriteSafetensorsFile(path, t, {}).ok());
  auto f = SafetensorsFile::Open(path);
  REQUIRE(f.ok());
  CHECK(*f->ReadTensorAsFloat("a") == std::vector<float>{0.5f, 3.0f});
  CHECK(*f->ReadTensorAsFloat("b") == std::vector<float>{-1.0f, 256.0f, 7.0f});
  std::remove(path.c_str());
  CHECK(SafetensorsFile::Open(path).status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("safetensors: writer refuses bad input", "[safetensors]") {
  std::vector<SafetensorsTensorData> t(1);
  t[0] = {"x", StDType::kF32, {3}, F32Bytes({1, 2})};
  CHECK_FALSE(SerializeSafetensors(t, {}).ok());  // 8 bytes for 12
  t[0] = {"__metadata__", StDType::kF32, {}, F32Bytes({1})};
  CHECK_FALSE(SerializeSafetensors(t, {}).ok());
  std::vector<SafetensorsTensorData> dup(2, {"x", StDType::kU8, {1}, "a"});
  CHECK_FALSE(SerializeSafetensors(dup, {}).ok());
  CHECK_FALSE(EncodeFloatTensor({1.0f}, StDType::kI32).ok());
}

TEST_CASE("safetensors: bad header length", "[safetensors]") {
  CHECK_THAT(ParseError("1234567"),
             Catch::Contains("header_length") && Catch::Contains("shorter"));
  // Length runs past the end of the file.
  std::string f = RawFile("{}", "");
  f[0] = 50;
  CHECK_THAT(ParseError(f), Catch::Contains("header_length") &&
                                Catch::Contains("past the end"));
  // Enormous length (would overflow 8 + N).
  std::string huge = f;
  std::memset(&huge[0], 0xff, 8);
  CHECK_THAT(ParseError(huge), Catch::Contains("header_length"));
  std::string tiny = RawFile("{", "");
  CHECK_THAT(ParseError(tiny), Catch::Contains("header_length"));
}

TEST_CASE("safetensors: malformed JSON and structure", "[safetensors]") {
  CHECK_THAT(ParseError(RawFile("[1,2]", "")), Catch::Contains("json"));
  CHECK_THAT(ParseError(RawFile("{\"a\": ", "")),
             Catch::Contains("not valid JSON"));
  CHECK_THAT(ParseError(RawFile(R"({"a":{"dtype":"F32","shape":[1],)"
                                R"("data_offsets":[0,4]},"a":{}})",
                                "1234")),
             Catch::Contains("duplicate key 'a'"));
  CHECK_THAT(ParseError(RawFile(R"({"a":{"dtype":"F32","dtype":"F32",)"
                                R"("shape":[1],"data_offsets":[0,4]}})",
                                "1234")),
             Catch::Contains("duplicate key 'dtype'"));
  CHECK_THAT(ParseError(RawFile(R"({"a":{"x":[[[[1]]]]}})", "")),
             Catch::Contains("nesting"));
  std::string deep = "{\"a\":" + std::string(100000, '[');
  CHECK_THAT(ParseError(RawFile(deep, "")), Catch::Contains("nesting"));
  CHECK_THAT(ParseError(RawFile(R"({"__metadata__":{"k":1}})", "")),
             Catch::Contains("__metadata__['k']"));
  CHECK_THAT(ParseError(RawFile(R"({"__metadata__":[]})", "")),
             Catch::Contains("__metadata__"));
}

TEST_CASE("safetensors: every tensor field is checked", "[safetensors]") {
  const std::string data(8, '\0');
  auto err = [&](const std::string& entry) {
    return ParseError(RawFile("{\"t\":" + entry + "}", data));
  };
  CHECK_THAT(err(R"({"dtype":"F33","shape":[2],"data_offsets":[0,8]})"),
             Catch::Contains("tensors['t'].dtype") &&
                 Catch::Contains("unknown dtype"));
  CHECK_THAT(err(R"({"dtype":7,"shape":[2],"data_offsets":[0,8]})"),
             Catch::Contains("tensors['t'].dtype"));
  CHECK_THAT(err(R"({"shape":[2],"data_offsets":[0,8]})"),
             Catch::Contains("tensors['t'].dtype: is missing"));
  CHECK_THAT(err(R"({"dtype":"F32","data_offsets":[0,8]})"),
             Catch::Contains("tensors['t'].shape: is missing"));
  CHECK_THAT(err(R"({"dtype":"F32","shape":[2]})"),
             Catch::Contains("tensors['t'].data_offsets: is missing"));
  CHECK_THAT(err(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"),
             Catch::Contains("tensors['t'].shape[0]"));
  CHECK_THAT(err(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"),
             Catch::Contains("tensors['t'].shape[0]"));
  CHECK_THAT(err(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})"),
             Catch::Contains("tensors['t'].shape"));
  CHECK_THAT(err(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})"),
             Catch::Contains("tensors['t'].data_offsets") &&
                 Catch::Contains("before begin"));
  CHECK_THAT(err(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"),
             Catch::Contains("tensors['t'].data_offsets"));
  CHECK_THAT(err(R"({"dtype":"F32","shape":[2],"data_offsets":[0,-8]})"),
             Catch::Contains("tensors['t'].data_offsets"));
  CHECK_THAT(
      err(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1})"),
      Catch::Contains("tensors['t'].'x'") && Catch::Contains("unknown key"));
  CHECK_THAT(err(R"([1])"), Catch::Contains("tensors['t']: must be an object"));
  // Wrong dtype size for the span: F64 needs 16 bytes for 2 elements.
  CHECK_THAT(err(R"({"dtype":"F64","shape":[2],"data_offsets":[0,8]})"),
             Catch::Contains("spans 8 bytes") && Catch::Contains("need 16"));
  // Element count overflow.
  CHECK_THAT(err(R"({"dtype":"F32","shape":[4294967296,4294967296],)"
                 R"("data_offsets":[0,8]})"),
             Catch::Contains("overflows"));
  CHECK_THAT(err(R"({"dtype":"F32","shape":[4611686018427387904],)"
                 R"("data_offsets":[0,8]})"),
             Catch::Contains("byte size overflows"));
  // Offsets past the end of the file.
  CHECK_THAT(err(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"),
             Catch::Contains("data_offsets") &&
                 Catch::Contains("data section is 8 bytes"));
  CHECK_THAT(err(R"({"dtype":"U8","shape":[1],)"
                 R"("data_offsets":[18446744073709551615,0]})"),
             Catch::Contains("tensors['t'].data_offsets"));
}

TEST_CASE("safetensors: offsets must tile the data section", "[safetensors]") {
  const std::string data(8, '\0');
  auto two = [&](const std::string& a, const std::string& b) {
    return ParseError(RawFile(R"({"a":{"dtype":"F32","shape":[1],)"
                              R"("data_offsets":)" +
                                  a +
                                  R"(},)"
                                  R"("b":{"dtype":"F32","shape":[1],)"
                                  R"("data_offsets":)" +
                                  b + "}}",
                              data));
  };
  CHECK_THAT(two("[0,4]", "[2,6]"), Catch::Contains("overlap"));
  CHECK_THAT(two("[0,4]", "[0,4]"), Catch::Contains("overlap"));
  CHECK_THAT(two("[4,8]", "[8,12]"), Catch::Contains("gap"));
  CHECK_THAT(two("[0,4]", "[5,9]"), Catch::Contains("gap"));
  // Trailing bytes no tensor covers.
  CHECK_THAT(ParseError(RawFile(R"({"a":{"dtype":"F32","shape":[1],)"
                                R"("data_offsets":[0,4]}})",
                                data)),
             Catch::Contains("data section is 8 bytes"));
  // The same tensors in the right places parse.
  auto ok = SafetensorsFile::FromBytes(
      RawFile(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
              R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
              data));
  CHECK(ok.ok());
}

TEST_CASE("safetensors: truncated and corrupted files never crash",
          "[safetensors]") {
  auto bytes = SerializeSafetensors(SampleTensors(), {{"k", "v"}});
  REQUIRE(bytes.ok());
  // Every truncation fails cleanly; none succeeds.
  for (size_t n = 0; n < bytes->size(); ++n) {
    CHECK_FALSE(SafetensorsFile::FromBytes(bytes->substr(0, n)).ok());
  }
  // Single-byte corruptions of the header either fail or still describe a
  // consistent file whose tensors can all be read.
  uint64_t n;
  std::memcpy(&n, bytes->data(), 8);
  for (size_t i = 0; i < 8 + n; ++i) {
    std::string b = *bytes;
    b[i] = static_cast<char>(b[i] ^ 0x5a);
    auto f = SafetensorsFile::FromBytes(b);
    if (!f.ok()) continue;
    for (const auto& t : f->header().tensors) {
      CHECK(f->ReadTensorBytes(t.name).ok());
    }
  }
}

}  // namespace
}  // namespace kvharbor
