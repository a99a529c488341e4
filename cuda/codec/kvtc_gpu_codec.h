// KvtcGpuCodec: KVTC (arXiv 2511.01815; shared/seeds/002) on an NVIDIA GPU.
// It writes and reads exactly the buffer format of the CPU reference
// (core/codec/kvtc/kvtc_codec.h, core/codec/kvtc/kvtc_format.h): the CPU codec
// decodes what this codec encodes and vice versa. Stages: gather + RoPE undo +
// mean subtract, the projection through cuBLAS (FP32, TF32 or BF16 tensor
// cores, see cuda/codec/projection_gemm.h), FP8 / IntX quantization straight
// into the output (device memory or mapped pinned host memory: the
// device-to-host copy is fused into the kernels), attention sinks in FP8;
// decode reverses them.
//
// PAGE POINTERS ARE DEVICE POINTERS. PageRef::data / MutablePageRef::data
// must be device-accessible (device memory, or pinned host memory mapped
// into the device's address space), aligned to the element size.
//
// Two ways to call it:
//  * The hot path: EncodeAsync / FinishEncode and DecodeAsync / FinishDecode
//    with a caller-owned KvtcGpuWorkspace (memory sized by WorkspaceSizes, a
//    cuBLAS handle, two events) and a caller-owned stream. Nothing is
//    allocated on the device per call; the host side does O(pages + rows)
//    bookkeeping and the envelope checksum (XXH3 over the compressed bytes),
//    which FinishDecode runs while the GPU decodes.
//  * The core Codec interface (Encode / Decode): synchronous, for interop
//    and tests; each call creates a stream and a workspace (slow).
//
// Accuracy: quantized bytes equal the CPU's given equal coefficients (the
// kernels are bit-exact ports of core/codec/kvtc/kvtc_stages.h); coefficients
// differ from OpenBLAS's by GEMM rounding (FP32), more in TF32 / BF16 modes.
//
// Memory: the codec owns device copies of its calibration (mean, projection,
// RoPE frequencies), uploaded once by Create on the then-current device and
// freed by the destructor. Thread-safety: immutable after Create; const
// methods may run concurrently with one workspace per concurrent call.
#ifndef KVHARBOR_CUDA_CODEC_KVTC_GPU_CODEC_H_
#define KVHARBOR_CUDA_CODEC_KVTC_GPU_CODEC_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/codec/codec.h"
#include "core/codec/envelope.h"
#include "core/codec/kvtc/kvtc_codec.h"
#include "cuda/codec/projection_gemm.h"
#include "cuda/kernels/kvtc_device_types.h"
#include "cuda/kernels/paged_kv_dest.h"

namespace kvharbor {
namespace gpu {

struct KvtcGpuOptions {
  KvtcGemmMode gemm_mode = KvtcGemmMode::kFp32;
  Fp8Path fp8_path = Fp8Path::kAuto;
  // Rows projected per GEMM call; bounds the workspace (X is rows x features
  // floats). Larger chunks run the GEMM closer to its peak.
  uint32_t max_rows_per_chunk = 16384;
  // Check each page pointer with cudaPointerGetAttributes (about a
  // microsecond per page) so a host pointer gets an error, not a fault.
  bool check_page_pointers = true;
  // Instrumentation: when set, called on the host just before each stage is
  // enqueued ("upload", "gather", "project", "check", "quantize", "sinks",
  // "copy_wait", "dequantize", "convert", "reconstruct", "scatter", and
  // "end" after the last), e.g. to record CUDA events for a per-stage time
  // breakdown (bench/kvtc_gpu_bench.cc). Must be thread-safe if the codec is
  // used from several threads.
  std::function<void(const char* stage)> stage_hook;
};

// Memory one in-flight call needs for batches of up to max_pages pages.
struct KvtcGpuWorkspaceSizes {
  size_t device_bytes = 0;  // cudaMalloc'd
  size_t pinned_bytes = 0;  // cudaHostAlloc'd (uploads and read-backs)
};

// What a call runs with; all owned by the caller (KvtcGpuWorkspaceHolder
// makes one). One call at a time per workspace: a workspace's next
// EncodeAsync may be issued once the previous encode is enqueued (on the
// same stream; on another stream only after `done`), but FinishEncode must
// come before the next call reuses the workspace. After a DecodeAsync, every
// call on the workspace but FinishDecode is refused until FinishDecode
// (the decode's result lives in the workspace); to overlap one batch's
// host work with another's GPU work, alternate two workspaces. `pinned` also
// keeps that mark: zero it once before first use (the holder does).
struct KvtcGpuWorkspace {
  size_t max_pages = 0;  // what the sizes were computed for
  void* device = nullptr;
  size_t device_bytes = 0;
  void* pinned = nullptr;
  size_t pinned_bytes = 0;
  cublasHandle_t cublas = nullptr;  // default math mode
  cudaEvent_t uploaded = nullptr;   // the call's reads of `pinned` are done
  cudaEvent_t done = nullptr;       // the call's work is done
  // Optional: a second stream and an event with which DecodeAsync copies a
  // pinned input buffer to the device chunk by chunk, overlapped with the
  // decoding of the previous chunk. Without them the kernels read pinned
  // input in place over PCIe (zero-copy).
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t copy_event = nullptr;
};

// Optional input of DecodeAsync: the buffer's bytes already in device
// memory of the codec's GPU, or being copied there on another stream (the
// decode waits for `ready`, an event recorded after that copy; may be null
// when the bytes are there already). The kernels read them there and
// DecodeAsync copies nothing: for a caller that moves several merged
// batches to the GPU in one copy (KvtcBatchDecoder::EnqueueMerged), since
// one copy of a 1 MB batch runs far below the link. The host buffer is still
// what is checked and checksummed, and the two must hold the same bytes.
struct KvtcDeviceInput {
  const uint8_t* data = nullptr;  // buffer.size() bytes; null: not used
  cudaEvent_t ready = nullptr;
};

class KvtcGpuCodec final : public Codec {
 public:
  // Validates like KvtcCodec::Create, resolves the FP8 path on the current
  // device, and uploads the calibration there.
  static absl::StatusOr<std::unique_ptr<KvtcGpuCodec>> Create(
      const CodecParams& params, const KvtcGpuOptions& options = {});
  ~KvtcGpuCodec() override;

  CodecId id() const override { return CodecId::kKvtc; }
  absl::string_view name() const override { return "kvtc_gpu"; }
  const Geometry& geometry() const override { return cpu_->geometry(); }
  // The CPU codec's: both write the same buffers, so a buffer's fingerprint
  // must not depend on which of them encoded it.
  uint64_t calibration_fingerprint() const override {
    return cpu_->calibration_fingerprint();
  }
  const KvtcCalibration& calibration() const { return cpu_->calibration(); }
  const KvtcGpuOptions& options() const { return options_; }
  bool native_fp8() const { return native_fp8_; }
  int device() const { return device_; }

  absl::StatusOr<size_t> MaxEncodedSize(size_t num_pages) const override;
  absl::StatusOr<size_t> EncodedSize(
      absl::Span<const PageRef> pages) const override;

  absl::StatusOr<KvtcGpuWorkspaceSizes> WorkspaceSizes(size_t max_pages) const;

  // Enqueues the encoding of `pages` on `stream`. `out` (device memory or
  // pinned host memory, at least EncodedSize(pages) bytes) receives the raw
  // payload at out + 128 + 8 * pages.size(); the envelope header and the
  // positions table are written by FinishEncode. Returns EncodedSize(pages).
  // Input errors are returned here; value errors (non-finite input) are
  // found by the kernels and returned by FinishEncode.
  absl::StatusOr<size_t> EncodeAsync(absl::Span<const PageRef> pages,
                                     uint8_t* out, size_t out_bytes,
                                     const KvtcGpuWorkspace& ws,
                                     cudaStream_t stream) const;
  // Waits for the call's work (ws.done), reports a refused batch
  // (InvalidArgument naming the page and token), then writes the positions
  // and the envelope header into `host_out` (the pinned `out` itself, or a
  // host copy of a device `out`), with the zstd stage when the codec has it.
  // Returns the buffer's final size. `scratch` may be null.
  absl::StatusOr<size_t> FinishEncode(absl::Span<const PageRef> pages,
                                      absl::Span<uint8_t> host_out,
                                      const KvtcGpuWorkspace& ws,
                                      CodecWorkspace* scratch) const;

  // Decoding is two calls, and only FinishDecode's OK means the pages hold
  // the buffer's values:
  //
  // DecodeAsync checks on the host everything that decides what is read or
  // written (envelope header and its checksum, lengths, positions against
  // `pages`, calibration, every section and range header; O(pages + ranges))
  // and enqueues the decoding of `buffer` (host memory) into `pages` on
  // `stream`; nothing is enqueued unless those checks pass. The kernels
  // check the data bytes as they dequantize (no FP8 NaN code, IntX min / max
  // finite and ordered) into the workspace's error word. A pinned buffer is
  // copied to the workspace chunk by chunk on ws.copy_stream, overlapped
  // with decoding (or, without a copy stream, read in place by the
  // kernels); any other buffer is copied to the workspace first. Either way
  // `buffer` must stay valid and unchanged until FinishDecode returns.
  // `scratch` (may be null) holds the zstd stage's output.
  //
  // FinishDecode(buffer, ws), with DecodeAsync's buffer, verifies the body
  // checksum (XXH3 over the whole buffer, ~1 ms per 10 MB on one core, on
  // the calling thread while the GPU decodes), waits for ws.done, and
  // returns DataLoss for a checksum mismatch or InvalidArgument naming the
  // field ("buffer: sections[0].ranges[2]: FP8 NaN code in row 17") for bad
  // data; it ends the pending decode whatever the result.
  //
  // After any failed decode (either call) the pages' contents are
  // unspecified: the GPU may have written some or all of them.
  //
  // `dest` enabled (cuda/kernels/paged_kv_dest.h): the pages are decoded
  // straight into that engine layout (page i of the buffer to block
  // dest.block_ids[i], only the layout's layers), bit for bit what decoding
  // into pages and scattering them gives; pages[i].data is then not used
  // (may be null), only the positions.
  //
  // `device_input` set: the kernels read the buffer's device copy there
  // (KvtcDeviceInput); a buffer whose payload is zstd-compressed is then
  // INVALID_ARGUMENT naming "device_input".
  absl::Status DecodeAsync(absl::Span<const uint8_t> buffer,
                           absl::Span<const MutablePageRef> pages,
                           const KvtcGpuWorkspace& ws, cudaStream_t stream,
                           CodecWorkspace* scratch,
                           const PagedKvDest& dest = PagedKvDest{},
                           const KvtcDeviceInput& device_input = {}) const;
  absl::Status FinishDecode(absl::Span<const uint8_t> buffer,
                            const KvtcGpuWorkspace& ws) const;

  // Codec interface: synchronous; `out` / `buffer` may be any host memory.
  // Decode is DecodeAsync + FinishDecode (pages unspecified on error).
  absl::StatusOr<size_t> Encode(absl::Span<const PageRef> pages,
                                absl::Span<uint8_t> out,
                                CodecWorkspace* workspace) const override;
  absl::Status Decode(absl::Span<const uint8_t> buffer,
                      absl::Span<const MutablePageRef> pages,
                      CodecWorkspace* workspace) const override;

 private:
  struct DeviceCalibration;
  struct Batch;
  KvtcGpuCodec(std::unique_ptr<KvtcCodec> cpu, const KvtcGpuOptions& options,
               bool zstd, int zstd_level);

  absl::Status Upload();
  // `dest` enabled: `data` is not used (a decode into a layout).
  absl::StatusOr<Batch> PrepareBatch(
      absl::Span<const uint64_t> positions, absl::Span<uint8_t* const> data,
      const KvtcGpuWorkspace& ws,
      const PagedKvDest& dest = PagedKvDest{}) const;
  absl::Status StageTables(const Batch& b, const KvtcGpuWorkspace& ws,
                           cudaStream_t stream) const;
  absl::Status EncodeSection(const Batch& b, int kv, uint8_t* payload,
                             const KvtcGpuWorkspace& ws,
                             cudaStream_t stream) const;
  // `host_payload`: when set, the chunks' bytes are first copied from it to
  // `payload` (the staging region) on ws.copy_stream.
  absl::Status DecodeSection(const Batch& b, int kv, const uint8_t* payload,
                             const uint8_t* host_payload,
                             const KvtcGpuWorkspace& ws,
                             cudaStream_t stream) const;
  // The fields gather and scatter args (GatherMeanSubtractArgs,
  // MeanAddScatterArgs) share, for rows [r0, r0 + n) of section kv of `b`.
  template <typename Args>
  Args RowArgs(const Batch& b, int kv, uint64_t r0, uint32_t n) const;
  absl::Status QuantizeChunk(const Batch& b, int kv, uint64_t r0, uint32_t n,
                             uint8_t* payload, cudaStream_t stream) const;
  absl::Status DequantizeChunk(const Batch& b, int kv, uint64_t r0, uint32_t n,
                               const uint8_t* payload,
                               cudaStream_t stream) const;
  absl::Status CopyChunkIn(const Batch& b, const KvtcSectionLayout& sec,
                           uint64_t r0, uint32_t n, const uint8_t* host_payload,
                           const KvtcGpuWorkspace& ws) const;
  absl::Status CopyIn(const uint8_t* host_payload, uint8_t* staging,
                      uint64_t offset, uint64_t bytes,
                      const KvtcGpuWorkspace& ws) const;
  // DecodeAsync's steps: the envelope fits this codec and `pages`; the
  // payload reaches the device (*dpayload where the kernels read it;
  // *staged_from set when pinned input is copied in chunk by chunk on
  // ws.copy_stream); the sink rows are decoded.
  // (`data_use`: kNotWritten for a decode into a PagedKvDest, whose pages'
  // data pointers are not used).
  absl::Status CheckDecodeEnvelope(const ParsedEnvelope& env,
                                   absl::Span<const MutablePageRef> pages,
                                   PageDataUse data_use) const;
  absl::Status UploadPayload(const Batch& b, absl::Span<const uint8_t> payload,
                             const KvtcGpuWorkspace& ws, cudaStream_t stream,
                             const uint8_t** dpayload,
                             const uint8_t** staged_from) const;
  absl::Status DecodeSinks(const Batch& b, const uint8_t* dpayload,
                           const uint8_t* staged_from,
                           const KvtcGpuWorkspace& ws,
                           cudaStream_t stream) const;
  void Stage(const char* name) const {
    if (options_.stage_hook) options_.stage_hook(name);
  }
  absl::Status WriteHeaders(const Batch& b, uint8_t* payload, bool host_out,
                            const KvtcGpuWorkspace& ws,
                            cudaStream_t stream) const;
  std::string DescribeError(unsigned long long code,
                            absl::Span<const uint64_t> positions) const;
  // A kCorruptData code: the field, as the CPU decoder names it.
  std::string DescribeDataError(unsigned long long code) const;

  std::unique_ptr<KvtcCodec> cpu_;  // layouts, sizes, validation
  KvtcGpuOptions options_;
  bool zstd_ = false;
  int zstd_level_ = 1;
  bool native_fp8_ = false;
  int device_ = 0;
  std::unique_ptr<DeviceCalibration> dev_;
};

// Owns a KvtcGpuWorkspace: device and pinned memory, events, the copy stream
// and the cuBLAS handle.
// Allocates only in Create. Not thread-safe (one call at a time).
class KvtcGpuWorkspaceHolder {
 public:
  static absl::StatusOr<std::unique_ptr<KvtcGpuWorkspaceHolder>> Create(
      const KvtcGpuCodec& codec, size_t max_pages);
  ~KvtcGpuWorkspaceHolder();
  KvtcGpuWorkspaceHolder(const KvtcGpuWorkspaceHolder&) = delete;
  KvtcGpuWorkspaceHolder& operator=(const KvtcGpuWorkspaceHolder&) = delete;

  const KvtcGpuWorkspace& get() const { return ws_; }

 private:
  KvtcGpuWorkspaceHolder() = default;
  KvtcGpuWorkspace ws_;
};

// Registers "kvtc_gpu" (KvtcGpuCodec with default options) in `registry`.
absl::Status RegisterKvtcGpuCodec(CodecRegistry& registry);

}  // namespace gpu
}  // namespace kvharbor

#endif  // KVHARBOR_CUDA_CODEC_KVTC_GPU_CODEC_H_
