#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "cuda/codec/kvcm_gpu.h"
#include "cuda/kernels/cuda_check.h"
#include "types/geometry.h"

namespace kvharbor {
namespace gpu {
namespace {

constexpr unsigned kThreads = 256;

unsigned GridFor(uint64_t n) {
  const uint64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(
      std::min<uint64_t>(std::max<uint64_t>(b, 1), uint64_t{1} << 20));
}

// y[r][i] = relu?(y[r][i] + bias[i]), as LinearForward in
// core/transform/kvcm_compressor.cc (std::max(v, 0) keeps NaN).
__global__ void BiasActivationKernel(float* y, uint64_t rows, uint32_t cols,
                                     const float* bias, bool relu) {
  const uint64_t n = rows * cols;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    float v = y[i];
    if (bias != nullptr) v = __fadd_rn(v, bias[i % cols]);
    if (relu) v = v < 0.0f ? 0.0f : v;
    y[i] = v;
  }
}

// x[r][j * hd + d] = token (g * f + j), head h, dim d of `src`
// ([token][head][hd]), for rows r = (g, h) = first_row + r, group-major.
__global__ void GatherGroupsKernel(const float* src, uint64_t first_row,
                                   uint64_t count, uint32_t heads,
                                   uint32_t head_dim, uint32_t f, float* x) {
  const uint64_t row_len = uint64_t{f} * head_dim;
  const uint64_t te = uint64_t{heads} * head_dim;
  const uint64_t n = count * row_len;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t r = first_row + i / row_len;
    const uint64_t k = i % row_len;
    const uint64_t g = r / heads, h = r % heads;
    const uint64_t j = k / head_dim, d = k % head_dim;
    x[i] = src[(g * f + j) * te + h * head_dim + d];
  }
}

// Y[rows][lin.rows] = X[rows][lin.cols] W^T: column-major Y^T = W X^T with
// W row-major [rows][cols] read as its transpose.
absl::Status Linear(cublasHandle_t handle, const KvcmDeviceLinear& lin,
                    const float* x, uint64_t rows, bool relu, float* y,
                    cudaStream_t stream) {
  const float one = 1.0f, zero = 0.0f;
  const int n = static_cast<int>(lin.rows), k = static_cast<int>(lin.cols);
  KVH_CUBLAS_RETURN_IF_ERROR(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, n,
                                         static_cast<int>(rows), k, &one,
                                         lin.weight, k, x, k, &zero, y, n));
  if (lin.bias != nullptr || relu) {
    BiasActivationKernel<<<GridFor(rows * lin.rows), kThreads, 0, stream>>>(
        y, rows, lin.rows, lin.bias, relu);
    KVH_CUDA_CHECK_LAUNCH("BiasActivationKernel<<<grid, 256, 0, stream>>>");
  }
  return absl::OkStatus();
}

uint64_t SegmentOutput(const KvcmDeviceWeights& w, uint64_t n, bool has_mlp) {
  const uint64_t f = w.header().compression_factor;
  if (!has_mlp || n / f < w.header().min_seq_len) return n;
  return n / f + n % f;
}

uint64_t MaxRowsPerCall(const KvcmCompressArgs& a) {
  const uint64_t f = a.weights->header().compression_factor;
  const uint64_t groups = a.in_tokens / f;
  return std::min<uint64_t>(kKvcmGpuChunkRows, groups * a.num_kv_heads);
}

// One segment of one (K or V, layer) block; returns the tokens written.
absl::Status CompressSegment(const KvcmCompressArgs& a, const float* src,
                             uint64_t n, uint32_t layer, KvcmPrefix prefix,
                             bool has_mlp, float* dst, cublasHandle_t handle,
                             float* ws, cudaStream_t stream,
                             uint64_t* written) {
  const KvcmDeviceWeights& w = *a.weights;
  const uint32_t hd = w.head_dim();
  const uint64_t te = uint64_t{a.num_kv_heads} * hd;
  const uint64_t f = w.header().compression_factor;
  *written = SegmentOutput(w, n, has_mlp);
  if (*written == n) {
    if (n > 0) {
      KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          dst, src, n * te * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    }
    return absl::OkStatus();
  }
  const uint64_t groups = n / f;
  const uint64_t rows = groups * a.num_kv_heads;
  const uint64_t chunk = MaxRowsPerCall(a);
  float* x = ws;
  float* hidden = ws + chunk * f * hd;
  KvcmMlpArgs mlp;
  for (uint32_t i = 0; i < 3; ++i) mlp.linear[i] = w.linear(layer, prefix, i);
  for (uint64_t r0 = 0; r0 < rows; r0 += chunk) {
    const uint64_t count = std::min(chunk, rows - r0);
    GatherGroupsKernel<<<GridFor(count * f * hd), kThreads, 0, stream>>>(
        src, r0, count, a.num_kv_heads, hd, static_cast<uint32_t>(f), x);
    KVH_CUDA_CHECK_LAUNCH("GatherGroupsKernel<<<grid, 256, 0, stream>>>");
    mlp.rows = count;
    mlp.in = x;
    mlp.out = dst + r0 * hd;
    KVH_RETURN_IF_ERROR(
        LaunchKvcmMlp(mlp, handle, hidden, KvcmMlpWorkspaceBytes(mlp), stream));
  }
  const uint64_t tail = n - groups * f;
  if (tail > 0) {
    KVH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        dst + groups * te, src + groups * f * te, tail * te * sizeof(float),
        cudaMemcpyDeviceToDevice, stream));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvcmDeviceWeights>> KvcmDeviceWeights::Upload(
    const KvcmWeights& weights) {
  KVH_RETURN_IF_ERROR(weights.Validate());
  std::unique_ptr<KvcmDeviceWeights> d(new KvcmDeviceWeights());
  d->header_ = weights.header;
  d->has_image_ = weights.has_image();
  d->head_dim_ = weights.EffectiveHeadDim();
  uint64_t total = 0;
  for (const auto& layer : weights.layers) {
    for (const KvcmLinear& lin : layer) {
      total += lin.weight.size() + lin.bias.size();
    }
  }
  KVH_CUDA_RETURN_IF_ERROR(
      cudaMalloc(&d->buffer_, std::max<uint64_t>(total, 1) * sizeof(float)));
  std::vector<float> host;
  host.reserve(total);
  std::vector<std::vector<std::pair<uint64_t, int64_t>>> at;  // weight, bias
  for (const auto& layer : weights.layers) {
    at.emplace_back();
    for (const KvcmLinear& lin : layer) {
      const uint64_t wo = host.size();
      host.insert(host.end(), lin.weight.begin(), lin.weight.end());
      int64_t bo = -1;
      if (!lin.bias.empty()) {
        bo = static_cast<int64_t>(host.size());
        host.insert(host.end(), lin.bias.begin(), lin.bias.end());
      }
      at.back().emplace_back(wo, bo);
    }
  }
  KVH_CUDA_RETURN_IF_ERROR(cudaMemcpy(d->buffer_, host.data(),
                                      host.size() * sizeof(float),
                                      cudaMemcpyHostToDevice));
  const float* base = static_cast<const float*>(d->buffer_);
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    d->layers_.emplace_back();
    for (size_t b = 0; b < weights.layers[l].size(); ++b) {
      const KvcmLinear& lin = weights.layers[l][b];
      KvcmDeviceLinear dl;
      dl.rows = lin.rows;
      dl.cols = lin.cols;
      dl.weight = base + at[l][b].first;
      dl.bias = at[l][b].second < 0 ? nullptr : base + at[l][b].second;
      d->layers_.back().push_back(dl);
      if (b % 3 == 0) d->max_h1_ = std::max(d->max_h1_, lin.rows);
      if (b % 3 == 1) d->max_h2_ = std::max(d->max_h2_, lin.rows);
    }
  }
  return d;
}

KvcmDeviceWeights::~KvcmDeviceWeights() { cudaFree(buffer_); }

size_t KvcmMlpWorkspaceBytes(const KvcmMlpArgs& a) {
  return a.rows * (uint64_t{a.linear[0].rows} + a.linear[1].rows) *
         sizeof(float);
}

absl::Status LaunchKvcmMlp(const KvcmMlpArgs& a, cublasHandle_t handle,
                           void* workspace, size_t workspace_bytes,
                           cudaStream_t stream) {
  if (handle == nullptr) {
    return absl::InvalidArgumentError("kvcm_mlp: handle: must not be null");
  }
  if (a.rows == 0) return absl::OkStatus();
  if (a.rows > INT_MAX || a.in == nullptr || a.out == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kvcm_mlp: rows %u must be < 2^31 and in / out not null", a.rows));
  }
  for (int i = 0; i < 3; ++i) {
    const KvcmDeviceLinear& l = a.linear[i];
    if (l.weight == nullptr || l.rows == 0 || l.cols == 0 ||
        (i > 0 && l.cols != a.linear[i - 1].rows)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "kvcm_mlp: linear[%d]: %u x %u with weight %p does not chain", i,
          l.rows, l.cols, l.weight));
    }
  }
  if (workspace == nullptr || workspace_bytes < KvcmMlpWorkspaceBytes(a)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kvcm_mlp: workspace: %u bytes, need %u",
                        workspace_bytes, KvcmMlpWorkspaceBytes(a)));
  }
  KVH_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream));
  float* h0 = static_cast<float*>(workspace);
  float* h1 = h0 + a.rows * a.linear[0].rows;
  KVH_RETURN_IF_ERROR(
      Linear(handle, a.linear[0], a.in, a.rows, true, h0, stream));
  KVH_RETURN_IF_ERROR(
      Linear(handle, a.linear[1], h0, a.rows, true, h1, stream));
  return Linear(handle, a.linear[2], h1, a.rows, false, a.out, stream);
}

uint64_t KvcmGpuOutputTokens(const KvcmDeviceWeights& w, uint64_t image_tokens,
                             uint64_t n) {
  const uint64_t image = std::min(image_tokens, n);
  return SegmentOutput(w, image, w.has_image()) +
         SegmentOutput(w, n - image, true);
}

size_t KvcmCompressWorkspaceBytes(const KvcmCompressArgs& a) {
  if (a.weights == nullptr) return 0;
  const uint64_t f = a.weights->header().compression_factor;
  return MaxRowsPerCall(a) *
         (f * a.weights->head_dim() + a.weights->max_h1() +
          a.weights->max_h2()) *
         sizeof(float);
}

absl::Status LaunchKvcmCompress(const KvcmCompressArgs& a,
                                cublasHandle_t handle, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream) {
  if (a.weights == nullptr) {
    return absl::InvalidArgumentError("kvcm_compress: weights: missing");
  }
  if (a.num_kv_heads == 0 || a.num_kv_heads > kMaxKvHeads) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kvcm_compress: num_kv_heads: %u is out of range "
                        "[1, %u]",
                        a.num_kv_heads, kMaxKvHeads));
  }
  if (a.in_tokens > 0 && (a.in == nullptr || a.out == nullptr)) {
    return absl::InvalidArgumentError("kvcm_compress: in / out: is null");
  }
  const size_t need = KvcmCompressWorkspaceBytes(a);
  if (need > 0 && (workspace == nullptr || workspace_bytes < need)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kvcm_compress: workspace: %u bytes, need %u", workspace_bytes, need));
  }
  const KvcmDeviceWeights& w = *a.weights;
  const uint32_t layers = w.header().num_layers;
  const uint64_t te = uint64_t{a.num_kv_heads} * w.head_dim();
  const uint64_t n = a.in_tokens;
  const uint64_t out_n = KvcmGpuOutputTokens(w, a.image_tokens, n);
  const uint64_t image = std::min(a.image_tokens, n);
  float* ws = static_cast<float*>(workspace);
  for (int kv = 0; kv < 2; ++kv) {
    const KvcmPrefix ip =
        kv == 0 ? KvcmPrefix::kImageKey : KvcmPrefix::kImageValue;
    const KvcmPrefix tp =
        kv == 0 ? KvcmPrefix::kTextKey : KvcmPrefix::kTextValue;
    for (uint32_t l = 0; l < layers; ++l) {
      const float* src = a.in + (uint64_t(kv) * layers + l) * n * te;
      float* dst = a.out + (uint64_t(kv) * layers + l) * out_n * te;
      uint64_t written = 0, unused = 0;
      KVH_RETURN_IF_ERROR(CompressSegment(a, src, image, l, ip, w.has_image(),
                                          dst, handle, ws, stream, &written));
      KVH_RETURN_IF_ERROR(CompressSegment(a, src + image * te, n - image, l, tp,
                                          true, dst + written * te, handle, ws,
                                          stream, &unused));
    }
  }
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace kvharbor
