// TransferDevice: what client/cuda/layout_transfer.h keeps per GPU for its
// copies: a copy stream and a compute stream, a ring of staging slots (each
// a device buffer and a pinned host buffer of `slot_pages` pages, with the
// events that say when a slot may be reused), the device tables the
// scatter and gather kernels read (block ids, K / V bases, page addresses),
// a pinned buffer that an insert gathers into, the copy regions of the
// gathered KVTC copies, and GPU timing events.
//
// Why a ring: the H2D copy of chunk k+1 runs on the copy stream while the
// scatter of chunk k runs on the compute stream; a slot is written again
// only after the scatter that read it finished (events, not host waits).
//
// Memory: owns all of it, on `device`, until destroyed; it grows buffers
// when a call needs more and keeps them for the next call. Not
// thread-safe: LayoutTransfer runs one call at a time per device.
#ifndef KVHARBOR_CLIENT_CUDA_TRANSFER_DEVICE_H_
#define KVHARBOR_CLIENT_CUDA_TRANSFER_DEVICE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvharbor/layout_fetch.h"

namespace kvharbor {
namespace client {

class TransferDevice {
 public:
  struct Slot {
    uint8_t* device = nullptr;       // slot_pages pages
    uint8_t* pinned = nullptr;       // slot_pages pages (pinned host)
    cudaEvent_t copied = nullptr;    // its H2D (or gather) is done
    cudaEvent_t consumed = nullptr;  // its scatter (or D2H) is done
    cudaEvent_t drained = nullptr;   // the copy out of `pinned` is done
  };
  // The call's tables in device memory.
  struct Tables {
    const int64_t* blocks = nullptr;
    const uint64_t* k = nullptr;
    const uint64_t* v = nullptr;
    const uint64_t* pages = nullptr;  // null unless page addresses given
  };

  static absl::StatusOr<std::unique_ptr<TransferDevice>> Create(int device);
  ~TransferDevice();
  TransferDevice(const TransferDevice&) = delete;
  TransferDevice& operator=(const TransferDevice&) = delete;

  int device() const { return device_; }
  cudaStream_t copy_stream() const { return copy_; }
  cudaStream_t compute_stream() const { return compute_; }

  // A ring of `slots` slots of `slot_pages` pages of `page_bytes` (made, or
  // made again when smaller); pinned halves only when `pinned`.
  absl::Status EnsureRing(uint64_t page_bytes, uint32_t slot_pages, int slots,
                          bool pinned);
  Slot& slot(size_t chunk) { return slots_[chunk % slots_.size()]; }
  uint32_t slot_pages() const { return slot_pages_; }
  size_t num_slots() const { return slots_.size(); }

  // Copies the tables into device memory on the compute stream.
  absl::StatusOr<Tables> UploadTables(absl::Span<const int64_t> blocks,
                                      absl::Span<const uint64_t> k,
                                      absl::Span<const uint64_t> v,
                                      absl::Span<const uint64_t> pages);

  // A region a gathered H2D copy goes through (client/cuda/
  // group_decode.cc): pinned host memory the groups' KVTC batches are
  // merged into, and device memory of the same size they are copied to and
  // decoded from.
  struct CopyRegion {
    uint8_t* pinned = nullptr;
    uint8_t* device = nullptr;
    cudaEvent_t copied = nullptr;  // its H2D copy is done
  };
  // `count` copy regions of at least `bytes` each (made, or made again when
  // fewer or smaller), kept for later calls. Only while no copy or decode
  // of a region is in flight.
  absl::Status EnsureCopyRegions(int count, uint64_t bytes);
  CopyRegion& copy_region(int i) { return regions_[i]; }
  uint64_t copy_region_bytes() const { return region_bytes_; }

  // Pinned host memory of at least `bytes`, kept for later calls.
  absl::StatusOr<uint8_t*> PinnedBuffer(uint64_t bytes);

  // GPU stage timing: Begin records an event on `stream`; End records
  // another and books the interval to `stage`; Collect (after the streams
  // finished) adds every interval to `clock` and forgets them.
  absl::StatusOr<size_t> Begin(cudaStream_t stream);
  absl::Status End(const std::string& stage, size_t begin, cudaStream_t stream);
  absl::Status Collect(TransferClock* clock);
  // Forgets intervals a failed call left behind.
  void ResetTiming();

  // Makes both streams wait for the work enqueued so far on `stream`.
  absl::Status WaitFor(cudaStream_t stream);
  // Waits for both streams.
  absl::Status Synchronize();

 private:
  explicit TransferDevice(int device) : device_(device) {}
  void FreeRing();
  void FreeCopyRegions();
  absl::StatusOr<cudaEvent_t> Event(size_t i);

  const int device_;
  cudaStream_t copy_ = nullptr;
  cudaStream_t compute_ = nullptr;
  cudaEvent_t wait_ = nullptr;
  std::vector<Slot> slots_;
  uint64_t slot_bytes_ = 0;
  uint32_t slot_pages_ = 0;
  bool pinned_ring_ = false;
  uint8_t* tables_dev_ = nullptr;
  uint8_t* tables_host_ = nullptr;  // pinned mirror
  uint64_t tables_bytes_ = 0;
  std::vector<CopyRegion> regions_;
  uint64_t region_bytes_ = 0;
  uint8_t* pinned_ = nullptr;
  uint64_t pinned_bytes_ = 0;
  std::vector<cudaEvent_t> events_;  // timing pool
  size_t events_used_ = 0;
  struct Interval {
    std::string stage;
    size_t begin, end;
  };
  std::vector<Interval> intervals_;
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_TRANSFER_DEVICE_H_
