// GpuPageDecoder: decodes the codec buffers of Client::FetchCompressed on
// the client's GPU (library kvharbor_client_cuda, built only with CUDA).
//
// Issue 5: COMPRESSED fetches are decoded by the SDK, on the GPU when the
// client has one, after getting the namespace's calibration once
// (Client::GetCalibration). The decoder is made from that calibration and
// the namespace's geometry. KVTC pages are joined into batch buffers and
// decoded in batches by cuda/'s KvtcBatchDecoder, built by the factory the
// daemon's device tier builds its decoder of cold pages with
// (cuda/tier/kvtc_page_codecs.h: one reconstruction GEMM per section and
// batch), in the arithmetic GpuDecodeOptions::gemm names: kFp32 gives what the
// CPU codec gives for the same buffer up to GEMM rounding (byte for byte when
// the GEMM is exact); kTf32 / kBf16 round the GEMM's inputs (errors in
// docs/hit_paths.md "Options").
// Pages of codecs without a GPU decoder (identity, int8_c8, commvq, or a
// kvtc page of another calibration) are decoded on the CPU by the SDK's
// PageDecoder. Decode's destinations are host memory (pageable or pinned):
// the GPU decodes into its own device batch and copies the pages out
// through a pinned bounce buffer (device memory there is INVALID_ARGUMENT
// naming "dst"). DecodeToDevice's are device memory of the decoder's GPU:
// KVTC pages are decoded straight into them, other codecs' pages decoded on
// the CPU and copied there (client/cuda/layout_transfer.h uses it).
//
// Memory: the decoder owns its GPU codec (one device copy of the
// calibration), workspaces, pinned staging and device batch; the caller
// owns pages and destinations. Thread-safe: Decode calls may overlap (the
// batch decoder takes them in turn; the CPU decoder has its own lock).
#ifndef KVHARBOR_CLIENT_CUDA_GPU_DECODE_H_
#define KVHARBOR_CLIENT_CUDA_GPU_DECODE_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/codec/codec.h"
#include "cuda/kernels/paged_kv_dest.h"
#include "kvharbor/types.h"

namespace kvharbor {
namespace gpu {
class KvtcBatchDecoder;  // cuda/tier/device_tier.h
}  // namespace gpu

namespace client {

class PageDecoder;  // client/page_decoder.h

struct GpuDecodeOptions {
  int device = 0;          // CUDA ordinal the KVTC pages are decoded on
  size_t batch_pages = 0;  // pages per GPU batch (0: the decoder's default)
  // The reconstruction GEMM; FP32 here (the CPU codec's arithmetic), TF32
  // in ClientOptions::gpu_decode_gemm, which LayoutTransfer passes.
  GpuDecodeGemm gemm = GpuDecodeGemm::kFp32;
};

class GpuPageDecoder {
 public:
  // `calibration` as Client::GetCalibration returned it for the namespace
  // whose pages will be decoded, `geometry` the namespace's. INVALID_ARGUMENT
  // naming "geometry" or "calibration" for ones that do not fit together.
  static absl::StatusOr<std::unique_ptr<GpuPageDecoder>> Create(
      const Calibration& calibration, const Geometry& geometry,
      const GpuDecodeOptions& options = {});
  ~GpuPageDecoder();

  // Decodes pages[i] (from FetchCompressed) into dst[i], host memory of
  // page_bytes() bytes each. Returns the first failure, naming its page
  // ("page <handle>"); pages that decoded are complete either way.
  absl::Status Decode(absl::Span<const CompressedPage> pages,
                      absl::Span<uint8_t* const> dst);

  // Decodes pages[i] into dst[i], DEVICE memory of the decoder's GPU of
  // page_bytes() bytes each: KVTC pages of this calibration on the GPU in
  // batches of at most batch_pages(), with no host copy; other pages on the
  // CPU, then copied there. Done when it returns; the first failure names
  // its page.
  absl::Status DecodeToDevice(absl::Span<const CompressedPage> pages,
                              absl::Span<uint8_t* const> dst);

  // DecodeToDevice in two steps, so that a caller decoding group after
  // group overlaps one group's GPU decode with the next group's merge and
  // H2D copy (KvtcBatchDecoder::EnqueueToDevice: two batches in flight).
  // EnqueueToDevice decodes the pages of other codecs at once (CPU, then a
  // copy) and enqueues the KVTC ones; it returns a ticket. FinishToDevice
  // waits for everything enqueued up to that ticket; the pages of those
  // calls hold their values once it is OK. A page refused when enqueued (a
  // bad buffer) is named ("page <handle>": the call's batches are then
  // finished); a batch that fails on the GPU names its first page ("batch
  // from page <handle>").
  static constexpr uint64_t kAllTickets = ~uint64_t{0};
  absl::StatusOr<uint64_t> EnqueueToDevice(
      absl::Span<const CompressedPage> pages, absl::Span<uint8_t* const> dst);
  absl::Status FinishToDevice(uint64_t ticket);

  // EnqueueToDevice straight into an engine layout: page i's decode goes to
  // block dest.block_ids[i] of the layout `dest` describes (device tables on
  // the decoder's GPU; only the layout's layers are written), with no page
  // staging and no separate scatter; bit for bit what EnqueueToDevice into
  // pages followed by the paged-KV scatter gives. Every page must be one
  // DecodesOnGpu accepts (else INVALID_ARGUMENT naming the page). Finished
  // by FinishToDevice as above.
  absl::StatusOr<uint64_t> EnqueueToLayout(
      absl::Span<const CompressedPage> pages, const gpu::PagedKvDest& dest);
  // EnqueueToLayout in two steps, for a caller that moves several groups'
  // KVTC batches to the GPU in ONE H2D copy (client/cuda/group_decode.cc
  // gathers them into pinned copy regions): a batch's payload copied range
  // by range, as EnqueueToLayout does, is many small copies, far below the
  // link. MergeForLayout splits `pages` (every one DecodesOnGpu accepts,
  // else INVALID_ARGUMENT naming the page) into batches of at most
  // batch_pages(), checks each page in full and merges each batch into
  // `out` at 256-byte aligned offsets; it appends the batches to `*batches`
  // and returns the bytes of `out` used (at most MaxMergedBytes). A bad
  // page fails it naming the page ("page <handle>"), with `*batches` as it
  // was. It takes no lock: a caller merges on its own thread while the
  // decoder decodes. EnqueueMergedToLayout then enqueues each batch's decode
  // from the device copy of those bytes: batch b's merged bytes, at
  // b.merged.data() - host_base in the host region, are read at the same
  // offset from `device_base` once `ready` (an event recorded after the
  // copy; may be null) has passed. One ticket per batch, finished by
  // FinishToDevice as above. The host and device regions must stay
  // unchanged until the batches are finished.
  struct MergedBatch {
    absl::Span<const uint8_t> merged;  // in the caller's pinned region
    std::vector<MutablePageRef> refs;  // positions only (data unused)
    gpu::PagedKvDest dest;             // block ids of the batch's pages
    uint64_t handle = 0;               // its first page
  };
  absl::StatusOr<uint64_t> MergeForLayout(
      absl::Span<const CompressedPage> pages, const gpu::PagedKvDest& dest,
      absl::Span<uint8_t> out, std::vector<MergedBatch>* batches) const;
  // The most bytes MergeForLayout uses for `pages` pages.
  uint64_t MaxMergedBytes(size_t pages) const;
  absl::StatusOr<std::vector<uint64_t>> EnqueueMergedToLayout(
      absl::Span<const MergedBatch> batches, const uint8_t* host_base,
      const uint8_t* device_base, cudaEvent_t ready);
  // Whether `page` is decoded on the GPU (a KVTC page of this calibration).
  bool DecodesOnGpu(const CompressedPage& page) const;

  uint64_t page_bytes() const { return page_bytes_; }
  // Pages one GPU batch holds (1 when nothing decodes on the GPU).
  size_t batch_pages() const;
  int device() const { return device_; }
  // Pages decoded on the GPU / on the CPU so far (tests check the routing).
  uint64_t gpu_pages() const { return gpu_pages_; }
  uint64_t cpu_pages() const { return cpu_pages_; }

 private:
  GpuPageDecoder() = default;
  absl::Status DecodeOnCpu(const CompressedPage& page, uint8_t* dst);
  // EnqueueToDevice (dest disabled: into dst) and EnqueueToLayout (dest
  // enabled: dst empty, every page decoded on the GPU into the layout).
  absl::StatusOr<uint64_t> Enqueue(absl::Span<const CompressedPage> pages,
                                   absl::Span<uint8_t* const> dst,
                                   const gpu::PagedKvDest& dest);
  // The pages and destination of a decode into a layout: `dest` enabled and
  // every page one DecodesOnGpu accepts (else INVALID_ARGUMENT naming the
  // page and `caller`).
  absl::Status CheckLayoutPages(absl::Span<const CompressedPage> pages,
                                const gpu::PagedKvDest& dest,
                                const char* caller) const;
  // A batch EnqueueToDevice refused (`why`): the error of the first of its
  // pages that fails alone, naming it. `dest`: the batch's (block ids from
  // its first page), or disabled.
  absl::Status NameRefusedPage(absl::Span<const absl::Span<const uint8_t>> bufs,
                               absl::Span<const MutablePageRef> refs,
                               absl::Span<const uint64_t> handles,
                               const gpu::PagedKvDest& dest,
                               const absl::Status& why);

  Calibration calibration_;
  int device_ = 0;
  uint64_t page_bytes_ = 0;
  uint32_t page_size_ = 0;
  std::unique_ptr<gpu::KvtcBatchDecoder> kvtc_;  // null: not a kvtc namespace
  std::unique_ptr<PageDecoder> cpu_;
  absl::Mutex mu_;
  // The first page handle of each pending KVTC batch, by its ticket.
  std::map<uint64_t, uint64_t> batch_page_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> gpu_pages_{0};
  std::atomic<uint64_t> cpu_pages_{0};
};

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CUDA_GPU_DECODE_H_
