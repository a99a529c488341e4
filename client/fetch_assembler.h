// FetchAssembler: puts the chunks of one Fetch stream into caller memory and
// verifies each page's XXH3-64 checksum as it completes.
//
// Internal to the SDK (not installed); separate from the gRPC code so that
// tests can feed it chunks directly, corrupted ones included. The daemon
// sends each page's chunks in order, one page at a time, the first chunk
// (offset 0) carrying the page's handle, size and checksum. Anything else
// (gaps, overlaps, pages of different sizes, a page index outside the
// request, more bytes than the page holds) is an INTERNAL error and no byte
// is written outside the memory the Destination callback handed out.
//
// Not thread-safe: one assembler per stream. The destination memory belongs
// to the caller; the assembler only writes into it.
#ifndef KVHARBOR_CLIENT_FETCH_ASSEMBLER_H_
#define KVHARBOR_CLIENT_FETCH_ASSEMBLER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvharbor/types.h"

namespace kvharbor {
namespace client {

// One FetchResponse, or a piece of one: pieces of a chunk arrive as chunks
// with consecutive offsets.
struct FetchChunk {
  uint32_t page_index = 0;
  uint64_t offset = 0;
  absl::string_view data;
  // Meaningful on the first chunk of a page (offset 0) only.
  uint64_t page_handle = 0;
  uint64_t page_bytes = 0;
  uint64_t page_checksum = 0;
};

class FetchAssembler {
 public:
  // Where page `index` of `page_bytes` bytes goes: memory for at least
  // page_bytes bytes, or an error (e.g. the caller's buffer is too small),
  // which ends the fetch with that error.
  using Destination = PageDestination;

  // `expected_pages`: how many pages the request implies; 0 when unknown (a
  // lease fetched to its end). `done` (may be empty) is called with a
  // page's index once it is complete and verified; its error ends the
  // fetch.
  FetchAssembler(Destination destination, uint32_t expected_pages,
                 bool verify_checksums, PageDone done = nullptr);
  ~FetchAssembler();
  FetchAssembler(const FetchAssembler&) = delete;
  FetchAssembler& operator=(const FetchAssembler&) = delete;

  // After an error the assembler is dead: every later call returns it.
  absl::Status Add(const FetchChunk& chunk);
  // Once the stream ended OK: every page 0..n-1 arrived whole (and n is the
  // expected count when that is known).
  absl::StatusOr<FetchResult> Finish();

 private:
  struct HashState;
  absl::Status Fail(absl::Status s);
  absl::Status StartPage(const FetchChunk& chunk);

  Destination destination_;
  PageDone done_callback_;
  const uint32_t expected_pages_;
  const bool verify_;
  std::unique_ptr<HashState> hash_;
  absl::Status error_;
  uint64_t page_bytes_ = 0;    // 0 until the first page starts
  std::vector<uint8_t> done_;  // per page index: 1 once complete
  std::vector<PageHandle> handles_;
  bool in_page_ = false;  // a page started and is not complete
  uint32_t cur_index_ = 0;
  uint8_t* cur_dst_ = nullptr;
  uint64_t cur_received_ = 0;
  uint64_t cur_checksum_ = 0;
  uint32_t completed_ = 0;
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_FETCH_ASSEMBLER_H_
