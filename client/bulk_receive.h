// BulkReceive: the receiving side of one bulk data plane fetch
// (docs/data_plane.md) in the SDK: the offer checked, then one thread per
// connection, each receiving its stripes straight into the memory a
// client::BulkSink names and checking every page against the offer's
// checksum. Used by Client::Impl::TryBulkFetch (RAW pages, equal sizes) and
// TryBulkFetchCompressed (codec buffers, each of its own size).
//
// Memory: borrows the offer and the sink, which must outlive Run. Thread
// safety: one Run per object; the sink's callbacks run on the receiving
// threads, several at once.
#ifndef KVHARBOR_CLIENT_BULK_RECEIVE_H_
#define KVHARBOR_CLIENT_BULK_RECEIVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvharbor/types.h"
#include "kvharbor/v1/kvharbor.pb.h"

namespace kvharbor {
namespace client {

// Largest codec buffer of one page a daemon's offer may announce (memory
// is reserved for it before any byte arrives).
inline constexpr uint64_t kMaxCompressedPageBytes = uint64_t{1} << 30;

// The offer's fields against the request (INTERNAL naming the field: a
// daemon that breaks the protocol); `expected` 0 = any page count.
absl::Status CheckBulkOffer(const v1::BulkOffer& o, uint32_t connections,
                            uint32_t stripe_pages, uint32_t expected);
// Bytes of page `page` on the wire: page_bytes, or its page_sizes entry.
uint64_t OfferedPageBytes(const v1::BulkOffer& o, uint32_t page);

class BulkReceive {
 public:
  BulkReceive(const v1::BulkOffer& offer, const BulkSink& sink,
              std::string host, absl::Time deadline, bool verify);

  // Receives every connection's pages; the first error, if any (then
  // sink.abort ran, once).
  absl::Status Run();

 private:
  void Connection(uint32_t index);
  absl::Status Serve(uint32_t index);

  const v1::BulkOffer& offer_;
  const BulkSink& sink_;
  const std::string host_;
  const absl::Time deadline_;
  const bool verify_;
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_BULK_RECEIVE_H_
