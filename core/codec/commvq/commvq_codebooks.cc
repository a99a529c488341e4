#include "core/codec/commvq/commvq_codebooks.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"

namespace kvharbor {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("commvq.", field, ": ", what));
}

absl::Status Range(absl::string_view field, uint64_t v, uint64_t lo,
                   uint64_t hi) {
  return Invalid(field,
                 absl::StrFormat("%u is out of range [%u, %u]", v, lo, hi));
}

}  // namespace

uint32_t CommVqConfig::key_code_bits() const {
  uint32_t bits = 0;
  while ((uint32_t{1} << bits) < key_levels) ++bits;
  return bits;
}

void CommVqConfig::PairElements(uint32_t j, uint32_t* e0, uint32_t* e1) const {
  const uint32_t half = head_dim / 2;
  const uint32_t h = j / half;
  const uint32_t i = j % half;
  if (rope_style == RopeStyle::kHalfSplit) {
    *e0 = h * head_dim + i;
    *e1 = *e0 + half;
  } else {
    *e0 = h * head_dim + 2 * i;
    *e1 = *e0 + 1;
  }
}

absl::Status CommVqConfig::Validate() const {
  if (num_layers == 0 || num_layers > kMaxLayers) {
    return Range("num_layers", num_layers, 1, kMaxLayers);
  }
  if (num_kv_heads == 0 || num_kv_heads > kMaxKvHeads) {
    return Range("num_kv_heads", num_kv_heads, 1, kMaxKvHeads);
  }
  if (head_dim < 2 || head_dim > kMaxHeadDim || head_dim % 2 != 0) {
    return Invalid("head_dim", absl::StrFormat("%u is not even and in [2, %u]",
                                               head_dim, kMaxHeadDim));
  }
  if (rope_style != RopeStyle::kNone && rope_style != RopeStyle::kInterleaved &&
      rope_style != RopeStyle::kHalfSplit) {
    return Invalid(
        "rope_style",
        absl::StrCat("unknown value ", static_cast<uint32_t>(rope_style)));
  }
  if (!std::isfinite(rope_theta) || rope_theta < 0.0f ||
      (rope_style == RopeStyle::kNone) != (rope_theta == 0.0f)) {
    return Invalid(
        "rope_theta",
        absl::StrFormat("%g: must be > 0 with RoPE and 0 without", rope_theta));
  }
  if (key_levels < 2 || key_levels > kCommVqMaxKeyLevels ||
      (key_levels & (key_levels - 1)) != 0) {
    return Invalid("key_levels",
                   absl::StrFormat("%u is not a power of two in [2, %u]",
                                   key_levels, kCommVqMaxKeyLevels));
  }
  if (key_group_pairs == 0 || pairs() % key_group_pairs != 0) {
    return Invalid("key_group_pairs",
                   absl::StrFormat("%u does not divide the %u pairs of "
                                   "num_kv_heads * head_dim / 2",
                                   key_group_pairs, pairs()));
  }
  if (key_stages == 0 || key_stages > kCommVqMaxKeyStages) {
    return Range("key_stages", key_stages, 1, kCommVqMaxKeyStages);
  }
  if (value_stage_rows == 0 || value_stage_rows > kCommVqMaxValueStageRows) {
    return Range("value_stage_rows", value_stage_rows, 1,
                 kCommVqMaxValueStageRows);
  }
  if (value_stages == 0 ||
      uint64_t{value_stages} * value_stage_rows > kCommVqMaxValueRows) {
    return Invalid(
        "value_stages",
        absl::StrFormat("%u stages of %u rows: total must be in "
                        "[1, %u]",
                        value_stages, value_stage_rows, kCommVqMaxValueRows));
  }
  if (key_floats() > kCommVqMaxArrayElements) {
    return Invalid("key_stages",
                   absl::StrFormat("the key codebooks would hold %u floats, "
                                   "over the limit of %u",
                                   key_floats(), kCommVqMaxArrayElements));
  }
  if (value_floats() > kCommVqMaxArrayElements) {
    return Invalid("value_stages",
                   absl::StrFormat("the value codebooks would hold %u floats, "
                                   "over the limit of %u",
                                   value_floats(), kCommVqMaxArrayElements));
  }
  return absl::OkStatus();
}

absl::Status CommVqCodebooks::Validate() const {
  KVH_RETURN_IF_ERROR(config.Validate());
  if (key.size() != config.key_floats()) {
    return Invalid("key", absl::StrFormat("%u floats, the config needs %u",
                                          key.size(), config.key_floats()));
  }
  if (value.size() != config.value_floats()) {
    return Invalid(
        "value", absl::StrFormat("%u floats, the config needs %u", value.size(),
                                 config.value_floats()));
  }
  for (size_t i = 0; i < key.size(); ++i) {
    if (!std::isfinite(key[i])) {
      return Invalid(absl::StrCat("key[", i, "]"), "is not finite");
    }
  }
  for (size_t i = 0; i < value.size(); ++i) {
    if (!std::isfinite(value[i])) {
      return Invalid(absl::StrCat("value[", i, "]"), "is not finite");
    }
  }
  return absl::OkStatus();
}

absl::Status CommVqCodebooks::CheckGeometry(const Geometry& g) const {
  const CommVqConfig& c = config;
  if (c.num_layers != g.num_layers || c.num_kv_heads != g.num_kv_heads ||
      c.head_dim != g.head_dim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "commvq: codebooks are for %u layers x %u kv heads x %u dims, but "
        "geometry has %u x %u x %u",
        c.num_layers, c.num_kv_heads, c.head_dim, g.num_layers, g.num_kv_heads,
        g.head_dim));
  }
  if (g.rope_theta != 0.0f && g.rope_theta != c.rope_theta) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "commvq: rope_theta: the codebooks use %g, geometry.rope_theta is %g",
        c.rope_theta, g.rope_theta));
  }
  return absl::OkStatus();
}

void DecodeCommVqKey(const CommVqCodebooks& cb, uint32_t layer,
                     const uint16_t* codes, float* key) {
  const CommVqConfig& c = cb.config;
  const uint32_t g = c.key_group_pairs;
  const uint32_t mask = c.key_levels - 1;
  std::memset(key, 0, sizeof(float) * c.dim());
  for (uint32_t s = 0; s < c.key_stages; ++s) {
    for (uint32_t q = 0; q < c.key_groups(); ++q) {
      const uint32_t a = codes[(s * c.key_groups() + q) * 2] & mask;
      const uint32_t b = codes[(s * c.key_groups() + q) * 2 + 1] & mask;
      for (uint32_t j = q * g; j < (q + 1) * g; ++j) {
        const float* xy = cb.key_at(layer, s, j);
        uint32_t e0, e1;
        c.PairElements(j, &e0, &e1);
        key[e0] += xy[2 * a] - xy[2 * b + 1];
        key[e1] += xy[2 * a + 1] + xy[2 * b];
      }
    }
  }
}

void DecodeCommVqValue(const CommVqCodebooks& cb, uint32_t layer,
                       const uint8_t* bits, float* value) {
  const uint32_t d = cb.config.dim();
  std::memset(value, 0, sizeof(float) * d);
  for (uint32_t n = 0; n < cb.config.value_rows(); ++n) {
    if (((bits[n / 8] >> (n % 8)) & 1) == 0) continue;
    const float* row = cb.value_at(layer, n);
    for (uint32_t i = 0; i < d; ++i) value[i] += row[i];
  }
}

CommVqCodebooks RotateCommVqKeyCodebook(const CommVqCodebooks& cb,
                                        const float* cos, const float* sin) {
  CommVqCodebooks out = cb;
  const CommVqConfig& c = cb.config;
  const uint32_t half = c.head_dim / 2;
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    for (uint32_t s = 0; s < c.key_stages; ++s) {
      for (uint32_t j = 0; j < c.pairs(); ++j) {
        float* xy = const_cast<float*>(out.key_at(l, s, j));
        const float co = cos[j % half], si = sin[j % half];
        for (uint32_t v = 0; v < c.key_levels; ++v) {
          const float x = xy[2 * v], y = xy[2 * v + 1];
          xy[2 * v] = x * co - y * si;
          xy[2 * v + 1] = x * si + y * co;
        }
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------- encoder

void CommVqKeyGroupTables(const CommVqCodebooks& cb, uint32_t layer,
                          uint32_t stage, uint32_t group, float* na,
                          float* m2) {
  const CommVqConfig& c = cb.config;
  const uint32_t nl = c.key_levels, g = c.key_group_pairs;
  for (uint32_t a = 0; a < nl; ++a) {
    float n = 0.0f;
    for (uint32_t j = group * g; j < (group + 1) * g; ++j) {
      const float* xy = cb.key_at(layer, stage, j);
      n += xy[2 * a] * xy[2 * a] + xy[2 * a + 1] * xy[2 * a + 1];
    }
    na[a] = n;
    for (uint32_t b = 0; b < nl; ++b) {
      float m = 0.0f;
      for (uint32_t j = group * g; j < (group + 1) * g; ++j) {
        const float* xy = cb.key_at(layer, stage, j);
        m += xy[2 * a + 1] * xy[2 * b] - xy[2 * a] * xy[2 * b + 1];
      }
      m2[a * nl + b] = 2.0f * m;
    }
  }
}

float CommVqPickKeyCode(const CommVqCodebooks& cb, uint32_t layer,
                        uint32_t stage, uint32_t group, const float* na,
                        const float* m2, float* r, float* scratch, uint16_t* a,
                        uint16_t* b) {
  const CommVqConfig& c = cb.config;
  const uint32_t nl = c.key_levels, g = c.key_group_pairs;
  float* pa = scratch;  // Na[a] - 2 P[a]
  float* qb = pa + nl;  // Na[b] - 2 Q[b]
  for (uint32_t v = 0; v < nl; ++v) {
    float p = 0.0f, q = 0.0f;
    for (uint32_t j = group * g; j < (group + 1) * g; ++j) {
      const float* xy = cb.key_at(layer, stage, j);
      uint32_t e0, e1;
      c.PairElements(j, &e0, &e1);
      p += r[e0] * xy[2 * v] + r[e1] * xy[2 * v + 1];
      q += r[e1] * xy[2 * v] - r[e0] * xy[2 * v + 1];
    }
    pa[v] = na[v] - 2.0f * p;
    qb[v] = na[v] - 2.0f * q;
  }
  float best = std::numeric_limits<float>::infinity();
  uint32_t ba = 0, bb = 0;
  for (uint32_t x = 0; x < nl; ++x) {
    for (uint32_t y = 0; y < nl; ++y) {
      const float score = (pa[x] + qb[y]) + m2[x * nl + y];
      if (score < best) {
        best = score;
        ba = x;
        bb = y;
      }
    }
  }
  for (uint32_t j = group * g; j < (group + 1) * g; ++j) {
    const float* xy = cb.key_at(layer, stage, j);
    uint32_t e0, e1;
    c.PairElements(j, &e0, &e1);
    r[e0] -= xy[2 * ba] - xy[2 * bb + 1];
    r[e1] -= xy[2 * ba + 1] + xy[2 * bb];
  }
  *a = static_cast<uint16_t>(ba);
  *b = static_cast<uint16_t>(bb);
  return best;
}

int64_t CommVqPickValueRow(const float* rows, const float* norms, uint32_t k,
                           uint32_t d, float* r) {
  float best = 0.0f;
  int64_t pick = -1;
  for (uint32_t i = 0; i < k; ++i) {
    const float* row = rows + uint64_t{i} * d;
    float dot = 0.0f;
    for (uint32_t e = 0; e < d; ++e) dot += r[e] * row[e];
    const float score = norms[i] - 2.0f * dot;
    if (score < best) {
      best = score;
      pick = i;
    }
  }
  if (pick >= 0) {
    const float* row = rows + uint64_t(pick) * d;
    for (uint32_t e = 0; e < d; ++e) r[e] -= row[e];
  }
  return pick;
}

CommVqEncoder::CommVqEncoder(std::shared_ptr<const CommVqCodebooks> cb)
    : cb_(std::move(cb)) {}

absl::StatusOr<std::unique_ptr<CommVqEncoder>> CommVqEncoder::Create(
    std::shared_ptr<const CommVqCodebooks> codebooks) {
  if (codebooks == nullptr) {
    return absl::InvalidArgumentError("commvq: codebooks: missing");
  }
  KVH_RETURN_IF_ERROR(codebooks->Validate());
  const CommVqConfig& c = codebooks->config;
  const uint64_t tables =
      uint64_t{c.num_layers} * c.key_stages * c.key_groups() * c.key_levels;
  const uint64_t bytes = tables * (c.key_levels + 1) * sizeof(float);
  if (bytes > kCommVqMaxEncoderTableBytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "commvq: the encoder's key tables would need %u bytes, over the limit "
        "of %u; use fewer key_levels, key_stages or larger key_group_pairs",
        bytes, kCommVqMaxEncoderTableBytes));
  }
  std::unique_ptr<CommVqEncoder> e(new CommVqEncoder(std::move(codebooks)));
  const CommVqCodebooks& cb = *e->cb_;
  e->na_.assign(tables, 0.0f);
  e->m2_.assign(tables * c.key_levels, 0.0f);
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    for (uint32_t s = 0; s < c.key_stages; ++s) {
      for (uint32_t q = 0; q < c.key_groups(); ++q) {
        CommVqKeyGroupTables(cb, l, s, q, const_cast<float*>(e->Na(l, s, q)),
                             const_cast<float*>(e->M2(l, s, q)));
      }
    }
  }
  e->row_norm_.resize(uint64_t{c.num_layers} * c.value_rows());
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    for (uint32_t r = 0; r < c.value_rows(); ++r) {
      const float* row = cb.value_at(l, r);
      float n = 0.0f;
      for (uint32_t i = 0; i < c.dim(); ++i) n += row[i] * row[i];
      e->row_norm_[uint64_t{l} * c.value_rows() + r] = n;
    }
  }
  return e;
}

const float* CommVqEncoder::Na(uint32_t layer, uint32_t stage,
                               uint32_t group) const {
  const CommVqConfig& c = cb_->config;
  return na_.data() +
         ((uint64_t{layer} * c.key_stages + stage) * c.key_groups() + group) *
             c.key_levels;
}

const float* CommVqEncoder::M2(uint32_t layer, uint32_t stage,
                               uint32_t group) const {
  const CommVqConfig& c = cb_->config;
  return m2_.data() +
         ((uint64_t{layer} * c.key_stages + stage) * c.key_groups() + group) *
             c.key_levels * c.key_levels;
}

size_t CommVqEncoder::ScratchFloats() const {
  return cb_->config.dim() + 2 * size_t{cb_->config.key_levels};
}

void CommVqEncoder::EncodeKey(uint32_t layer, const float* key, uint16_t* codes,
                              float* scratch) const {
  const CommVqConfig& c = cb_->config;
  float* r = scratch;
  std::memcpy(r, key, sizeof(float) * c.dim());
  for (uint32_t s = 0; s < c.key_stages; ++s) {
    for (uint32_t q = 0; q < c.key_groups(); ++q) {
      uint16_t* code = codes + (s * c.key_groups() + q) * 2;
      CommVqPickKeyCode(*cb_, layer, s, q, Na(layer, s, q), M2(layer, s, q), r,
                        scratch + c.dim(), &code[0], &code[1]);
    }
  }
}

void CommVqEncoder::EncodeValue(uint32_t layer, const float* value,
                                uint8_t* bits, float* scratch) const {
  const CommVqConfig& c = cb_->config;
  float* r = scratch;
  std::memcpy(r, value, sizeof(float) * c.dim());
  std::memset(bits, 0, (c.value_rows() + 7) / 8);
  const float* norms = row_norm_.data() + uint64_t{layer} * c.value_rows();
  for (uint32_t m = 0; m < c.value_stages; ++m) {
    const uint32_t first = m * c.value_stage_rows;
    const int64_t pick =
        CommVqPickValueRow(cb_->value_at(layer, first), norms + first,
                           c.value_stage_rows, c.dim(), r);
    if (pick < 0) continue;
    const uint64_t n = first + uint64_t(pick);
    bits[n / 8] |= static_cast<uint8_t>(1u << (n % 8));
  }
}

}  // namespace kvharbor
