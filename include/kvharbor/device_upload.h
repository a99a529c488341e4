// client::DeviceUpload: the SDK's side of DeviceInsert, a same-host insert
// into the daemon's device tier by CUDA IPC (the proto's DeviceInsertBegin
// states the protocol; docs/tiers.md "Same-host zero copy").
//
// Client::BeginDeviceInsert opens the stream and returns a DeviceUpload
// holding the daemon's answer: the device arena (map it with
// client/cuda/device_ipc.h, the mapping GetDeviceHandles uses) and, for
// each page from first_page on, where its reserved slot lies. The caller
// writes the pages there from its GPU (cudaMemcpy device-to-device, or the
// paged-KV gather of cuda/kernels/paged_kv_gather.h), waits for the copies,
// computes each page's XXH3-64 where it lies (cuda/kernels/xxh3_checksum.h, the
// daemon's kernel) and calls Commit. Abort, destruction, a failed call or
// the TTL before Commit abort the insert: nothing is stored and the slots go
// back. Never write a slot after that (the daemon may have handed it to
// another page).
//
// Memory: owns the stream; page memory is the caller's. Not thread-safe:
// one caller drives one upload. This header includes no gRPC header.
#ifndef KVHARBOR_CLIENT_DEVICE_UPLOAD_H_
#define KVHARBOR_CLIENT_DEVICE_UPLOAD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvharbor/types.h"

namespace kvharbor {
namespace client {

// Client::GetDeviceHandles options.
struct DeviceHandlesOptions {
  // GetDeviceHandlesRequest.stage_cold: bring the lease's cold pages onto
  // the device first.
  bool stage_cold = false;
};

struct DeviceSlot {
  uint64_t offset = 0;  // from the base of the arena's IPC mapping
  uint64_t bytes = 0;   // the namespace's page bytes
};

struct DeviceInsertSlots {
  // The arena, as in DeviceHandles.
  std::string ipc_handle;
  int device = 0;
  std::string device_uuid;
  uint64_t arena_bytes = 0;
  // Pages [0, first_page) are cached already: write nothing for them.
  uint32_t first_page = 0;
  std::vector<DeviceSlot> slots;  // page first_page + i goes to slots[i]
  absl::Time expiry = absl::InfinitePast();  // aborted unless committed
};

// Whether a BeginDeviceInsert error means DeviceInsert is not there for
// this insert, so that the caller should store the pages another way (the
// Insert stream): the daemon has no device tier ("store.device_pool_bytes")
// or does not allow IPC ("store.allow_ipc"), the namespace keeps its pages
// outside the device arena (FAILED_PRECONDITION), or the daemon has no
// DeviceInsert (UNIMPLEMENTED). Other errors (a bad request, no room:
// RESOURCE_EXHAUSTED) would fail the Insert stream too.
bool DeviceInsertUnavailable(const absl::Status& begin);

class DeviceUpload {
 public:
  struct State;  // the stream (client/client_device.cc)
  explicit DeviceUpload(std::unique_ptr<State> state, DeviceInsertSlots slots);
  ~DeviceUpload();  // aborts unless committed
  DeviceUpload(const DeviceUpload&) = delete;
  DeviceUpload& operator=(const DeviceUpload&) = delete;

  const DeviceInsertSlots& slots() const { return slots_; }

  // `checksums`: XXH3-64 of each written page, one per slots(). The daemon
  // hashes the slots on its GPU: DATA_LOSS naming
  // "commit.page_checksums[i]" for a page that differs (nothing is
  // stored); DEADLINE_EXCEEDED naming "begin.ttl_ms" past the TTL.
  absl::StatusOr<InsertResult> Commit(absl::Span<const uint64_t> checksums);
  // Cancels the stream: the daemon gives the slots back. Idempotent.
  void Abort();

 private:
  std::unique_ptr<State> state_;
  DeviceInsertSlots slots_;
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_DEVICE_UPLOAD_H_
