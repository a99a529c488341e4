#include "client/fetch_assembler.h"

#include <xxh3.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvharbor/checksum.h"

namespace kvharbor {
namespace client {

// Hashing each chunk right after copying it keeps the bytes in cache, so the
// checksum costs a fraction of a second pass over the finished page.
struct FetchAssembler::HashState {
  HashState() : state(XXH3_createState()) {}
  ~HashState() { XXH3_freeState(state); }
  XXH3_state_t* state;
};

namespace {

// The daemon's limit on a page (types/geometry.h kMaxPageBytes); a larger
// page_bytes can only be a broken stream.
constexpr uint64_t kMaxPageBytes = uint64_t{256} << 20;

// A stream that breaks the protocol is a daemon bug, hence INTERNAL.
template <typename... Args>
absl::Status Protocol(const absl::FormatSpec<Args...>& format,
                      const Args&... args) {
  return absl::InternalError(
      absl::StrCat("fetch stream: ", absl::StrFormat(format, args...)));
}

}  // namespace

FetchAssembler::FetchAssembler(Destination destination, uint32_t expected_pages,
                               bool verify_checksums, PageDone done)
    : destination_(std::move(destination)),
      done_callback_(std::move(done)),
      expected_pages_(expected_pages),
      verify_(verify_checksums),
      hash_(std::make_unique<HashState>()) {
  if (hash_->state == nullptr) {
    error_ = absl::ResourceExhaustedError("fetch: cannot allocate XXH3 state");
  }
}

FetchAssembler::~FetchAssembler() = default;

absl::Status FetchAssembler::Fail(absl::Status s) {
  error_ = std::move(s);
  return error_;
}

absl::Status FetchAssembler::StartPage(const FetchChunk& c) {
  if (in_page_) {
    return Fail(
        Protocol("page %u began while page %u was incomplete (%u of "
                 "%u bytes)",
                 c.page_index, cur_index_, cur_received_, page_bytes_));
  }
  if (c.page_bytes == 0 || c.page_bytes > kMaxPageBytes) {
    return Fail(Protocol("page %u: first chunk has page_bytes %u", c.page_index,
                         c.page_bytes));
  }
  if (page_bytes_ == 0) {
    page_bytes_ = c.page_bytes;
  } else if (c.page_bytes != page_bytes_) {
    return Fail(Protocol("page %u: page_bytes %u differs from earlier pages",
                         c.page_index, c.page_bytes));
  }
  if (expected_pages_ != 0 && c.page_index >= expected_pages_) {
    return Fail(Protocol("page_index %u: the request asked for %u pages",
                         c.page_index, expected_pages_));
  }
  // With no count to check against, only in-order pages bound the memory
  // the destination has to provide.
  if (expected_pages_ == 0 && c.page_index != done_.size()) {
    return Fail(
        Protocol("page_index %u arrived after %u pages of an "
                 "open-ended fetch",
                 c.page_index, done_.size()));
  }
  if (c.page_index < done_.size() && done_[c.page_index] != 0) {
    return Fail(
        Protocol("page %u sent twice (offset %u)", c.page_index, c.offset));
  }
  absl::StatusOr<uint8_t*> dst = destination_(c.page_index, c.page_bytes);
  if (!dst.ok()) return Fail(dst.status());
  if (c.page_index >= done_.size()) {
    done_.resize(size_t{c.page_index} + 1, 0);
    handles_.resize(size_t{c.page_index} + 1, 0);
  }
  handles_[c.page_index] = c.page_handle;
  in_page_ = true;
  cur_index_ = c.page_index;
  cur_dst_ = *dst;
  cur_received_ = 0;
  cur_checksum_ = c.page_checksum;
  if (verify_) XXH3_64bits_reset(hash_->state);
  return absl::OkStatus();
}

absl::Status FetchAssembler::Add(const FetchChunk& c) {
  if (!error_.ok()) return error_;
  const bool continues =
      in_page_ && c.page_index == cur_index_ && c.offset == cur_received_;
  if (!continues) {
    if (c.offset != 0) {
      return Fail(
          Protocol("page %u: chunk at offset %u does not continue the "
                   "page being received",
                   c.page_index, c.offset));
    }
    absl::Status s = StartPage(c);
    if (!s.ok()) return s;
  }
  if (c.data.size() > page_bytes_ - cur_received_) {
    return Fail(Protocol("page %u: chunk runs past the page end (%u bytes)",
                         c.page_index, page_bytes_));
  }
  if (!c.data.empty()) {
    std::memcpy(cur_dst_ + cur_received_, c.data.data(), c.data.size());
    if (verify_) XXH3_64bits_update(hash_->state, c.data.data(), c.data.size());
    cur_received_ += c.data.size();
  }
  if (cur_received_ == page_bytes_) {
    if (verify_ && XXH3_64bits_digest(hash_->state) != cur_checksum_) {
      return Fail(VerifyPageChecksum(absl::MakeConstSpan(cur_dst_, page_bytes_),
                                     cur_checksum_, cur_index_,
                                     handles_[cur_index_]));
    }
    done_[cur_index_] = 1;
    ++completed_;
    in_page_ = false;
    if (done_callback_) {
      absl::Status s = done_callback_(cur_index_);
      if (!s.ok()) return Fail(std::move(s));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<FetchResult> FetchAssembler::Finish() {
  if (!error_.ok()) return error_;
  if (in_page_) {
    return Fail(Protocol("stream ended inside page %u after %u bytes",
                         cur_index_, cur_received_));
  }
  const uint64_t n = done_.size();
  if (completed_ != n) {
    for (uint32_t i = 0; i < n; ++i) {
      if (done_[i] == 0) {
        return Fail(
            Protocol("page %u missing (stream held pages up to %u)", i, n - 1));
      }
    }
  }
  if (expected_pages_ != 0 && n != expected_pages_) {
    return Fail(
        Protocol("got %u pages, the request asked for %u", n, expected_pages_));
  }
  FetchResult r;
  r.num_pages = static_cast<uint32_t>(n);
  r.page_bytes = page_bytes_;
  r.handles = std::move(handles_);
  return r;
}

}  // namespace client
}  // namespace kvharbor
