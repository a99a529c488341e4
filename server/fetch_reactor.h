// FetchReactor: server side of the server-streaming Fetch RPC.
//
// Streams pinned pages in chunks of at most `chunk_bytes`, one write
// outstanding at a time (StartWrite, then the next from OnWriteDone), so a
// slow client holds at most one chunk of memory here. The first chunk of each
// page carries the page's handle, size, checksum and tier, and for a
// compressed fetch the codec name and calibration fingerprint. The pins are
// released when the reactor is deleted (OnDone), whether the stream completed,
// failed or was cancelled.
//
// Owned by gRPC's callback machinery: created by KvHarborService::Fetch and
// deleted in OnDone. OnCancel only sets an atomic flag; everything else runs
// in the serialized write reactions.
#ifndef KVHARBOR_SERVER_FETCH_REACTOR_H_
#define KVHARBOR_SERVER_FETCH_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "core/namespace.h"
#include "kvharbor/v1/kvharbor.pb.h"
#include "server/call_tracker.h"

namespace kvharbor {

class FetchReactor final : public grpc::ServerWriteReactor<v1::FetchResponse> {
 public:
  // A reactor that finishes at once with `error` (bad request).
  FetchReactor(CallTracker* calls, const CallRecord& call,
               const grpc::Status& error);
  // `codec` and `calibration_fingerprint` go out with compressed pages.
  FetchReactor(CallTracker* calls, const CallRecord& call,
               Namespace::PinnedPages pages, uint32_t chunk_bytes,
               std::string codec = "", uint64_t calibration_fingerprint = 0);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  void WriteNext();
  void FinishWith(const grpc::Status& status);  // notes the code, Finish

  CallTracker* const calls_;
  CallRecord call_;
  Namespace::PinnedPages pages_;
  const uint64_t chunk_bytes_ = 0;
  const std::string codec_;
  const uint64_t fingerprint_ = 0;
  size_t page_ = 0;              // page of the next chunk
  uint64_t offset_ = 0;          // offset of the next chunk in its page
  uint64_t bytes_in_write_ = 0;  // data bytes of the outstanding write
  std::atomic<bool> cancelled_{false};
  v1::FetchResponse response_;  // the one outstanding write's message
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_FETCH_REACTOR_H_
