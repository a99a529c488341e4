"""stories260K (llama2.c) in PyTorch with an explicit, page-aligned KV-cache.

Loads Karpathy's llama2.c "legacy" checkpoint (7 int32 header fields, then
float32 weights in llama2.c's order; read by tools/hf/convert_llama2c.py) and
its tokenizer (tok512.bin; tools/hf/llama2c_tokenizer.py), and runs
the forward pass of llama2.c's run.c: RMSNorm (eps 1e-5), grouped-query
attention, RoPE on interleaved pairs (2i, 2i+1) with theta 10000, SwiGLU,
classifier shared with the embedding.

The cache is explicit: per layer K and V of shape [tokens][kv_head][head_dim]
(KVCache.k[layer][:length], .v[layer][:length]); keys are cached *after*
RoPE, as inference engines do, so a cached key carries its position. A
forward pass can start from any cache (filled by a previous prefill, or
rebuilt from kvharbor pages) and continue.

Determinism: prefill runs in chunks of `chunk` tokens aligned to absolute
positions (multiples of `chunk`, the namespace's page size). Every chunk then
has the same shapes whether the prefix before it was computed here or
fetched from kvharbor, so on one device the continuation from a fetched
(identity-coded) cache is bitwise the same as a full recompute.

Only the standard library, NumPy and torch (1.13 .. 2.x APIs) are used.
"""

import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tools", "hf"))
from convert_llama2c import read_llama2c  # noqa: E402
from llama2c_tokenizer import BOS, EOS, Tokenizer, load_stories  # noqa: E402,F401


class Config:
    def __init__(self, dim, hidden_dim, n_layers, n_heads, n_kv_heads,
                 vocab_size, seq_len, shared_classifier):
        self.dim = dim
        self.hidden_dim = hidden_dim
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.shared_classifier = shared_classifier
        self.head_dim = dim // n_heads
        self.kv_dim = n_kv_heads * self.head_dim
        self.rope_theta = 10000.0

    def __repr__(self):
        return (f"Config(dim={self.dim}, hidden={self.hidden_dim}, "
                f"layers={self.n_layers}, heads={self.n_heads}, "
                f"kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, "
                f"vocab={self.vocab_size}, seq_len={self.seq_len})")


def pick_device(name=None):
    """CUDA when available (or as asked), else CPU. TF32 stays off so the
    GPU computes in true fp32 like the CPU."""
    if name is None:
        name = os.environ.get("E2E_DEVICE") or (
            "cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return dev


class KVCache:
    """Per layer K and V, [max_tokens][kv_head][head_dim] each, filled up to
    `length` (K with RoPE applied)."""

    def __init__(self, cfg, max_tokens, device, dtype=torch.float32):
        shape = (cfg.n_layers, max_tokens, cfg.n_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    def load(self, k, v):
        """Starts from a given cache: k, v [layers][tokens][kv_head][head_dim]."""
        n = k.shape[1]
        self.k[:, :n].copy_(k)
        self.v[:, :n].copy_(v)
        self.length = n


class Model:
    def __init__(self, path, device=None):
        self.device = device if device is not None else pick_device()
        h, w = read_llama2c(path)
        cfg = Config(dim=h.dim, hidden_dim=h.hidden_dim, n_layers=h.n_layers,
                     n_heads=h.n_heads, n_kv_heads=h.n_kv_heads,
                     vocab_size=h.vocab_size, seq_len=h.seq_len,
                     shared_classifier=h.shared_classifier)
        self.cfg = cfg
        for name in ("emb", "rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1",
                     "w2", "w3", "rms_final"):
            setattr(self, name, torch.from_numpy(w[name]).to(self.device))
        self.wcls = (self.emb if cfg.shared_classifier
                     else torch.from_numpy(w["wcls"]).to(self.device))
        # RoPE tables for interleaved pairs: inv_freq[i] = theta^(-2i/head_dim),
        # angles in double, then float32 (as the KVTC codec computes them).
        half = cfg.head_dim // 2
        inv = cfg.rope_theta ** (-np.arange(half, dtype=np.float64) * 2 / cfg.head_dim)
        ang = np.arange(4 * cfg.seq_len, dtype=np.float64)[:, None] * inv[None, :]
        self.cos = torch.from_numpy(np.cos(ang).astype(np.float32)).to(self.device)
        self.sin = torch.from_numpy(np.sin(ang).astype(np.float32)).to(self.device)

    # ---- pieces ----
    @staticmethod
    def _rmsnorm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def _rope(self, x, pos):
        """x [n][heads][head_dim], positions pos [n] (a LongTensor)."""
        n, h, hd = x.shape
        xr = x.reshape(n, h, hd // 2, 2)
        c = self.cos[pos][:, None, :]
        s = self.sin[pos][:, None, :]
        a, b = xr[..., 0], xr[..., 1]
        return torch.stack((a * c - b * s, a * s + b * c), dim=-1).reshape(n, h, hd)

    def _ffn(self, x, l):
        xb = self._rmsnorm(x, self.rms_ffn[l])
        return F.linear(F.silu(F.linear(xb, self.w1[l])) * F.linear(xb, self.w3[l]),
                        self.w2[l])

    def _qkv(self, x, l, pos):
        c = self.cfg
        n = x.shape[0]
        xb = self._rmsnorm(x, self.rms_att[l])
        q = F.linear(xb, self.wq[l]).reshape(n, c.n_heads, c.head_dim)
        k = F.linear(xb, self.wk[l]).reshape(n, c.n_kv_heads, c.head_dim)
        v = F.linear(xb, self.wv[l]).reshape(n, c.n_kv_heads, c.head_dim)
        return self._rope(q, pos), self._rope(k, pos), v

    def _heads(self, kv):
        """[T][kv_head][hd] -> [heads][T][hd] (query head h uses kv head
        h // (heads / kv_heads), as llama2.c)."""
        rep = self.cfg.n_heads // self.cfg.n_kv_heads
        return kv.repeat_interleave(rep, dim=1).permute(1, 0, 2)

    # ---- forward with a cache ----
    def _forward_chunk(self, tokens, start, cache):
        """Tokens at positions [start, start + n), the cache holding [0,
        start); appends their K/V and returns logits [n][vocab]."""
        c = self.cfg
        n = tokens.shape[0]
        end = start + n
        pos = torch.arange(start, end, device=self.device)
        x = self.emb[tokens]
        scale = 1.0 / math.sqrt(c.head_dim)
        # Causal mask within the chunk: query i sees keys [0, start + i].
        mask = (torch.arange(end, device=self.device)[None, :]
                > pos[:, None])
        for l in range(c.n_layers):
            q, k, v = self._qkv(x, l, pos)
            cache.k[l, start:end] = k
            cache.v[l, start:end] = v
            keys = self._heads(cache.k[l, :end])          # [h][end][hd]
            vals = self._heads(cache.v[l, :end])
            s = torch.matmul(q.permute(1, 0, 2), keys.transpose(1, 2)) * scale
            s = s.masked_fill(mask[None], float("-inf"))
            att = torch.matmul(torch.softmax(s, dim=-1), vals)  # [h][n][hd]
            x = x + F.linear(att.permute(1, 0, 2).reshape(n, c.dim), self.wo[l])
            x = x + self._ffn(x, l)
        cache.length = end
        return F.linear(self._rmsnorm(x, self.rms_final), self.wcls)

    @torch.no_grad()
    def prefill(self, tokens, cache, chunk=16, all_logits=False):
        """Runs tokens[cache.length:] (the cache holds the first
        cache.length tokens' K/V) in chunks ending at multiples of `chunk`.
        Returns the last token's logits [vocab] (or all new rows)."""
        t = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
        start = cache.length
        if start >= t.shape[0]:
            raise ValueError(f"tokens: {t.shape[0]} tokens, the cache holds {start} already")
        outs = []
        while start < t.shape[0]:
            end = min(t.shape[0], (start // chunk + 1) * chunk)
            outs.append(self._forward_chunk(t[start:end], start, cache))
            start = end
        return torch.cat(outs) if all_logits else outs[-1][-1]

    @torch.no_grad()
    def step(self, token, cache):
        """One decode step: the logits after `token` at position cache.length."""
        t = torch.tensor([int(token)], dtype=torch.long, device=self.device)
        return self._forward_chunk(t, cache.length, cache)[-1]

    @torch.no_grad()
    def generate(self, prompt, cache, n, chunk=16):
        """Greedy: prefill what the cache lacks of `prompt`, then `n` tokens.
        Returns (tokens, logits [n][vocab]); logits[i] produced tokens[i]."""
        logits = self.prefill(prompt, cache, chunk)
        toks, rows = [], []
        for i in range(n):
            rows.append(logits)
            nxt = int(torch.argmax(logits))
            toks.append(nxt)
            if i + 1 < n:
                logits = self.step(nxt, cache)
        return toks, torch.stack(rows)

    @torch.no_grad()
    def loss_with_history(self, tokens, hist_k, hist_v):
        """Teacher-forced NLL (sum, count) over `tokens` where the attention
        of position t uses hist_k/hist_v ([layers][T][kv_head][hd], e.g. a
        decoded cache) for positions < t and its own fresh K/V for t: every
        prediction is made from a restored cache of the whole past (the
        measure of tools/llama2c_model.h). With the clean cache as history
        this is the plain model."""
        c = self.cfg
        t = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
        T = t.shape[0]
        pos = torch.arange(T, device=self.device)
        x = self.emb[t]
        scale = 1.0 / math.sqrt(c.head_dim)
        past = pos[None, :] < pos[:, None]                       # j < t
        for l in range(c.n_layers):
            q, k, v = self._qkv(x, l, pos)
            qh = q.permute(1, 0, 2)                              # [h][T][hd]
            s_hist = torch.matmul(qh, self._heads(hist_k[l]).transpose(1, 2)) * scale
            s_hist = s_hist.masked_fill(~past[None], float("-inf"))
            kh, vh = self._heads(k), self._heads(v)              # [h][T][hd]
            s_self = (qh * kh).sum(-1, keepdim=True) * scale     # [h][T][1]
            p = torch.softmax(torch.cat((s_hist, s_self), dim=-1), dim=-1)
            att = torch.matmul(p[..., :T], self._heads(hist_v[l])) + p[..., T:] * vh
            x = x + F.linear(att.permute(1, 0, 2).reshape(T, c.dim), self.wo[l])
            x = x + self._ffn(x, l)
        logits = F.linear(self._rmsnorm(x[:-1], self.rms_final), self.wcls)
        nll = F.cross_entropy(logits.double(), t[1:], reduction="sum")
        return float(nll), T - 1


# ---- pages <-> cache ----

def cache_to_pages(k, v, page_size):
    """K, V [layers][T][kv_head][hd] (T a multiple of page_size) -> pages
    [P][2][layers][page_size][kv_head][hd], the daemon's default layout
    KV_LAYER_TOKEN_HEAD_DIM ([K|V][layer][token][kv_head][head_dim] per page)."""
    L, T, H, D = k.shape
    if T % page_size:
        raise ValueError(f"tokens: {T} is not a multiple of page_size {page_size}")
    kv = torch.stack((k, v))                                     # [2][L][T][H][D]
    return kv.reshape(2, L, T // page_size, page_size, H, D).permute(
        2, 0, 1, 3, 4, 5).contiguous()


def pages_to_cache(pages):
    """Inverse of cache_to_pages: [P][2][L][S][H][D] -> (K, V) [L][P*S][H][D]."""
    P, _, L, S, H, D = pages.shape
    kv = pages.permute(1, 2, 0, 3, 4, 5).reshape(2, L, P * S, H, D)
    return kv[0], kv[1]


LILY = "Once upon a time, there was a little girl named Lily."


def self_check(model, tok, n=16):
    """Greedy decoding from BOS must begin with the Lily sentence."""
    cache = KVCache(model.cfg, n + 1, model.device)
    toks, _ = model.generate([BOS], cache, n)
    text = tok.decode(toks)
    return text.startswith(LILY), text


if __name__ == "__main__":
    import sys
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "..", "..", "shared", "stories260K")
    m = Model(os.path.join(d, "stories260K.bin"))
    tk = Tokenizer(os.path.join(d, "tok512.bin"), m.cfg.vocab_size)
    ok, text = self_check(m, tk, 40)
    print(m.cfg, m.device)
    print(repr(text))
    print("Lily check:", "OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)
