// Fetch with FetchRequest.max_pages_per_message (server/rpc/fetch_reactor.h):
// whole pages packed into one message up to the chunk limit and the count,
// pages larger than the limit still chunked, COMPRESSED pages with their
// codec, and a request that does not ask getting exactly one page per
// message, as before.
#include <string>
#include <vector>

#include "server/rpc/service.h"
#include "tests/server/server_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

using C = grpc::StatusCode;

struct StreamedPage {
  uint32_t index = 0;
  uint64_t handle = 0;
  uint64_t checksum = 0;
  std::string codec;
  std::string data;
};

v1::FetchRequest PackedFetch(uint64_t lease, uint32_t max_chunk,
                             uint32_t pages_per_message) {
  v1::FetchRequest req;
  req.set_namespace_(kNs);
  req.set_lease_id(lease);
  req.set_max_chunk_bytes(max_chunk);
  req.set_max_pages_per_message(pages_per_message);
  return req;
}

// The pages of a stream, checking its framing: pages in order, chunks of a
// page contiguous, packed pages whole, only after a complete page and
// following it, each message's data within `max_chunk` and at most
// `max_pages` pages.
std::vector<StreamedPage> Unpack(const FetchResult& f, uint64_t max_chunk,
                                 uint32_t max_pages) {
  std::vector<StreamedPage> pages;
  uint64_t page_bytes = 0;  // of the page being received
  for (const v1::FetchResponse& m : f.chunks) {
    const bool first = m.offset() == 0;
    if (first) {
      REQUIRE(m.page_index() == pages.size());
      pages.emplace_back();
      pages.back().index = m.page_index();
      pages.back().handle = m.page_handle();
      pages.back().checksum = m.page_checksum();
      pages.back().codec = m.codec();
      page_bytes = m.page_bytes();
    } else {
      REQUIRE(!pages.empty());
      REQUIRE(m.page_index() == pages.back().index);
      REQUIRE(m.offset() == pages.back().data.size());
    }
    pages.back().data += m.data();
    REQUIRE(pages.back().data.size() <= page_bytes);
    uint64_t data = m.data().size();
    if (m.packed_pages_size() > 0) {
      // Only after the message's page is complete.
      REQUIRE(pages.back().data.size() == page_bytes);
    }
    for (const v1::PackedPage& p : m.packed_pages()) {
      REQUIRE(p.page_index() == pages.size());
      REQUIRE(p.page_bytes() == p.data().size());
      pages.push_back({p.page_index(), p.page_handle(), p.page_checksum(),
                       p.codec(), p.data()});
      data += p.data().size();
    }
    CHECK(data <= max_chunk);
    CHECK(1 + static_cast<uint32_t>(m.packed_pages_size()) <= max_pages);
  }
  if (!pages.empty()) REQUIRE(pages.back().data.size() == page_bytes);
  for (const StreamedPage& p : pages) {
    CHECK(p.checksum == XXH3_64bits(p.data.data(), p.data.size()));
  }
  return pages;
}

struct Stored {
  std::string bytes;
  v1::MatchResponse match;
};

Stored StorePages(TestServer& s, size_t pages) {
  const std::vector<int32_t> tokens = Tokens(pages * kPageSize, 300);
  Stored out{RandomBytes(pages * kPageBytes, 41), {}};
  REQUIRE(InsertPages(s.stub.get(), tokens, out.bytes, 1 << 20).ok());
  out.match = MatchOk(s.stub.get(), tokens, /*lock=*/true);
  REQUIRE(out.match.lease_id() != 0);
  return out;
}

TEST_CASE("Fetch packs whole pages into a message up to the limits",
          "[server][fetch]") {
  TestServer s;
  const size_t n = 8;
  const Stored st = StorePages(s, n);
  struct Case {
    uint32_t chunk, pages_per_message;
    size_t messages;
  };
  // A page costs kPageBytes of data plus at most 72 bytes of metadata once
  // packed: 20000 bytes hold 4 pages, 6000 bytes one, 3000 bytes not even
  // one (pages are chunked as without packing: 2 chunks each).
  const Case c =
      GENERATE(Case{20000, 256, 2}, Case{20000, 3, 3}, Case{20000, 2, 4},
               Case{6000, 256, 8}, Case{3000, 256, 16}, Case{0, 4096, 1});
  INFO("chunk " << c.chunk << ", pages " << c.pages_per_message);
  const uint64_t out_before = s.ns()->Counters().bytes_out;
  FetchResult f =
      FetchAll(s.stub.get(),
               PackedFetch(st.match.lease_id(), c.chunk, c.pages_per_message));
  INFO(f.status.error_message());
  REQUIRE(f.status.ok());
  CHECK(f.chunks.size() == c.messages);
  const std::vector<StreamedPage> pages =
      Unpack(f, c.chunk == 0 ? (1u << 20) : c.chunk, c.pages_per_message);
  REQUIRE(pages.size() == n);
  std::string all;
  for (size_t i = 0; i < n; ++i) {
    CHECK(pages[i].handle == st.match.page_handles(static_cast<int>(i)));
    CHECK(pages[i].checksum == PageChecksum(st.bytes, i));
    CHECK(pages[i].codec.empty());  // RAW: no codec
    all += pages[i].data;
  }
  CHECK(all == st.bytes);
  CHECK(s.ns()->Counters().bytes_out - out_before == st.bytes.size());
}

TEST_CASE("Fetch without max_pages_per_message sends one page per message",
          "[server][fetch]") {
  TestServer s;
  const Stored st = StorePages(s, 5);
  // 0 (an old client) and 1 ask for the same stream.
  const uint32_t asked = GENERATE(0u, 1u);
  FetchResult f =
      FetchAll(s.stub.get(), PackedFetch(st.match.lease_id(), 20000, asked));
  REQUIRE(f.status.ok());
  REQUIRE(f.chunks.size() == 5);
  for (const v1::FetchResponse& m : f.chunks) {
    CHECK(m.packed_pages_size() == 0);
  }
  CHECK(Reassemble(f, 20000) == st.bytes);
}

TEST_CASE("COMPRESSED pages pack with their codec and checksum",
          "[server][fetch]") {
  TestServer s;
  const Stored st = StorePages(s, 6);
  v1::FetchRequest req = PackedFetch(st.match.lease_id(), 30000, 64);
  req.set_format(v1::FETCH_FORMAT_COMPRESSED);
  FetchResult f = FetchAll(s.stub.get(), req);
  REQUIRE(f.status.ok());
  CHECK(f.chunks.size() < 6);
  const std::vector<StreamedPage> pages = Unpack(f, 30000, 64);
  REQUIRE(pages.size() == 6);
  for (const StreamedPage& p : pages) {
    CHECK(p.codec == "identity");
    CHECK(p.data.size() > kPageBytes);  // the envelope around the page
  }
  // The same buffers as one page per message.
  req.set_max_pages_per_message(0);
  FetchResult one = FetchAll(s.stub.get(), req);
  REQUIRE(one.status.ok());
  CHECK(one.chunks.size() == 6);
  const std::vector<StreamedPage> single = Unpack(one, 30000, 1);
  REQUIRE(single.size() == 6);
  for (size_t i = 0; i < 6; ++i) CHECK(single[i].data == pages[i].data);
}

TEST_CASE("max_pages_per_message above the maximum is INVALID_ARGUMENT",
          "[server][fetch]") {
  TestServer s;
  const Stored st = StorePages(s, 2);
  std::shared_ptr<Namespace> ns = s.ns();
  FetchResult f = FetchAll(s.stub.get(), PackedFetch(st.match.lease_id(), 0,
                                                     kMaxPagesPerMessage + 1));
  CHECK(f.chunks.empty());
  CheckError(f.status, C::INVALID_ARGUMENT, "max_pages_per_message");
  // Still serving, and the lease still fetches, packed.
  FetchResult ok = FetchAll(
      s.stub.get(), PackedFetch(st.match.lease_id(), 0, kMaxPagesPerMessage));
  REQUIRE(ok.status.ok());
  CHECK(ok.chunks.size() == 1);
  CHECK(Unpack(ok, 1 << 20, kMaxPagesPerMessage).size() == 2);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
