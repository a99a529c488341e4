"""A small Llama forward pass in plain PyTorch over a Hugging Face Llama
state dict, independent of transformers: the reference that checks a
converted checkpoint (tests/python/test_llama2c_hf.py) and the engine of
bench/hit_correctness.py where transformers is not installed.

Semantics are HF LlamaForCausalLM's with default RoPE: RMSNorm (eps from the
config), half-split RoPE (`rotate_half`, inv_freq[i] = theta^(-2i/head_dim)),
grouped-query attention (query head h reads KV head h // (heads / kv_heads)),
SwiGLU feed-forward, classifier tied to the embedding when the config says
so. RoPE scaling (rope_scaling / llama3) is not implemented: a config that
asks for it is refused.

The cache is DenseKv: per layer K and V tensors [1][kv_heads][capacity][head_dim]
(HF's DynamicCache layout), filled up to `length`; keys are cached after
RoPE. forward() attends to the cache's first `length` tokens, writes the new
tokens' K/V behind them and returns logits. Works with torch 1.13 .. 2.x, on
CPU or CUDA. Not thread-safe (a DenseKv is mutated).
"""

import math

import torch
import torch.nn.functional as F


class DenseKv:
    """Per-layer K/V, [1][kv_heads][capacity][head_dim] each."""

    def __init__(self, keys, values, length=0):
        self.k, self.v, self.length = list(keys), list(values), length

    @classmethod
    def empty(cls, layers, kv_heads, capacity, head_dim, dtype, device):
        shape = (1, kv_heads, capacity, head_dim)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)])

    @property
    def capacity(self):
        return self.k[0].shape[2]


class TorchLlama:
    def __init__(self, cfg, state, device="cpu", dtype=torch.float32):
        scaling = cfg.get("rope_scaling")
        if scaling:
            raise ValueError(f"config.rope_scaling: {scaling} is not supported here")
        self.layers = cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads") or self.heads
        self.dim = cfg["hidden_size"]
        self.head_dim = cfg.get("head_dim") or self.dim // self.heads
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.vocab = cfg["vocab_size"]
        self.dtype, self.device = dtype, torch.device(device)

        def w(name):
            return state[name].to(device=self.device, dtype=dtype)

        self.emb = w("model.embed_tokens.weight")
        self.norm = w("model.norm.weight")
        self.lm_head = (self.emb if cfg.get("tie_word_embeddings")
                        and "lm_head.weight" not in state else w("lm_head.weight"))
        names = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                 "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
        self.w = [{n: w(f"model.layers.{l}.{n}.weight") for n in names}
                  for l in range(self.layers)]
        theta = float(cfg.get("rope_theta", 10000.0))
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2,
                                                      dtype=torch.int64).float()
                                         / self.head_dim)).to(self.device)

    def new_cache(self, capacity):
        return DenseKv.empty(self.layers, self.kv_heads, capacity, self.head_dim,
                             self.dtype, self.device)

    def _rms(self, x, weight):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * xf.to(self.dtype)

    def _rope(self, x, pos):
        """x [heads][T][head_dim], positions pos [T]."""
        ang = pos.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        half = self.head_dim // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rot * sin

    @torch.no_grad()
    def forward(self, tokens, cache):
        """Logits [T][vocab] of `tokens` at positions [cache.length,
        cache.length + T); their K/V are appended to the cache."""
        t = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
        T, start = t.shape[0], cache.length
        end = start + T
        if end > cache.capacity:
            raise ValueError(f"tokens: {T} more tokens do not fit the cache "
                             f"({start} of {cache.capacity} used)")
        pos = torch.arange(start, end, device=self.device)
        mask = torch.arange(end, device=self.device)[None, :] > pos[:, None]
        rep = self.heads // self.kv_heads
        scale = 1.0 / math.sqrt(self.head_dim)
        x = self.emb[t]
        for l, w in enumerate(self.w):
            h = self._rms(x, w["input_layernorm"])
            q = F.linear(h, w["self_attn.q_proj"]).view(T, self.heads, self.head_dim)
            k = F.linear(h, w["self_attn.k_proj"]).view(T, self.kv_heads, self.head_dim)
            v = F.linear(h, w["self_attn.v_proj"]).view(T, self.kv_heads, self.head_dim)
            q = self._rope(q.transpose(0, 1), pos)          # [heads][T][hd]
            k = self._rope(k.transpose(0, 1), pos)          # [kv_heads][T][hd]
            cache.k[l][0, :, start:end] = k
            cache.v[l][0, :, start:end] = v.transpose(0, 1)
            keys = cache.k[l][0, :, :end].repeat_interleave(rep, dim=0)
            vals = cache.v[l][0, :, :end].repeat_interleave(rep, dim=0)
            s = torch.matmul(q, keys.transpose(1, 2)) * scale
            s = s.masked_fill(mask[None], float("-inf"))
            att = torch.matmul(torch.softmax(s.float(), dim=-1).to(self.dtype), vals)
            x = x + F.linear(att.transpose(0, 1).reshape(T, self.dim),
                             w["self_attn.o_proj"])
            h = self._rms(x, w["post_attention_layernorm"])
            x = x + F.linear(F.silu(F.linear(h, w["mlp.gate_proj"]))
                             * F.linear(h, w["mlp.up_proj"]), w["mlp.down_proj"])
        cache.length = end
        return F.linear(self._rms(x, self.norm), self.lm_head)
