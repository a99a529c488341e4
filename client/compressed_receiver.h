// CompressedReceiver: the client side of a FETCH_FORMAT_COMPRESSED stream.
// Compressed pages have sizes of their own, so they do not go through the
// zero-copy FetchAssembler (equal-sized raw pages into caller memory): each
// page is collected into its own buffer, verified against the daemon's
// XXH3-64 checksum and handed to a CompressedPageSink as soon as it is
// whole, so a caller decodes early pages while later ones arrive.
//
// The daemon sends pages in order: each message holds a page's chunk (the
// first, offset 0, with its metadata) and, when the client asked for
// packing (FetchRequest.max_pages_per_message), whole pages after it in
// packed_pages. The messages are untrusted input: anything else (pages out
// of order or twice, chunks past a page's size, a packed page whose data
// differs from its page_bytes, a checksum mismatch) is an error, INTERNAL
// for a broken stream and DATA_LOSS for a checksum, never a crash.
//
// Internal to the SDK (not installed). Not thread-safe: one per stream. The
// sink is the caller's and must outlive the receiver.
#ifndef KVHARBOR_CLIENT_COMPRESSED_RECEIVER_H_
#define KVHARBOR_CLIENT_COMPRESSED_RECEIVER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvharbor/types.h"
#include "kvharbor/v1/kvharbor.pb.h"

namespace kvharbor {
namespace client {

class CompressedReceiver {
 public:
  // `expected`: the pages the request implies (0 = unknown: a lease
  // fetched to its end).
  CompressedReceiver(uint32_t expected, bool verify_checksums,
                     const CompressedPageSink* sink);

  // Takes one message of the stream; its data buffers are moved out (the
  // message can be read into again). After an error every call returns it.
  absl::Status Add(v1::FetchResponse& r);
  // Once the stream ended OK: the number of pages received, all of them
  // whole (and the expected count when that is known).
  absl::StatusOr<uint32_t> Finish();

 private:
  absl::Status AddChunk(v1::FetchResponse& r);
  absl::Status AddPacked(v1::PackedPage& p, int i);
  absl::Status Complete();

  const uint32_t expected_;
  const bool verify_;
  const CompressedPageSink* const sink_;
  absl::Status error_;
  uint32_t next_ = 0;  // index of the page being received / the next one
  bool open_ = false;
  CompressedPage page_;
  uint64_t size_ = 0;
  uint64_t checksum_ = 0;
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_COMPRESSED_RECEIVER_H_
