"""The models bench/pd_handoff_bench.py runs in its prefill and decode
processes, behind one interface:

- HfRandomEngine: transformers' LlamaForCausalLM of a config dict with
  random bf16 weights (bench_model.build_model: Llama-3.1-8B by default),
  SDPA; the GPU machine's model. Both processes seed torch identically, so
  they hold the same weights.
- TorchLlamaEngine: tools/hf/torch_llama.py (HF Llama semantics in plain
  torch, fp32), over stories260K converted to an HF folder
  (tools/hf/convert_llama2c.py), or over a tiny random Llama config when
  stories260K is not found; runs without transformers (Debian's python3 has
  torch only), on CPU or CUDA. The CI mode's model.

Interface: `shape` (bench_model.Shape: layers, KV heads, head_dim, dtype,
bytes per token), `describe()`, `prefill(ids, spare)` -> (last logits,
state, per-layer K and V views [1][H][len(ids)][D]), `start(keys, values,
n)` -> a state whose cache is keys/values[:, :, :n] (no copy), `step(state,
token)` -> (last logits, state), `dense(capacity)` -> zeroed per-layer K and
V tensors. A state is the engine's own cache (an HF DynamicCache or a
torch_llama DenseKv); tensors given to start() are never written below n.

Not thread-safe; one engine per process.
"""

import json
import os

import torch

import bench_model

# A tiny Llama for the CPU mode when stories260K is not found: random fp32
# weights, seed 0 (the same in every process).
TINY_RANDOM = {"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 4,
               "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8,
               "vocab_size": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
               "tie_word_embeddings": False, "max_position_embeddings": 1024}


class HfRandomEngine:
    def __init__(self, config, device, name):
        self.device, self.name = device, name
        self.model, self.cfg = bench_model.build_model(config, device)
        self.shape = bench_model.Shape(config, torch.bfloat16, device)

    def describe(self):
        import hf_kv
        import transformers
        return (f"transformers {transformers.__version__} LlamaForCausalLM, {self.name} "
                f"({hf_kv.rope_description(self.cfg)}), attention "
                f"{getattr(self.model.config, '_attn_implementation', '?')}, bf16, "
                f"{sum(p.numel() for p in self.model.parameters()) / 1e9:.2f} B parameters, "
                "RANDOM weights (timing does not depend on them)")

    def prefill(self, ids, spare=0):
        import hf_kv
        logits, cache = hf_kv.forward(self.model, ids, None, last_only=True)
        kv = hf_kv.layer_kv(cache)
        return logits, cache, [k for k, _ in kv], [v for _, v in kv]

    def start(self, keys, values, n):
        import hf_kv
        return hf_kv.cache_from_tensors(self.cfg, keys, values, n)[0]

    def step(self, state, token):
        import hf_kv
        ids = torch.tensor([int(token)], dtype=torch.long, device=self.device)
        return hf_kv.forward(self.model, ids, state, last_only=True)

    def dense(self, capacity):
        return self.shape.dense(capacity)


class TorchLlamaEngine:
    def __init__(self, hf_dir, device):
        """hf_dir: a converted HF folder (config.json + weights), or None
        for TINY_RANDOM with random weights."""
        import convert_llama2c
        from torch_llama import TorchLlama
        self.device = device
        if hf_dir:
            cfg, state = convert_llama2c.load_hf_folder(hf_dir)
            self.name = "stories260K (llama2.c, converted to HF), trained weights"
        else:
            cfg, state = dict(TINY_RANDOM), random_state(TINY_RANDOM)
            self.name = "a tiny Llama config (TINY_RANDOM), RANDOM fp32 weights"
        self.cfg = cfg
        self.model = TorchLlama(cfg, state, device)
        self.shape = bench_model.Shape(cfg, torch.float32, device)

    def describe(self):
        c = self.cfg
        return (f"tools/hf/torch_llama.py (no transformers), {self.name}: "
                f"{c['num_hidden_layers']} layers, {c['num_key_value_heads']} KV heads, "
                f"head_dim {self.shape.head_dim}, vocab {c['vocab_size']}, fp32")

    def prefill(self, ids, spare=0):
        cache = self.model.new_cache(int(ids.shape[0]) + spare)
        logits = self.model.forward(ids, cache)[-1]
        n = int(ids.shape[0])
        return (logits, cache, [k[:, :, :n] for k in cache.k],
                [v[:, :, :n] for v in cache.v])

    def start(self, keys, values, n):
        from torch_llama import DenseKv
        return DenseKv(keys, values, n)

    def step(self, state, token):
        return self.model.forward([int(token)], state)[-1], state

    def dense(self, capacity):
        return self.shape.dense(capacity)


def random_state(cfg):
    """A random HF Llama state dict of `cfg` (seed 0), std 0.02 like HF's
    initializer, norms at 1."""
    g = torch.Generator().manual_seed(0)
    d, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    state = {"model.embed_tokens.weight": w(cfg["vocab_size"], d),
             "model.norm.weight": torch.ones(d), "lm_head.weight": w(cfg["vocab_size"], d)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        state.update({p + "input_layernorm.weight": torch.ones(d),
                      p + "post_attention_layernorm.weight": torch.ones(d),
                      p + "self_attn.q_proj.weight": w(q, d),
                      p + "self_attn.k_proj.weight": w(kv, d),
                      p + "self_attn.v_proj.weight": w(kv, d),
                      p + "self_attn.o_proj.weight": w(d, q),
                      p + "mlp.gate_proj.weight": w(inter, d),
                      p + "mlp.up_proj.weight": w(inter, d),
                      p + "mlp.down_proj.weight": w(d, inter)})
    return state


def make_engine(spec, device):
    """The engine of `spec` (a dict from pd_handoff_bench: kind "hf" with a
    config, or kind "torch_llama" with an HF folder or None)."""
    if spec["kind"] == "hf":
        return HfRandomEngine(spec["config"], device, spec["name"])
    return TorchLlamaEngine(spec.get("hf_dir"), device)


def load_config(path):
    with open(path) as f:
        return json.load(f)


def stories_hf_dir(repo, work, explicit=""):
    """stories260K converted into work/hf (once); None when not found."""
    import convert_llama2c
    try:
        src = convert_llama2c.find_stories260k(repo, explicit)
    except FileNotFoundError as e:
        print(f"pd_handoff_bench: {e}; using a tiny random Llama config", flush=True)
        return None
    out = os.path.join(work, "hf")
    convert_llama2c.convert(os.path.join(src, "stories260K.bin"), out)
    return out
