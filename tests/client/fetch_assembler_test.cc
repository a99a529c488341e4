// FetchAssembler and the checksum helpers without a daemon: chunks fed by
// hand, corrupted ones included.
#include "client/fetch_assembler.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "kvharbor/checksum.h"
#include "tests/client/client_test_util.h"

namespace kvharbor {
namespace client {
namespace {

using testing::RandomBytes;

absl::string_view View(const std::vector<uint8_t>& v, size_t off, size_t n) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()) + off, n);
}

// The chunks a well-behaved daemon sends for `pages` (back to back).
std::vector<FetchChunk> Chunks(const std::vector<uint8_t>& pages,
                               uint64_t page_bytes, uint64_t chunk) {
  std::vector<FetchChunk> out;
  for (uint32_t p = 0; p * page_bytes < pages.size(); ++p) {
    for (uint64_t off = 0; off < page_bytes; off += chunk) {
      FetchChunk c;
      c.page_index = p;
      c.offset = off;
      c.data =
          View(pages, p * page_bytes + off, std::min(chunk, page_bytes - off));
      if (off == 0) {
        c.page_handle = 100 + p;
        c.page_bytes = page_bytes;
        c.page_checksum = PageChecksum(
            absl::MakeConstSpan(pages.data() + p * page_bytes, page_bytes));
      }
      out.push_back(c);
    }
  }
  return out;
}

FetchAssembler::Destination Into(std::vector<uint8_t>* dst) {
  return [dst](uint32_t i, uint64_t pb) -> absl::StatusOr<uint8_t*> {
    if ((i + 1) * pb > dst->size()) return absl::InvalidArgumentError("dst");
    return dst->data() + i * pb;
  };
}

TEST_CASE("checksum helpers", "[client][checksum]") {
  std::vector<uint8_t> page = RandomBytes(4096, 1);
  const uint64_t sum = PageChecksum(page);
  CHECK(VerifyPageChecksum(page, sum, 0, 7).ok());
  page[4095] ^= 1;
  CHECK(PageChecksum(page) != sum);
  absl::Status s = VerifyPageChecksum(page, sum, 3, 0x1234);
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message().find("page 3") != absl::string_view::npos);
  CHECK(s.message().find("0x1234") != absl::string_view::npos);
}

TEST_CASE("assembler puts well-formed chunks in place", "[client][checksum]") {
  const uint64_t pb = 1000;
  const std::vector<uint8_t> pages = RandomBytes(3 * pb, 2);
  for (uint64_t chunk : {uint64_t{1}, uint64_t{333}, pb, 5 * pb}) {
    std::vector<uint8_t> dst(3 * pb);
    FetchAssembler a(Into(&dst), 3, true);
    for (const FetchChunk& c : Chunks(pages, pb, chunk)) REQUIRE(a.Add(c).ok());
    absl::StatusOr<FetchResult> r = a.Finish();
    REQUIRE(r.ok());
    CHECK(r->num_pages == 3);
    CHECK(r->page_bytes == pb);
    CHECK(r->handles == std::vector<PageHandle>{100, 101, 102});
    CHECK(dst == pages);
  }
}

TEST_CASE("a corrupted page is DATA_LOSS", "[client][checksum]") {
  const uint64_t pb = 4096;
  const std::vector<uint8_t> pages = RandomBytes(2 * pb, 3);
  std::vector<uint8_t> corrupted = pages;
  corrupted[pb + 17] ^= 0x80;  // page 1, after the checksums were taken
  std::vector<FetchChunk> chunks = Chunks(pages, pb, 1000);
  for (FetchChunk& c : chunks) {
    const size_t off =
        c.data.data() - reinterpret_cast<const char*>(pages.data());
    c.data = View(corrupted, off, c.data.size());
  }
  std::vector<uint8_t> dst(2 * pb);
  FetchAssembler a(Into(&dst), 0, true);
  absl::Status s;
  for (const FetchChunk& c : chunks) {
    s = a.Add(c);
    if (!s.ok()) break;
  }
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message().find("page 1") != absl::string_view::npos);
  CHECK(a.Finish().status().code() == absl::StatusCode::kDataLoss);

  // With verification off the same bytes go through unchecked.
  FetchAssembler unchecked(Into(&dst), 0, false);
  for (const FetchChunk& c : chunks) REQUIRE(unchecked.Add(c).ok());
  REQUIRE(unchecked.Finish().ok());
  CHECK(dst == corrupted);
}

TEST_CASE("assembler rejects broken streams without writing out of bounds",
          "[client][checksum]") {
  const uint64_t pb = 512;
  const std::vector<uint8_t> pages = RandomBytes(2 * pb, 4);
  std::vector<FetchChunk> good = Chunks(pages, pb, 200);  // 3 per page
  auto run = [&](std::vector<FetchChunk> chunks, uint32_t expected) {
    std::vector<uint8_t> dst(2 * pb);
    FetchAssembler a(Into(&dst), expected, true);
    for (const FetchChunk& c : chunks) {
      absl::Status s = a.Add(c);
      if (!s.ok()) return s;
    }
    return a.Finish().status();
  };
  REQUIRE(run(good, 2).ok());

  SECTION("gap inside a page") {
    good.erase(good.begin() + 1);
    CHECK(run(good, 2).code() == absl::StatusCode::kInternal);
  }
  SECTION("chunk runs past the page") {
    good[2].data = View(pages, 400, 200);  // offset 400 + 200 > 512
    CHECK(run(good, 2).code() == absl::StatusCode::kInternal);
  }
  SECTION("truncated stream") {
    good.pop_back();
    CHECK(run(good, 2).code() == absl::StatusCode::kInternal);
  }
  SECTION("missing page") {
    good.resize(3);
    CHECK(run(good, 2).code() == absl::StatusCode::kInternal);
  }
  SECTION("page index outside the request") {
    for (size_t i = 3; i < 6; ++i) good[i].page_index = 5;
    CHECK(run(good, 2).code() == absl::StatusCode::kInternal);
    // Open-ended (lease to the end): pages must come in order.
    CHECK(run(good, 0).code() == absl::StatusCode::kInternal);
  }
  SECTION("page sent twice") {
    std::vector<FetchChunk> twice(good.begin(), good.begin() + 3);
    twice.insert(twice.end(), good.begin(), good.begin() + 3);
    CHECK(run(twice, 2).code() == absl::StatusCode::kInternal);
  }
  SECTION("pages of different sizes") {
    good[3].page_bytes = pb + 1;
    CHECK(run(good, 2).code() == absl::StatusCode::kInternal);
  }
  SECTION("absurd page size") {
    good[0].page_bytes = uint64_t{1} << 62;
    CHECK(run(good, 2).code() == absl::StatusCode::kInternal);
  }
  SECTION("destination refuses") {
    std::vector<uint8_t> dst(pb);  // room for one page
    FetchAssembler a(Into(&dst), 2, true);
    absl::Status s;
    for (const FetchChunk& c : good) {
      s = a.Add(c);
      if (!s.ok()) break;
    }
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace client
}  // namespace kvharbor
