// PagedKvLayout (types/kv_layout.h): resolving against a namespace geometry
// fills the namespace's dimensions in and refuses, naming the field, every
// layout that does not fit it (dtype, heads, head_dim, block size, layer
// range, strides that overlap, misaligned or too-small buffers); block ids
// are checked for count, range and duplicates; the contiguous run and the
// extent follow the strides.
#include "types/kv_layout.h"

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/match.h"

namespace kvharbor {
namespace {

Geometry G() {
  Geometry g;
  g.num_layers = 4;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  g.page_size = 4;
  g.dtype = DType::kBF16;
  return g;
}

// vLLM-like: [blocks, page, heads, dim] per layer, 10 blocks.
PagedKvLayout Vllm(uint32_t layers = 4) {
  PagedKvLayout l;
  l.dtype = DType::kBF16;
  for (uint32_t i = 0; i < layers; ++i) {
    l.k.push_back(0x10000 + i * 0x1000);
    l.v.push_back(0x80000 + i * 0x1000);
  }
  l.num_blocks = 10;
  l.head_stride = 8;
  l.token_stride = 16;
  l.block_stride = 64;
  return l;
}

void ExpectInvalid(const PagedKvLayout& l, const std::string& field,
                   bool all_layers = false) {
  absl::StatusOr<PagedKvLayout> r = ResolveLayout(l, G(), all_layers);
  INFO(r.status().ToString());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StartsWith(r.status().message(), field));
}

TEST_CASE("ResolveLayout fills in the namespace's dimensions",
          "[types][kv_layout]") {
  absl::StatusOr<PagedKvLayout> r = ResolveLayout(Vllm(), G());
  REQUIRE(r.ok());
  CHECK(r->num_kv_heads == 2);
  CHECK(r->head_dim == 8);
  CHECK(r->block_size == 4);
  CHECK(r->ContiguousRunElements() == 64);  // the whole block
  CHECK(r->ExtentBytes() == 10 * 64 * 2);
  PagedKvLayout dense = *r;  // HF: [heads, tokens, dim]
  dense.head_stride = 40 * 8;
  dense.token_stride = 8;
  dense.block_stride = 32;
  REQUIRE(ResolveLayout(dense, G()).ok());
  CHECK(dense.ContiguousRunElements() == 8);
  PagedKvLayout heads = *r;  // token rows padded: heads adjacent only
  heads.token_stride = 24;
  heads.block_stride = 96;
  REQUIRE(ResolveLayout(heads, G()).ok());
  CHECK(heads.ContiguousRunElements() == 16);
  PagedKvLayout range = Vllm(2);
  range.layer_begin = 2;
  CHECK(ResolveLayout(range, G()).ok());
}

TEST_CASE("ResolveLayout names the field that does not fit",
          "[types][kv_layout]") {
  PagedKvLayout l = Vllm();
  l.dtype = DType::kFP16;
  ExpectInvalid(l, "layout.dtype");
  l = Vllm();
  l.num_kv_heads = 4;
  ExpectInvalid(l, "layout.num_kv_heads");
  l = Vllm();
  l.head_dim = 16;
  ExpectInvalid(l, "layout.head_dim");
  l = Vllm();
  l.block_size = 8;
  ExpectInvalid(l, "layout.block_size");
  l = Vllm(5);
  ExpectInvalid(l, "layout.num_layers");
  l = Vllm(2);
  l.layer_begin = 3;
  ExpectInvalid(l, "layout.num_layers");
  l.layer_begin = 4;
  ExpectInvalid(l, "layout.layer_begin");
  ExpectInvalid(Vllm(3), "layout.num_layers", /*all_layers=*/true);
  l = Vllm();
  l.v.pop_back();
  ExpectInvalid(l, "layout.v");
  l = Vllm();
  l.k.clear();
  l.v.clear();
  ExpectInvalid(l, "layout.k");
  l = Vllm();
  l.num_blocks = 0;
  ExpectInvalid(l, "layout.num_blocks");
  l = Vllm();
  l.token_stride = 0;
  ExpectInvalid(l, "layout.token_stride");
  l = Vllm();
  l.head_stride = 4;  // heads overlap within a token
  ExpectInvalid(l, "layout.head_stride");
  l = Vllm();
  l.block_stride = 32;  // blocks overlap
  ExpectInvalid(l, "layout.block_stride");
  l = Vllm();
  l.k[1] += 1;
  ExpectInvalid(l, "layout.k[1]");
  l = Vllm();
  l.v[3] = 0;
  ExpectInvalid(l, "layout.v[3]");
  l = Vllm();
  l.k_bytes.assign(4, 10 * 64 * 2);
  CHECK(ResolveLayout(l, G()).ok());
  l.k_bytes[2] = 10 * 64 * 2 - 1;
  ExpectInvalid(l, "layout.k[2]");
  l.k_bytes.resize(3);
  ExpectInvalid(l, "layout.k_bytes");
  l = Vllm();
  l.device = -2;
  ExpectInvalid(l, "layout.device");
}

TEST_CASE("CheckBlockIds: count, range, duplicates", "[types][kv_layout]") {
  const PagedKvLayout l = Vllm();
  CHECK(CheckBlockIds(l, {3, 9, 0}, 3).ok());
  auto bad = [&](std::vector<int64_t> ids, size_t n, const std::string& f) {
    const absl::Status s = CheckBlockIds(l, ids, n);
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StartsWith(s.message(), f));
  };
  bad({3, 9}, 3, "block_ids:");
  bad({3, 10, 0}, 3, "block_ids[1]");
  bad({3, -1, 0}, 3, "block_ids[1]");
  bad({3, 5, 3}, 3, "block_ids[2]");
}

}  // namespace
}  // namespace kvharbor
