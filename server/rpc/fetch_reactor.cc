#include "server/rpc/fetch_reactor.h"

#include <xxh3.h>

#include <algorithm>
#include <utility>

#include "server/rpc/convert.h"
#include "server/rpc/status_map.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

uint64_t SentChecksum(const Namespace::PinnedPages& pages, size_t page,
                      const PageRuns& runs) {
  if (runs.count == 0) return pages.checksum(page);
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  const absl::string_view bytes = pages.bytes(page);
  for (int r = 0; r < runs.count; ++r) {
    XXH3_64bits_update(h, bytes.data() + runs.offset[r], runs.bytes[r]);
  }
  const uint64_t sum = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return sum;
}

FetchReactor::FetchReactor(grpc::CallbackServerContext* ctx, CallTracker* calls,
                           const CallRecord& call, const grpc::Status& error)
    : ctx_(ctx), calls_(calls), call_(call) {
  FinishWith(error);
}

FetchReactor::FetchReactor(grpc::CallbackServerContext* ctx, CallTracker* calls,
                           const CallRecord& call, Namespace::PinnedPages pages,
                           uint32_t chunk_bytes, IdleWatchdog* watchdog,
                           IdleWatchdog::Entry* idle, PageRuns runs,
                           uint32_t pages_per_message,
                           std::optional<TransformedKv> transformed)
    : ctx_(ctx),
      calls_(calls),
      watchdog_(watchdog),
      idle_(idle),
      call_(call),
      pages_(std::move(pages)),
      chunk_bytes_(chunk_bytes),
      transformed_(transformed.has_value()),
      runs_(runs),
      pages_per_message_(std::max<uint32_t>(1, pages_per_message)),
      transformed_kv_(transformed ? *std::move(transformed) : TransformedKv()) {
  WriteNext();
}

uint64_t FetchReactor::PageBytes(size_t page) const {
  if (transformed_) return transformed_kv_.bytes.size();
  return runs_.count == 0 ? pages_.bytes(page).size() : runs_.total();
}

void FetchReactor::AppendPageBytes(size_t index, uint64_t offset, uint64_t n,
                                   std::string* out) const {
  if (transformed_) {
    out->append(transformed_kv_.bytes, offset, n);
    return;
  }
  const absl::string_view page = pages_.bytes(index);
  if (runs_.count == 0) {
    out->append(page.data() + offset, n);
    return;
  }
  for (int r = 0; r < runs_.count && n > 0; ++r) {
    if (offset >= runs_.bytes[r]) {
      offset -= runs_.bytes[r];
      continue;
    }
    const uint64_t take = std::min(n, runs_.bytes[r] - offset);
    out->append(page.data() + runs_.offset[r] + offset, take);
    n -= take;
    offset = 0;
  }
}

void FetchReactor::SetPageMetadata() {
  if (transformed_) {
    // Not a stored page: no handle, and TIER_RAW (the default) for the tier.
    response_.set_page_bytes(transformed_kv_.bytes.size());
    response_.set_page_checksum(transformed_kv_.checksum);
    response_.set_transformed_tokens(transformed_kv_.output_tokens);
    response_.set_input_tokens(transformed_kv_.input_tokens);
    return;
  }
  SetStoredPageMetadata(page_, &response_);
}

template <typename Message>
void FetchReactor::SetStoredPageMetadata(size_t page, Message* m) const {
  m->set_page_handle(pages_.handle(page));
  m->set_page_bytes(PageBytes(page));
  m->set_page_checksum(SentChecksum(pages_, page, runs_));
  m->set_page_tier(TierToProto(pages_.tier(page)));
  if (pages_.format() == FetchFormat::kCompressed) {
    m->set_codec(std::string(pages_.codec_name(page)));
    m->set_calibration_fingerprint(pages_.calibration_fingerprint(page));
  }
}

// An upper bound on the wire bytes of a PackedPage besides its codec name
// and data: tag and length of the entry and of data (6 + 6), page_index
// (6), page_handle, page_checksum and calibration_fingerprint (9 each),
// page_bytes (11), page_tier (3), codec's tag and length (6).
constexpr uint64_t kPackedPageOverhead = 72;

void FetchReactor::PackPages(uint64_t used) {
  for (uint32_t in_message = 1;
       in_message < pages_per_message_ && page_ < num_pages(); ++in_message) {
    const uint64_t n = PageBytes(page_);
    const uint64_t cost =
        n + kPackedPageOverhead + pages_.codec_name(page_).size();
    if (used + cost > chunk_bytes_) return;
    v1::PackedPage* p = response_.add_packed_pages();
    p->set_page_index(static_cast<uint32_t>(page_));
    SetStoredPageMetadata(page_, p);
    AppendPageBytes(page_, 0, n, p->mutable_data());
    used += cost;
    bytes_in_write_ += n;
    ++page_;
  }
}

void FetchReactor::WriteNext() {
  if (const absl::Status alive = CallAlive(*ctx_, "Fetch"); !alive.ok()) {
    FinishWith(ToGrpcStatus(
        idle_ != nullptr && idle_->expired()
            ? absl::CancelledError(
                  "limits.fetch_idle_timeout_ms: the client took no chunk for "
                  "too long; cancelled")
            : alive));
    return;
  }
  if (page_ >= num_pages()) {
    FinishWith(grpc::Status::OK);
    return;
  }
  // Raw pages all have page_bytes(); compressed ones their buffer's size.
  const uint64_t page_bytes = PageBytes(page_);
  const uint64_t n = std::min(chunk_bytes_, page_bytes - offset_);
  // Keeps the data buffers' capacity (packed pages' too) for the next write.
  response_.Clear();
  response_.set_page_index(static_cast<uint32_t>(page_));
  response_.set_offset(offset_);
  if (offset_ == 0) SetPageMetadata();
  // An unavoidable copy: protobuf 3.21 bytes fields own their storage (no
  // aliasing of external memory), so the pinned page is copied into the
  // message, and gRPC serializes it once more into its send buffer.
  AppendPageBytes(page_, offset_, n, response_.mutable_data());
  bytes_in_write_ = n;
  offset_ += n;
  if (offset_ == page_bytes) {
    ++page_;
    offset_ = 0;
    if (pages_per_message_ > 1 && !transformed_) PackPages(n);
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
  NoteProgress(idle_);
  WriteNext();
}

void FetchReactor::FinishWith(const grpc::Status& status) {
  call_.code = status.error_code();
  // No write is in flight here (the message owns a copy of its bytes), so
  // the pins go now: a client that sees the status may at once insert into
  // the room its fetched pages held, and OnDone can come later than that.
  pages_ = Namespace::PinnedPages();
  calls_->ReleaseAdmission(&call_);  // same reason: the client may go on now
  Finish(status);
}

void FetchReactor::OnDone() {
  pages_ = Namespace::PinnedPages();  // unpins before the call counts as done
  if (watchdog_ != nullptr) watchdog_->Unwatch(idle_);
  calls_->End(call_);
  delete this;
}

}  // namespace kvharbor
