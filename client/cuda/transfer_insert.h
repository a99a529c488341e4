// InsertCall: what LayoutTransfer::Insert (client/cuda/layout_transfer.h)
// hands its "device_ipc" path (client/cuda/transfer_insert.cc) for one
// call: the checked layout, the device state and the result being built.
//
// Memory: views of the caller's arguments and of LayoutTransfer's state,
// valid for the call only. Not thread-safe (one call at a time, under
// LayoutTransfer's mutex).
#ifndef KVHARBOR_CLIENT_CUDA_TRANSFER_INSERT_H_
#define KVHARBOR_CLIENT_CUDA_TRANSFER_INSERT_H_

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "client/cuda/layout_transfer.h"
#include "client/cuda/transfer_device.h"
#include "kvharbor/client.h"
#include "kvharbor/layout_fetch.h"
#include "kvharbor/types.h"

namespace kvharbor {
namespace client {

struct InsertCall {
  std::string ns;
  absl::Span<const Token> tokens;
  const LayoutCall* lc = nullptr;  // geometry, resolved layout
  absl::Span<const int64_t> block_ids;
  uint32_t num_pages = 0;
  const LayoutInsertOptions* opts = nullptr;
  CallOptions call;
  TransferDevice* dev = nullptr;  // layout.device's, current
  uint32_t layout_align = 1;      // of every K / V base
  TransferClock* clock = nullptr;
  TransferResult* result = nullptr;  // fallbacks, bytes_moved
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_TRANSFER_INSERT_H_
