#include "client/compressed_receiver.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvharbor/checksum.h"

namespace kvharbor {
namespace client {

namespace {

// Largest size announced for one compressed page that is taken at its word
// when reserving memory (the buffer still grows to what really arrives).
constexpr uint64_t kMaxReserve = uint64_t{64} << 20;

absl::Status BadStream(absl::string_view what) {
  return absl::InternalError(absl::StrCat("fetch stream: ", what));
}

}  // namespace

CompressedReceiver::CompressedReceiver(uint32_t expected, bool verify_checksums,
                                       const CompressedPageSink* sink)
    : expected_(expected), verify_(verify_checksums), sink_(sink) {}

absl::Status CompressedReceiver::Complete() {
  open_ = false;
  if (verify_) {
    absl::Status ok = VerifyPageChecksum(
        absl::MakeConstSpan(
            reinterpret_cast<const uint8_t*>(page_.buffer.data()),
            page_.buffer.size()),
        checksum_, next_, page_.handle);
    if (!ok.ok()) return ok;
  }
  const uint32_t index = next_++;
  return (*sink_)(index, std::move(page_));
}

absl::Status CompressedReceiver::AddChunk(v1::FetchResponse& r) {
  const uint32_t index = r.page_index();
  if (expected_ != 0 && index >= expected_) {
    return BadStream(absl::StrFormat("page_index %u outside the %u pages asked",
                                     index, expected_));
  }
  if (r.offset() == 0 && !(open_ && index == next_)) {
    if (open_ || index != next_) {
      return BadStream(absl::StrFormat("page %u out of order", index));
    }
    open_ = true;
    page_ = CompressedPage();
    page_.handle = r.page_handle();
    page_.tier = static_cast<Tier>(r.page_tier());
    page_.codec = std::move(*r.mutable_codec());
    page_.calibration_fingerprint = r.calibration_fingerprint();
    size_ = r.page_bytes();
    checksum_ = r.page_checksum();
    if (r.data().size() == size_) {
      // The whole page in one message: take its buffer, no copy.
      page_.buffer = std::move(*r.mutable_data());
      return Complete();
    }
    page_.buffer.reserve(std::min(size_, kMaxReserve));
  } else if (!open_ || index != next_ || r.offset() != page_.buffer.size()) {
    return BadStream(absl::StrFormat("chunk at %u of page %u out of order",
                                     r.offset(), index));
  }
  if (r.data().size() > size_ - page_.buffer.size()) {
    return BadStream(
        absl::StrFormat("page %u has more than its %u bytes", index, size_));
  }
  page_.buffer.append(r.data());
  return page_.buffer.size() == size_ ? Complete() : absl::OkStatus();
}

absl::Status CompressedReceiver::AddPacked(v1::PackedPage& p, int i) {
  const uint32_t index = p.page_index();
  if (open_ || index != next_) {
    return BadStream(
        absl::StrFormat("packed_pages[%d]: page %u out of order (%s page %u)",
                        i, index, open_ ? "inside" : "expected", next_));
  }
  if (expected_ != 0 && index >= expected_) {
    return BadStream(absl::StrFormat(
        "packed_pages[%d]: page_index %u outside the %u pages asked", i, index,
        expected_));
  }
  if (p.data().size() != p.page_bytes()) {
    return BadStream(absl::StrFormat(
        "packed_pages[%d]: page %u has %u data bytes, page_bytes says %u (a "
        "packed page is whole)",
        i, index, p.data().size(), p.page_bytes()));
  }
  page_ = CompressedPage();
  page_.handle = p.page_handle();
  page_.tier = static_cast<Tier>(p.page_tier());
  page_.codec = std::move(*p.mutable_codec());
  page_.calibration_fingerprint = p.calibration_fingerprint();
  page_.buffer = std::move(*p.mutable_data());
  size_ = p.page_bytes();
  checksum_ = p.page_checksum();
  return Complete();
}

absl::Status CompressedReceiver::Add(v1::FetchResponse& r) {
  if (!error_.ok()) return error_;
  absl::Status s = AddChunk(r);
  for (int i = 0; s.ok() && i < r.packed_pages_size(); ++i) {
    s = AddPacked(*r.mutable_packed_pages(i), i);
  }
  if (!s.ok()) error_ = s;
  return s;
}

absl::StatusOr<uint32_t> CompressedReceiver::Finish() {
  if (!error_.ok()) return error_;
  if (open_) {
    return BadStream(absl::StrFormat("page %u ended after %u of %u bytes",
                                     next_, page_.buffer.size(), size_));
  }
  if (expected_ != 0 && next_ != expected_) {
    return BadStream(absl::StrFormat("%u pages arrived, %u were asked for",
                                     next_, expected_));
  }
  return next_;
}

}  // namespace client
}  // namespace kvharbor
