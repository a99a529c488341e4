// Internals shared by kvtc_gpu_codec.cc and kvtc_gpu_pipeline.cc: how a
// workspace is carved into regions, the per-call batch description, and the
// device copy of the calibration. Not a public header.
#ifndef KVHARBOR_CUDA_CODEC_KVTC_GPU_INTERNAL_H_
#define KVHARBOR_CUDA_CODEC_KVTC_GPU_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/codec/kvtc/kvtc_format.h"
#include "cuda/codec/kvtc_gpu_codec.h"
#include "cuda/kernels/kvtc_device_types.h"

namespace kvharbor {
namespace gpu {

// Byte offsets of each region of a workspace (256-byte aligned).
struct WorkspaceCarve {
  uint64_t chunk_rows = 0;  // rows per GEMM
  // Device regions.
  uint64_t pages = 0;    // KvtcPageInfo[max_pages]
  uint64_t rows = 0;     // KvtcTokenRef[max projected rows] (per token)
  uint64_t sinks = 0;    // KvtcTokenRef[max sink rows]
  uint64_t rope = 0;     // float cos[max tokens][head_dim/2], then sin
  uint64_t x = 0;        // float[chunk][features]
  uint64_t y = 0;        // float[chunk][components]
  uint64_t y_bf16 = 0;   // bf16[chunk][components] (BF16 mode)
  uint64_t minmax = 0;   // float[2][chunk]
  uint64_t error = 0;    // unsigned long long
  uint64_t cublas = 0;   // cuBLAS workspace
  uint64_t staging = 0;  // a whole encoded buffer (pageable in/out)
  uint64_t staging_bytes = 0;
  uint64_t rope_bytes = 0;  // of one of the cos / sin tables
  uint64_t device_total = 0;
  // Pinned regions.
  uint64_t p_pages = 0;
  uint64_t p_rows = 0;
  uint64_t p_sinks = 0;
  uint64_t p_headers = 0;  // section and range headers, packed
  uint64_t p_error = 0;
  uint64_t p_decode = 0;  // PendingDecode
  uint64_t pinned_total = 0;
};

// What FinishDecode needs of the DecodeAsync it completes, kept in the
// workspace's pinned memory (host-only state; one call at a time per
// workspace). While `mark` is kPendingDecodeMark, the error word in p_error
// belongs to that decode, so every other call on the workspace is refused.
inline constexpr uint64_t kPendingDecodeMark = 0x50444354564b4e44ull;
struct PendingDecode {
  uint64_t mark = 0;
  uint64_t body_checksum = 0;  // the header's; verified by FinishDecode
  uint64_t buffer = 0;         // address and size of DecodeAsync's buffer
  uint64_t buffer_bytes = 0;
};
inline PendingDecode* PendingDecodeOf(const KvtcGpuWorkspace& ws,
                                      const WorkspaceCarve& c) {
  return reinterpret_cast<PendingDecode*>(static_cast<uint8_t*>(ws.pinned) +
                                          c.p_decode);
}
// FailedPrecondition when a DecodeAsync on `ws` still awaits FinishDecode.
absl::Status CheckNoPendingDecode(const KvtcGpuWorkspace& ws,
                                  const WorkspaceCarve& c);

absl::StatusOr<WorkspaceCarve> CarveWorkspace(const KvtcGpuCodec& codec,
                                              size_t max_pages);

struct KvtcGpuCodec::DeviceCalibration {
  float* mean[2] = {nullptr, nullptr};
  void* projection[2] = {nullptr, nullptr};  // fp32, or bf16 in BF16 mode
  double* inv_freq = nullptr;                // RoPE frequencies
  ~DeviceCalibration();
};

struct KvtcGpuCodec::Batch {
  size_t num_pages = 0;
  std::vector<uint64_t> positions;
  std::vector<uint8_t*> data;   // device-accessible page pointers
  std::vector<uint32_t> sinks;  // sink tokens of each page
  KvtcPayloadLayout layout;
  WorkspaceCarve carve;
  bool pages_aligned16 = false;  // every page pointer 16-byte aligned
  PagedKvDest dest;        // enabled: decode into this layout, not into `data`
  uint8_t* dev = nullptr;  // ws.device
  uint8_t* pin = nullptr;  // ws.pinned
  // Typed views of the workspace.
  KvtcPageInfo* d_pages() const {
    return reinterpret_cast<KvtcPageInfo*>(dev + carve.pages);
  }
  KvtcTokenRef* d_rows() const {
    return reinterpret_cast<KvtcTokenRef*>(dev + carve.rows);
  }
  KvtcTokenRef* d_sinks() const {
    return reinterpret_cast<KvtcTokenRef*>(dev + carve.sinks);
  }
  float* d_cos() const { return reinterpret_cast<float*>(dev + carve.rope); }
  float* d_sin() const {
    return reinterpret_cast<float*>(dev + carve.rope + carve.rope_bytes);
  }
  void* d_x() const { return dev + carve.x; }
  float* d_y() const { return reinterpret_cast<float*>(dev + carve.y); }
  uint16_t* d_y_bf16() const {
    return reinterpret_cast<uint16_t*>(dev + carve.y_bf16);
  }
  float* d_minmax() const {
    return reinterpret_cast<float*>(dev + carve.minmax);
  }
  unsigned long long* d_error() const {
    return reinterpret_cast<unsigned long long*>(dev + carve.error);
  }
  void* d_cublas() const { return dev + carve.cublas; }
  uint8_t* d_staging() const { return dev + carve.staging; }
};

// Where a pointer lives, as far as kernels are concerned.
struct PointerKind {
  bool host = false;              // pinned host memory (mapped)
  uint8_t* device_ptr = nullptr;  // what kernels dereference
};
// InvalidArgument naming `field` for memory the device cannot reach
// (pageable host memory) or memory of another device.
absl::StatusOr<PointerKind> ClassifyPointer(const void* p, int device,
                                            const char* field);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_CODEC_KVTC_GPU_INTERNAL_H_
