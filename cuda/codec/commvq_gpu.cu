#include <climits>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "cuda/codec/commvq_gpu.h"
#include "cuda/kernels/cuda_check.h"

namespace kvharbor {
namespace gpu {
namespace {

constexpr unsigned kThreads = 256;  // a power of two (block reductions)
constexpr unsigned kNoIndex = UINT_MAX;

// The CommVqConfig fields the kernels use, as plain integers.
struct Dims {
  uint32_t layers, head_dim, dim, pairs, levels, group_pairs, groups, stages;
  uint32_t value_rows, stage_rows, value_stages;
  uint64_t value_bytes;
  bool half_split;
};

Dims MakeDims(const CommVqConfig& c) {
  return Dims{c.num_layers,
              c.head_dim,
              c.dim(),
              c.pairs(),
              c.key_levels,
              c.key_group_pairs,
              c.key_groups(),
              c.key_stages,
              c.value_rows(),
              c.value_stage_rows,
              c.value_stages,
              CommVqValueBytes(c),
              c.rope_style == RopeStyle::kHalfSplit};
}

// CommVqConfig::PairElements.
__device__ __forceinline__ void PairElements(const Dims& d, uint32_t j,
                                             uint32_t* e0, uint32_t* e1) {
  const uint32_t half = d.head_dim / 2;
  const uint32_t h = j / half, i = j % half;
  if (d.half_split) {
    *e0 = h * d.head_dim + i;
    *e1 = *e0 + half;
  } else {
    *e0 = h * d.head_dim + 2 * i;
    *e1 = *e0 + 1;
  }
}

__device__ __forceinline__ const float* KeyAt(const float* cb, const Dims& d,
                                              uint32_t layer, uint32_t stage,
                                              uint32_t pair) {
  return cb +
         ((uint64_t{layer} * d.stages + stage) * d.pairs + pair) * d.levels * 2;
}

// DecodeCommVqKey, one thread per (layer, token, pair): the stages are
// summed in order, each as (x_a - y_b, y_a + x_b).
__global__ void DecodeKeysKernel(Dims d, uint64_t tokens, const float* cb,
                                 const uint16_t* codes, float* keys) {
  const uint64_t n = uint64_t{d.layers} * tokens * d.pairs;
  const uint32_t mask = d.levels - 1;
  const uint32_t key_codes = d.stages * d.groups * 2;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint32_t j = i % d.pairs;
    const uint64_t lt = i / d.pairs;
    const uint32_t layer = lt / tokens;
    const uint16_t* c = codes + lt * key_codes;
    const uint32_t q = j / d.group_pairs;
    float o0 = 0.0f, o1 = 0.0f;
    for (uint32_t s = 0; s < d.stages; ++s) {
      const uint32_t a = c[(s * d.groups + q) * 2] & mask;
      const uint32_t b = c[(s * d.groups + q) * 2 + 1] & mask;
      const float* xy = KeyAt(cb, d, layer, s, j);
      o0 = __fadd_rn(o0, __fsub_rn(xy[2 * a], xy[2 * b + 1]));
      o1 = __fadd_rn(o1, __fadd_rn(xy[2 * a + 1], xy[2 * b]));
    }
    uint32_t e0, e1;
    PairElements(d, j, &e0, &e1);
    keys[lt * d.dim + e0] = o0;
    keys[lt * d.dim + e1] = o1;
  }
}

// DecodeCommVqValue, one block per (layer, token), threads over dims; rows
// whose bit is set are added in row order.
__global__ void DecodeValuesKernel(Dims d, uint64_t tokens, const float* cb,
                                   const uint8_t* bits, float* values) {
  const uint64_t n = uint64_t{d.layers} * tokens;
  for (uint64_t lt = blockIdx.x; lt < n; lt += gridDim.x) {
    const uint32_t layer = lt / tokens;
    const uint8_t* b = bits + lt * d.value_bytes;
    const float* rows = cb + uint64_t{layer} * d.value_rows * d.dim;
    for (uint32_t e = threadIdx.x; e < d.dim; e += blockDim.x) {
      float o = 0.0f;
      for (uint32_t r = 0; r < d.value_rows; ++r) {
        if (((b[r / 8] >> (r % 8)) & 1) == 0) continue;
        o = __fadd_rn(o, rows[uint64_t{r} * d.dim + e]);
      }
      values[lt * d.dim + e] = o;
    }
  }
}

// CommVqKeyGroupTables: Na[l][s][q][a] and M2[l][s][q][a][b].
__global__ void KeyTablesKernel(Dims d, const float* cb, float* na, float* m2) {
  const uint64_t lsq = uint64_t{d.layers} * d.stages * d.groups;
  const uint64_t n = lsq * d.levels * d.levels;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint32_t b = i % d.levels;
    const uint32_t a = (i / d.levels) % d.levels;
    const uint64_t t = i / (uint64_t{d.levels} * d.levels);
    const uint32_t q = t % d.groups;
    const uint32_t s = (t / d.groups) % d.stages;
    const uint32_t layer = t / (uint64_t{d.groups} * d.stages);
    float m = 0.0f;
    for (uint32_t j = q * d.group_pairs; j < (q + 1) * d.group_pairs; ++j) {
      const float* xy = KeyAt(cb, d, layer, s, j);
      m = __fadd_rn(m, __fsub_rn(__fmul_rn(xy[2 * a + 1], xy[2 * b]),
                                 __fmul_rn(xy[2 * a], xy[2 * b + 1])));
    }
    m2[i] = __fmul_rn(2.0f, m);
    if (b == 0) {
      float s2 = 0.0f;
      for (uint32_t j = q * d.group_pairs; j < (q + 1) * d.group_pairs; ++j) {
        const float* xy = KeyAt(cb, d, layer, s, j);
        s2 = __fadd_rn(s2, __fadd_rn(__fmul_rn(xy[2 * a], xy[2 * a]),
                                     __fmul_rn(xy[2 * a + 1], xy[2 * a + 1])));
      }
      na[t * d.levels + a] = s2;
    }
  }
}

__global__ void ValueNormsKernel(Dims d, const float* cb, float* norms) {
  const uint64_t n = uint64_t{d.layers} * d.value_rows;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const float* row = cb + i * d.dim;
    float s = 0.0f;
    for (uint32_t e = 0; e < d.dim; ++e) {
      s = __fadd_rn(s, __fmul_rn(row[e], row[e]));
    }
    norms[i] = s;
  }
}

// Block-wide argmin of (score, index) candidates: the smallest score, ties
// to the smallest index; kNoIndex entries are not candidates. The result is
// in idx[0] (kNoIndex when there was none). Ends with __syncthreads.
__device__ void BlockArgmin(float score, unsigned index, float* sc,
                            unsigned* idx) {
  sc[threadIdx.x] = score;
  idx[threadIdx.x] = index;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      const float s2 = sc[threadIdx.x + w];
      const unsigned i2 = idx[threadIdx.x + w];
      const unsigned i1 = idx[threadIdx.x];
      if (i2 != kNoIndex && (i1 == kNoIndex || s2 < sc[threadIdx.x] ||
                             (s2 == sc[threadIdx.x] && i2 < i1))) {
        sc[threadIdx.x] = s2;
        idx[threadIdx.x] = i2;
      }
    }
    __syncthreads();
  }
}

// CommVqEncoder::EncodeKey: per stage, per group, the code (a, b) of the
// smallest score ((Na[a] - 2P[a]) + (Na[b] - 2Q[b])) + M2[a][b], ties to the
// smallest a * Nc' + b, then its centre leaves the residual.
__global__ void EncodeKeysKernel(Dims d, uint64_t tokens, const float* cb,
                                 const float* na_all, const float* m2_all,
                                 const float* keys, float* resid,
                                 uint16_t* codes) {
  extern __shared__ float smem[];
  float* pa = smem;
  float* qb = pa + d.levels;
  float* sc = qb + d.levels;
  unsigned* idx = reinterpret_cast<unsigned*>(sc + blockDim.x);
  const uint64_t n = uint64_t{d.layers} * tokens;
  const uint32_t nl = d.levels, nn = d.levels * d.levels;
  for (uint64_t lt = blockIdx.x; lt < n; lt += gridDim.x) {
    const uint32_t layer = lt / tokens;
    float* r = resid + lt * d.dim;
    for (uint32_t e = threadIdx.x; e < d.dim; e += blockDim.x) {
      r[e] = keys[lt * d.dim + e];
    }
    __syncthreads();
    for (uint32_t s = 0; s < d.stages; ++s) {
      for (uint32_t q = 0; q < d.groups; ++q) {
        const uint64_t t = (uint64_t{layer} * d.stages + s) * d.groups + q;
        const float* na = na_all + t * nl;
        const float* m2 = m2_all + t * nn;
        for (uint32_t v = threadIdx.x; v < nl; v += blockDim.x) {
          float p = 0.0f, qq = 0.0f;
          for (uint32_t j = q * d.group_pairs; j < (q + 1) * d.group_pairs;
               ++j) {
            const float* xy = KeyAt(cb, d, layer, s, j);
            uint32_t e0, e1;
            PairElements(d, j, &e0, &e1);
            p = __fadd_rn(p, __fadd_rn(__fmul_rn(r[e0], xy[2 * v]),
                                       __fmul_rn(r[e1], xy[2 * v + 1])));
            qq = __fadd_rn(qq, __fsub_rn(__fmul_rn(r[e1], xy[2 * v]),
                                         __fmul_rn(r[e0], xy[2 * v + 1])));
          }
          pa[v] = __fsub_rn(na[v], __fmul_rn(2.0f, p));
          qb[v] = __fsub_rn(na[v], __fmul_rn(2.0f, qq));
        }
        __syncthreads();
        float best = __int_as_float(0x7f800000);  // +inf, as the CPU
        unsigned bi = kNoIndex;
        for (uint32_t i = threadIdx.x; i < nn; i += blockDim.x) {
          const float score =
              __fadd_rn(__fadd_rn(pa[i / nl], qb[i % nl]), m2[i]);
          if (score < best) {
            best = score;
            bi = i;
          }
        }
        BlockArgmin(best, bi, sc, idx);
        const unsigned pick = idx[0] == kNoIndex ? 0 : idx[0];
        const uint32_t a = pick / nl, b = pick % nl;
        if (threadIdx.x == 0) {
          uint16_t* c =
              codes + lt * (d.stages * d.groups * 2) + (s * d.groups + q) * 2;
          c[0] = static_cast<uint16_t>(a);
          c[1] = static_cast<uint16_t>(b);
        }
        for (uint32_t j = q * d.group_pairs + threadIdx.x;
             j < (q + 1) * d.group_pairs; j += blockDim.x) {
          const float* xy = KeyAt(cb, d, layer, s, j);
          uint32_t e0, e1;
          PairElements(d, j, &e0, &e1);
          r[e0] = __fsub_rn(r[e0], __fsub_rn(xy[2 * a], xy[2 * b + 1]));
          r[e1] = __fsub_rn(r[e1], __fadd_rn(xy[2 * a + 1], xy[2 * b]));
        }
        __syncthreads();
      }
    }
  }
}

// CommVqEncoder::EncodeValue: per stage, the row of the smallest score
// |C_k|^2 - 2 r.C_k below 0 (ties to the smaller k), or none.
__global__ void EncodeValuesKernel(Dims d, uint64_t tokens, const float* cb,
                                   const float* norms_all, const float* values,
                                   float* resid, uint8_t* bits) {
  __shared__ float sc[kThreads];
  __shared__ unsigned idx[kThreads];
  const uint64_t n = uint64_t{d.layers} * tokens;
  for (uint64_t lt = blockIdx.x; lt < n; lt += gridDim.x) {
    const uint32_t layer = lt / tokens;
    float* r = resid + lt * d.dim;
    uint8_t* out = bits + lt * d.value_bytes;
    for (uint32_t e = threadIdx.x; e < d.dim; e += blockDim.x) {
      r[e] = values[lt * d.dim + e];
    }
    if (threadIdx.x == 0) {
      for (uint64_t k = 0; k < d.value_bytes; ++k) out[k] = 0;
    }
    __syncthreads();
    const float* norms = norms_all + uint64_t{layer} * d.value_rows;
    const float* rows = cb + uint64_t{layer} * d.value_rows * d.dim;
    for (uint32_t m = 0; m < d.value_stages; ++m) {
      const uint32_t first = m * d.stage_rows;
      float best = 0.0f;
      unsigned bi = kNoIndex;
      for (uint32_t k = threadIdx.x; k < d.stage_rows; k += blockDim.x) {
        const float* row = rows + uint64_t{first + k} * d.dim;
        float dot = 0.0f;
        for (uint32_t e = 0; e < d.dim; ++e) {
          dot = __fadd_rn(dot, __fmul_rn(r[e], row[e]));
        }
        const float score = __fsub_rn(norms[first + k], __fmul_rn(2.0f, dot));
        if (score < best) {
          best = score;
          bi = k;
        }
      }
      BlockArgmin(best, bi, sc, idx);
      const unsigned pick = idx[0];
      if (pick != kNoIndex) {
        const float* row = rows + uint64_t{first + pick} * d.dim;
        for (uint32_t e = threadIdx.x; e < d.dim; e += blockDim.x) {
          r[e] = __fsub_rn(r[e], row[e]);
        }
        if (threadIdx.x == 0) {
          const uint32_t bit = first + pick;
          out[bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
        }
      }
      __syncthreads();
    }
  }
}

unsigned GridFor(uint64_t work_items, uint64_t per_block) {
  const uint64_t b = (work_items + per_block - 1) / per_block;
  return static_cast<unsigned>(b > (1u << 20) ? (1u << 20) : (b == 0 ? 1 : b));
}

absl::Status CheckCommon(const char* what, const CommVqConfig& c,
                         uint64_t tokens, bool need_tokens) {
  absl::Status st = c.Validate();
  if (!st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: config: %s", what, st.message()));
  }
  if (need_tokens && (tokens == 0 || tokens > (uint64_t{1} << 31))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: tokens: %u is out of range [1, 2^31]", what, tokens));
  }
  return absl::OkStatus();
}

absl::Status Missing(const char* what, const char* field) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: %s: must not be null", what, field));
}

}  // namespace

uint64_t CommVqNaFloats(const CommVqConfig& c) {
  return uint64_t{c.num_layers} * c.key_stages * c.key_groups() * c.key_levels;
}
uint64_t CommVqM2Floats(const CommVqConfig& c) {
  return CommVqNaFloats(c) * c.key_levels;
}
uint64_t CommVqValueNormFloats(const CommVqConfig& c) {
  return uint64_t{c.num_layers} * c.value_rows();
}

size_t CommVqEncodeWorkspaceBytes(const CommVqEncodeArgs& a) {
  return 2 * uint64_t{a.config.num_layers} * a.tokens * a.config.dim() *
         sizeof(float);
}

absl::Status LaunchCommVqDecode(const CommVqDecodeArgs& a,
                                cudaStream_t stream) {
  KVH_RETURN_IF_ERROR(CheckCommon("commvq_decode", a.config, a.tokens, true));
  const Dims d = MakeDims(a.config);
  if (a.key_codes != nullptr) {
    if (a.key_codebook == nullptr)
      return Missing("commvq_decode", "key_codebook");
    if (a.keys == nullptr) return Missing("commvq_decode", "keys");
    DecodeKeysKernel<<<GridFor(uint64_t{d.layers} * a.tokens * d.pairs,
                               kThreads),
                       kThreads, 0, stream>>>(d, a.tokens, a.key_codebook,
                                              a.key_codes, a.keys);
    KVH_CUDA_CHECK_LAUNCH("DecodeKeysKernel<<<grid, 256, 0, stream>>>");
  }
  if (a.value_bits != nullptr) {
    if (a.value_codebook == nullptr) {
      return Missing("commvq_decode", "value_codebook");
    }
    if (a.values == nullptr) return Missing("commvq_decode", "values");
    DecodeValuesKernel<<<GridFor(uint64_t{d.layers} * a.tokens, 1), kThreads, 0,
                         stream>>>(d, a.tokens, a.value_codebook, a.value_bits,
                                   a.values);
    KVH_CUDA_CHECK_LAUNCH("DecodeValuesKernel<<<grid, 256, 0, stream>>>");
  }
  return absl::OkStatus();
}

absl::Status LaunchCommVqTables(const CommVqTablesArgs& a,
                                cudaStream_t stream) {
  KVH_RETURN_IF_ERROR(CheckCommon("commvq_tables", a.config, 0, false));
  const Dims d = MakeDims(a.config);
  if (a.key_codebook != nullptr) {
    if (a.tables.na == nullptr) return Missing("commvq_tables", "tables.na");
    if (a.tables.m2 == nullptr) return Missing("commvq_tables", "tables.m2");
    if (CommVqM2Floats(a.config) * sizeof(float) >
        kCommVqMaxEncoderTableBytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "commvq_tables: the key tables would need %u bytes, over the limit "
          "of %u",
          CommVqM2Floats(a.config) * sizeof(float),
          kCommVqMaxEncoderTableBytes));
    }
    KeyTablesKernel<<<GridFor(CommVqM2Floats(a.config), kThreads), kThreads, 0,
                      stream>>>(d, a.key_codebook, a.tables.na, a.tables.m2);
    KVH_CUDA_CHECK_LAUNCH("KeyTablesKernel<<<grid, 256, 0, stream>>>");
  }
  if (a.value_codebook != nullptr) {
    if (a.tables.value_norms == nullptr) {
      return Missing("commvq_tables", "tables.value_norms");
    }
    ValueNormsKernel<<<GridFor(CommVqValueNormFloats(a.config), kThreads),
                       kThreads, 0, stream>>>(d, a.value_codebook,
                                              a.tables.value_norms);
    KVH_CUDA_CHECK_LAUNCH("ValueNormsKernel<<<grid, 256, 0, stream>>>");
  }
  return absl::OkStatus();
}

absl::Status LaunchCommVqEncode(const CommVqEncodeArgs& a, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream) {
  KVH_RETURN_IF_ERROR(CheckCommon("commvq_encode", a.config, a.tokens, true));
  const size_t need = CommVqEncodeWorkspaceBytes(a);
  if (workspace == nullptr || workspace_bytes < need) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "commvq_encode: workspace: %u bytes, need %u", workspace_bytes, need));
  }
  const Dims d = MakeDims(a.config);
  const uint64_t lt = uint64_t{d.layers} * a.tokens;
  float* resid_k = static_cast<float*>(workspace);
  float* resid_v = resid_k + lt * d.dim;
  if (a.keys != nullptr) {
    if (a.key_codebook == nullptr)
      return Missing("commvq_encode", "key_codebook");
    if (a.tables.na == nullptr || a.tables.m2 == nullptr) {
      return Missing("commvq_encode", "tables.na / tables.m2");
    }
    if (a.key_codes == nullptr) return Missing("commvq_encode", "key_codes");
    const size_t smem = (2 * size_t{d.levels} + kThreads) * sizeof(float) +
                        kThreads * sizeof(unsigned);
    EncodeKeysKernel<<<GridFor(lt, 1), kThreads, smem, stream>>>(
        d, a.tokens, a.key_codebook, a.tables.na, a.tables.m2, a.keys, resid_k,
        a.key_codes);
    KVH_CUDA_CHECK_LAUNCH("EncodeKeysKernel<<<grid, 256, smem, stream>>>");
  }
  if (a.values != nullptr) {
    if (a.value_codebook == nullptr) {
      return Missing("commvq_encode", "value_codebook");
    }
    if (a.tables.value_norms == nullptr) {
      return Missing("commvq_encode", "tables.value_norms");
    }
    if (a.value_bits == nullptr) return Missing("commvq_encode", "value_bits");
    EncodeValuesKernel<<<GridFor(lt, 1), kThreads, 0, stream>>>(
        d, a.tokens, a.value_codebook, a.tables.value_norms, a.values, resid_v,
        a.value_bits);
    KVH_CUDA_CHECK_LAUNCH("EncodeValuesKernel<<<grid, 256, 0, stream>>>");
  }
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace kvharbor
