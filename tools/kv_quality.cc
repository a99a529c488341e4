#include "tools/kv_quality.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/float_formats.h"
#include "core/base/status_macros.h"
#include "tools/commvq_calibrate.h"

namespace kvharbor {
namespace {

void StoreElement(DType dtype, float v, uint8_t* p) {
  switch (dtype) {
    case DType::kFP32:
      std::memcpy(p, &v, 4);
      return;
    case DType::kBF16: {
      const uint16_t b = FloatToBf16(v);
      std::memcpy(p, &b, 2);
      return;
    }
    case DType::kFP16: {
      const uint16_t b = FloatToFp16(v);
      std::memcpy(p, &b, 2);
      return;
    }
    case DType::kFP8E4M3:
      *p = FloatToFp8E4M3(v);
      return;
    case DType::kUnspecified:
      break;
  }
}

float LoadElement(DType dtype, const uint8_t* p) {
  switch (dtype) {
    case DType::kFP32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kBF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return Bf16ToFloat(b);
    }
    case DType::kFP16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return Fp16ToFloat(b);
    }
    case DType::kFP8E4M3:
      return Fp8E4M3ToFloat(*p);
    case DType::kUnspecified:
      break;
  }
  return 0;
}

// Byte offset in a page (layout kKvLayerTokenHeadDim) of (kv, layer, token)'s
// run of kv_dim elements.
uint64_t RunOffset(const Geometry& g, int kv, uint32_t l, uint32_t t) {
  const uint64_t hd = uint64_t{g.num_kv_heads} * g.head_dim;
  return ((uint64_t(kv) * g.num_layers + l) * g.page_size + t) * hd *
         DTypeSize(g.dtype);
}

float Fp16Round(float v) { return Fp16ToFloat(FloatToFp16(v)); }

// Quantizes n values (stride apart) to 2 bits with an fp16 min and scale.
void Quantize2Bit(float* x, int n, size_t stride) {
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[i * stride]);
    mx = std::max(mx, x[i * stride]);
  }
  const float lo = Fp16Round(mn);
  const float scale = Fp16Round((mx - mn) / 3.0f);
  for (int i = 0; i < n; ++i) {
    float& v = x[i * stride];
    const float q =
        scale > 0 ? std::min(3.0f, std::max(0.0f, std::round((v - lo) / scale)))
                  : 0.0f;
    v = q * scale + lo;
  }
}

// The model's KV shape and RoPE (interleaved pairs, theta 10000), as a
// CommVqConfig and KvSamples both state them.
template <typename T>
void SetModelKvShape(const Llama2cConfig& c, T* out) {
  out->num_layers = c.n_layers;
  out->num_kv_heads = c.n_kv_heads;
  out->head_dim = c.head_dim();
  out->rope_style = RopeStyle::kInterleaved;
  out->rope_theta = 10000.0f;
}

}  // namespace

Geometry ModelGeometry(const Llama2cConfig& c, uint32_t page_size,
                       DType dtype) {
  Geometry g;
  g.num_layers = c.n_layers;
  g.num_kv_heads = c.n_kv_heads;
  g.head_dim = c.head_dim();
  g.page_size = page_size;
  g.dtype = dtype;
  g.layout = PageLayout::kKvLayerTokenHeadDim;
  g.rope_theta = 10000.0f;
  return g;
}

absl::StatusOr<DecodedCaches> RoundTripPages(
    const Codec& codec, const std::vector<const KvSequence*>& seqs) {
  const Geometry& g = codec.geometry();
  const uint32_t ps = g.page_size, L = g.num_layers;
  const uint64_t kvd = uint64_t{g.num_kv_heads} * g.head_dim;
  const size_t elem = DTypeSize(g.dtype);
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageRef> refs;
  for (const KvSequence* s : seqs) {
    const uint64_t T = s->tokens.size();
    for (uint64_t first = 0; first < T; first += ps) {
      pages.emplace_back(g.PageBytes());
      uint8_t* page = pages.back().data();
      for (uint32_t t = 0; t < ps; ++t) {
        const uint64_t tok = std::min(first + t, T - 1);
        for (int kv = 0; kv < 2; ++kv) {
          const float* src = (kv == 0 ? s->clean.k : s->clean.v).data();
          for (uint32_t l = 0; l < L; ++l) {
            uint8_t* dst = page + RunOffset(g, kv, l, t);
            const float* run = src + (tok * L + l) * kvd;
            for (uint64_t i = 0; i < kvd; ++i) {
              StoreElement(g.dtype, run[i], dst + i * elem);
            }
          }
        }
      }
    }
  }
  uint64_t first_index = 0;
  for (const KvSequence* s : seqs) {
    for (uint64_t first = 0; first < s->tokens.size(); first += ps) {
      refs.push_back({pages[first_index++].data(), first});
    }
  }
  uint64_t bytes = 0;
  CodecWorkspace ws;
  for (size_t i = 0; i < pages.size(); ++i) {
    KVH_ASSIGN_OR_RETURN(
        const std::string buf,
        codec.EncodeToString(absl::MakeConstSpan(&refs[i], 1), &ws));
    bytes += buf.size();
    std::fill(pages[i].begin(), pages[i].end(), 0);
    const MutablePageRef out{pages[i].data(), refs[i].first_position};
    KVH_RETURN_IF_ERROR(codec.Decode(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(buf.data()),
                            buf.size()),
        absl::MakeConstSpan(&out, 1), &ws));
  }
  DecodedCaches d;
  d.bytes = bytes;
  size_t pi = 0;
  for (const KvSequence* s : seqs) {
    const uint64_t T = s->tokens.size();
    d.k.emplace_back(T * L * kvd);
    d.v.emplace_back(T * L * kvd);
    for (uint64_t first = 0; first < T; first += ps, ++pi) {
      for (uint32_t t = 0; t < ps && first + t < T; ++t) {
        for (int kv = 0; kv < 2; ++kv) {
          float* dst = (kv == 0 ? d.k : d.v).back().data();
          for (uint32_t l = 0; l < L; ++l) {
            const uint8_t* run = pages[pi].data() + RunOffset(g, kv, l, t);
            for (uint64_t i = 0; i < kvd; ++i) {
              dst[((first + t) * L + l) * kvd + i] =
                  LoadElement(g.dtype, run + i * elem);
            }
          }
        }
      }
    }
  }
  return d;
}

DecodedCaches KiviRoundTrip(const std::vector<const KvSequence*>& seqs,
                            const Llama2cConfig& c, int group) {
  DecodedCaches d;
  const int L = c.n_layers, kvd = c.kv_dim();
  auto group_bytes = [](int n) { return uint64_t((2 * n + 7) / 8) + 4; };
  for (const KvSequence* s : seqs) {
    const int T = static_cast<int>(s->tokens.size());
    std::vector<float> k = s->clean.k, v = s->clean.v;
    const size_t stride = size_t(L) * kvd;  // next token, same channel
    for (int l = 0; l < L; ++l) {
      for (int ch = 0; ch < kvd; ++ch) {
        for (int t0 = 0; t0 < T; t0 += group) {
          const int n = std::min(group, T - t0);
          Quantize2Bit(&k[(size_t(t0) * L + l) * kvd + ch], n, stride);
          d.bytes += group_bytes(n);
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int l = 0; l < L; ++l) {
        for (int c0 = 0; c0 < kvd; c0 += group) {
          const int n = std::min(group, kvd - c0);
          Quantize2Bit(&v[(size_t(t) * L + l) * kvd + c0], n, 1);
          d.bytes += group_bytes(n);
        }
      }
    }
    d.k.push_back(std::move(k));
    d.v.push_back(std::move(v));
  }
  return d;
}

float RoundToE2M1(float v) {
  static constexpr float kLevels[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  const float a = std::min(std::fabs(v), 6.0f);
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const float d = std::fabs(a - kLevels[i]), b = std::fabs(a - kLevels[best]);
    if (d < b || (d == b && i % 2 == 0)) best = i;  // ties: the even code
  }
  return std::copysign(kLevels[best], v);
}

DecodedCaches Nvfp4RoundTrip(const std::vector<const KvSequence*>& seqs,
                             const Llama2cConfig& c) {
  constexpr int kBlock = 16;
  DecodedCaches d;
  const int L = c.n_layers, kvd = c.kv_dim();
  for (const KvSequence* s : seqs) {
    const int T = static_cast<int>(s->tokens.size());
    std::vector<float> k = s->clean.k, v = s->clean.v;
    for (std::vector<float>* x : {&k, &v}) {
      for (int l = 0; l < L; ++l) {
        float amax = 0;
        for (int t = 0; t < T; ++t) {
          const float* row = x->data() + (size_t(t) * L + l) * kvd;
          for (int i = 0; i < kvd; ++i)
            amax = std::max(amax, std::fabs(row[i]));
        }
        const float global = amax > 0 ? amax / (448.0f * 6.0f) : 1.0f;
        d.bytes += 4;
        for (int t = 0; t < T; ++t) {
          float* row = x->data() + (size_t(t) * L + l) * kvd;
          for (int b0 = 0; b0 < kvd; b0 += kBlock) {
            const int n = std::min(kBlock, kvd - b0);
            float bmax = 0;
            for (int i = 0; i < n; ++i)
              bmax = std::max(bmax, std::fabs(row[b0 + i]));
            const float scale =
                Fp8E4M3ToFloat(FloatToFp8E4M3(bmax / 6.0f / global)) * global;
            for (int i = 0; i < n; ++i) {
              row[b0 + i] =
                  scale > 0 ? RoundToE2M1(row[b0 + i] / scale) * scale : 0.0f;
            }
            d.bytes += 1 + uint64_t(n + 1) / 2;
          }
        }
      }
    }
    d.k.push_back(std::move(k));
    d.v.push_back(std::move(v));
  }
  return d;
}

std::shared_ptr<const C8Scales> FitC8Scales(
    const std::vector<const KvSequence*>& seqs, const Llama2cConfig& c) {
  auto s = std::make_shared<C8Scales>();
  const int L = c.n_layers, kvd = c.kv_dim();
  s->num_layers = L;
  s->kv_channels = kvd;
  for (int kv = 0; kv < 2; ++kv) {
    std::vector<float> lo(size_t(L) * kvd, 0.0f), hi(size_t(L) * kvd, 0.0f);
    for (const KvSequence* q : seqs) {
      const std::vector<float>& x = kv == 0 ? q->clean.k : q->clean.v;
      for (size_t i = 0; i < x.size(); ++i) {
        const size_t ch = i % lo.size();  // [T][L][kvd]: (layer, channel)
        lo[ch] = std::min(lo[ch], x[i]);
        hi[ch] = std::max(hi[ch], x[i]);
      }
    }
    std::vector<float>& scale = kv == 0 ? s->k_scale : s->v_scale;
    std::vector<float>& offset = kv == 0 ? s->k_offset : s->v_offset;
    for (size_t ch = 0; ch < lo.size(); ++ch) {
      const float sc = hi[ch] > lo[ch] ? (hi[ch] - lo[ch]) / 255.0f : 1.0f;
      scale.push_back(sc);
      offset.push_back(
          std::min(kC8Max, std::max(kC8Min, kC8Min - lo[ch] / sc)));
    }
  }
  return s;
}

absl::StatusOr<CommVqConfig> CommVqSetting(const Llama2cConfig& c,
                                           uint32_t bits,
                                           uint32_t value_stage_rows) {
  CommVqConfig cfg;
  SetModelKvShape(c, &cfg);
  cfg.key_levels = 16;
  cfg.key_group_pairs = cfg.head_dim / 2;
  const uint32_t key_bits = bits * cfg.key_group_pairs;
  const uint32_t value_rows = bits * cfg.dim();
  if (bits == 0 || key_bits % 4 != 0 || value_stage_rows == 0 ||
      value_rows % value_stage_rows != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--commvq-bits: %u bits does not fit head_dim %u (need bits * "
        "head_dim / 2 divisible by 4) or %u value rows in stages of %u",
        bits, cfg.head_dim, value_rows, value_stage_rows));
  }
  cfg.key_stages = key_bits / 4;
  cfg.value_stage_rows = value_stage_rows;
  cfg.value_stages = value_rows / value_stage_rows;
  KVH_RETURN_IF_ERROR(cfg.Validate());
  return cfg;
}

absl::StatusOr<std::shared_ptr<const CommVqCodebooks>> TrainCommVq(
    const std::vector<const KvSequence*>& seqs, const CommVqConfig& config,
    const CommVqTrainOptions& options) {
  std::vector<float> k, v;
  std::vector<uint64_t> positions;
  for (const KvSequence* s : seqs) {
    k.insert(k.end(), s->clean.k.begin(), s->clean.k.end());
    v.insert(v.end(), s->clean.v.begin(), s->clean.v.end());
    for (uint64_t t = 0; t < s->tokens.size(); ++t) positions.push_back(t);
  }
  const uint64_t samples = positions.size();
  std::vector<float> keys, values;
  CommVqTrainingRows(config, k, v, positions, /*keys_roped=*/true, &keys,
                     &values);
  KVH_ASSIGN_OR_RETURN(
      CommVqCodebooks cb,
      TrainCommVqCodebooks(config, keys, values, samples, options, nullptr));
  return std::make_shared<const CommVqCodebooks>(std::move(cb));
}

absl::StatusOr<QualityRow> Evaluate(const std::string& name,
                                    const Llama2cModel& model,
                                    const std::vector<const KvSequence*>& seqs,
                                    const DecodedCaches& decoded) {
  const Llama2cConfig& c = model.config();
  const int L = c.n_layers, kvd = c.kv_dim(), hs = c.head_dim();
  const int kv_mul = c.n_heads / c.n_kv_heads;
  double k_err = 0, k_ref = 0, v_err = 0, v_ref = 0, a_err = 0, a_ref = 0;
  double nll = 0;
  uint64_t count = 0, tokens = 0, agree = 0;
  std::vector<float> out(hs);
  for (size_t si = 0; si < seqs.size(); ++si) {
    const KvSequence& s = *seqs[si];
    const std::vector<float>& dk = decoded.k[si];
    const std::vector<float>& dv = decoded.v[si];
    for (size_t i = 0; i < dk.size(); ++i) {
      k_err += std::pow(double(dk[i]) - s.clean.k[i], 2);
      k_ref += std::pow(double(s.clean.k[i]), 2);
      v_err += std::pow(double(dv[i]) - s.clean.v[i], 2);
      v_ref += std::pow(double(s.clean.v[i]), 2);
    }
    const int T = static_cast<int>(s.tokens.size());
    tokens += T;
    std::vector<const float*> keys(T), values(T);
    for (int t = 0; t < T; ++t) {
      for (int l = 0; l < L; ++l) {
        for (int h = 0; h < c.n_heads; ++h) {
          for (int j = 0; j <= t; ++j) {
            const size_t r =
                (size_t(j) * L + l) * kvd + size_t(h / kv_mul) * hs;
            keys[j] = (j < t ? dk.data() : s.clean.k.data()) + r;
            values[j] = (j < t ? dv.data() : s.clean.v.data()) + r;
          }
          const size_t qr = (size_t(t) * L + l) * c.dim + size_t(h) * hs;
          Llama2cModel::Attend(&s.clean.q[qr], hs, t + 1, keys.data(),
                               values.data(), out.data());
          for (int i = 0; i < hs; ++i) {
            a_err += std::pow(double(out[i]) - s.clean.att[qr + i], 2);
            a_ref += std::pow(double(s.clean.att[qr + i]), 2);
          }
        }
      }
    }
    KVH_ASSIGN_OR_RETURN(const Llama2cTrace tr,
                         model.Run(s.tokens, dk.data(), dv.data()));
    nll += tr.nll_sum;
    count += tr.nll_count;
    for (size_t t = 0; t < tr.top1.size() && t < s.clean.top1.size(); ++t) {
      agree += tr.top1[t] == s.clean.top1[t] ? 1 : 0;
    }
  }
  QualityRow row;
  row.codec = name;
  row.bytes_per_token = double(decoded.bytes) / double(tokens);
  row.ratio_vs_bf16 = 2.0 * 2 * L * kvd / row.bytes_per_token;
  row.k_rel_error = std::sqrt(k_err / k_ref);
  row.v_rel_error = std::sqrt(v_err / v_ref);
  row.attn_rel_error = std::sqrt(a_err / a_ref);
  row.loss = nll / double(count);
  row.top1_agreement = double(agree) / double(count);
  return row;
}

KvSamples SamplesFrom(const std::vector<const KvSequence*>& seqs,
                      const Llama2cConfig& c) {
  KvSamples s;
  SetModelKvShape(c, &s);
  s.keys_roped = true;
  s.extra["model"] = "llama2.c checkpoint (tools/llama2c_model.h)";
  for (const KvSequence* q : seqs) {
    s.k.insert(s.k.end(), q->clean.k.begin(), q->clean.k.end());
    s.v.insert(s.v.end(), q->clean.v.begin(), q->clean.v.end());
    for (size_t t = 0; t < q->tokens.size(); ++t) {
      s.positions.push_back(static_cast<int64_t>(t));
    }
  }
  s.tokens = s.positions.size();
  return s;
}

}  // namespace kvharbor
