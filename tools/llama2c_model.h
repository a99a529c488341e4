// A small CPU implementation of Karpathy's llama2.c model (the "legacy"
// checkpoint format: 7 int32 header fields, then float32 weights in
// llama2.c's order) and its tokenizer, for measuring KV-cache codecs on a
// real (tiny) model's cache: teacher-forced loss, with the cache captured and
// optionally replaced by a decoded one.
//
// The forward pass follows llama2.c's run.c (computed layer by layer over
// all positions with sgemm, which only reorders float sums): RMSNorm (eps
// 1e-5),
// grouped-query attention, interleaved RoPE with theta 10000 (pairs (2i,
// 2i+1), inv_freq = 10000^(-2i/head_dim)), SwiGLU feed-forward, classifier
// shared with the embedding when vocab_size is positive in the header.
//
// Memory: Llama2cModel owns its weights (about 4 bytes per parameter);
// traces are returned by value. Thread-safety: a loaded model is immutable;
// Run is const and may run concurrently.
#ifndef KVHARBOR_TOOLS_LLAMA2C_MODEL_H_
#define KVHARBOR_TOOLS_LLAMA2C_MODEL_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvharbor {

struct Llama2cConfig {
  int32_t dim = 0;
  int32_t hidden_dim = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t vocab_size = 0;  // absolute value of the header's
  int32_t seq_len = 0;
  bool shared_classifier = true;

  int32_t head_dim() const { return dim / n_heads; }
  int32_t kv_dim() const { return n_kv_heads * head_dim(); }
};

// What one teacher-forced run over a sequence produces. Layouts are
// [token][layer][...]: k and v [T][L][kv_dim] (keys with RoPE applied, as the
// cache holds them), q [T][L][dim] (with RoPE), att [T][L][dim] (attention
// output per head before the output projection).
struct Llama2cTrace {
  std::vector<float> k, v, q, att;
  double nll_sum = 0;      // sum over t of -log p(token[t+1] | ..token[t])
  uint64_t nll_count = 0;  // tokens.size() - 1
  std::vector<int> top1;   // [nll_count]: the most likely next token at t
};

class Llama2cModel {
 public:
  // Checks the header (positive sizes, n_heads divisible by n_kv_heads, dim
  // by n_heads, even head_dim) and that the file holds exactly the weights
  // the header implies.
  static absl::StatusOr<Llama2cModel> Load(const std::string& path);

  const Llama2cConfig& config() const { return config_; }

  // Runs `tokens` (at most seq_len, each < vocab_size) one position at a
  // time. With `history_k`/`history_v` ([T][L][kv_dim], e.g. a decoded
  // cache) the attention of position t uses them for positions < t and the
  // freshly computed key and value for t itself: every prediction is made
  // from a restored cache of the whole past. Without them it is the plain
  // model.
  absl::StatusOr<Llama2cTrace> Run(const std::vector<int>& tokens,
                                   const float* history_k = nullptr,
                                   const float* history_v = nullptr) const;

  // Attention output of one query head over positions [0, n): keys/values
  // of position j at k(j)/v(j) (head_dim floats). Writes head_dim floats.
  static void Attend(const float* q, int head_dim, int n,
                     const float* const* keys, const float* const* values,
                     float* out);

 private:
  struct Activations;  // one Run's buffers (llama2c_model.cc)

  // Each of `tokens` in [0, vocab_size), 1 .. seq_len of them.
  absl::Status CheckTokens(const std::vector<int>& tokens) const;
  // Layer l's attention block over all positions: q/k/v (recorded in `tr`),
  // attention (from history_k/v for earlier positions when given), the
  // output projection added to the residual stream.
  void AttentionLayer(int l, const float* history_k, const float* history_v,
                      Activations* a, Llama2cTrace* tr) const;
  // Layer l's SwiGLU feed-forward block, added to the residual stream.
  void FeedForwardLayer(int l, Activations* a) const;
  // The next-token log-likelihoods and top-1 of positions 0 .. T-2.
  void Score(const std::vector<int>& tokens, Activations* a,
             Llama2cTrace* tr) const;

  Llama2cConfig config_;
  std::vector<float> w_;  // all weights, in file order
  // Offsets into w_.
  size_t emb_ = 0, rms_att_ = 0, wq_ = 0, wk_ = 0, wv_ = 0, wo_ = 0;
  size_t rms_ffn_ = 0, w1_ = 0, w2_ = 0, w3_ = 0, rms_final_ = 0, wcls_ = 0;
};

// llama2.c's tokenizer.bin: int32 max_token_length, then per token float32
// score, int32 length, bytes. Encode is llama2.c's: optional BOS (1), a
// dummy-prefix space, characters (UTF-8 code points) or byte fallback
// (byte + 3), then greedy merges of the best-scoring adjacent pair.
class Llama2cTokenizer {
 public:
  static absl::StatusOr<Llama2cTokenizer> Load(const std::string& path,
                                               int vocab_size);
  std::vector<int> Encode(absl::string_view text, bool bos) const;

 private:
  std::vector<std::string> vocab_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> ids_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_TOOLS_LLAMA2C_MODEL_H_
