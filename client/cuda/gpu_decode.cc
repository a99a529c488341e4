#include "client/cuda/gpu_decode.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "client/page_decoder.h"
#include "core/base/byte_io.h"
#include "core/base/status_macros.h"
#include "core/codec/codec.h"
#include "core/codec/envelope.h"
#include "cuda/tier/device_tier.h"
#include "cuda/tier/kvtc_page_codecs.h"

namespace kvharbor {
namespace client {
namespace {

static_assert(static_cast<int>(GpuDecodeGemm::kFp32) ==
                  static_cast<int>(gpu::KvtcGemmMode::kFp32) &&
              static_cast<int>(GpuDecodeGemm::kTf32) ==
                  static_cast<int>(gpu::KvtcGemmMode::kTf32) &&
              static_cast<int>(GpuDecodeGemm::kBf16) ==
                  static_cast<int>(gpu::KvtcGemmMode::kBf16));

bool OnDevice(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // older runtimes flag unregistered host memory
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuPageDecoder>> GpuPageDecoder::Create(
    const Calibration& calibration, const Geometry& geometry,
    const GpuDecodeOptions& options) {
  const kvharbor::Geometry g = geometry.Resolved();
  if (absl::Status s = g.Validate("geometry"); !s.ok()) return s;
  std::unique_ptr<GpuPageDecoder> d(new GpuPageDecoder());
  d->calibration_ = calibration;
  d->device_ = options.device;
  d->page_bytes_ = g.PageBytes();
  d->page_size_ = g.page_size;
  d->cpu_ = std::make_unique<PageDecoder>();
  if (calibration.codec == "kvtc") {
    // Built as the daemon's device tier builds its decoder of cold pages.
    gpu::KvtcPageCodecs codecs(options.device);
    absl::StatusOr<std::unique_ptr<gpu::KvtcBatchDecoder>> k =
        codecs.CreateDecoder(
            g, std::make_shared<const std::string>(calibration.bytes),
            calibration.fingerprint, options.batch_pages,
            static_cast<gpu::KvtcGemmMode>(options.gemm));
    if (!k.ok()) return k.status();
    d->kvtc_ = *std::move(k);
  }
  return d;
}

GpuPageDecoder::~GpuPageDecoder() = default;

size_t GpuPageDecoder::batch_pages() const {
  return kvtc_ != nullptr ? kvtc_->batch_pages() : 1;
}

absl::Status GpuPageDecoder::DecodeOnCpu(const CompressedPage& page,
                                         uint8_t* dst) {
  // The CPU decoder asks for the calibration only for calibrated codecs;
  // this decoder has exactly one, so another fingerprint is refused there.
  const PageDecoder::CalibrationLoader load =
      [this](uint64_t) -> absl::StatusOr<Calibration> { return calibration_; };
  std::vector<uint8_t> out;
  absl::Status s = cpu_->Decode("", page, load, &out);
  if (!s.ok()) return s;
  if (out.size() != page_bytes_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "geometry: page %u decodes to %u bytes, the decoder's pages have %u",
        page.handle, out.size(), page_bytes_));
  }
  std::memcpy(dst, out.data(), out.size());
  ++cpu_pages_;
  return absl::OkStatus();
}

absl::Status GpuPageDecoder::Decode(absl::Span<const CompressedPage> pages,
                                    absl::Span<uint8_t* const> dst) {
  if (dst.size() != pages.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "dst: %u destinations for %u pages", dst.size(), pages.size()));
  }
  std::vector<absl::Span<const uint8_t>> gpu_bufs;
  std::vector<MutablePageRef> gpu_dst;
  std::vector<size_t> gpu_index;
  absl::Status first;
  for (size_t i = 0; i < pages.size(); ++i) {
    const CompressedPage& p = pages[i];
    if (dst[i] == nullptr || OnDevice(dst[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "dst: page %u needs a host destination (null or device memory "
          "given)",
          p.handle));
    }
    if (!DecodesOnGpu(p)) {
      absl::Status s = DecodeOnCpu(p, dst[i]);
      if (first.ok()) first = s;
      continue;
    }
    // The batch decoder checks each buffer in full (MergeKvtcPages); only
    // its first position is read here.
    absl::StatusOr<ParsedEnvelope> env = ParseEnvelope(AsBytes(p.buffer));
    if (!env.ok()) {
      if (first.ok()) {
        first = absl::DataLossError(
            absl::StrFormat("page %u: not a valid codec buffer: %s", p.handle,
                            env.status().message()));
      }
      continue;
    }
    gpu_bufs.push_back(AsBytes(p.buffer));
    gpu_dst.push_back(MutablePageRef{dst[i], env->position(0)});
    gpu_index.push_back(i);
  }
  if (gpu_bufs.empty()) return first;
  const std::vector<absl::Status> st = kvtc_->DecodeEach(gpu_bufs, gpu_dst);
  for (size_t k = 0; k < st.size(); ++k) {
    if (st[k].ok()) {
      ++gpu_pages_;
    } else if (first.ok()) {
      first =
          absl::Status(st[k].code(), absl::StrFormat("page %u: %s",
                                                     pages[gpu_index[k]].handle,
                                                     st[k].message()));
    }
  }
  return first;
}

absl::Status GpuPageDecoder::DecodeToDevice(
    absl::Span<const CompressedPage> pages, absl::Span<uint8_t* const> dst) {
  absl::StatusOr<uint64_t> t = EnqueueToDevice(pages, dst);
  absl::Status done = FinishToDevice(t.ok() ? *t : kAllTickets);
  return t.ok() ? done : t.status();
}

bool GpuPageDecoder::DecodesOnGpu(const CompressedPage& p) const {
  return kvtc_ != nullptr && p.codec == "kvtc" &&
         p.calibration_fingerprint == calibration_.fingerprint;
}

absl::StatusOr<uint64_t> GpuPageDecoder::EnqueueToDevice(
    absl::Span<const CompressedPage> pages, absl::Span<uint8_t* const> dst) {
  if (dst.size() != pages.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "dst: %u destinations for %u pages", dst.size(), pages.size()));
  }
  return Enqueue(pages, dst, gpu::PagedKvDest{});
}

absl::Status GpuPageDecoder::CheckLayoutPages(
    absl::Span<const CompressedPage> pages, const gpu::PagedKvDest& dest,
    const char* caller) const {
  if (!dest.enabled()) {
    return absl::InvalidArgumentError("dest: block_ids must be set");
  }
  for (const CompressedPage& p : pages) {
    if (!DecodesOnGpu(p)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "page %u: codec %s is not decoded on the GPU by this decoder "
          "(%s takes KVTC pages of its calibration only)",
          p.handle, p.codec, caller));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> GpuPageDecoder::EnqueueToLayout(
    absl::Span<const CompressedPage> pages, const gpu::PagedKvDest& dest) {
  KVH_RETURN_IF_ERROR(CheckLayoutPages(pages, dest, "EnqueueToLayout"));
  return Enqueue(pages, {}, dest);
}

namespace {

// Each merged batch of a copy region starts 256-byte aligned, as a lane's
// staging does.
constexpr uint64_t kMergedAlign = 256;

uint64_t AlignMerged(uint64_t n) {
  return (n + kMergedAlign - 1) / kMergedAlign * kMergedAlign;
}

}  // namespace

uint64_t GpuPageDecoder::MaxMergedBytes(size_t pages) const {
  if (kvtc_ == nullptr) return 0;
  const size_t bp = kvtc_->batch_pages();
  return (pages + bp - 1) / bp * AlignMerged(kvtc_->max_merged_bytes());
}

absl::StatusOr<uint64_t> GpuPageDecoder::MergeForLayout(
    absl::Span<const CompressedPage> pages, const gpu::PagedKvDest& dest,
    absl::Span<uint8_t> out, std::vector<MergedBatch>* batches) const {
  KVH_RETURN_IF_ERROR(CheckLayoutPages(pages, dest, "MergeForLayout"));
  const size_t bp = kvtc_->batch_pages();
  std::vector<MergedBatch> merged;
  uint64_t at = 0;
  for (size_t a = 0; a < pages.size(); a += bp) {
    const size_t n = std::min(bp, pages.size() - a);
    MergedBatch b;
    b.dest = dest;
    b.dest.block_ids += a;
    b.handle = pages[a].handle;
    std::vector<absl::Span<const uint8_t>> bufs;
    for (size_t i = a; i < a + n; ++i) {
      const CompressedPage& p = pages[i];
      // Only the position is read here: Merge checks each page in full,
      // body checksum included, so the body is hashed once.
      absl::StatusOr<ParsedEnvelope> env =
          ParseEnvelopeDeferBodyChecksum(AsBytes(p.buffer));
      if (!env.ok()) {
        return absl::DataLossError(
            absl::StrFormat("page %u: not a valid codec buffer: %s", p.handle,
                            env.status().message()));
      }
      bufs.push_back(AsBytes(p.buffer));
      b.refs.push_back(MutablePageRef{nullptr, env->position(0)});
    }
    if (at > out.size()) at = out.size();
    absl::StatusOr<size_t> size = kvtc_->Merge(bufs, out.subspan(at));
    if (!size.ok()) {
      // The first page that fails alone is the one to name.
      absl::Status why = size.status();
      size_t bad = a;
      for (size_t i = 0; i < n && n > 1; ++i) {
        absl::StatusOr<size_t> one = kvtc_->Merge(
            absl::MakeConstSpan(bufs).subspan(i, 1), out.subspan(at));
        if (!one.ok()) {
          why = one.status();
          bad = a + i;
          break;
        }
      }
      return absl::Status(
          why.code(),
          absl::StrFormat("page %u: %s", pages[bad].handle, why.message()));
    }
    b.merged = absl::MakeConstSpan(out.data() + at, *size);
    at += AlignMerged(*size);
    merged.push_back(std::move(b));
  }
  for (MergedBatch& b : merged) batches->push_back(std::move(b));
  return std::min<uint64_t>(at, out.size());
}

absl::StatusOr<std::vector<uint64_t>> GpuPageDecoder::EnqueueMergedToLayout(
    absl::Span<const MergedBatch> batches, const uint8_t* host_base,
    const uint8_t* device_base, cudaEvent_t ready) {
  if (kvtc_ == nullptr) {
    return absl::FailedPreconditionError(
        "EnqueueMergedToLayout: this decoder decodes nothing on the GPU");
  }
  std::vector<uint64_t> tickets;
  for (const MergedBatch& b : batches) {
    if (b.merged.data() < host_base) {
      return absl::InvalidArgumentError(
          "batches: a merged batch lies before host_base");
    }
    const gpu::KvtcDeviceInput input{
        device_base + (b.merged.data() - host_base), ready};
    absl::StatusOr<uint64_t> t =
        kvtc_->EnqueueMerged(b.merged, b.refs, b.dest, input);
    if (!t.ok()) {
      return absl::Status(
          t.status().code(),
          absl::StrFormat("page %u: %s", b.handle, t.status().message()));
    }
    {
      absl::MutexLock l(&mu_);
      batch_page_[*t] = b.handle;
    }
    gpu_pages_ += b.refs.size();
    tickets.push_back(*t);
  }
  return tickets;
}

absl::StatusOr<uint64_t> GpuPageDecoder::Enqueue(
    absl::Span<const CompressedPage> pages, absl::Span<uint8_t* const> dst,
    const gpu::PagedKvDest& dest) {
  std::vector<absl::Span<const uint8_t>> bufs;
  std::vector<MutablePageRef> refs;
  std::vector<uint64_t> handles;
  uint64_t ticket = 0;
  size_t batch_first = 0;  // call page of bufs[0]
  auto flush = [&]() -> absl::Status {
    if (bufs.empty()) return absl::OkStatus();
    gpu::PagedKvDest d = dest;
    if (d.enabled()) d.block_ids += batch_first;
    absl::StatusOr<uint64_t> t = kvtc_->EnqueueToDevice(bufs, refs, d);
    if (!t.ok()) return NameRefusedPage(bufs, refs, handles, d, t.status());
    ticket = *t;
    {
      absl::MutexLock l(&mu_);
      batch_page_[ticket] = handles[0];
    }
    gpu_pages_ += bufs.size();
    bufs.clear();
    refs.clear();
    handles.clear();
    return absl::OkStatus();
  };
  std::vector<uint8_t> host;
  for (size_t i = 0; i < pages.size(); ++i) {
    const CompressedPage& p = pages[i];
    if (!DecodesOnGpu(p)) {
      host.resize(page_bytes_);
      absl::Status s = DecodeOnCpu(p, host.data());
      if (!s.ok()) return s;
      if (cudaError_t e = cudaMemcpy(dst[i], host.data(), page_bytes_,
                                     cudaMemcpyHostToDevice);
          e != cudaSuccess) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "dst: page %u: cudaMemcpy: %s", p.handle, cudaGetErrorString(e)));
      }
      continue;
    }
    absl::StatusOr<ParsedEnvelope> env = ParseEnvelope(AsBytes(p.buffer));
    if (!env.ok()) {
      return absl::DataLossError(
          absl::StrFormat("page %u: not a valid codec buffer: %s", p.handle,
                          env.status().message()));
    }
    if (bufs.empty()) batch_first = i;
    handles.push_back(p.handle);
    bufs.push_back(AsBytes(p.buffer));
    refs.push_back(
        MutablePageRef{dest.enabled() ? nullptr : dst[i], env->position(0)});
    if (bufs.size() == kvtc_->batch_pages()) {
      if (absl::Status s = flush(); !s.ok()) return s;
    }
  }
  if (absl::Status s = flush(); !s.ok()) return s;
  return ticket;
}

absl::Status GpuPageDecoder::NameRefusedPage(
    absl::Span<const absl::Span<const uint8_t>> bufs,
    absl::Span<const MutablePageRef> refs, absl::Span<const uint64_t> handles,
    const gpu::PagedKvDest& dest, const absl::Status& why) {
  // Every batch of the call is finished first; then the pages alone until
  // one fails, so that the error names it.
  FinishToDevice(kAllTickets).IgnoreError();
  for (size_t k = 0; k < bufs.size() && bufs.size() > 1; ++k) {
    gpu::PagedKvDest d = dest;
    if (d.enabled()) d.block_ids += k;
    absl::StatusOr<uint64_t> one =
        kvtc_->EnqueueToDevice(bufs.subspan(k, 1), refs.subspan(k, 1), d);
    absl::Status s = one.ok() ? kvtc_->FinishToDevice(*one) : one.status();
    if (!s.ok()) {
      return absl::Status(
          s.code(), absl::StrFormat("page %u: %s", handles[k], s.message()));
    }
  }
  return absl::Status(
      why.code(), absl::StrFormat("page %u: %s", handles[0], why.message()));
}

absl::Status GpuPageDecoder::FinishToDevice(uint64_t ticket) {
  if (kvtc_ == nullptr || ticket == 0) return absl::OkStatus();
  std::vector<std::pair<uint64_t, uint64_t>> batches;
  {
    absl::MutexLock l(&mu_);
    const auto end = batch_page_.upper_bound(ticket);
    batches.assign(batch_page_.begin(), end);
    batch_page_.erase(batch_page_.begin(), end);
  }
  // Batch by batch, so that a failure names its batch's first page.
  absl::Status first;
  for (const auto& [t, page] : batches) {
    absl::Status s = kvtc_->FinishToDevice(t);
    if (!s.ok() && first.ok()) {
      first = absl::Status(s.code(), absl::StrFormat("batch from page %u: %s",
                                                     page, s.message()));
    }
  }
  if (ticket == kAllTickets) {
    absl::Status s = kvtc_->FinishToDevice(ticket);
    if (first.ok()) first = s;
  }
  return first;
}

}  // namespace client
}  // namespace kvharbor
