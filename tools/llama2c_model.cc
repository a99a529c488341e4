#include "tools/llama2c_model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/byte_io.h"
#include "core/base/status_macros.h"

namespace kvharbor {
namespace {

// llama2.c checkpoints and tokenizers are read whole (stories260K is 1 MiB;
// the larger stories models are tens to hundreds of MiB).
absl::StatusOr<std::string> ReadAll(const std::string& path) {
  return ReadWholeFile(path, uint64_t{8} << 30);
}

void RmsNorm(const float* x, const float* w, int n, float* out) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / n) + 1e-5f);
  for (int i = 0; i < n; ++i) out[i] = w[i] * (scale * x[i]);
}

// out[T][d] = x[T][n] W^T, W being [d][n] (llama2.c's layout).
void MatMul(const float* w, const float* x, int T, int n, int d, float* out) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, d, n, 1.0f, x, n, w,
              n, 0.0f, out, d);
}

// llama2.c's RoPE over a vector of n floats (a whole q or k).
void Rope(float* v, int n, int head_dim, int pos) {
  for (int i = 0; i < n; i += 2) {
    const int hd = i % head_dim;
    const float freq = 1.0f / std::pow(10000.0f, hd / float(head_dim));
    const float angle = pos * freq;
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = v[i], b = v[i + 1];
    v[i] = a * c - b * s;
    v[i + 1] = a * s + b * c;
  }
}

}  // namespace

absl::StatusOr<Llama2cModel> Llama2cModel::Load(const std::string& path) {
  auto bytes = ReadAll(path);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() < 28) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header: file is shorter than 28 bytes"));
  }
  int32_t h[7];
  std::memcpy(h, bytes->data(), 28);
  Llama2cConfig c;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.shared_classifier = h[5] > 0;
  c.vocab_size = h[5] > 0 ? h[5] : -h[5];
  c.seq_len = h[6];
  const char* names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                          "n_kv_heads", "vocab_size", "seq_len"};
  const int32_t vals[7] = {c.dim,        c.hidden_dim, c.n_layers, c.n_heads,
                           c.n_kv_heads, c.vocab_size, c.seq_len};
  for (int i = 0; i < 7; ++i) {
    if (vals[i] <= 0 || vals[i] > (1 << 20)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: header.%s: %d is out of range [1, 2^20]", path,
                          names[i], vals[i]));
    }
  }
  if (c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0 ||
      c.head_dim() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: header: dim %d, n_heads %d, n_kv_heads %d do not give an even "
        "head_dim shared by whole groups",
        path, c.dim, c.n_heads, c.n_kv_heads));
  }
  Llama2cModel m;
  m.config_ = c;
  const size_t d = c.dim, hd = c.hidden_dim, l = c.n_layers, kv = c.kv_dim();
  size_t off = 0;
  auto take = [&](size_t n) {
    const size_t at = off;
    off += n;
    return at;
  };
  m.emb_ = take(size_t(c.vocab_size) * d);
  m.rms_att_ = take(l * d);
  m.wq_ = take(l * d * d);
  m.wk_ = take(l * d * kv);
  m.wv_ = take(l * d * kv);
  m.wo_ = take(l * d * d);
  m.rms_ffn_ = take(l * d);
  m.w1_ = take(l * d * hd);
  m.w2_ = take(l * hd * d);
  m.w3_ = take(l * d * hd);
  m.rms_final_ = take(d);
  take(size_t(c.seq_len) * c.head_dim());  // freq_cis real + imag (unused)
  m.wcls_ = c.shared_classifier ? m.emb_ : take(size_t(c.vocab_size) * d);
  if (bytes->size() != 28 + off * 4) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: weights: the header implies %u bytes, the file has %u", path,
        28 + off * 4, bytes->size()));
  }
  m.w_.resize(off);
  std::memcpy(m.w_.data(), bytes->data() + 28, off * 4);
  return m;
}

void Llama2cModel::Attend(const float* q, int head_dim, int n,
                          const float* const* keys, const float* const* values,
                          float* out) {
  std::vector<float> att(n);
  float max = -INFINITY;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int j = 0; j < n; ++j) {
    float s = 0;
    for (int i = 0; i < head_dim; ++i) s += q[i] * keys[j][i];
    att[j] = s * scale;
    max = std::max(max, att[j]);
  }
  float sum = 0;
  for (int j = 0; j < n; ++j) sum += att[j] = std::exp(att[j] - max);
  std::fill(out, out + head_dim, 0.0f);
  for (int j = 0; j < n; ++j) {
    const float a = att[j] / sum;
    for (int i = 0; i < head_dim; ++i) out[i] += a * values[j][i];
  }
}

// One run's activations, [T][n] row-major throughout: layer by layer over
// all positions (position t's inputs to layer l do not depend on other
// positions' layer-l outputs), so each projection is one GEMM over the T
// positions.
struct Llama2cModel::Activations {
  Activations(int T, const Llama2cConfig& c)
      : T(T),
        x(size_t(T) * c.dim),
        xb(size_t(T) * c.dim),
        q(size_t(T) * c.dim),
        k(size_t(T) * c.kv_dim()),
        v(size_t(T) * c.kv_dim()),
        att(size_t(T) * c.dim),
        hb(size_t(T) * c.hidden_dim),
        hb2(size_t(T) * c.hidden_dim),
        keys(T),
        values(T) {}
  int T;
  std::vector<float> x, xb, q, k, v, att, hb, hb2;
  std::vector<const float*> keys, values;
};

absl::Status Llama2cModel::CheckTokens(const std::vector<int>& tokens) const {
  const Llama2cConfig& c = config_;
  const int T = static_cast<int>(tokens.size());
  if (T == 0 || T > c.seq_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tokens: %d tokens, need 1 .. seq_len %d", T, c.seq_len));
  }
  for (int t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tokens[%d]: %d is not in [0, %d)", t, tokens[t], c.vocab_size));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Llama2cTrace> Llama2cModel::Run(const std::vector<int>& tokens,
                                               const float* history_k,
                                               const float* history_v) const {
  KVH_RETURN_IF_ERROR(CheckTokens(tokens));
  const Llama2cConfig& c = config_;
  const int T = static_cast<int>(tokens.size());
  const int d = c.dim, kvd = c.kv_dim(), L = c.n_layers;
  Llama2cTrace tr;
  tr.k.resize(size_t(T) * L * kvd);
  tr.v.resize(size_t(T) * L * kvd);
  tr.q.resize(size_t(T) * L * d);
  tr.att.resize(size_t(T) * L * d);
  Activations a(T, c);
  const float* w = w_.data();
  for (int t = 0; t < T; ++t) {
    std::copy(w + emb_ + size_t(tokens[t]) * d,
              w + emb_ + size_t(tokens[t] + 1) * d,
              a.x.begin() + size_t(t) * d);
  }
  for (int l = 0; l < L; ++l) {
    AttentionLayer(l, history_k, history_v, &a, &tr);
    FeedForwardLayer(l, &a);
  }
  Score(tokens, &a, &tr);
  return tr;
}

void Llama2cModel::AttentionLayer(int l, const float* history_k,
                                  const float* history_v, Activations* a,
                                  Llama2cTrace* tr) const {
  const Llama2cConfig& c = config_;
  const int T = a->T, d = c.dim, kvd = c.kv_dim(), hs = c.head_dim();
  const int L = c.n_layers, kv_mul = c.n_heads / c.n_kv_heads;
  const float* w = w_.data();
  for (int t = 0; t < T; ++t) {
    RmsNorm(&a->x[size_t(t) * d], w + rms_att_ + size_t(l) * d, d,
            &a->xb[size_t(t) * d]);
  }
  MatMul(w + wq_ + size_t(l) * d * d, a->xb.data(), T, d, d, a->q.data());
  MatMul(w + wk_ + size_t(l) * d * kvd, a->xb.data(), T, d, kvd, a->k.data());
  MatMul(w + wv_ + size_t(l) * d * kvd, a->xb.data(), T, d, kvd, a->v.data());
  for (int t = 0; t < T; ++t) {
    Rope(&a->q[size_t(t) * d], d, hs, t);
    Rope(&a->k[size_t(t) * kvd], kvd, hs, t);
    const size_t row = size_t(t) * L + l;
    std::copy_n(&a->q[size_t(t) * d], d, &tr->q[row * d]);
    std::copy_n(&a->k[size_t(t) * kvd], kvd, &tr->k[row * kvd]);
    std::copy_n(&a->v[size_t(t) * kvd], kvd, &tr->v[row * kvd]);
  }
  for (int t = 0; t < T; ++t) {
    const size_t row = size_t(t) * L + l;
    for (int h = 0; h < c.n_heads; ++h) {
      const int g = h / kv_mul;
      for (int j = 0; j <= t; ++j) {
        const bool hist = history_k != nullptr && j < t;
        const size_t r = (size_t(j) * L + l) * kvd + size_t(g) * hs;
        a->keys[j] = (hist ? history_k : tr->k.data()) + r;
        a->values[j] = (hist ? history_v : tr->v.data()) + r;
      }
      Attend(&a->q[size_t(t) * d] + h * hs, hs, t + 1, a->keys.data(),
             a->values.data(), &a->att[size_t(t) * d] + h * hs);
    }
    std::copy_n(&a->att[size_t(t) * d], d, &tr->att[row * d]);
  }
  MatMul(w + wo_ + size_t(l) * d * d, a->att.data(), T, d, d, a->xb.data());
  for (size_t i = 0; i < a->x.size(); ++i) a->x[i] += a->xb[i];
}

void Llama2cModel::FeedForwardLayer(int l, Activations* a) const {
  const Llama2cConfig& c = config_;
  const int T = a->T, d = c.dim, hd = c.hidden_dim;
  const float* w = w_.data();
  for (int t = 0; t < T; ++t) {
    RmsNorm(&a->x[size_t(t) * d], w + rms_ffn_ + size_t(l) * d, d,
            &a->xb[size_t(t) * d]);
  }
  const size_t fo = size_t(l) * d * hd;
  MatMul(w + w1_ + fo, a->xb.data(), T, d, hd, a->hb.data());
  MatMul(w + w3_ + fo, a->xb.data(), T, d, hd, a->hb2.data());
  for (size_t i = 0; i < a->hb.size(); ++i) {
    a->hb[i] = a->hb[i] / (1.0f + std::exp(-a->hb[i])) * a->hb2[i];
  }
  MatMul(w + w2_ + fo, a->hb.data(), T, hd, d, a->xb.data());
  for (size_t i = 0; i < a->x.size(); ++i) a->x[i] += a->xb[i];
}

void Llama2cModel::Score(const std::vector<int>& tokens, Activations* a,
                         Llama2cTrace* tr) const {
  const Llama2cConfig& c = config_;
  const int d = c.dim;
  const float* w = w_.data();
  // The last position predicts nothing we score.
  const int scored = a->T - 1;
  if (scored == 0) return;
  for (int t = 0; t < scored; ++t) {
    RmsNorm(&a->x[size_t(t) * d], w + rms_final_, d, &a->xb[size_t(t) * d]);
  }
  std::vector<float> logits(size_t(scored) * c.vocab_size);
  MatMul(w + wcls_, a->xb.data(), scored, d, c.vocab_size, logits.data());
  for (int t = 0; t < scored; ++t) {
    const float* z = &logits[size_t(t) * c.vocab_size];
    const float* top = std::max_element(z, z + c.vocab_size);
    const float max = *top;
    double sum = 0;
    for (int i = 0; i < c.vocab_size; ++i) sum += std::exp(double(z[i]) - max);
    tr->nll_sum += std::log(sum) + max - z[tokens[t + 1]];
    tr->top1.push_back(static_cast<int>(top - z));
    ++tr->nll_count;
  }
}

absl::StatusOr<Llama2cTokenizer> Llama2cTokenizer::Load(const std::string& path,
                                                        int vocab_size) {
  auto bytes = ReadAll(path);
  if (!bytes.ok()) return bytes.status();
  const std::string& b = *bytes;
  size_t pos = 4;  // max_token_length is not needed
  Llama2cTokenizer tok;
  for (int i = 0; i < vocab_size; ++i) {
    float score;
    int32_t len;
    if (pos + 8 > b.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: token %d: truncated", path, i));
    }
    std::memcpy(&score, b.data() + pos, 4);
    std::memcpy(&len, b.data() + pos + 4, 4);
    pos += 8;
    if (len < 0 || size_t(len) > b.size() - pos) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: token %d: length %d is out of bounds", path, i, len));
    }
    tok.vocab_.emplace_back(b.data() + pos, len);
    tok.scores_.push_back(score);
    tok.ids_.emplace(tok.vocab_.back(), i);
    pos += len;
  }
  return tok;
}

std::vector<int> Llama2cTokenizer::Encode(absl::string_view text,
                                          bool bos) const {
  std::vector<int> out;
  if (bos) out.push_back(1);
  // The dummy-prefix space takes part in merges, BOS does not.
  const size_t first = out.size();
  auto lookup = [&](const std::string& s) {
    auto it = ids_.find(s);
    return it == ids_.end() ? -1 : it->second;
  };
  if (!text.empty()) {
    const int space = lookup(" ");
    if (space >= 0) out.push_back(space);
  }
  for (size_t i = 0; i < text.size();) {
    size_t n = 1;  // UTF-8 code point length (continuation bytes 10xxxxxx)
    while (i + n < text.size() && n < 4 &&
           (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) {
      ++n;
    }
    const int id = lookup(std::string(text.substr(i, n)));
    if (id >= 0) {
      out.push_back(id);
    } else {
      for (size_t j = 0; j < n; ++j) {
        out.push_back(static_cast<unsigned char>(text[i + j]) + 3);
      }
    }
    i += n;
  }
  for (;;) {
    float best = -1e10f;
    int best_id = -1;
    size_t best_at = 0;
    for (size_t i = first; i + 1 < out.size(); ++i) {
      const int id = lookup(vocab_[out[i]] + vocab_[out[i + 1]]);
      if (id >= 0 && scores_[id] > best) {
        best = scores_[id];
        best_id = id;
        best_at = i;
      }
    }
    if (best_id < 0) break;
    out[best_at] = best_id;
    out.erase(out.begin() + best_at + 1);
  }
  return out;
}

}  // namespace kvharbor
