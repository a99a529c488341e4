// Byte-exact Insert -> Match -> Fetch round trips through the SDK against an
// in-process daemon, over geometries, dtypes, page sizes (4 KiB .. 2 MiB)
// and Insert/Fetch chunk sizes below, equal to and above the page size.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvharbor/client.h"
#include "tests/client/client_test_util.h"

namespace kvharbor {
namespace {

using client::DType;
using client::FetchSource;
using testing::Connect;
using testing::CreateNs;
using testing::MakeSpec;
using testing::RandomBytes;
using testing::StartTestDaemon;
using testing::TokenRange;

struct Case {
  const char* name;
  uint32_t layers, heads, head_dim, page_size;
  DType dtype;
  client::PageLayout layout;
  uint32_t pages;
};

std::vector<uint8_t> Slice(const std::vector<uint8_t>& v, size_t off,
                           size_t n) {
  return std::vector<uint8_t>(v.begin() + off, v.begin() + off + n);
}

// Reads the pages of `lease` back every way the SDK offers and compares
// them with `data`, the pages as inserted.
void ReadBack(Client& cl, const std::string& ns, const client::Lease& lease,
              const std::vector<uint8_t>& data, uint64_t pb) {
  const uint32_t n = static_cast<uint32_t>(lease.pages.size());
  // Whole lease into one span.
  std::vector<uint8_t> out(n * pb, 0xEE);
  absl::StatusOr<client::FetchResult> fr =
      cl.FetchInto(ns, FetchSource::FromLease(lease.id), absl::MakeSpan(out));
  INFO(fr.status().ToString());
  REQUIRE(fr.ok());
  CHECK(fr->num_pages == n);
  CHECK(fr->page_bytes == pb);
  CHECK(fr->handles == lease.pages);
  CHECK(out == data);

  // By handle, in reverse order, into per-page buffers.
  std::vector<client::PageHandle> reversed(lease.pages.rbegin(),
                                           lease.pages.rend());
  std::vector<std::vector<uint8_t>> bufs(n, std::vector<uint8_t>(pb + 16, 0));
  std::vector<uint8_t*> ptrs;
  for (auto& b : bufs) ptrs.push_back(b.data());
  fr = cl.FetchInto(ns, FetchSource::FromPages(reversed), ptrs, pb + 16);
  INFO(fr.status().ToString());
  REQUIRE(fr.ok());
  CHECK(fr->handles == reversed);
  for (uint32_t i = 0; i < n; ++i) {
    const size_t src = size_t{n - 1 - i} * pb;
    CHECK(std::equal(data.begin() + src, data.begin() + src + pb,
                     bufs[i].begin()));
    // Nothing written past the page.
    CHECK(std::all_of(bufs[i].begin() + pb, bufs[i].end(),
                      [](uint8_t b) { return b == 0; }));
  }

  // A sub-range of the lease as a vector of pages.
  if (n >= 2) {
    absl::StatusOr<std::vector<std::vector<uint8_t>>> pages =
        cl.Fetch(ns, FetchSource::FromLease(lease.id, 1, n - 1));
    REQUIRE(pages.ok());
    REQUIRE(pages->size() == n - 1);
    for (uint32_t i = 0; i + 1 < n; ++i) {
      CHECK((*pages)[i] == Slice(data, size_t{i + 1} * pb, pb));
    }
  }
}

// The per-page Insert overload, pages scattered in separate buffers, on a
// sequence that shares its first page with `tokens`: that page is
// deduplicated, the rest read back as given.
void ScatteredInsert(Client& cl, const std::string& ns, const Case& c,
                     const std::vector<uint8_t>& data,
                     const client::Lease& lease, uint64_t pb, int variant) {
  const uint32_t n = c.pages;
  std::vector<std::vector<uint8_t>> scattered;
  std::vector<absl::Span<const uint8_t>> views;
  for (uint32_t i = 0; i < n; ++i) {
    scattered.push_back(i == 0 ? Slice(data, 0, pb)
                               : RandomBytes(pb, 5000 + variant * 100 + i));
  }
  for (const auto& p : scattered) views.push_back(p);
  std::vector<int32_t> tokens2 = TokenRange(n * c.page_size, 7);
  for (size_t i = c.page_size; i < tokens2.size(); ++i) tokens2[i] += 1000000;
  absl::StatusOr<client::InsertResult> ins = cl.Insert(ns, tokens2, views);
  INFO(ins.status().ToString());
  REQUIRE(ins.ok());
  CHECK(ins->already_present_tokens == c.page_size);
  CHECK(ins->pages_stored == n - 1);
  absl::StatusOr<client::Lease> m2 = cl.Match(ns, tokens2);
  REQUIRE(m2.ok());
  REQUIRE(m2->pages.size() == n);
  CHECK(!m2->locked());
  CHECK(m2->pages[0] == lease.pages[0]);
  absl::StatusOr<std::vector<std::vector<uint8_t>>> pages2 =
      cl.Fetch(ns, FetchSource::FromPages(m2->pages));
  REQUIRE(pages2.ok());
  REQUIRE(*pages2 == scattered);
}

// Inserts `c.pages` pages with the given chunk sizes and reads them back.
void RoundTrip(const Daemon& daemon, const Case& c, uint32_t insert_chunk,
               uint32_t fetch_chunk, int variant) {
  ClientOptions options;
  options.insert_chunk_bytes = insert_chunk;
  options.fetch_chunk_bytes = fetch_chunk;
  std::unique_ptr<Client> cl = Connect(daemon, options);
  const std::string ns = absl::StrCat(c.name, "_", variant);
  client::NamespaceSpec spec =
      MakeSpec(ns, c.layers, c.heads, c.head_dim, c.page_size, c.dtype);
  spec.geometry.layout = c.layout;
  const uint64_t pb = CreateNs(*cl, spec);
  INFO("namespace " << ns << " page_bytes " << pb << " insert_chunk "
                    << insert_chunk << " fetch_chunk " << fetch_chunk);

  const uint32_t n = c.pages;
  const std::vector<uint8_t> data = RandomBytes(n * pb, 1000 + variant);
  const std::vector<int32_t> tokens = TokenRange(n * c.page_size, 7);
  absl::StatusOr<client::InsertResult> ins = cl->Insert(ns, tokens, data, pb);
  INFO(ins.status().ToString());
  REQUIRE(ins.ok());
  CHECK(ins->pages_stored == n);
  CHECK(ins->already_present_tokens == 0);

  // A prompt longer than what is cached (plus a partial page) matches the
  // cached whole pages only.
  std::vector<int32_t> prompt = tokens;
  for (uint32_t i = 0; i < c.page_size + 1; ++i) prompt.push_back(900000 + i);
  absl::StatusOr<client::Lease> lease =
      cl->Match(ns, prompt, /*lock=*/true, absl::Seconds(30));
  REQUIRE(lease.ok());
  REQUIRE(lease->matched_tokens == uint64_t{n} * c.page_size);
  REQUIRE(lease->pages.size() == n);
  REQUIRE(lease->locked());
  CHECK(lease->page_bytes == pb);
  CHECK(lease->expiry > absl::Now());

  ReadBack(*cl, ns, *lease, data, pb);
  REQUIRE(cl->Release(lease->id).ok());
  ScatteredInsert(*cl, ns, c, data, *lease, pb, variant);
  REQUIRE(cl->DeleteNamespace(ns).ok());
}

TEST_CASE("pages round-trip byte-exactly across geometries and chunk sizes",
          "[client][roundtrip]") {
  std::unique_ptr<Daemon> daemon = StartTestDaemon();
  using L = client::PageLayout;
  const std::vector<Case> cases = {
      // 2*2*4*2*64*2 = 4 KiB
      {"bf16_4k", 2, 2, 64, 4, DType::kBF16, L::kKvLayerTokenHeadDim, 6},
      // 2*3*7*5*96*4 = 80640 bytes: not a power of two
      {"fp32_odd", 3, 5, 96, 7, DType::kFP32, L::kKvLayerTokenHeadDim, 5},
      // 2*4*16*4*128*1 = 64 KiB
      {"fp8_64k", 4, 4, 128, 16, DType::kFP8E4M3, L::kKvLayerTokenHeadDim, 4},
      // 2*2*8*4*32*2 = 8 KiB, the other layout
      {"bf16_lkv", 2, 4, 32, 8, DType::kBF16, L::kLayerKvTokenHeadDim, 4},
      // 2*4*16*8*128*2 = 256 KiB
      {"fp16_256k", 4, 8, 128, 16, DType::kFP16, L::kKvLayerTokenHeadDim, 4},
      // 2*16*16*8*128*4 = 2 MiB
      {"fp32_2m", 16, 8, 128, 16, DType::kFP32, L::kKvLayerTokenHeadDim, 3},
  };
  for (const Case& c : cases) {
    client::Geometry g;
    g.num_layers = c.layers;
    g.num_kv_heads = c.heads;
    g.head_dim = c.head_dim;
    g.page_size = c.page_size;
    g.dtype = c.dtype;
    const uint32_t pb = static_cast<uint32_t>(g.PageBytes());
    DYNAMIC_SECTION(c.name) {
      // Chunks smaller than a page (and not dividing it), equal, larger.
      RoundTrip(*daemon, c, /*insert=*/std::max<uint32_t>(pb / 3 + 1, 1031),
                /*fetch=*/1024 + 7, 0);
      RoundTrip(*daemon, c, pb, pb, 1);
      RoundTrip(*daemon, c, 2 * pb + 7, 0, 2);
      RoundTrip(*daemon, c, 1 << 20, 3 * pb, 3);
    }
  }
}

}  // namespace
}  // namespace kvharbor
