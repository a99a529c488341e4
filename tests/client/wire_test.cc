// The SDK's hand-rolled wire paths against protobuf: FetchResponse parsing
// from arbitrarily split pieces, and the InsertRequest chunks it encodes.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/fetch_assembler.h"
#include "client/fetch_wire.h"
#include "client/insert_wire.h"
#include "kvharbor/checksum.h"
#include "kvharbor/v1/kvharbor.pb.h"
#include "tests/client/client_test_util.h"

namespace kvharbor {
namespace client {
namespace {

using testing::RandomBytes;

// `bytes` cut into pieces of `piece` bytes (the last one shorter).
std::vector<absl::string_view> Split(const std::string& bytes, size_t piece) {
  std::vector<absl::string_view> out;
  for (size_t i = 0; i < bytes.size(); i += piece) {
    out.push_back(absl::string_view(bytes).substr(i, piece));
  }
  return out;
}

TEST_CASE("ParseFetchResponse reads what protobuf writes, however split",
          "[client][wire]") {
  const uint64_t pb = 3000;
  const std::vector<uint8_t> pages = RandomBytes(2 * pb, 5);
  // Two pages in chunks of 1100 bytes, as the daemon would send them.
  std::vector<std::string> wire;
  for (uint32_t p = 0; p < 2; ++p) {
    for (uint64_t off = 0; off < pb; off += 1100) {
      v1::FetchResponse m;
      m.set_page_index(p);
      m.set_offset(off);
      m.set_data(reinterpret_cast<const char*>(pages.data()) + p * pb + off,
                 std::min<uint64_t>(1100, pb - off));
      if (off == 0) {
        m.set_page_handle(0xABCD0000u + p);
        m.set_page_bytes(pb);
        m.set_page_checksum(
            PageChecksum(absl::MakeConstSpan(pages.data() + p * pb, pb)));
      }
      wire.push_back(m.SerializeAsString());
    }
  }
  for (size_t piece : {size_t{1}, size_t{7}, size_t{512}, size_t{1 << 20}}) {
    std::vector<uint8_t> dst(2 * pb);
    FetchAssembler a(
        [&](uint32_t i, uint64_t n) -> absl::StatusOr<uint8_t*> {
          return dst.data() + i * n;
        },
        2, true);
    for (const std::string& msg : wire) {
      REQUIRE(ParseFetchResponse(Split(msg, piece), &a).ok());
    }
    absl::StatusOr<FetchResult> r = a.Finish();
    REQUIRE(r.ok());
    CHECK(r->handles == std::vector<PageHandle>{0xABCD0000u, 0xABCD0001u});
    CHECK(dst == pages);
  }

  // Unknown fields are skipped; truncated or garbled messages are INTERNAL.
  v1::FetchResponse m;
  m.set_page_bytes(4);
  m.set_data("abcd");
  m.set_page_checksum(PageChecksum(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>("abcd"), 4)));
  std::string with_unknown =
      m.SerializeAsString() + std::string("\xF8\x07\x2A", 3);
  std::vector<uint8_t> dst(4);
  auto into = [&](uint32_t, uint64_t) -> absl::StatusOr<uint8_t*> {
    return dst.data();
  };
  {
    FetchAssembler a(into, 1, true);
    REQUIRE(ParseFetchResponse(Split(with_unknown, 3), &a).ok());
    REQUIRE(a.Finish().ok());
    CHECK(std::string(dst.begin(), dst.end()) == "abcd");
  }
  const std::string full = m.SerializeAsString();
  for (size_t cut = 1; cut < full.size(); ++cut) {
    FetchAssembler a(into, 1, true);
    absl::Status s =
        ParseFetchResponse({absl::string_view(full).substr(0, cut)}, &a);
    if (s.ok()) s = a.Finish().status();
    // INTERNAL, or DATA_LOSS when the cut drops just the checksum field.
    CHECK((s.code() == absl::StatusCode::kInternal ||
           s.code() == absl::StatusCode::kDataLoss));
  }
  FetchAssembler a(into, 1, true);
  CHECK(ParseFetchResponse({std::string("\x00\x01", 2)}, &a).code() ==
        absl::StatusCode::kInternal);
}

// Page `p` of `pages` (each `pb` bytes) as a whole-page message or packed
// entry's fields.
template <typename Message>
void SetWholePage(const std::vector<uint8_t>& pages, uint64_t pb, uint32_t p,
                  Message* m) {
  m->set_page_index(p);
  m->set_page_handle(0x7000u + p);
  m->set_page_bytes(pb);
  m->set_page_checksum(
      PageChecksum(absl::MakeConstSpan(pages.data() + p * pb, pb)));
  m->set_data(reinterpret_cast<const char*>(pages.data()) + p * pb, pb);
}

// Parses `wire` (each message cut into `piece`-byte pieces) into a fresh
// assembler of `n` pages of `pb` bytes; the fetch's status.
absl::Status Assemble(const std::vector<std::string>& wire, size_t piece,
                      uint32_t n, uint64_t pb, std::vector<uint8_t>* dst) {
  dst->assign(n * pb, 0);
  FetchAssembler a(
      [&](uint32_t i, uint64_t bytes) -> absl::StatusOr<uint8_t*> {
        return dst->data() + i * bytes;
      },
      n, true);
  for (const std::string& msg : wire) {
    absl::Status s = ParseFetchResponse(Split(msg, piece), &a);
    if (!s.ok()) return s;
  }
  return a.Finish().status();
}

TEST_CASE("ParseFetchResponse reads packed pages, however split",
          "[client][wire]") {
  const uint64_t pb = 700;
  const uint32_t n = 7;
  const std::vector<uint8_t> pages = RandomBytes(n * pb, 9);
  // Page 0 in two chunks, then 1+2+3 in one message (1 on top), then 4
  // alone, then 5+6.
  std::vector<std::string> wire;
  for (uint64_t off : {uint64_t{0}, uint64_t{500}}) {
    v1::FetchResponse m;
    m.set_offset(off);
    m.set_data(reinterpret_cast<const char*>(pages.data()) + off,
               off == 0 ? 500 : pb - 500);
    if (off == 0) {
      m.set_page_handle(0x7000u);
      m.set_page_bytes(pb);
      m.set_page_checksum(PageChecksum(absl::MakeConstSpan(pages.data(), pb)));
    } else {
      // The message that completes page 0 carries page 1.
      SetWholePage(pages, pb, 1, m.add_packed_pages());
    }
    wire.push_back(m.SerializeAsString());
  }
  for (std::vector<uint32_t> group :
       {std::vector<uint32_t>{2, 3}, std::vector<uint32_t>{4},
        std::vector<uint32_t>{5, 6}}) {
    v1::FetchResponse m;
    SetWholePage(pages, pb, group[0], &m);
    for (size_t k = 1; k < group.size(); ++k) {
      SetWholePage(pages, pb, group[k], m.add_packed_pages());
    }
    wire.push_back(m.SerializeAsString());
  }
  for (size_t piece : {size_t{1}, size_t{13}, size_t{1 << 20}}) {
    std::vector<uint8_t> dst;
    absl::Status s = Assemble(wire, piece, n, pb, &dst);
    INFO(s.ToString());
    REQUIRE(s.ok());
    CHECK(dst == pages);
  }

  std::vector<uint8_t> dst;
  auto broken = [&](auto&& change) {
    v1::FetchResponse m;
    SetWholePage(pages, pb, 0, &m);
    SetWholePage(pages, pb, 1, m.add_packed_pages());
    change(m);
    return Assemble({m.SerializeAsString()}, 1 << 20, 2, pb, &dst);
  };
  SECTION("a packed page repeating the message's page") {
    absl::Status s = broken([](v1::FetchResponse& m) {
      m.mutable_packed_pages(0)->set_page_index(0);
    });
    CHECK(s.code() == absl::StatusCode::kInternal);
    CHECK(absl::StrContains(s.message(), "packed_pages[0]"));
  }
  SECTION("a packed page shorter than its page_bytes") {
    absl::Status s = broken([](v1::FetchResponse& m) {
      m.mutable_packed_pages(0)->mutable_data()->pop_back();
    });
    CHECK(s.code() == absl::StatusCode::kInternal);
    CHECK(absl::StrContains(s.message(), "a packed page is whole"));
  }
  SECTION("a packed page after an incomplete chunk") {
    absl::Status s =
        broken([](v1::FetchResponse& m) { m.mutable_data()->resize(100); });
    CHECK(s.code() == absl::StatusCode::kInternal);
  }
  SECTION("a packed page that fails its checksum") {
    absl::Status s = broken([](v1::FetchResponse& m) {
      (*m.mutable_packed_pages(0)->mutable_data())[3] ^= 1;
    });
    CHECK(s.code() == absl::StatusCode::kDataLoss);
  }
  SECTION("a packed page outside the request") {
    absl::Status s = broken([&](v1::FetchResponse& m) {
      SetWholePage(pages, pb, 1, m.add_packed_pages());
      m.mutable_packed_pages(1)->set_page_index(2);
    });
    CHECK(s.code() == absl::StatusCode::kInternal);
  }
}

TEST_CASE("InsertOut encodes what protobuf reads", "[client][wire]") {
  const std::vector<uint8_t> p0 = RandomBytes(1000, 1);
  const std::vector<uint8_t> p1 = RandomBytes(1000, 2);
  const std::vector<uint8_t> p2 = RandomBytes(1000, 3);
  const std::vector<absl::Span<const uint8_t>> pages = {p0, p1, p2};
  std::string all(p0.begin(), p0.end());
  all.append(p1.begin(), p1.end());
  all.append(p2.begin(), p2.end());
  // Chunks inside a page, across two and three pages, and at offset 0.
  for (auto [offset, bytes] :
       std::vector<std::pair<uint64_t, uint64_t>>{{0, 1},
                                                  {0, 3000},
                                                  {10, 100},
                                                  {999, 2},
                                                  {500, 2500},
                                                  {2999, 1},
                                                  {300, 0}}) {
    // A layer-major upload's chunks sit at a base offset (a varint that
    // may take more bytes than the offset within the buffers).
    for (uint64_t base : {uint64_t{0}, uint64_t{1} << 40}) {
      InsertOut out;
      out.pages = pages;
      out.offset = offset;
      out.bytes = bytes;
      out.base = base;
      v1::InsertRequest req;
      REQUIRE(req.ParseFromString(SerializeInsertOut(out)));
      REQUIRE(req.has_chunk());
      CHECK(req.chunk().offset() == base + offset);
      CHECK(req.chunk().data() == all.substr(offset, bytes));
    }
  }
  v1::InsertRequest header;
  header.mutable_header()->set_namespace_("ns");
  header.mutable_header()->add_token_ids(7);
  InsertOut h;
  h.header = &header;
  v1::InsertRequest back;
  REQUIRE(back.ParseFromString(SerializeInsertOut(h)));
  CHECK(back.header().namespace_() == "ns");
  CHECK(back.header().token_ids_size() == 1);
}

}  // namespace
}  // namespace client
}  // namespace kvharbor
