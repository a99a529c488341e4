"""Model setup shared by the Python benchmarks that drive a Llama through
kvharbor (bench/ttft_bench.py, bench/pd_handoff_bench.py): the
Llama-3.1-8B config, a transformers LlamaForCausalLM with random bf16
weights built straight on a device, random prompts, synchronized timers,
the cache geometry of a config, and a KVTC calibration made from a model's
own KV with kvharbor-calibrate.

Random weights: no download, and timing does not depend on the weights (the
same kernels run on the same shapes whatever the values). build_model seeds
torch with 0 first, so two processes that build the same config on the same
kind of device get the same weights.

Nothing here is thread-safe; tensors are the caller's.
"""

import glob
import json
import os
import subprocess
import time

import torch

PAGE = 16
LLAMA31_8B = {  # config.json of Llama-3.1-8B, as on the hub
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001,
    "torch_dtype": "bfloat16", "use_cache": True,
}


def write_json(args, report):
    """Writes a bench's report to args.json (if given); True when written."""
    if not args.json:
        return False
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    return True


def sync(device="cuda"):
    """Waits for the device's queued work (a no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def now(device="cuda"):
    """perf_counter after the device's queued work is done."""
    sync(device)
    return time.perf_counter()


def timed(fn, device="cuda"):
    """(seconds, fn()) with the device synchronized on both sides."""
    t0 = now(device)
    out = fn()
    return now(device) - t0, out


class Shape:
    """The cache geometry of a config dict, for K/V of `dtype`."""

    def __init__(self, d, dtype=torch.bfloat16, device="cuda"):
        self.layers, self.kv_heads = d["num_hidden_layers"], d["num_key_value_heads"]
        self.head_dim = d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]
        self.vocab, self.rope_theta = d["vocab_size"], float(d.get("rope_theta", 10000.0))
        self.dtype, self.device = dtype, device
        elem = torch.tensor([], dtype=dtype).element_size()
        self.bytes_per_token = 2 * self.layers * self.kv_heads * self.head_dim * elem

    def dense(self, tokens):
        """Zeroed per-layer K and V, [1][kv_heads][tokens][head_dim] each."""
        shape = (1, self.kv_heads, tokens, self.head_dim)
        return ([torch.zeros(shape, dtype=self.dtype, device=self.device)
                 for _ in range(self.layers)],
                [torch.zeros(shape, dtype=self.dtype, device=self.device)
                 for _ in range(self.layers)])


def build_model(config, device="cuda"):
    """(transformers LlamaForCausalLM of `config` with random bf16 weights on
    `device`, its LlamaConfig), SDPA attention, eval mode."""
    import hf_kv
    from transformers import LlamaForCausalLM
    cfg = hf_kv.llama_config(config, attn_implementation="sdpa")
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    try:  # parameters made in bf16 right away; fp32 first where torch refuses
        torch.set_default_dtype(torch.bfloat16)
    except (TypeError, RuntimeError):
        pass
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.to(dtype=torch.bfloat16).eval(), cfg


def random_ids(n, vocab, seed, device="cuda"):
    """n token ids uniform in [0, vocab), the same for the same seed."""
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, vocab, (n,), device=device, generator=g)


def kvtc_calibration(binary, work, k, v, rope_theta, *, ratio, raw_dtype, device,
                     components=None, model="", source=""):
    """Writes KV samples k, v ([T][L][H][D], keys roped half-split, one
    sequence from position 0) to work/kv_samples.safetensors and runs
    kvharbor-calibrate on them (--device cpu or gpu; the GPU subspace solver
    with `components`); returns the calibration file's path."""
    import kv_samples
    samples = os.path.join(work, "kv_samples.safetensors")
    kv_samples.write_kv_samples(samples, k, v, torch.arange(int(k.shape[0])), "half_split",
                                rope_theta, model=model, source=source)
    prefix = os.path.join(work, "model_kv")
    cmd = [binary, "--samples", samples, "--out", prefix, "--ratios", str(ratio),
           "--raw-dtype", raw_dtype, "--page-size", str(PAGE), "--sink-tokens", "4",
           "--device", device, "--quiet"]
    if device == "gpu":
        cmd += ["--gpu-solver", "subspace"]
    if components:
        cmd += ["--components", str(components)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout, end="")
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}")
    found = sorted(glob.glob(prefix + ".*x.kvtc"))
    if not found:
        raise RuntimeError(f"kvharbor-calibrate wrote no {prefix}.*x.kvtc")
    return found[0]
