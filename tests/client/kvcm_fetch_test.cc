// The KVCM fetch transform end to end: a namespace created with a KVCM
// weights file (spec.kvcm_path), pages inserted through the SDK and fetched
// with FetchTransform::kKvcm; the daemon's result must equal the CPU
// compressor applied here to the same pages gathered into one sequence (to
// the rounding of the namespace's dtype), in the layout
// [K|V][layer][token][kv_head][head_dim], with OutputTokens tokens. Also the
// errors: no kvcm configured, a COMPRESSED transformed fetch, and bad
// kvcm_path files.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/base/float_formats.h"
#include "core/transform/kv_transform.h"
#include "core/transform/kvcm_compressor.h"
#include "core/transform/kvcm_format.h"
#include "kvharbor/v1/kvharbor.grpc.pb.h"
#include "tests/client/client_test_util.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

using client::FetchSource;
using client::FetchTransform;
using testing::Connect;
using testing::StartTestDaemon;
using testing::TokenRange;

constexpr uint32_t kLayers = 2, kHeads = 2, kHeadDim = 8, kPageSize = 4;
constexpr uint32_t kFactor = 3, kMinSeqLen = 2;

using testing::TempDir;

// Text-only weights with random values: per prefix Linear(f * hd -> 12),
// Linear(12 -> 10), Linear(10 -> hd).
KvcmWeights RandomWeights(uint32_t layers, uint32_t head_dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  KvcmWeights w;
  w.header.dtype = KvcmDType::kFP32;
  w.header.num_layers = layers;
  w.header.head_dim = head_dim;
  w.header.compression_factor = kFactor;
  w.header.min_seq_len = kMinSeqLen;
  w.header.weight_count_per_layer = kKvcmTextOnlyBlocks;
  const uint32_t dims[4] = {kFactor * head_dim, 12, 10, head_dim};
  w.layers.resize(layers);
  for (auto& layer : w.layers) {
    for (uint32_t b = 0; b < kKvcmTextOnlyBlocks; ++b) {
      KvcmLinear lin;
      lin.cols = dims[b % 3];
      lin.rows = dims[b % 3 + 1];
      for (uint32_t i = 0; i < lin.rows * lin.cols; ++i) {
        lin.weight.push_back(nd(rng));
      }
      for (uint32_t i = 0; i < lin.rows; ++i) lin.bias.push_back(nd(rng));
      layer.push_back(std::move(lin));
    }
  }
  return w;
}

size_t ElementBytes(client::DType dtype) { return client::DTypeSize(dtype); }

float Load(client::DType dtype, const uint8_t* p) {
  if (dtype == client::DType::kFP32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return dtype == client::DType::kBF16 ? Bf16ToFloat(bits) : Fp16ToFloat(bits);
}

// Pages of random values in [-1, 1] in `dtype`.
std::vector<uint8_t> RandomPages(const client::Geometry& g, size_t pages,
                                 uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const size_t es = ElementBytes(g.dtype);
  std::vector<uint8_t> out(pages * g.PageBytes());
  for (size_t i = 0; i + es <= out.size(); i += es) {
    const float v = dist(rng);
    if (g.dtype == client::DType::kFP32) {
      std::memcpy(&out[i], &v, 4);
    } else {
      const uint16_t bits =
          g.dtype == client::DType::kBF16 ? FloatToBf16(v) : FloatToFp16(v);
      std::memcpy(&out[i], &bits, 2);
    }
  }
  return out;
}

// Pages [first, first + n) of `data` as one float32 sequence
// [kv][layer][token][head][dim], gathered element by element from either
// page layout.
std::vector<float> Gather(const client::Geometry& g,
                          const std::vector<uint8_t>& data, size_t first,
                          size_t n) {
  const uint64_t tokens = n * g.page_size;
  const uint64_t te = uint64_t{g.num_kv_heads} * g.head_dim;
  const size_t es = ElementBytes(g.dtype);
  std::vector<float> seq(2 * g.num_layers * tokens * te);
  for (size_t p = 0; p < n; ++p) {
    const uint8_t* page = data.data() + (first + p) * g.PageBytes();
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t l = 0; l < g.num_layers; ++l) {
        const uint64_t block =
            g.layout == client::PageLayout::kLayerKvTokenHeadDim
                ? uint64_t{l} * 2 + kv
                : uint64_t(kv) * g.num_layers + l;
        for (uint64_t t = 0; t < g.page_size; ++t) {
          for (uint64_t e = 0; e < te; ++e) {
            const uint64_t src = (block * g.page_size + t) * te + e;
            const uint64_t dst = ((uint64_t(kv) * g.num_layers + l) * tokens +
                                  p * g.page_size + t) *
                                     te +
                                 e;
            seq[dst] = Load(g.dtype, page + src * es);
          }
        }
      }
    }
  }
  return seq;
}

// Checks the daemon's transformed result against `compressor` applied here
// to pages [first, first + n) of `data`.
void CheckAgainstLocal(const client::Geometry& g, const KvcmCompressor& cmp,
                       const std::vector<uint8_t>& data, size_t first, size_t n,
                       const client::TransformedKv& got) {
  const uint64_t tokens = n * g.page_size;
  CHECK(got.input_tokens == tokens);
  auto want_tokens = cmp.OutputTokens(tokens);
  REQUIRE(want_tokens.ok());
  REQUIRE(got.output_tokens == *want_tokens);
  const std::vector<float> in = Gather(g, data, first, n);
  KvSequenceShape shape{g.num_layers, g.num_kv_heads, g.head_dim, tokens};
  KvSequenceShape out_shape = shape;
  out_shape.num_tokens = *want_tokens;
  std::vector<float> want(out_shape.Elements());
  REQUIRE(cmp.Apply({shape, in.data()}, {out_shape, want.data()}).ok());
  const size_t es = ElementBytes(g.dtype);
  REQUIRE(got.bytes.size() == want.size() * es);
  // One rounding to the dtype (bf16: 8 significant bits) on top of float32
  // arithmetic whose summation order may differ between runs of BLAS.
  const float rel = g.dtype == client::DType::kFP32 ? 1e-5f : 1.0f / 128;
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float v = Load(g.dtype, got.bytes.data() + i * es);
    if (!(std::fabs(v - want[i]) <= rel * std::fabs(want[i]) + 1e-6f)) ++bad;
  }
  CHECK(bad == 0);
}

std::string WriteWeights(const std::string& dir, const std::string& name,
                         const KvcmWeights& w) {
  const std::string path = dir + "/" + name;
  REQUIRE(WriteKvcmWeightsFile(w, path).ok());
  return path;
}

TEST_CASE("SDK kvcm transform: fetched pages merge as the CPU compressor does",
          "[client][kvcm]") {
  TempDir dir;
  const KvcmWeights weights = RandomWeights(kLayers, kHeadDim, 21);
  const std::string path = WriteWeights(dir.path, "kvcm.bin", weights);
  auto cmp = KvcmCompressor::Create(
      std::make_shared<const KvcmWeights>(weights), kLayers, kHeads, kHeadDim);
  REQUIRE(cmp.ok());

  auto daemon = StartTestDaemon();
  auto c = Connect(*daemon);
  for (auto [dtype, layout] :
       {std::make_pair(client::DType::kFP32,
                       client::PageLayout::kKvLayerTokenHeadDim),
        std::make_pair(client::DType::kBF16,
                       client::PageLayout::kLayerKvTokenHeadDim)}) {
    const std::string ns = "kvcm-" + std::string(client::DTypeName(dtype));
    INFO(ns);
    client::NamespaceSpec spec = testing::MakeSpec(
        ns, kLayers, kHeads, kHeadDim, kPageSize, dtype, 1 << 20);
    spec.geometry.layout = layout;
    spec.kvcm_path = path;
    auto made = c->CreateNamespace(spec);
    INFO(made.status().ToString());
    REQUIRE(made.ok());
    CHECK(made->info.spec.kvcm_path == path);
    const client::Geometry& g = spec.geometry;
    const std::vector<uint8_t> data = RandomPages(g, 5, 7);
    const auto tokens = TokenRange(5 * kPageSize, 100);
    REQUIRE(c->Insert(ns, tokens, data, g.PageBytes()).ok());
    auto lease = c->Match(ns, tokens, /*lock=*/true);
    REQUIRE(lease.ok());
    REQUIRE(lease->pages.size() == 5);

    // The whole lease: 20 tokens -> 6 merged + 2 tail tokens.
    auto all = c->FetchTransformed(ns, FetchSource::FromLease(lease->id),
                                   FetchTransform::kKvcm);
    INFO(all.status().ToString());
    REQUIRE(all.ok());
    CHECK(all->output_tokens == 20 / kFactor + 20 % kFactor);
    CheckAgainstLocal(g, **cmp, data, 0, 5, *all);

    // A slice of the lease and pages by handle give the same sequences.
    auto slice = c->FetchTransformed(
        ns, FetchSource::FromLease(lease->id, 1, 3), FetchTransform::kKvcm);
    REQUIRE(slice.ok());
    CHECK(slice->output_tokens == 12 / kFactor);
    CheckAgainstLocal(g, **cmp, data, 1, 3, *slice);
    const std::vector<client::PageHandle> handles(lease->pages.begin() + 1,
                                                  lease->pages.begin() + 4);
    auto by_handle = c->FetchTransformed(ns, FetchSource::FromPages(handles),
                                         FetchTransform::kKvcm);
    REQUIRE(by_handle.ok());
    CHECK(by_handle->bytes == slice->bytes);

    // One page: 4 tokens make one group, under min_seq_len: left alone, so
    // the result is the page's values, reordered to [kv][layer] blocks.
    auto one = c->FetchTransformed(ns, FetchSource::FromLease(lease->id, 2, 1),
                                   FetchTransform::kKvcm);
    REQUIRE(one.ok());
    CHECK(one->output_tokens == kPageSize);
    const std::vector<float> page = Gather(g, data, 2, 1);
    REQUIRE(one->bytes.size() == page.size() * ElementBytes(dtype));
    for (size_t i = 0; i < page.size(); ++i) {
      REQUIRE(Load(dtype, one->bytes.data() + i * ElementBytes(dtype)) ==
              page[i]);
    }
    CheckAgainstLocal(g, **cmp, data, 2, 1, *one);

    // The untransformed fetch is unchanged.
    auto raw = c->Fetch(ns, FetchSource::FromLease(lease->id));
    REQUIRE(raw.ok());
    REQUIRE(raw->size() == 5);
    CHECK(std::equal((*raw)[0].begin(), (*raw)[0].end(), data.begin()));
    REQUIRE(c->Release(lease->id).ok());
  }
}

TEST_CASE("SDK kvcm transform: refused without kvcm or with COMPRESSED",
          "[client][kvcm]") {
  TempDir dir;
  const std::string path =
      WriteWeights(dir.path, "kvcm.bin", RandomWeights(kLayers, kHeadDim, 22));
  auto daemon = StartTestDaemon();
  auto c = Connect(*daemon);
  client::NamespaceSpec plain = testing::MakeSpec(
      "plain", kLayers, kHeads, kHeadDim, kPageSize, client::DType::kFP32);
  testing::CreateNs(*c, plain);
  client::NamespaceSpec with = plain;
  with.name = "with";
  with.kvcm_path = path;
  testing::CreateNs(*c, with);
  const auto tokens = TokenRange(2 * kPageSize, 1);
  const auto data = RandomPages(plain.geometry, 2, 3);
  for (const char* ns : {"plain", "with"}) {
    REQUIRE(c->Insert(ns, tokens, data, plain.geometry.PageBytes()).ok());
  }
  auto lease = c->Match("plain", tokens, /*lock=*/true);
  REQUIRE(lease.ok());
  auto refused = c->FetchTransformed("plain", FetchSource::FromLease(lease->id),
                                     FetchTransform::kKvcm);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(refused.status().message().find("transform") == 0);
  CHECK(refused.status().message().find("kvcm_path") !=
        absl::string_view::npos);
  auto none = c->FetchTransformed("plain", FetchSource::FromLease(lease->id),
                                  FetchTransform::kNone);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(none.status().message().find("transform") == 0);

  // Through the raw API: COMPRESSED with the transform, and an unknown
  // transform value, are INVALID_ARGUMENT naming the field.
  auto stub = v1::KvHarbor::NewStub(grpc::CreateChannel(
      daemon->address(), grpc::InsecureChannelCredentials()));
  auto lease2 = c->Match("with", tokens, /*lock=*/true);
  REQUIRE(lease2.ok());
  for (int variant = 0; variant < 2; ++variant) {
    INFO("variant " << variant);
    v1::FetchRequest req;
    req.set_namespace_("with");
    req.set_lease_id(lease2->id);
    if (variant == 0) {
      req.set_format(v1::FETCH_FORMAT_COMPRESSED);
      req.set_transform(v1::FETCH_TRANSFORM_KVCM);
    } else {
      req.set_transform(static_cast<v1::FetchTransform>(7));
    }
    grpc::ClientContext ctx;
    auto reader = stub->Fetch(&ctx, req);
    v1::FetchResponse r;
    size_t chunks = 0;
    while (reader->Read(&r)) ++chunks;
    const grpc::Status s = reader->Finish();
    CHECK(chunks == 0);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(s.error_message().find("transform") == 0);
  }
  // The same lease fetched raw with the transform works.
  v1::FetchRequest req;
  req.set_namespace_("with");
  req.set_lease_id(lease2->id);
  req.set_transform(v1::FETCH_TRANSFORM_KVCM);
  grpc::ClientContext ctx;
  auto reader = stub->Fetch(&ctx, req);
  v1::FetchResponse r;
  bool first = true;
  while (reader->Read(&r)) {
    CHECK(r.page_index() == 0);
    if (first) {
      CHECK(r.offset() == 0);
      CHECK(r.input_tokens() == 2 * kPageSize);
      CHECK(r.transformed_tokens() == 8 / kFactor + 8 % kFactor);
      CHECK(r.page_bytes() ==
            2 * kLayers * r.transformed_tokens() * kHeads * kHeadDim * 4);
      first = false;
    }
  }
  CHECK(reader->Finish().ok());
  CHECK_FALSE(first);
}

TEST_CASE("SDK kvcm transform: bad kvcm_path files name the field",
          "[client][kvcm]") {
  TempDir dir;
  auto daemon = StartTestDaemon();
  auto c = Connect(*daemon);
  auto refuse = [&](const std::string& name, const std::string& path,
                    uint32_t layers, uint32_t head_dim) {
    INFO(name);
    client::NamespaceSpec spec =
        testing::MakeSpec(name, layers, kHeads, head_dim, kPageSize,
                          client::DType::kFP32, 1 << 20);
    spec.kvcm_path = path;
    auto r = c->CreateNamespace(spec);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(r.status().message().find("spec.kvcm_path") == 0);
    CHECK_FALSE(c->DescribeNamespace(name).ok());
  };
  refuse("missing", dir.path + "/nope.bin", kLayers, kHeadDim);
  const std::string path =
      WriteWeights(dir.path, "kvcm.bin", RandomWeights(kLayers, kHeadDim, 23));
  refuse("layers", path, kLayers + 1, kHeadDim);
  refuse("head-dim", path, kLayers, kHeadDim * 2);
  // Not a KVCM file at all.
  const std::string junk = dir.path + "/junk.bin";
  REQUIRE(std::system(("echo not-kvcm > '" + junk + "'").c_str()) == 0);
  refuse("junk", junk, kLayers, kHeadDim);
  // The right geometry is accepted, with any number of KV heads.
  client::NamespaceSpec ok = testing::MakeSpec(
      "ok", kLayers, 5, kHeadDim, kPageSize, client::DType::kFP16, 1 << 20);
  ok.kvcm_path = path;
  auto made = c->CreateNamespace(ok);
  INFO(made.status().ToString());
  REQUIRE(made.ok());
  auto info = c->DescribeNamespace("ok");
  REQUIRE(info.ok());
  CHECK(info->spec.kvcm_path == path);
}

}  // namespace
}  // namespace kvharbor
