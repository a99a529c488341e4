// KvtcGpuCodec's asynchronous paths: batch preparation, uploads, and the
// kernel / cuBLAS sequence of encode and decode.
#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "cuda/codec/kvtc_gpu_codec.h"
#include "cuda/codec/kvtc_gpu_internal.h"
#include "cuda/kernels/coeff_utils.h"
#include "cuda/kernels/cuda_check.h"
#include "cuda/kernels/fp8_quantize.h"
#include "cuda/kernels/gather_mean_subtract.h"
#include "cuda/kernels/intx_quantize.h"
#include "cuda/kernels/mean_add_scatter.h"
#include "cuda/kernels/minmax_reduce.h"
#include "cuda/kernels/rope_table.h"
#include "cuda/kernels/sink_fp8.h"

namespace kvharbor {
namespace gpu {
namespace {

static_assert(kDTypeBf16 == static_cast<int>(DType::kBF16) &&
                  kDTypeFp16 == static_cast<int>(DType::kFP16) &&
                  kDTypeFp32 == static_cast<int>(DType::kFP32) &&
                  kDTypeFp8E4M3 == static_cast<int>(DType::kFP8E4M3),
              "kernel dtype constants must match core DType");
static_assert(static_cast<int>(PageLayout::kKvLayerTokenHeadDim) == 1 &&
                  static_cast<int>(PageLayout::kLayerKvTokenHeadDim) == 2,
              "KvtcPageShape::RunIndex assumes these layout values");

KvtcPageShape ShapeOf(const Geometry& g) {
  KvtcPageShape s;
  s.num_layers = g.num_layers;
  s.num_kv_heads = g.num_kv_heads;
  s.head_dim = g.head_dim;
  s.page_size = g.page_size;
  s.dtype = static_cast<int>(g.dtype);
  s.layout = static_cast<int>(g.layout);
  return s;
}

// Whether the section's ranges leave some component to be decoded as 0.
bool HasGaps(const KvtcSectionLayout& s) {
  uint64_t covered = 0;
  for (const KvtcRangeLayout& r : s.ranges) {
    covered += r.range.end_idx - r.range.start_idx;
  }
  return covered != s.components;
}

// The fields sink encode and decode args (SinkEncodeArgs, SinkDecodeArgs)
// share, for the sink tokens of batch `b`.
template <typename Args, typename BatchT>
Args SinkArgs(const BatchT& b, const Geometry& g, bool native_fp8) {
  Args a;
  a.shape = ShapeOf(g);
  a.pages = b.d_pages();
  a.num_pages = static_cast<uint32_t>(b.num_pages);
  a.sinks = b.d_sinks();
  a.num_sinks = static_cast<uint32_t>(b.layout.sink_rows);
  a.native_fp8 = native_fp8;
  return a;
}

// fn(first_row, rows) for the chunks of section kv's rows that fit batch
// `b`'s workspace (b.carve.chunk_rows each, the last shorter), in order;
// stops at the first error.
template <typename BatchT, typename Fn>
absl::Status ForEachChunk(const BatchT& b, int kv, Fn&& fn) {
  const uint64_t rows = b.layout.sections[kv].rows;
  const uint64_t chunk = b.carve.chunk_rows;
  for (uint64_t r0 = 0; r0 < rows; r0 += chunk) {
    KVH_RETURN_IF_ERROR(
        fn(r0, static_cast<uint32_t>(std::min(chunk, rows - r0))));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KvtcGpuCodec::Batch> KvtcGpuCodec::PrepareBatch(
    absl::Span<const uint64_t> positions, absl::Span<uint8_t* const> data,
    const KvtcGpuWorkspace& ws, const PagedKvDest& dest) const {
  if (ws.device == nullptr || ws.pinned == nullptr || ws.cublas == nullptr ||
      ws.uploaded == nullptr || ws.done == nullptr) {
    return absl::InvalidArgumentError(
        "workspace: device, pinned, cublas, uploaded and done must be set");
  }
  if (positions.size() > ws.max_pages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pages: %u pages, the workspace was sized for %u",
                        positions.size(), ws.max_pages));
  }
  Batch b;
  KVH_ASSIGN_OR_RETURN(b.carve, CarveWorkspace(*this, ws.max_pages));
  if (ws.device_bytes < b.carve.device_total ||
      ws.pinned_bytes < b.carve.pinned_total) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "workspace: %u device / %u pinned bytes, %u pages need %u / %u",
        ws.device_bytes, ws.pinned_bytes, ws.max_pages, b.carve.device_total,
        b.carve.pinned_total));
  }
  // The error word is the pending decode's until FinishDecode reads it.
  KVH_RETURN_IF_ERROR(CheckNoPendingDecode(ws, b.carve));
  int current = -1;
  KVH_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
  if (current != device_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "device: the current device is %d, the codec was created on %d",
        current, device_));
  }
  KVH_ASSIGN_OR_RETURN(b.layout, cpu_->PayloadLayout(positions));
  b.num_pages = positions.size();
  b.positions.assign(positions.begin(), positions.end());
  b.data.resize(b.num_pages);
  b.sinks.resize(b.num_pages);
  const size_t elem = DTypeSize(geometry().dtype);
  const uint32_t sink_tokens = calibration().sink_tokens;
  b.pages_aligned16 = !dest.enabled();
  b.dest = dest;
  for (size_t i = 0; i < b.num_pages; ++i) {
    b.sinks[i] = positions[i] >= sink_tokens
                     ? 0
                     : static_cast<uint32_t>(std::min<uint64_t>(
                           geometry().page_size, sink_tokens - positions[i]));
    if (dest.enabled()) {
      b.data[i] = nullptr;  // the kernels write the layout
      continue;
    }
    if (reinterpret_cast<uintptr_t>(data[i]) % elem != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pages[%u].data: not aligned to the %u-byte element", i, elem));
    }
    b.data[i] = data[i];
    if (options_.check_page_pointers) {
      const std::string field = absl::StrFormat("pages[%u].data", i);
      KVH_ASSIGN_OR_RETURN(const PointerKind k,
                           ClassifyPointer(data[i], device_, field.c_str()));
      b.data[i] = k.device_ptr;
    }
    b.pages_aligned16 &= reinterpret_cast<uintptr_t>(b.data[i]) % 16 == 0;
  }
  b.dev = static_cast<uint8_t*>(ws.device);
  b.pin = static_cast<uint8_t*>(ws.pinned);
  return b;
}

absl::Status KvtcGpuCodec::StageTables(const Batch& b,
                                       const KvtcGpuWorkspace& ws,
                                       cudaStream_t stream) const {
  // The previous call's uploads from the pinned region must be done.
  KVH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ws.uploaded));
  auto* pages = reinterpret_cast<KvtcPageInfo*>(b.pin + b.carve.p_pages);
  auto* rows = reinterpret_cast<KvtcTokenRef*>(b.pin + b.carve.p_rows);
  auto* sinks = reinterpret_cast<KvtcTokenRef*>(b.pin + b.carve.p_sinks);
  const bool per_token = calibration().row_kind == KvtcRowKind::kPerToken;
  const uint32_t page_size = geometry().page_size;
  uint64_t nrows = 0, nsinks = 0;
  for (size_t p = 0; p < b.num_pages; ++p) {
    pages[p].data = b.data[p];
    pages[p].first_position = b.positions[p];
    pages[p].sinks = b.sinks[p];
    pages[p].reserved = 0;
    for (uint32_t t = 0; t < b.sinks[p]; ++t) {
      sinks[nsinks++] = {static_cast<uint32_t>(p), t};
    }
    if (!per_token) continue;
    for (uint32_t t = b.sinks[p]; t < page_size; ++t) {
      rows[nrows++] = {static_cast<uint32_t>(p), t};
    }
  }
  KVH_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(b.d_error(), 0xFF, sizeof(unsigned long long), stream));
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.d_pages(), pages,
                                           b.num_pages * sizeof(KvtcPageInfo),
                                           cudaMemcpyHostToDevice, stream));
  if (nrows > 0) {
    KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.d_rows(), rows,
                                             nrows * sizeof(KvtcTokenRef),
                                             cudaMemcpyHostToDevice, stream));
  }
  if (nsinks > 0) {
    KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.d_sinks(), sinks,
                                             nsinks * sizeof(KvtcTokenRef),
                                             cudaMemcpyHostToDevice, stream));
  }
  if (calibration().rope_style != RopeStyle::kNone) {
    RopeTableArgs r;
    r.pages = b.d_pages();
    r.num_pages = static_cast<uint32_t>(b.num_pages);
    r.page_size = page_size;
    r.head_dim = geometry().head_dim;
    r.inv_freq = dev_->inv_freq;
    r.cos = b.d_cos();
    r.sin = b.d_sin();
    KVH_RETURN_IF_ERROR(LaunchRopeTable(r, stream));
  }
  return absl::OkStatus();
}

absl::Status KvtcGpuCodec::WriteHeaders(const Batch& b, uint8_t* payload,
                                        bool host_out,
                                        const KvtcGpuWorkspace& ws,
                                        cudaStream_t stream) const {
  if (host_out) {
    WriteKvtcPayloadHeaders(b.layout, payload);
    return absl::OkStatus();
  }
  // Device output: write the headers packed into pinned memory (the same
  // function, with offsets moved), then copy each run to its place.
  KvtcPayloadLayout packed = b.layout;
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> runs;  // src, dst, n
  uint64_t at = 0;
  auto add = [&](uint64_t* offset, uint64_t n) {
    const uint64_t dst = *offset;
    *offset = at;
    if (!runs.empty() &&
        std::get<0>(runs.back()) + std::get<2>(runs.back()) == at &&
        std::get<1>(runs.back()) + std::get<2>(runs.back()) == dst) {
      std::get<2>(runs.back()) += n;
    } else {
      runs.emplace_back(at, dst, n);
    }
    at += n;
  };
  for (KvtcSectionLayout& s : packed.sections) {
    add(&s.offset, kKvtcSectionHeaderBytes);
    for (KvtcRangeLayout& r : s.ranges) {
      add(&r.header_offset, kKvtcRangeHeaderBytes);
    }
  }
  uint8_t* staged = b.pin + b.carve.p_headers;
  WriteKvtcPayloadHeaders(packed, staged);
  for (const auto& [src, dst, n] : runs) {
    KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(payload + dst, staged + src, n,
                                             cudaMemcpyHostToDevice, stream));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> KvtcGpuCodec::EncodeAsync(
    absl::Span<const PageRef> pages, uint8_t* out, size_t out_bytes,
    const KvtcGpuWorkspace& ws, cudaStream_t stream) const {
  KVH_RETURN_IF_ERROR(CheckPagesToEncode(pages));
  std::vector<uint64_t> positions(pages.size());
  std::vector<uint8_t*> data(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    positions[i] = pages[i].first_position;
    data[i] = const_cast<uint8_t*>(pages[i].data);
  }
  KVH_ASSIGN_OR_RETURN(const Batch b, PrepareBatch(positions, data, ws));
  const size_t head = kEnvelopeHeaderBytes + 8 * pages.size();
  const size_t need = head + b.layout.raw_payload_bytes;
  if (out == nullptr) return absl::InvalidArgumentError("out: null");
  if (out_bytes < need) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("out: %u bytes, encoding needs %u", out_bytes, need));
  }
  KVH_ASSIGN_OR_RETURN(const PointerKind kind,
                       ClassifyPointer(out, device_, "out"));
  uint8_t* payload = kind.device_ptr + head;
  Stage("upload");
  KVH_RETURN_IF_ERROR(StageTables(b, ws, stream));
  KVH_RETURN_IF_ERROR(
      WriteHeaders(b, kind.host ? out + head : payload, kind.host, ws, stream));
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(ws.uploaded, stream));
  for (int kv = 0; kv < 2; ++kv) {
    KVH_RETURN_IF_ERROR(EncodeSection(b, kv, payload, ws, stream));
  }
  Stage("sinks");
  SinkEncodeArgs s = SinkArgs<SinkEncodeArgs>(b, geometry(), native_fp8_);
  s.out = payload + b.layout.sections[2].ranges[0].data_offset;
  s.error = b.d_error();
  KVH_RETURN_IF_ERROR(LaunchSinkEncode(s, stream));
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.pin + b.carve.p_error, b.d_error(),
                                           sizeof(unsigned long long),
                                           cudaMemcpyDeviceToHost, stream));
  Stage("end");
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(ws.done, stream));
  return need;
}

absl::Status KvtcGpuCodec::QuantizeChunk(const Batch& b, int kv, uint64_t r0,
                                         uint32_t n, uint8_t* payload,
                                         cudaStream_t stream) const {
  const KvtcSectionLayout& sec = b.layout.sections[kv];
  const uint64_t rows = sec.rows;
  const uint64_t comps = sec.components;
  float* mins = b.d_minmax();
  float* maxs = mins + b.carve.chunk_rows;
  for (const KvtcRangeLayout& rl : sec.ranges) {
    const KvtcRange& r = rl.range;
    const uint64_t width = r.end_idx - r.start_idx;
    if (r.quant_type == KvtcQuantType::kFp8) {
      QuantizeFp8Args q{b.d_y(),    n,
                        comps,      r.start_idx,
                        r.end_idx,  payload + rl.data_offset + r0 * width,
                        native_fp8_};
      KVH_RETURN_IF_ERROR(LaunchQuantizeFp8(q, stream));
      continue;
    }
    MinMaxArgs mm{b.d_y(),     n,           comps,
                  r.start_idx, r.end_idx,   mins,
                  maxs,        b.d_error(), static_cast<unsigned>(kv),
                  r0};
    KVH_RETURN_IF_ERROR(LaunchMinMax(mm, stream));
    uint8_t* meta = payload + rl.metadata_offset;
    KVH_RETURN_IF_ERROR(LaunchCopyBytes(
        {reinterpret_cast<const uint8_t*>(mins), meta + 4 * r0, 4ull * n},
        stream));
    KVH_RETURN_IF_ERROR(LaunchCopyBytes({reinterpret_cast<const uint8_t*>(maxs),
                                         meta + 4 * (rows + r0), 4ull * n},
                                        stream));
    QuantizeIntXArgs q{
        b.d_y(),
        n,
        comps,
        r.start_idx,
        r.end_idx,
        r.int_bits,
        mins,
        maxs,
        payload + rl.data_offset + r0 * IntXBytesPerRow(width, r.int_bits)};
    KVH_RETURN_IF_ERROR(LaunchQuantizeIntX(q, stream));
  }
  return absl::OkStatus();
}

template <typename Args>
Args KvtcGpuCodec::RowArgs(const Batch& b, int kv, uint64_t r0,
                           uint32_t n) const {
  const KvtcCalibration& cal = calibration();
  Args a;
  a.shape = ShapeOf(geometry());
  a.row_kind = cal.row_kind;
  a.kv = kv;
  a.rope = kv == 0 ? cal.rope_style : RopeStyle::kNone;
  a.pages = b.d_pages();
  a.num_pages = static_cast<uint32_t>(b.num_pages);
  a.rows = b.d_rows();
  a.first_row = r0;
  a.num_rows = n;
  a.mean = dev_->mean[kv];
  a.rope_cos = b.d_cos();
  a.rope_sin = b.d_sin();
  a.native_fp8 = native_fp8_;
  a.pages_aligned16 = b.pages_aligned16;
  return a;
}

absl::Status KvtcGpuCodec::EncodeSection(const Batch& b, int kv,
                                         uint8_t* payload,
                                         const KvtcGpuWorkspace& ws,
                                         cudaStream_t stream) const {
  const KvtcCalibration& cal = calibration();
  const KvtcBasis& basis = kv == 0 ? cal.keys : cal.values;
  const uint64_t comps = basis.components;
  return ForEachChunk(b, kv, [&](uint64_t r0, uint32_t n) -> absl::Status {
    GatherMeanSubtractArgs g = RowArgs<GatherMeanSubtractArgs>(b, kv, r0, n);
    g.out = b.d_x();
    g.out_bf16 = options_.gemm_mode == KvtcGemmMode::kBf16;
    g.error = b.d_error();
    Stage("gather");
    KVH_RETURN_IF_ERROR(LaunchGatherMeanSubtract(g, stream));
    ProjectArgs pj;
    pj.mode = options_.gemm_mode;
    pj.rows = n;
    pj.features = basis.features;
    pj.components = comps;
    pj.x = b.d_x();
    pj.projection = dev_->projection[kv];
    pj.y = b.d_y();
    Stage("project");
    KVH_RETURN_IF_ERROR(LaunchProject(pj, ws.cublas, b.d_cublas(),
                                      kProjectionGemmWorkspaceBytes, stream));
    CheckFiniteArgs cf{
        b.d_y(), n, comps, b.d_error(), static_cast<unsigned>(kv), r0};
    Stage("check");
    KVH_RETURN_IF_ERROR(LaunchCheckFinite(cf, stream));
    Stage("quantize");
    return QuantizeChunk(b, kv, r0, n, payload, stream);
  });
}

absl::Status KvtcGpuCodec::DecodeAsync(
    absl::Span<const uint8_t> buffer, absl::Span<const MutablePageRef> pages,
    const KvtcGpuWorkspace& ws, cudaStream_t stream, CodecWorkspace* scratch,
    const PagedKvDest& dest, const KvtcDeviceInput& device_input) const {
  // Host checks: everything that decides what is read and written (sizes,
  // offsets, headers, pages); the body checksum (FinishDecode) and the data
  // checks (the dequantize kernels) overlap the GPU work.
  KVH_ASSIGN_OR_RETURN(const ParsedEnvelope env,
                       ParseEnvelopeDeferBodyChecksum(buffer));
  // A decode into a layout writes no page: their pointers may be null.
  KVH_RETURN_IF_ERROR(CheckDecodeEnvelope(
      env, pages,
      dest.enabled() ? PageDataUse::kNotWritten : PageDataUse::kWritten));
  std::vector<uint64_t> positions(pages.size());
  std::vector<uint8_t*> data(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    positions[i] = env.position(i);
    data[i] = pages[i].data;
  }
  if (dest.enabled() &&
      (dest.k_bases == nullptr || dest.v_bases == nullptr ||
       dest.num_layers == 0 ||
       uint64_t{dest.layer_begin} + dest.num_layers > geometry().num_layers)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "dest: k_bases, v_bases and layers [%u, +%u) of the %u page layers "
        "must be set with block_ids",
        dest.layer_begin, dest.num_layers, geometry().num_layers));
  }
  KVH_ASSIGN_OR_RETURN(const Batch b, PrepareBatch(positions, data, ws, dest));
  CodecWorkspace local;
  KVH_ASSIGN_OR_RETURN(const absl::Span<const uint8_t> payload,
                       RawPayload(env, b.layout.raw_payload_bytes,
                                  scratch != nullptr ? scratch : &local));
  KVH_RETURN_IF_ERROR(CheckKvtcPayloadHeaders(b.layout, payload));
  // Every size and offset is checked: from here on only CUDA itself can
  // fail; bad data bytes are found by the kernels.
  const uint8_t* dpayload = b.d_staging();
  const uint8_t* staged_from = nullptr;  // pinned input copied chunk by chunk
  Stage("upload");
  if (device_input.data != nullptr) {
    // The payload's place in the buffer is its place in the device copy.
    const uintptr_t p0 = reinterpret_cast<uintptr_t>(payload.data());
    const uintptr_t b0 = reinterpret_cast<uintptr_t>(buffer.data());
    const uint64_t at = p0 - b0;
    if (p0 < b0 || at + payload.size() > buffer.size()) {
      return absl::InvalidArgumentError(
          "device_input: the buffer's payload is zstd-compressed; only an "
          "uncompressed payload can be read from a device copy");
    }
    dpayload = device_input.data + at;
    if (device_input.ready != nullptr) {
      KVH_CUDA_RETURN_IF_ERROR(
          cudaStreamWaitEvent(stream, device_input.ready, 0));
    }
  } else {
    KVH_RETURN_IF_ERROR(
        UploadPayload(b, payload, ws, stream, &dpayload, &staged_from));
  }
  KVH_RETURN_IF_ERROR(StageTables(b, ws, stream));
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(ws.uploaded, stream));
  for (int kv = 0; kv < 2; ++kv) {
    KVH_RETURN_IF_ERROR(
        DecodeSection(b, kv, dpayload, staged_from, ws, stream));
  }
  Stage("sinks");
  KVH_RETURN_IF_ERROR(DecodeSinks(b, dpayload, staged_from, ws, stream));
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.pin + b.carve.p_error, b.d_error(),
                                           sizeof(unsigned long long),
                                           cudaMemcpyDeviceToHost, stream));
  Stage("end");
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(ws.done, stream));
  PendingDecode* pending = PendingDecodeOf(ws, b.carve);
  pending->body_checksum = env.header.body_checksum;
  pending->buffer = reinterpret_cast<uintptr_t>(buffer.data());
  pending->buffer_bytes = buffer.size();
  pending->mark = kPendingDecodeMark;
  return absl::OkStatus();
}

absl::Status KvtcGpuCodec::CheckDecodeEnvelope(
    const ParsedEnvelope& env, absl::Span<const MutablePageRef> pages,
    PageDataUse data_use) const {
  KVH_RETURN_IF_ERROR(
      CheckEnvelopeMatches(env, CodecId::kKvtc, geometry(), pages, data_use));
  const EnvelopeHeader& h = env.header;
  const KvtcCalibration& cal = calibration();
  if (h.calibration_fingerprint != cpu_->calibration_fingerprint()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "buffer: calibration_fingerprint %016x differs from this codec's "
        "calibration %016x (encoded with another calibration)",
        h.calibration_fingerprint, cpu_->calibration_fingerprint()));
  }
  if (h.row_kind != static_cast<uint32_t>(cal.row_kind) ||
      h.num_sections != kKvtcNumSections) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "buffer: row_kind %u / num_sections %u, expected %u / %u", h.row_kind,
        h.num_sections, static_cast<uint32_t>(cal.row_kind), kKvtcNumSections));
  }
  return absl::OkStatus();
}

absl::Status KvtcGpuCodec::UploadPayload(const Batch& b,
                                         absl::Span<const uint8_t> payload,
                                         const KvtcGpuWorkspace& ws,
                                         cudaStream_t stream,
                                         const uint8_t** dpayload,
                                         const uint8_t** staged_from) const {
  cudaPointerAttributes attr;
  KVH_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, payload.data()));
  if (attr.type == cudaMemoryTypeHost && attr.devicePointer != nullptr) {
    if (ws.copy_stream != nullptr && ws.copy_event != nullptr) {
      *staged_from = payload.data();
      // The previous call may still read the staging region.
      KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(ws.copy_stream, ws.done, 0));
    } else {
      *dpayload = static_cast<const uint8_t*>(attr.devicePointer);
    }
  } else if (attr.type == cudaMemoryTypeDevice ||
             attr.type == cudaMemoryTypeManaged) {
    *dpayload = payload.data();
  } else {
    KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.d_staging(), payload.data(),
                                             payload.size(),
                                             cudaMemcpyHostToDevice, stream));
  }
  return absl::OkStatus();
}

absl::Status KvtcGpuCodec::DecodeSinks(const Batch& b, const uint8_t* dpayload,
                                       const uint8_t* staged_from,
                                       const KvtcGpuWorkspace& ws,
                                       cudaStream_t stream) const {
  const KvtcRangeLayout& sink_range = b.layout.sections[2].ranges[0];
  if (staged_from != nullptr) {
    KVH_RETURN_IF_ERROR(CopyIn(staged_from, b.d_staging(),
                               sink_range.data_offset, sink_range.data_bytes,
                               ws));
    KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, ws.copy_event, 0));
  }
  SinkDecodeArgs s = SinkArgs<SinkDecodeArgs>(b, geometry(), native_fp8_);
  s.in = dpayload + sink_range.data_offset;
  s.error = b.d_error();
  s.dest = b.dest;
  return LaunchSinkDecode(s, stream);
}

absl::Status KvtcGpuCodec::CopyIn(const uint8_t* host_payload, uint8_t* staging,
                                  uint64_t offset, uint64_t bytes,
                                  const KvtcGpuWorkspace& ws) const {
  if (bytes > 0) {
    KVH_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(staging + offset, host_payload + offset, bytes,
                        cudaMemcpyHostToDevice, ws.copy_stream));
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaEventRecord(ws.copy_event, ws.copy_stream));
  return absl::OkStatus();
}

// This chunk's rows of every range (metadata and packed bytes) go to the
// same offsets in the staging region; the copy stream runs ahead of the
// kernels, so chunk k + 1 is copied while chunk k decodes.
absl::Status KvtcGpuCodec::CopyChunkIn(const Batch& b,
                                       const KvtcSectionLayout& sec,
                                       uint64_t r0, uint32_t n,
                                       const uint8_t* host_payload,
                                       const KvtcGpuWorkspace& ws) const {
  const uint64_t rows = sec.rows;
  uint8_t* staging = b.d_staging();
  for (const KvtcRangeLayout& rl : sec.ranges) {
    const KvtcRange& r = rl.range;
    const uint64_t width = r.end_idx - r.start_idx;
    const uint64_t row_bytes = r.quant_type == KvtcQuantType::kFp8
                                   ? width
                                   : IntXBytesPerRow(width, r.int_bits);
    if (r.quant_type == KvtcQuantType::kIntX) {
      KVH_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(staging + rl.metadata_offset + 4 * r0,
                          host_payload + rl.metadata_offset + 4 * r0, 4ull * n,
                          cudaMemcpyHostToDevice, ws.copy_stream));
      KVH_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(staging + rl.metadata_offset + 4 * (rows + r0),
                          host_payload + rl.metadata_offset + 4 * (rows + r0),
                          4ull * n, cudaMemcpyHostToDevice, ws.copy_stream));
    }
    KVH_RETURN_IF_ERROR(CopyIn(host_payload, staging,
                               rl.data_offset + r0 * row_bytes, row_bytes * n,
                               ws));
  }
  return absl::OkStatus();
}

absl::Status KvtcGpuCodec::DequantizeChunk(const Batch& b, int kv, uint64_t r0,
                                           uint32_t n, const uint8_t* payload,
                                           cudaStream_t stream) const {
  const KvtcSectionLayout& sec = b.layout.sections[kv];
  const uint64_t rows = sec.rows;
  const uint64_t comps = sec.components;
  for (size_t ri = 0; ri < sec.ranges.size(); ++ri) {
    const KvtcRangeLayout& rl = sec.ranges[ri];
    const KvtcRange& r = rl.range;
    const uint64_t width = r.end_idx - r.start_idx;
    if (r.quant_type == KvtcQuantType::kFp8) {
      DequantizeFp8Args d;
      d.in = payload + rl.data_offset + r0 * width;
      d.rows = n;
      d.ld = comps;
      d.start = r.start_idx;
      d.end = r.end_idx;
      d.coeffs = b.d_y();
      d.native_fp8 = native_fp8_;
      d.error = b.d_error();
      d.section = static_cast<unsigned>(kv);
      d.range = static_cast<unsigned>(ri);
      d.first_row = r0;
      KVH_RETURN_IF_ERROR(LaunchDequantizeFp8(d, stream));
      continue;
    }
    const uint8_t* meta = payload + rl.metadata_offset;
    DequantizeIntXArgs d;
    d.in = payload + rl.data_offset + r0 * IntXBytesPerRow(width, r.int_bits);
    d.rows = n;
    d.ld = comps;
    d.start = r.start_idx;
    d.end = r.end_idx;
    d.bits = r.int_bits;
    d.mins = meta + 4 * r0;
    d.maxs = meta + 4 * (rows + r0);
    d.coeffs = b.d_y();
    d.error = b.d_error();
    d.section = static_cast<unsigned>(kv);
    d.range = static_cast<unsigned>(ri);
    d.first_row = r0;
    KVH_RETURN_IF_ERROR(LaunchDequantizeIntX(d, stream));
  }
  return absl::OkStatus();
}

absl::Status KvtcGpuCodec::DecodeSection(const Batch& b, int kv,
                                         const uint8_t* payload,
                                         const uint8_t* host_payload,
                                         const KvtcGpuWorkspace& ws,
                                         cudaStream_t stream) const {
  const KvtcCalibration& cal = calibration();
  const KvtcBasis& basis = kv == 0 ? cal.keys : cal.values;
  const KvtcSectionLayout& sec = b.layout.sections[kv];
  const uint64_t comps = basis.components;
  const bool gaps = HasGaps(sec);
  const bool bf16 = options_.gemm_mode == KvtcGemmMode::kBf16;
  return ForEachChunk(b, kv, [&](uint64_t r0, uint32_t n) -> absl::Status {
    if (host_payload != nullptr) {
      KVH_RETURN_IF_ERROR(CopyChunkIn(b, sec, r0, n, host_payload, ws));
      Stage("copy_wait");
      KVH_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, ws.copy_event, 0));
    }
    Stage("dequantize");
    if (gaps) {
      KVH_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(b.d_y(), 0, uint64_t{n} * comps * 4, stream));
    }
    KVH_RETURN_IF_ERROR(DequantizeChunk(b, kv, r0, n, payload, stream));
    if (bf16) {
      Stage("convert");
      KVH_RETURN_IF_ERROR(LaunchConvertToBf16(
          {b.d_y(), b.d_y_bf16(), uint64_t{n} * comps}, stream));
    }
    ReconstructArgs rc;
    rc.mode = options_.gemm_mode;
    rc.rows = n;
    rc.features = basis.features;
    rc.components = comps;
    rc.y = bf16 ? static_cast<const void*>(b.d_y_bf16()) : b.d_y();
    rc.projection = dev_->projection[kv];
    rc.x = static_cast<float*>(b.d_x());
    Stage("reconstruct");
    KVH_RETURN_IF_ERROR(LaunchReconstruct(
        rc, ws.cublas, b.d_cublas(), kProjectionGemmWorkspaceBytes, stream));
    MeanAddScatterArgs sc = RowArgs<MeanAddScatterArgs>(b, kv, r0, n);
    sc.dest = b.dest;
    sc.in = static_cast<const float*>(b.d_x());
    Stage("scatter");
    return LaunchMeanAddScatter(sc, stream);
  });
}

}  // namespace gpu
}  // namespace kvharbor
