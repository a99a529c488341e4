// CompressedReceiver (client/compressed_receiver.h): COMPRESSED streams of
// pages of mixed sizes, one page per message or packed (pages larger than
// the chunk limit chunked among packed small ones), and every malformed
// stream an error, never a crash.
#include "client/compressed_receiver.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "kvharbor/checksum.h"
#include "kvharbor/client.h"
#include "tests/client/client_test_util.h"

namespace kvharbor {
namespace client {
namespace {

struct Page {
  std::string bytes;
  uint64_t handle = 0;
};

std::vector<Page> MixedPages() {
  std::vector<Page> out;
  uint64_t seed = 1;
  for (size_t size : {100, 5000, 30, 30, 3000, 1, 2048, 700, 700}) {
    const std::vector<uint8_t> b = testing::RandomBytes(size, seed++);
    out.push_back({std::string(b.begin(), b.end()), 0x9000 + seed});
  }
  return out;
}

template <typename Message>
void SetMetadata(const Page& p, uint32_t index, Message* m) {
  m->set_page_index(index);
  m->set_page_handle(p.handle);
  m->set_page_bytes(p.bytes.size());
  m->set_page_checksum(PageChecksum(absl::MakeConstSpan(
      reinterpret_cast<const uint8_t*>(p.bytes.data()), p.bytes.size())));
  m->set_codec("kvtc");
  m->set_calibration_fingerprint(0xCA1);
  m->set_page_tier(v1::TIER_HOST_COMPRESSED);
}

// The daemon's stream (server/rpc/fetch_reactor.cc): chunks of at most `limit`
// bytes, and with `per_message` > 1 whole pages packed after a completed
// page while the message's data stays within `limit` (the metadata
// allowance is left out here: the receiver does not depend on it).
std::vector<v1::FetchResponse> Stream(const std::vector<Page>& pages,
                                      uint64_t limit, uint32_t per_message) {
  std::vector<v1::FetchResponse> out;
  size_t i = 0;
  uint64_t offset = 0;
  while (i < pages.size()) {
    v1::FetchResponse m;
    const std::string& b = pages[i].bytes;
    const uint64_t n = std::min<uint64_t>(limit, b.size() - offset);
    m.set_page_index(static_cast<uint32_t>(i));
    m.set_offset(offset);
    if (offset == 0) SetMetadata(pages[i], static_cast<uint32_t>(i), &m);
    m.set_data(b.substr(offset, n));
    offset += n;
    if (offset == b.size()) {
      ++i;
      offset = 0;
      uint64_t used = n;
      for (uint32_t k = 1; k < per_message && i < pages.size() &&
                           used + pages[i].bytes.size() <= limit;
           ++k, ++i) {
        v1::PackedPage* p = m.add_packed_pages();
        SetMetadata(pages[i], static_cast<uint32_t>(i), p);
        p->set_data(pages[i].bytes);
        used += pages[i].bytes.size();
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

// Feeds `stream` to a receiver; the pages it handed out, or its error.
absl::StatusOr<std::vector<CompressedPage>> Receive(
    std::vector<v1::FetchResponse> stream, uint32_t expected) {
  std::vector<CompressedPage> got;
  const CompressedPageSink sink = [&](uint32_t index, CompressedPage page) {
    REQUIRE(index == got.size());
    got.push_back(std::move(page));
    return absl::OkStatus();
  };
  CompressedReceiver r(expected, /*verify_checksums=*/true, &sink);
  for (v1::FetchResponse& m : stream) {
    absl::Status s = r.Add(m);
    if (!s.ok()) return s;
  }
  absl::StatusOr<uint32_t> n = r.Finish();
  if (!n.ok()) return n.status();
  REQUIRE(*n == got.size());
  return got;
}

TEST_CASE("CompressedReceiver takes mixed page sizes, packed or not",
          "[client][compressed]") {
  const std::vector<Page> pages = MixedPages();
  const uint32_t per_message = GENERATE(1u, 2u, 3u, 256u);
  const uint64_t limit =
      GENERATE(uint64_t{1024}, uint64_t{2048}, uint64_t{1} << 20);
  INFO("per_message " << per_message << ", limit " << limit);
  const std::vector<v1::FetchResponse> stream =
      Stream(pages, limit, per_message);
  // Packing saves messages (the small pages ride along with others).
  if (per_message > 1) {
    CHECK(stream.size() < Stream(pages, limit, 1).size());
  }
  for (uint32_t expected : {0u, static_cast<uint32_t>(pages.size())}) {
    absl::StatusOr<std::vector<CompressedPage>> got = Receive(stream, expected);
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    REQUIRE(got->size() == pages.size());
    for (size_t i = 0; i < pages.size(); ++i) {
      CHECK((*got)[i].buffer == pages[i].bytes);
      CHECK((*got)[i].handle == pages[i].handle);
      CHECK((*got)[i].codec == "kvtc");
      CHECK((*got)[i].calibration_fingerprint == 0xCA1);
      CHECK((*got)[i].tier == Tier::kHostCompressed);
    }
  }
}

TEST_CASE("CompressedReceiver refuses malformed packed streams",
          "[client][compressed]") {
  const std::vector<Page> pages = MixedPages();
  // Messages 0-1: page 0 whole + nothing (5000 does not fit); 2KiB chunks.
  std::vector<v1::FetchResponse> good = Stream(pages, 2048, 256);
  // The first message whose packed pages are not empty.
  size_t packed = 0;
  while (good[packed].packed_pages_size() == 0) ++packed;
  const auto expect = [&](std::vector<v1::FetchResponse> s,
                          absl::StatusCode code, absl::string_view what) {
    absl::StatusOr<std::vector<CompressedPage>> got =
        Receive(std::move(s), static_cast<uint32_t>(pages.size()));
    INFO(got.status().ToString());
    CHECK(got.status().code() == code);
    CHECK(absl::StrContains(got.status().message(), what));
  };
  SECTION("overlapping indices") {
    std::vector<v1::FetchResponse> s = good;
    v1::PackedPage* p = s[packed].mutable_packed_pages(0);
    p->set_page_index(p->page_index() - 1);
    expect(s, absl::StatusCode::kInternal, "out of order");
  }
  SECTION("a packed page skipping one") {
    std::vector<v1::FetchResponse> s = good;
    v1::PackedPage* p = s[packed].mutable_packed_pages(0);
    p->set_page_index(p->page_index() + 1);
    expect(s, absl::StatusCode::kInternal, "out of order");
  }
  SECTION("wrong sizes") {
    std::vector<v1::FetchResponse> s = good;
    s[packed].mutable_packed_pages(0)->set_page_bytes(
        s[packed].packed_pages(0).data().size() + 1);
    expect(s, absl::StatusCode::kInternal, "a packed page is whole");
  }
  SECTION("checksum mismatch") {
    std::vector<v1::FetchResponse> s = good;
    (*s[packed].mutable_packed_pages(0)->mutable_data())[0] ^= 0x40;
    expect(s, absl::StatusCode::kDataLoss, "checksum");
  }
  SECTION("a packed page inside an incomplete page") {
    // Page 1 (5000 bytes) arrives in chunks; pack page 2 into its first.
    std::vector<v1::FetchResponse> s = good;
    size_t first = 0;
    while (!(s[first].page_index() == 1 && s[first].offset() == 0)) ++first;
    v1::PackedPage* p = s[first].add_packed_pages();
    SetMetadata(pages[2], 2, p);
    p->set_data(pages[2].bytes);
    expect(s, absl::StatusCode::kInternal, "out of order");
  }
  SECTION("a packed page outside the request") {
    std::vector<v1::FetchResponse> s = good;
    v1::PackedPage* p = s.back().add_packed_pages();
    SetMetadata(pages[0], static_cast<uint32_t>(pages.size()), p);
    p->set_data(pages[0].bytes);
    expect(s, absl::StatusCode::kInternal, "outside the");
  }
  SECTION("a stream that ends early") {
    std::vector<v1::FetchResponse> s = good;
    s.pop_back();
    expect(s, absl::StatusCode::kInternal, "were asked for");
  }
}

TEST_CASE("SDK fetches are the same packed and one page per message",
          "[client][compressed]") {
  auto daemon = testing::StartTestDaemon();
  ClientOptions one_o;
  one_o.fetch_pages_per_message = 1;
  ClientOptions small_o;  // packed into 16 KiB messages, <= 2 pages each
  small_o.fetch_pages_per_message = 2;
  small_o.fetch_chunk_bytes = 16384;
  auto packed = testing::Connect(*daemon);  // the default: packed
  auto one = testing::Connect(*daemon, one_o);
  auto small = testing::Connect(*daemon, small_o);
  // 4 KiB pages: all 12 in one default (1 MiB) message.
  client::NamespaceSpec spec =
      testing::MakeSpec("pack", 2, 2, 64, 4, client::DType::kBF16, 16 * 4096);
  spec.host_compressed_bytes = 1 << 20;
  const uint64_t pb = testing::CreateNs(*packed, spec);
  const std::vector<int32_t> tokens = testing::TokenRange(12 * 4, 1);
  const std::vector<uint8_t> data = testing::FloatPages(12, pb, 3);
  REQUIRE(packed->Insert("pack", tokens, data, pb).ok());
  for (Tier tier : {Tier::kRaw, Tier::kHostCompressed}) {
    INFO("tier " << TierName(tier));
    if (tier != Tier::kRaw) {
      REQUIRE(packed->Demote("pack", tier).ok());
    }
    absl::StatusOr<client::Lease> l = packed->Match("pack", tokens, true);
    REQUIRE(l.ok());
    const FetchSource src = FetchSource::FromLease(l->id);
    std::vector<std::vector<CompressedPage>> comp;
    std::vector<std::vector<std::vector<uint8_t>>> raw;
    for (Client* c : {packed.get(), one.get(), small.get()}) {
      absl::StatusOr<std::vector<CompressedPage>> cp =
          c->FetchCompressed("pack", src);
      INFO(cp.status().ToString());
      REQUIRE(cp.ok());
      REQUIRE(cp->size() == 12);
      comp.push_back(*std::move(cp));
      absl::StatusOr<std::vector<std::vector<uint8_t>>> r =
          c->Fetch("pack", src);
      INFO(r.status().ToString());
      REQUIRE(r.ok());
      REQUIRE(r->size() == 12);
      raw.push_back(*std::move(r));
    }
    for (size_t k = 1; k < comp.size(); ++k) {
      for (size_t i = 0; i < 12; ++i) {
        CHECK(comp[k][i].buffer == comp[0][i].buffer);
        CHECK(comp[k][i].handle == comp[0][i].handle);
        CHECK(comp[k][i].tier == tier);
        CHECK(raw[k][i] == raw[0][i]);
      }
    }
    for (size_t i = 0; i < 12; ++i) {
      CHECK(raw[0][i] == std::vector<uint8_t>(data.begin() + i * pb,
                                              data.begin() + (i + 1) * pb));
    }
    REQUIRE(packed->Release(l->id).ok());
  }
  ClientOptions bad;
  bad.address = daemon->address();
  bad.fetch_pages_per_message = 4097;
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(bad);
  CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(c.status().message(), "fetch_pages_per_message"));
}

}  // namespace
}  // namespace client
}  // namespace kvharbor
