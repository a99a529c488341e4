// Device tier interfaces: what the core needs from a GPU, without CUDA.
//
// core/ never includes CUDA headers. A DeviceTier (cuda/tier/device_tier.h) is
// made by the server when the daemon is configured with a device pool
// (store.device_pool_bytes) and handed to the Store in StoreOptions. The
// store then cuts every namespace's PagePool (tier 0, MemoryKind::kDevice)
// from the tier's one arena on its GPU, and gives each namespace the
// tier itself; for every calibration it uses (the configured one, and each
// one an upload or online calibration switches to) the namespace asks the
// tier for a PageBatchEncoder, with which eviction compresses LRU device
// pages into the host-compressed tier in batches, and a PageBatchDecoder,
// with which RAW fetches decode host-compressed and disk pages in batches.
// A calibration without them (a codec with no GPU implementation) encodes
// host copies of device pages and decodes on the CPU.
//
// Memory: a pool made by CreatePool holds its arena range until destroyed
// and keeps the tier alive (shared ownership), so pools may outlive the
// Store. An encoder or decoder owns its GPU workspaces and pinned staging
// memory.
//
// Same-host zero copy: ExportIpc describes the arena for a client process
// on the same machine (a CUDA IPC handle as opaque bytes), and
// Namespace::DevicePagesOfLease says where a lease's pages lie in it; the
// server hands both out only when StoreOptions::allow_ipc is set. The same
// client may write pages it inserts straight into reserved device slots
// (Namespace::Upload::AcceptPlaced), which the tier then checksums on the
// GPU (ChecksumPages); cold pages a lease wants on the device are decoded
// straight into slots (PageBatchDecoder::DecodeEachToDevice,
// Namespace::StageLeaseOnDevice).
//
// Thread-safety: DeviceTier is thread-safe. A PageBatchEncoder serves one
// call at a time (NamespaceTiers calls it under its move_mu_). A
// PageBatchDecoder is thread-safe (concurrent fetches; it serialises its
// calls on its staging memory).
#ifndef KVHARBOR_CORE_STORE_DEVICE_TIER_H_
#define KVHARBOR_CORE_STORE_DEVICE_TIER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/codec/codec.h"
#include "core/memory/page_pool.h"
#include "types/geometry.h"

namespace kvharbor {

class PageBatchEncoder {
 public:
  virtual ~PageBatchEncoder() = default;
  // Encodes each page into its own codec buffer, decodable by the CPU codec
  // of the same name and calibration (one-page batches, as the host tier
  // stores them). PageRef::data are device addresses (PagePool::Data of a
  // device pool). One result per page, in order; a page that fails (e.g.
  // non-finite keys) gets its error and stays raw.
  virtual std::vector<absl::StatusOr<std::string>> EncodeEach(
      absl::Span<const PageRef> pages) = 0;
};

class PageBatchDecoder {
 public:
  virtual ~PageBatchDecoder() = default;
  // Decodes buffers[i] (a one-page buffer of the decoder's codec and
  // calibration, as the host tier stores it) into pages[i] (HOST memory,
  // the page's bytes; first_position must be the buffer's), many pages per
  // GPU batch. One status per page, in order: a page whose buffer is refused
  // gets its error (naming the field) and unspecified bytes; the others
  // decode. Results equal the CPU codec's decode of the same buffer up to
  // the projection's rounding (bit-exact where the GEMM is exact).
  virtual std::vector<absl::Status> DecodeEach(
      absl::Span<const absl::Span<const uint8_t>> buffers,
      absl::Span<const MutablePageRef> pages) = 0;
  // As DecodeEach, but pages[i].data are DEVICE addresses on the decoder's
  // GPU (PagePool::Data of a device pool): the pages are decoded straight
  // into them and never cross to the host (cold pages staged into device
  // slots for GetDeviceHandles). The default decodes nothing: every page
  // gets Unimplemented, and the caller decodes it on the CPU.
  virtual std::vector<absl::Status> DecodeEachToDevice(
      absl::Span<const absl::Span<const uint8_t>> buffers,
      absl::Span<const MutablePageRef> pages) {
    return std::vector<absl::Status>(
        pages.size(),
        absl::UnimplementedError("this decoder writes host pages only"));
  }
};

// What an encoder or decoder is built from: the namespace's codec name,
// geometry and canonical calibration bytes (null for codecs without one).
struct DeviceEncoderParams {
  std::string codec;
  Geometry geometry;
  std::shared_ptr<const std::string> calibration_bytes;
};

// What another process on the same machine needs to map the arena. core/
// sees the handle only as bytes; cuda/ makes it (cudaIpcGetMemHandle).
struct DeviceIpcExport {
  std::string handle;       // cudaIpcMemHandle_t, opaque (64 bytes)
  int device = 0;           // CUDA ordinal in this process
  std::string device_uuid;  // cudaDeviceProp.uuid (16 bytes)
  uint64_t arena_bytes = 0;
  // Device address of the arena's byte 0 in this process: only subtracted
  // from PagePool::Data addresses to get offsets, never dereferenced.
  uintptr_t arena_base = 0;
};

class DeviceTier {
 public:
  virtual ~DeviceTier() = default;
  // For the startup log: "GPU 0 (NVIDIA H100 80GB HBM3), arena 8.00 GiB".
  virtual std::string Describe() const = 0;
  virtual uint64_t arena_bytes() const = 0;
  // A pool of `capacity` slots of `slot_bytes` from the arena;
  // ResourceExhausted when no free range of the arena is large enough.
  virtual absl::StatusOr<std::unique_ptr<PagePool>> CreatePool(
      size_t slot_bytes, uint32_t capacity) = 0;
  // The GPU encoder for `params.codec`, or nullptr when the tier has none
  // for that codec. Errors: the calibration does not load on the GPU.
  virtual absl::StatusOr<std::unique_ptr<PageBatchEncoder>> CreateEncoder(
      const DeviceEncoderParams& params) = 0;
  // The arena's IPC description; the same handle bytes on every call.
  // FailedPrecondition for a tier that cannot export one.
  virtual absl::StatusOr<DeviceIpcExport> ExportIpc() {
    return absl::FailedPreconditionError(
        "store.allow_ipc: this device tier cannot export CUDA IPC handles");
  }
  // The GPU decoder for `params.codec`, or nullptr when the tier has none;
  // errors as CreateEncoder.
  virtual absl::StatusOr<std::unique_ptr<PageBatchDecoder>> CreateDecoder(
      const DeviceEncoderParams& params) = 0;
  // XXH3-64 (seed 0, the checksum pages carry) of `bytes` bytes at each of
  // `pages`, DEVICE addresses in the arena, computed where they lie (pages
  // a same-host client wrote by CUDA IPC, pages decoded into device slots).
  // Unimplemented: the tier cannot; the caller reads the pages back.
  virtual absl::StatusOr<std::vector<uint64_t>> ChecksumPages(
      absl::Span<const uint8_t* const> pages, uint64_t bytes) {
    return absl::UnimplementedError(
        "this device tier cannot checksum pages where they lie");
  }
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_DEVICE_TIER_H_
