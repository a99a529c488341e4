// SDK tests of the engine API (docs/engines_api.md) against an in-process
// daemon: page-key namespaces, append inserts (skip_pages, prefix leases,
// the retry with every page), layer-range fetches and layer-major uploads
// (client::LayerUpload), and the bad input of each (errors naming the field,
// nothing half-stored, no slot left reserved).
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "tests/client/client_test_util.h"
#include "types/layer_range.h"

namespace kvharbor {
namespace testing {
namespace {

using client::InsertOptions;
using client::Sequence;

// Pages [from, to) of `all` (to 0: to the end).
std::vector<absl::Span<const uint8_t>> Views(const std::vector<uint8_t>& all,
                                             uint64_t page_bytes,
                                             size_t from = 0, size_t to = 0) {
  const size_t end = to == 0 ? all.size() : to * page_bytes;
  std::vector<absl::Span<const uint8_t>> v;
  for (size_t off = from * page_bytes; off < end; off += page_bytes) {
    v.push_back(absl::MakeConstSpan(all).subspan(off, page_bytes));
  }
  return v;
}

// The status's message starts with `field`.
void CheckNames(const absl::Status& s, absl::StatusCode code,
                absl::string_view field) {
  INFO(s.ToString());
  CHECK(s.code() == code);
  CHECK(absl::StartsWith(s.message(), field));
}

client::NamespaceStats StatsOf(Client& c, const std::string& ns) {
  auto st = c.Stats(ns);
  REQUIRE(st.ok());
  REQUIRE(st->namespaces.size() == 1);
  return st->namespaces[0];
}

// Waits for the daemon to finish aborting uploads of `ns` (a cancelled
// stream is torn down after the client returns).
void AwaitNoUploads(Client& c, const std::string& ns) {
  for (int i = 0; i < 200 && StatsOf(c, ns).uploads_in_flight != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(StatsOf(c, ns).uploads_in_flight == 0);
}

TEST_CASE("SDK: page-key namespaces") {
  auto d = StartTestDaemon();
  auto c = Connect(*d);
  client::NamespaceSpec spec =
      MakeSpec("keys", 2, 2, 8, 16, client::DType::kBF16, 64 << 10);
  spec.key_kind = client::KeyKind::kPageKeys;
  const uint64_t pb = CreateNs(*c, spec);
  auto info = c->DescribeNamespace("keys");
  REQUIRE(info.ok());
  CHECK(info->spec.key_kind == client::KeyKind::kPageKeys);
  // SGLang-style hex strings are longer than 32 bytes; 32-byte digests fit.
  const std::vector<std::string> owned = {std::string(32, 'a'), "b", "cc",
                                          std::string(16, '\0')};
  const std::vector<absl::string_view> keys(owned.begin(), owned.end());
  const std::vector<uint8_t> pages = RandomBytes(4 * pb, 1);
  auto ins = c->Insert("keys", Sequence::OfKeys(keys), Views(pages, pb), {});
  REQUIRE(ins.ok());
  CHECK(ins->pages_stored == 4);
  std::vector<absl::string_view> query = {keys[0], keys[1], "zz"};
  auto m = c->Match("keys", Sequence::OfKeys(query), /*lock=*/true);
  REQUIRE(m.ok());
  CHECK(m->pages.size() == 2);
  CHECK(m->matched_tokens == 2 * 16);
  std::vector<uint8_t> got(2 * pb);
  REQUIRE(c->FetchInto("keys", client::FetchSource::FromLease(m->id),
                       absl::MakeSpan(got))
              .ok());
  CHECK(std::equal(got.begin(), got.end(), pages.begin()));
  REQUIRE(c->Release(m->id).ok());

  // Bad input: the other key kind's field, wrong key lengths.
  const std::vector<int32_t> tokens = TokenRange(16, 1);
  CheckNames(c->Match("keys", tokens).status(),
             absl::StatusCode::kInvalidArgument, "token_ids");
  const std::vector<absl::string_view> empty_key = {"a", ""};
  CheckNames(c->Match("keys", Sequence::OfKeys(empty_key)).status(),
             absl::StatusCode::kInvalidArgument, "page_keys[1]");
  const std::string long_key(33, 'x');
  const std::vector<absl::string_view> too_long = {long_key};
  CheckNames(
      c->Insert("keys", Sequence::OfKeys(too_long), Views(pages, pb, 3), {})
          .status(),
      absl::StatusCode::kInvalidArgument, "header.page_keys[0]");
  CheckNames(c->Insert("keys", tokens, Views(pages, pb, 3)).status(),
             absl::StatusCode::kInvalidArgument, "header.token_ids");
  CreateNs(*c, MakeSpec("toks", 2, 2, 8, 16, client::DType::kBF16, 64 << 10));
  CheckNames(c->Match("toks", Sequence::OfKeys(keys)).status(),
             absl::StatusCode::kInvalidArgument, "page_keys");
  CHECK(StatsOf(*c, "keys").cached_pages == 4);
  CHECK(StatsOf(*c, "keys").free_pages ==
        StatsOf(*c, "keys").capacity_pages - 4);
}

TEST_CASE("SDK: an append sends only the new pages and retries when needed") {
  auto d = StartTestDaemon();
  auto c = Connect(*d);
  const uint64_t pb = CreateNs(
      *c, MakeSpec("chat", 2, 2, 8, 4, client::DType::kFP32, 64 << 10));
  const std::vector<int32_t> t1 = TokenRange(16, 1);  // 4 pages
  const std::vector<int32_t> t2 = TokenRange(24, 1);  // 6 pages
  const std::vector<uint8_t> pages = RandomBytes(6 * pb, 2);
  REQUIRE(c->Insert("chat", t1, Views(pages, pb, 0, 4)).ok());
  InsertOptions skip4;
  skip4.skip_pages = 4;
  const uint64_t in0 = StatsOf(*c, "chat").bytes_in;
  // Every page given: only pages 4 and 5 go over the wire.
  auto r = c->Insert("chat", Sequence::OfTokens(t2), Views(pages, pb), skip4);
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 2);
  CHECK(r->already_present_tokens == 16);
  CHECK(StatsOf(*c, "chat").bytes_in - in0 == 2 * pb);
  auto m = c->Match("chat", t2);
  REQUIRE(m.ok());
  CHECK(m->pages.size() == 6);

  // The prefix evicted meanwhile: with every page given the SDK retries
  // with all of them; with only the new ones it cannot.
  REQUIRE(c->EvictAll("chat").ok());
  REQUIRE(c->Insert("chat", TokenRange(8, 1), Views(pages, pb, 0, 2)).ok());
  const std::vector<absl::Span<const uint8_t>> only_new = Views(pages, pb, 4);
  auto refused = c->Insert("chat", Sequence::OfTokens(t2), only_new, skip4);
  CheckNames(refused.status(), absl::StatusCode::kFailedPrecondition,
             "header.skip_pages");
  CHECK(StatsOf(*c, "chat").cached_pages == 2);  // nothing half-stored
  auto retried =
      c->Insert("chat", Sequence::OfTokens(t2), Views(pages, pb), skip4);
  REQUIRE(retried.ok());
  CHECK(retried->pages_stored == 4);
  InsertOptions no_retry = skip4;
  no_retry.retry_full = false;
  REQUIRE(c->EvictAll("chat").ok());
  CheckNames(
      c->Insert("chat", Sequence::OfTokens(t2), Views(pages, pb), no_retry)
          .status(),
      absl::StatusCode::kFailedPrecondition, "header.skip_pages");

  // After a prefix lease: only the new pages given.
  REQUIRE(c->Insert("chat", t1, Views(pages, pb, 0, 4)).ok());
  auto lease = c->Match("chat", t1, /*lock=*/true);
  REQUIRE(lease.ok());
  InsertOptions after_lease;
  after_lease.prefix_lease_id = lease->id;
  auto r2 = c->Insert("chat", Sequence::OfTokens(t2), only_new, after_lease);
  REQUIRE(r2.ok());
  CHECK(r2->pages_stored == 2);
  REQUIRE(c->Release(lease->id).ok());
  after_lease.skip_pages = 4;  // with every page given, the count too
  REQUIRE(c->Insert("chat", Sequence::OfTokens(t2), Views(pages, pb),
                    after_lease)
              .ok());  // the lease is gone: retried with every page
  std::vector<uint8_t> all(6 * pb);
  auto f = c->Match("chat", t2, true);
  REQUIRE(f.ok());
  REQUIRE(c->FetchInto("chat", client::FetchSource::FromLease(f->id),
                       absl::MakeSpan(all))
              .ok());
  CHECK(all == pages);
  AwaitNoUploads(*c, "chat");
}

TEST_CASE("SDK: a layer range fetches exactly those layers") {
  const client::PageLayout layout =
      GENERATE(client::PageLayout::kKvLayerTokenHeadDim,
               client::PageLayout::kLayerKvTokenHeadDim);
  auto d = StartTestDaemon();
  auto c = Connect(*d);
  client::NamespaceSpec spec =
      MakeSpec("l", 4, 2, 8, 4, client::DType::kBF16, 64 << 10);
  spec.geometry.layout = layout;
  const uint64_t pb = CreateNs(*c, spec);
  const std::vector<int32_t> t = TokenRange(12, 7);
  const std::vector<uint8_t> pages = RandomBytes(3 * pb, 3);
  REQUIRE(c->Insert("l", t, Views(pages, pb)).ok());
  auto m = c->Match("l", t, true);
  REQUIRE(m.ok());
  const LayerRange r{1, 3};
  const PageRuns runs = LayerRuns(spec.geometry, r);
  std::vector<uint8_t> want;
  for (size_t p = 0; p < 3; ++p) {
    for (int i = 0; i < runs.count; ++i) {
      const auto* base = pages.data() + p * pb + runs.offset[i];
      want.insert(want.end(), base, base + runs.bytes[i]);
    }
  }
  std::vector<uint8_t> got(want.size());
  auto f = c->FetchInto(
      "l", client::FetchSource::FromLease(m->id).Layers(r.begin, r.end),
      absl::MakeSpan(got));
  REQUIRE(f.ok());
  CHECK(f->page_bytes == runs.total());
  CHECK(got == want);
  // By handle, and every layer again with (0, 4).
  std::vector<uint8_t> whole(3 * pb);
  REQUIRE(c->FetchInto("l",
                       client::FetchSource::FromPages(m->pages).Layers(0, 4),
                       absl::MakeSpan(whole))
              .ok());
  CHECK(whole == pages);
  // Outside the geometry, empty, or with a codec buffer format.
  const auto fetch = [&](uint32_t b, uint32_t e) {
    return c->FetchInto("l", client::FetchSource::FromLease(m->id).Layers(b, e),
                        absl::MakeSpan(got));
  };
  CheckNames(fetch(0, 5).status(), absl::StatusCode::kInvalidArgument,
             "layer_end");
  CheckNames(fetch(2, 2).status(), absl::StatusCode::kInvalidArgument,
             "layer_begin");
  CheckNames(fetch(3, 0).status(), absl::StatusCode::kInvalidArgument,
             "layer_end");
  auto compressed =
      c->Fetch("l", client::FetchSource::FromLease(m->id).Layers(0, 1),
               client::FetchFormat::kCompressed);
  CheckNames(compressed.status(), absl::StatusCode::kInvalidArgument,
             "layer_begin");
}

// The layer-major bytes of pages [from, n) of `pages`: for each layer, for
// each page, K then V of that layer.
std::vector<uint8_t> LayerBytes(const client::Geometry& g,
                                const std::vector<uint8_t>& pages, size_t from,
                                uint32_t layer) {
  const uint64_t pb = g.PageBytes();
  const uint64_t kvb = KvLayerBytes(g);
  std::vector<uint8_t> out;
  for (size_t p = from; p < pages.size() / pb; ++p) {
    for (int kv = 0; kv < 2; ++kv) {
      const uint8_t* base = pages.data() + p * pb + KvLayerOffset(g, layer, kv);
      out.insert(out.end(), base, base + kvb);
    }
  }
  return out;
}

TEST_CASE("SDK: a layer-major upload stores pages layer by layer") {
  auto d = StartTestDaemon();
  auto c = Connect(*d);
  client::NamespaceSpec spec = MakeSpec("up", 3, 2, 8, 4, client::DType::kFP32,
                                        16 * 3 * 2 * 2 * 8 * 4 * 4);
  const uint64_t pb = CreateNs(*c, spec);
  const std::vector<int32_t> t = TokenRange(20, 3);  // 5 pages
  const std::vector<uint8_t> pages = RandomBytes(5 * pb, 4);
  REQUIRE(c->Insert("up", TokenRange(8, 3), Views(pages, pb, 0, 2)).ok());
  InsertOptions skip2;
  skip2.skip_pages = 2;
  auto up = c->BeginInsert("up", Sequence::OfTokens(t), skip2);
  REQUIRE(up.ok());
  client::LayerUpload& u = **up;
  CHECK(u.num_layers() == 3);
  CHECK(u.sent_pages() == 3);
  CHECK(u.layer_bytes() == 3 * 2 * KvLayerBytes(spec.geometry));
  // Out of order, or the wrong size: refused, the upload stays open.
  CheckNames(u.SendLayer(1, LayerBytes(spec.geometry, pages, 2, 1)),
             absl::StatusCode::kInvalidArgument, "layer");
  std::vector<uint8_t> short_layer = LayerBytes(spec.geometry, pages, 2, 0);
  short_layer.resize(short_layer.size() - 2 * KvLayerBytes(spec.geometry));
  CheckNames(u.SendLayer(0, short_layer), absl::StatusCode::kInvalidArgument,
             "layer_pages");
  for (uint32_t l = 0; l < 2; ++l) {
    REQUIRE(u.SendLayer(l, LayerBytes(spec.geometry, pages, 2, l)).ok());
  }
  CheckNames(u.Commit().status(), absl::StatusCode::kInvalidArgument, "layer");
  // The last layer in pieces: each page's K and V where they lie.
  const std::vector<uint8_t> last = LayerBytes(spec.geometry, pages, 2, 2);
  std::vector<absl::Span<const uint8_t>> pieces;
  const uint64_t kvb = KvLayerBytes(spec.geometry);
  for (size_t off = 0; off < last.size(); off += kvb) {
    pieces.push_back(absl::MakeConstSpan(last).subspan(off, kvb));
  }
  REQUIRE(u.SendLayer(2, pieces).ok());
  auto done = u.Commit();
  REQUIRE(done.ok());
  CHECK(done->pages_stored == 3);
  CHECK(done->already_present_tokens == 8);
  auto m = c->Match("up", t, true);
  REQUIRE(m.ok());
  std::vector<uint8_t> got(5 * pb);
  REQUIRE(c->FetchInto("up", client::FetchSource::FromLease(m->id),
                       absl::MakeSpan(got))
              .ok());
  CHECK(got == pages);
  REQUIRE(c->Release(m->id).ok());
}

TEST_CASE("SDK: a layer-major upload refused or aborted stores nothing") {
  auto d = StartTestDaemon();
  auto c = Connect(*d);
  client::NamespaceSpec spec =
      MakeSpec("ab", 2, 2, 8, 4, client::DType::kFP32, 64 << 10);
  const uint64_t pb = CreateNs(*c, spec);
  const std::vector<int32_t> t = TokenRange(16, 9);
  const std::vector<uint8_t> pages = RandomBytes(4 * pb, 5);
  InsertOptions skip1;
  skip1.skip_pages = 1;  // nothing is cached
  CheckNames(c->BeginInsert("ab", Sequence::OfTokens(t), skip1).status(),
             absl::StatusCode::kFailedPrecondition, "header.skip_pages");
  const uint64_t free_before = StatsOf(*c, "ab").free_pages;
  {
    auto up = c->BeginInsert("ab", Sequence::OfTokens(t), {});
    REQUIRE(up.ok());
    // Slots are reserved as bytes arrive: the header holds the first page's.
    CHECK(StatsOf(*c, "ab").free_pages == free_before - 1);
    REQUIRE((*up)->SendLayer(0, LayerBytes(spec.geometry, pages, 0, 0)).ok());
    (*up)->Abort();
    CHECK(absl::IsCancelled((*up)->SendLayer(1, absl::Span<const uint8_t>())));
  }
  {
    // Destroyed mid-way without Abort: the same.
    auto up = c->BeginInsert("ab", Sequence::OfTokens(t), {});
    REQUIRE(up.ok());
  }
  AwaitNoUploads(*c, "ab");
  const client::NamespaceStats s = StatsOf(*c, "ab");
  CHECK(s.cached_pages == 0);
  CHECK(s.free_pages == free_before);
  auto m = c->Match("ab", t);
  REQUIRE(m.ok());
  CHECK(m->pages.empty());
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
