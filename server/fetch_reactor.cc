#include "server/fetch_reactor.h"

#include <algorithm>
#include <utility>

#include "server/convert.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

FetchReactor::FetchReactor(CallTracker* calls, const CallRecord& call,
                           const grpc::Status& error)
    : calls_(calls), call_(call) {
  FinishWith(error);
}

FetchReactor::FetchReactor(CallTracker* calls, const CallRecord& call,
                           Namespace::PinnedPages pages, uint32_t chunk_bytes,
                           std::string codec, uint64_t calibration_fingerprint)
    : calls_(calls),
      call_(call),
      pages_(std::move(pages)),
      chunk_bytes_(chunk_bytes),
      codec_(std::move(codec)),
      fingerprint_(calibration_fingerprint) {
  WriteNext();
}

void FetchReactor::WriteNext() {
  if (cancelled_.load(std::memory_order_relaxed)) {
    FinishWith(grpc::Status(grpc::StatusCode::CANCELLED,
                            "Fetch: the call was cancelled"));
    return;
  }
  if (page_ >= pages_.size()) {
    FinishWith(grpc::Status::OK);
    return;
  }
  // Raw pages all have page_bytes(); compressed ones their buffer's size.
  const absl::string_view page = pages_.bytes(page_);
  const uint64_t page_bytes = page.size();
  const uint64_t n = std::min(chunk_bytes_, page_bytes - offset_);
  response_.Clear();  // keeps the data buffer's capacity for the next chunk
  response_.set_page_index(static_cast<uint32_t>(page_));
  response_.set_offset(offset_);
  if (offset_ == 0) {
    response_.set_page_handle(pages_.handle(page_));
    response_.set_page_bytes(page_bytes);
    response_.set_page_checksum(pages_.checksum(page_));
    response_.set_page_tier(TierToProto(pages_.tier(page_)));
    if (pages_.format() == FetchFormat::kCompressed) {
      response_.set_codec(codec_);
      response_.set_calibration_fingerprint(fingerprint_);
    }
  }
  // An unavoidable copy: protobuf 3.21 bytes fields own their storage (no
  // aliasing of external memory), so the pinned page is copied into the
  // message, and gRPC serializes it once more into its send buffer.
  response_.set_data(page.data() + offset_, n);
  bytes_in_write_ = n;
  offset_ += n;
  if (offset_ == page_bytes) {
    ++page_;
    offset_ = 0;
  }
  StartWrite(&response_);
}

void FetchReactor::OnWriteDone(bool ok) {
  if (!ok) {
    // The stream broke (client gone, cancelled, or server shutting down);
    // the status is not delivered, but Finish is what lets OnDone run.
    FinishWith(grpc::Status(grpc::StatusCode::CANCELLED,
                            "Fetch: the stream broke while writing"));
    return;
  }
  pages_.NoteBytesOut(bytes_in_write_);
  WriteNext();
}

void FetchReactor::FinishWith(const grpc::Status& status) {
  call_.code = status.error_code();
  Finish(status);
}

void FetchReactor::OnCancel() {
  cancelled_.store(true, std::memory_order_relaxed);
}

void FetchReactor::OnDone() {
  pages_ = Namespace::PinnedPages();  // unpins before the call counts as done
  calls_->End(call_);
  delete this;
}

}  // namespace kvharbor
