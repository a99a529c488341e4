#include "cuda/codec/kvtc_gpu_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "cuda/codec/kvtc_gpu_internal.h"
#include "cuda/kernels/coeff_utils.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/rope_table.h"

namespace kvharbor {
namespace gpu {
namespace {

constexpr const char* kKvName[2] = {"keys", "values"};

uint64_t Align(uint64_t v) { return (v + 255) / 256 * 256; }

// Allocates a region of `bytes` at the end of `*total`; returns its offset.
uint64_t Take(uint64_t* total, uint64_t bytes) {
  const uint64_t at = *total;
  *total = Align(*total + bytes);
  return at;
}

// Frees device memory on scope exit (errors at exit have nowhere to go).
struct DeviceBuffer {
  void* p = nullptr;
  ~DeviceBuffer() {
    if (p != nullptr) cudaFree(p);
  }
};

// A stream created for one synchronous Codec call.
struct OwnedStream {
  cudaStream_t s = nullptr;
  ~OwnedStream() {
    if (s != nullptr) cudaStreamDestroy(s);
  }
};

}  // namespace

KvtcGpuCodec::DeviceCalibration::~DeviceCalibration() {
  for (int kv = 0; kv < 2; ++kv) {
    if (mean[kv] != nullptr) cudaFree(mean[kv]);
    if (projection[kv] != nullptr) cudaFree(projection[kv]);
  }
  if (inv_freq != nullptr) cudaFree(inv_freq);
}

absl::StatusOr<PointerKind> ClassifyPointer(const void* p, int device,
                                            const char* field) {
  cudaPointerAttributes attr;
  KVH_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, p));
  PointerKind k;
  switch (attr.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
      if (attr.type == cudaMemoryTypeDevice && attr.device != device) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: device memory of device %d, the codec runs on device %d",
            field, attr.device, device));
      }
      k.device_ptr = static_cast<uint8_t*>(const_cast<void*>(p));
      return k;
    case cudaMemoryTypeHost:
      if (attr.devicePointer == nullptr) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: pinned host memory not mapped into the device", field));
      }
      k.host = true;
      k.device_ptr = static_cast<uint8_t*>(attr.devicePointer);
      return k;
    default:
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: pageable host memory; the GPU codec needs device memory or "
          "pinned host memory (cudaHostAlloc / cudaHostRegister)",
          field));
  }
}

absl::Status CheckNoPendingDecode(const KvtcGpuWorkspace& ws,
                                  const WorkspaceCarve& c) {
  if (PendingDecodeOf(ws, c)->mark == kPendingDecodeMark) {
    return absl::FailedPreconditionError(
        "workspace: a DecodeAsync on it awaits FinishDecode");
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkspaceCarve> CarveWorkspace(const KvtcGpuCodec& codec,
                                              size_t max_pages) {
  if (max_pages == 0 || max_pages > kMaxPagesPerBuffer) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_pages: %u is out of range [1, %u]", max_pages,
                        kMaxPagesPerBuffer));
  }
  const KvtcCalibration& cal = codec.calibration();
  const Geometry& g = codec.geometry();
  const bool per_token = cal.row_kind == KvtcRowKind::kPerToken;
  const uint64_t tokens = uint64_t{max_pages} * g.page_size;
  const uint64_t max_rows =
      per_token ? tokens : uint64_t{max_pages} * g.num_layers;
  const uint64_t max_sinks =
      uint64_t{max_pages} * std::min<uint64_t>(g.page_size, cal.sink_tokens);
  const uint64_t features = cal.keys.features;
  const uint64_t comps = std::max(cal.keys.components, cal.values.components);
  KVH_ASSIGN_OR_RETURN(const size_t staging, codec.MaxEncodedSize(max_pages));
  WorkspaceCarve c;
  c.chunk_rows = std::min<uint64_t>(
      std::max<uint32_t>(codec.options().max_rows_per_chunk, 1), max_rows);
  c.rope_bytes = cal.rope_style == RopeStyle::kNone
                     ? 0
                     : tokens * (g.head_dim / 2) * sizeof(float);
  const bool bf16 = codec.options().gemm_mode == KvtcGemmMode::kBf16;
  uint64_t d = 0;
  c.pages = Take(&d, max_pages * sizeof(KvtcPageInfo));
  c.rows = Take(&d, per_token ? max_rows * sizeof(KvtcTokenRef) : 0);
  c.sinks = Take(&d, max_sinks * sizeof(KvtcTokenRef));
  c.rope = Take(&d, 2 * c.rope_bytes);
  c.x = Take(&d, c.chunk_rows * features * sizeof(float));
  c.y = Take(&d, c.chunk_rows * comps * sizeof(float));
  c.y_bf16 = Take(&d, bf16 ? c.chunk_rows * comps * 2 : 0);
  c.minmax = Take(&d, 2 * c.chunk_rows * sizeof(float));
  c.error = Take(&d, sizeof(unsigned long long));
  c.cublas = Take(&d, kProjectionGemmWorkspaceBytes);
  c.staging = Take(&d, staging);
  c.staging_bytes = staging;
  c.device_total = d;
  const uint64_t header_bytes =
      kKvtcNumSections * kKvtcSectionHeaderBytes +
      (cal.keys.ranges.size() + cal.values.ranges.size() + 1) *
          kKvtcRangeHeaderBytes;
  uint64_t p = 0;
  c.p_pages = Take(&p, max_pages * sizeof(KvtcPageInfo));
  c.p_rows = Take(&p, per_token ? max_rows * sizeof(KvtcTokenRef) : 0);
  c.p_sinks = Take(&p, max_sinks * sizeof(KvtcTokenRef));
  c.p_headers = Take(&p, header_bytes);
  c.p_error = Take(&p, sizeof(unsigned long long));
  c.p_decode = Take(&p, sizeof(PendingDecode));
  c.pinned_total = p;
  return c;
}

KvtcGpuCodec::KvtcGpuCodec(std::unique_ptr<KvtcCodec> cpu,
                           const KvtcGpuOptions& options, bool zstd,
                           int zstd_level)
    : cpu_(std::move(cpu)),
      options_(options),
      zstd_(zstd),
      zstd_level_(zstd_level),
      dev_(std::make_unique<DeviceCalibration>()) {}

KvtcGpuCodec::~KvtcGpuCodec() = default;

absl::StatusOr<std::unique_ptr<KvtcGpuCodec>> KvtcGpuCodec::Create(
    const CodecParams& params, const KvtcGpuOptions& options) {
  KVH_ASSIGN_OR_RETURN(std::unique_ptr<KvtcCodec> cpu,
                       KvtcCodec::Create(params));
  if (options.gemm_mode != KvtcGemmMode::kFp32 &&
      options.gemm_mode != KvtcGemmMode::kTf32 &&
      options.gemm_mode != KvtcGemmMode::kBf16) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.gemm_mode: unknown value ",
                     static_cast<int>(options.gemm_mode)));
  }
  if (options.max_rows_per_chunk == 0 ||
      options.max_rows_per_chunk > 0x7FFFFFFFu) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.max_rows_per_chunk: ", options.max_rows_per_chunk,
                     " is out of range [1, 2^31)"));
  }
  const KvtcCalibration& cal = cpu->calibration();
  if (cal.keys.components > 0x7FFFFFFFu ||
      cal.values.components > 0x7FFFFFFFu) {
    return absl::InvalidArgumentError(
        "calibration: components over the cuBLAS limit 2^31 - 1");
  }
  std::unique_ptr<KvtcGpuCodec> codec(new KvtcGpuCodec(
      std::move(cpu), options, params.zstd, params.zstd_level));
  KVH_CUDA_RETURN_IF_ERROR(cudaGetDevice(&codec->device_));
  KVH_ASSIGN_OR_RETURN(codec->native_fp8_, ResolveNativeFp8(options.fp8_path));
  KVH_RETURN_IF_ERROR(codec->Upload());
  return codec;
}

absl::Status KvtcGpuCodec::Upload() {
  const KvtcCalibration& cal = calibration();
  for (int kv = 0; kv < 2; ++kv) {
    const KvtcBasis& b = kv == 0 ? cal.keys : cal.values;
    const size_t mean_bytes = b.mean.size() * sizeof(float);
    KVH_CUDA_RETURN_IF_ERROR(
        cudaMalloc(reinterpret_cast<void**>(&dev_->mean[kv]), mean_bytes));
    KVH_CUDA_RETURN_IF_ERROR(cudaMemcpy(dev_->mean[kv], b.mean.data(),
                                        mean_bytes, cudaMemcpyHostToDevice));
    // A block-diagonal basis runs as one dense GEMM (zeros off the blocks).
    std::vector<float> dense;
    const float* proj = b.projection.data();
    if (!b.blocks.empty()) {
      dense = DenseProjection(b);
      proj = dense.data();
    }
    const size_t n = b.features * b.components;
    if (options_.gemm_mode != KvtcGemmMode::kBf16) {
      KVH_CUDA_RETURN_IF_ERROR(cudaMalloc(&dev_->projection[kv], n * 4));
      KVH_CUDA_RETURN_IF_ERROR(cudaMemcpy(dev_->projection[kv], proj, n * 4,
                                          cudaMemcpyHostToDevice));
      continue;
    }
    // BF16 mode keeps only the bf16 copy, converted on the device.
    DeviceBuffer tmp;
    KVH_CUDA_RETURN_IF_ERROR(cudaMalloc(&tmp.p, n * 4));
    KVH_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(tmp.p, proj, n * 4, cudaMemcpyHostToDevice));
    KVH_CUDA_RETURN_IF_ERROR(cudaMalloc(&dev_->projection[kv], n * 2));
    ConvertToBf16Args conv;
    conv.in = static_cast<const float*>(tmp.p);
    conv.out = static_cast<uint16_t*>(dev_->projection[kv]);
    conv.count = n;
    KVH_RETURN_IF_ERROR(LaunchConvertToBf16(conv, nullptr));
    KVH_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  }
  if (cal.rope_style != RopeStyle::kNone) {
    const std::vector<double> f = RopeInvFreq(cal.head_dim, cal.rope_theta);
    KVH_CUDA_RETURN_IF_ERROR(cudaMalloc(
        reinterpret_cast<void**>(&dev_->inv_freq), f.size() * sizeof(double)));
    KVH_CUDA_RETURN_IF_ERROR(cudaMemcpy(dev_->inv_freq, f.data(),
                                        f.size() * sizeof(double),
                                        cudaMemcpyHostToDevice));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> KvtcGpuCodec::MaxEncodedSize(size_t num_pages) const {
  return cpu_->MaxEncodedSize(num_pages);
}

absl::StatusOr<size_t> KvtcGpuCodec::EncodedSize(
    absl::Span<const PageRef> pages) const {
  return cpu_->EncodedSize(pages);
}

absl::StatusOr<KvtcGpuWorkspaceSizes> KvtcGpuCodec::WorkspaceSizes(
    size_t max_pages) const {
  KVH_ASSIGN_OR_RETURN(const WorkspaceCarve c,
                       CarveWorkspace(*this, max_pages));
  KvtcGpuWorkspaceSizes s;
  s.device_bytes = c.device_total;
  s.pinned_bytes = c.pinned_total;
  return s;
}

std::string KvtcGpuCodec::DescribeError(
    unsigned long long code, absl::Span<const uint64_t> positions) const {
  const unsigned section = static_cast<unsigned>(code >> 56);
  const auto kind = static_cast<KvtcErrorKind>((code >> 48) & 0xFF);
  uint64_t row = code & ((1ull << 48) - 1);
  const KvtcCalibration& cal = calibration();
  const uint32_t page_size = geometry().page_size;
  auto sinks_in = [&](size_t p) -> uint64_t {
    return positions[p] >= cal.sink_tokens
               ? 0
               : std::min<uint64_t>(page_size, cal.sink_tokens - positions[p]);
  };
  std::string where = "unknown row";
  if (section == 2 || cal.row_kind == KvtcRowKind::kPerToken) {
    for (size_t p = 0; p < positions.size(); ++p) {
      const uint64_t n = section == 2 ? sinks_in(p) : page_size - sinks_in(p);
      if (row < n) {
        const uint64_t t = section == 2 ? row : sinks_in(p) + row;
        where = absl::StrFormat("pages[%u] token %u (position %u)", p, t,
                                positions[p] + t);
        break;
      }
      row -= n;
    }
  } else {
    where = absl::StrFormat("pages[%u] layer %u", row / geometry().num_layers,
                            row % geometry().num_layers);
  }
  const char* what = section < 2 ? kKvName[section] : "keys or values";
  switch (kind) {
    case KvtcErrorKind::kCorruptData:
      return DescribeDataError(code);
    case KvtcErrorKind::kNonFiniteInput:
    case KvtcErrorKind::kNonFiniteSink:
      return absl::StrCat(where, ": ", what, " hold a non-finite value");
    case KvtcErrorKind::kNonFiniteCoefficient:
      return absl::StrCat(where, ": ", what,
                          " hold a non-finite value (or values too large to "
                          "project)");
    case KvtcErrorKind::kCoefficientSpan:
      return absl::StrCat(where, ": ", what,
                          " coefficients span more than float can hold");
  }
  return absl::StrFormat("%s: error code %016x", where, code);
}

std::string KvtcGpuCodec::DescribeDataError(unsigned long long code) const {
  const unsigned section = static_cast<unsigned>(code >> 56);
  const uint64_t range = (code >> kKvtcDataRowBits) & 0xFFF;
  const uint64_t row = code & ((1ull << kKvtcDataRowBits) - 1);
  const KvtcCalibration& cal = calibration();
  bool fp8 = section == 2;
  if (section < 2) {
    const KvtcBasis& b = section == 0 ? cal.keys : cal.values;
    fp8 = range < b.ranges.size() &&
          b.ranges[range].quant_type == KvtcQuantType::kFp8;
  }
  if (fp8) {
    return absl::StrFormat(
        "buffer: sections[%u].ranges[%u]: FP8 NaN code in row %u", section,
        range, row);
  }
  return absl::StrFormat(
      "buffer: sections[%u].ranges[%u].metadata: row %u has a min / max that "
      "is not finite, or min > max",
      section, range, row);
}

absl::StatusOr<size_t> KvtcGpuCodec::FinishEncode(
    absl::Span<const PageRef> pages, absl::Span<uint8_t> host_out,
    const KvtcGpuWorkspace& ws, CodecWorkspace* scratch) const {
  KVH_ASSIGN_OR_RETURN(const size_t need, EncodedSize(pages));
  if (host_out.size() < need) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "host_out: %u bytes, the encoded batch has %u", host_out.size(), need));
  }
  if (ws.done == nullptr || ws.pinned == nullptr) {
    return absl::InvalidArgumentError(
        "workspace: done event and pinned memory "
        "must be set");
  }
  KVH_ASSIGN_OR_RETURN(const WorkspaceCarve c,
                       CarveWorkspace(*this, ws.max_pages));
  KVH_RETURN_IF_ERROR(CheckNoPendingDecode(ws, c));
  KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ws.done));
  unsigned long long code;
  std::memcpy(&code, static_cast<uint8_t*>(ws.pinned) + c.p_error, 8);
  if (code != kKvtcNoError) {
    std::vector<uint64_t> positions(pages.size());
    for (size_t i = 0; i < pages.size(); ++i) {
      positions[i] = pages[i].first_position;
    }
    return absl::InvalidArgumentError(DescribeError(code, positions));
  }
  EnvelopeHeader h;
  h.codec_id = CodecId::kKvtc;
  h.geometry = geometry();
  h.row_kind = static_cast<uint32_t>(calibration().row_kind);
  h.num_sections = kKvtcNumSections;
  h.calibration_fingerprint = cpu_->calibration_fingerprint();
  CodecWorkspace local;
  return FinishEnvelope(
      h, pages, need - kEnvelopeHeaderBytes - 8 * pages.size(), zstd_,
      zstd_level_, host_out, scratch != nullptr ? scratch : &local);
}

absl::StatusOr<size_t> KvtcGpuCodec::Encode(absl::Span<const PageRef> pages,
                                            absl::Span<uint8_t> out,
                                            CodecWorkspace* workspace) const {
  KVH_ASSIGN_OR_RETURN(const size_t need, EncodedSize(pages));
  if (out.size() < need) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("out: %u bytes, encoding needs %u", out.size(), need));
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  KVH_ASSIGN_OR_RETURN(auto holder,
                       KvtcGpuWorkspaceHolder::Create(*this, pages.size()));
  const KvtcGpuWorkspace& ws = holder->get();
  OwnedStream stream;
  KVH_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
  cudaPointerAttributes attr;
  KVH_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, out.data()));
  if (attr.type == cudaMemoryTypeHost && attr.devicePointer != nullptr) {
    KVH_RETURN_IF_ERROR(
        EncodeAsync(pages, out.data(), out.size(), ws, stream.s).status());
  } else {
    // Any other host memory: encode into the staging region, copy back.
    KVH_ASSIGN_OR_RETURN(const WorkspaceCarve c,
                         CarveWorkspace(*this, ws.max_pages));
    uint8_t* staging = static_cast<uint8_t*>(ws.device) + c.staging;
    KVH_RETURN_IF_ERROR(
        EncodeAsync(pages, staging, c.staging_bytes, ws, stream.s).status());
    const size_t head = kEnvelopeHeaderBytes + 8 * pages.size();
    KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data() + head, staging + head,
                                             need - head,
                                             cudaMemcpyDeviceToHost, stream.s));
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream.s));
  return FinishEncode(pages, out, ws, workspace);
}

absl::Status KvtcGpuCodec::FinishDecode(absl::Span<const uint8_t> buffer,
                                        const KvtcGpuWorkspace& ws) const {
  if (ws.done == nullptr || ws.pinned == nullptr) {
    return absl::InvalidArgumentError(
        "workspace: done event and pinned memory must be set");
  }
  KVH_ASSIGN_OR_RETURN(const WorkspaceCarve c,
                       CarveWorkspace(*this, ws.max_pages));
  if (ws.pinned_bytes < c.pinned_total) {
    return absl::InvalidArgumentError(
        absl::StrFormat("workspace: %u pinned bytes, %u pages need %u",
                        ws.pinned_bytes, ws.max_pages, c.pinned_total));
  }
  PendingDecode* pending = PendingDecodeOf(ws, c);
  if (pending->mark != kPendingDecodeMark) {
    return absl::FailedPreconditionError(
        "workspace: no DecodeAsync on it awaits FinishDecode");
  }
  if (pending->buffer != reinterpret_cast<uintptr_t>(buffer.data()) ||
      pending->buffer_bytes != buffer.size()) {
    return absl::InvalidArgumentError(
        "buffer: not the buffer given to the pending DecodeAsync");
  }
  // The checksum pass runs here, on the caller's thread, while the GPU
  // decodes; the wait comes after it, and always (the GPU may still read
  // `buffer` and write the pages).
  const absl::Status checksum =
      CheckBodyChecksum(buffer, pending->body_checksum);
  const absl::Status waited = [&]() -> absl::Status {
    KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ws.done));
    return absl::OkStatus();
  }();
  pending->mark = 0;
  KVH_RETURN_IF_ERROR(waited);
  KVH_RETURN_IF_ERROR(checksum);
  unsigned long long code;
  std::memcpy(&code, static_cast<uint8_t*>(ws.pinned) + c.p_error, 8);
  if (code != kKvtcNoError) {
    if (static_cast<KvtcErrorKind>((code >> 48) & 0xFF) !=
        KvtcErrorKind::kCorruptData) {
      return absl::InternalError(
          absl::StrFormat("decode: unexpected error code %016x", code));
    }
    return absl::InvalidArgumentError(DescribeDataError(code));
  }
  return absl::OkStatus();
}

absl::Status KvtcGpuCodec::Decode(absl::Span<const uint8_t> buffer,
                                  absl::Span<const MutablePageRef> pages,
                                  CodecWorkspace* workspace) const {
  KVH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (pages.empty() || pages.size() > kMaxPagesPerBuffer) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pages: %u given, want [1, %u]", pages.size(), kMaxPagesPerBuffer));
  }
  KVH_ASSIGN_OR_RETURN(auto holder,
                       KvtcGpuWorkspaceHolder::Create(*this, pages.size()));
  OwnedStream stream;
  KVH_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
  KVH_RETURN_IF_ERROR(
      DecodeAsync(buffer, pages, holder->get(), stream.s, workspace));
  return FinishDecode(buffer, holder->get());
}

absl::StatusOr<std::unique_ptr<KvtcGpuWorkspaceHolder>>
KvtcGpuWorkspaceHolder::Create(const KvtcGpuCodec& codec, size_t max_pages) {
  KVH_ASSIGN_OR_RETURN(const KvtcGpuWorkspaceSizes sizes,
                       codec.WorkspaceSizes(max_pages));
  std::unique_ptr<KvtcGpuWorkspaceHolder> h(new KvtcGpuWorkspaceHolder());
  KvtcGpuWorkspace& ws = h->ws_;
  ws.max_pages = max_pages;
  KVH_CUDA_RETURN_IF_ERROR(cudaMalloc(&ws.device, sizes.device_bytes));
  ws.device_bytes = sizes.device_bytes;
  KVH_CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&ws.pinned, sizes.pinned_bytes, cudaHostAllocDefault));
  ws.pinned_bytes = sizes.pinned_bytes;
  std::memset(ws.pinned, 0, ws.pinned_bytes);  // no decode pending
  KVH_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&ws.uploaded, cudaEventDisableTiming));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&ws.done, cudaEventDisableTiming));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&ws.copy_stream, cudaStreamNonBlocking));
  KVH_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&ws.copy_event, cudaEventDisableTiming));
  KVH_CUBLAS_RETURN_IF_ERROR(cublasCreate(&ws.cublas));
  return h;
}

KvtcGpuWorkspaceHolder::~KvtcGpuWorkspaceHolder() {
  // Pending work may still use the memory: wait for it first.
  if (ws_.done != nullptr) cudaEventSynchronize(ws_.done);
  if (ws_.copy_stream != nullptr) cudaStreamSynchronize(ws_.copy_stream);
  if (ws_.cublas != nullptr) cublasDestroy(ws_.cublas);
  if (ws_.copy_event != nullptr) cudaEventDestroy(ws_.copy_event);
  if (ws_.copy_stream != nullptr) cudaStreamDestroy(ws_.copy_stream);
  if (ws_.uploaded != nullptr) cudaEventDestroy(ws_.uploaded);
  if (ws_.done != nullptr) cudaEventDestroy(ws_.done);
  if (ws_.pinned != nullptr) cudaFreeHost(ws_.pinned);
  if (ws_.device != nullptr) cudaFree(ws_.device);
}

absl::Status RegisterKvtcGpuCodec(CodecRegistry& registry) {
  return registry.Register(
      "kvtc_gpu",
      [](const CodecParams& p) -> absl::StatusOr<std::unique_ptr<Codec>> {
        KVH_ASSIGN_OR_RETURN(std::unique_ptr<KvtcGpuCodec> c,
                             KvtcGpuCodec::Create(p));
        return std::unique_ptr<Codec>(std::move(c));
      });
}

}  // namespace gpu
}  // namespace kvharbor
