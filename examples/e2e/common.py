"""What worker_a.py and worker_b.py agree on: namespaces, geometry, the
prompts (built the same way in both processes from the validation text), the
KV sample writer and small helpers. Standard library, NumPy and torch only.
"""

import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tools", "hf"))

import kvharbor  # noqa: E402
import kv_samples  # noqa: E402

from model import BOS, KVCache, Model, Tokenizer, load_stories  # noqa: E402

PAGE_SIZE = 16
NS_RAW = "e2e_stories260k_raw"    # identity codec
NS_KVTC = "e2e_stories260k_kvtc"  # KVTC, calibrated on the model's own KV

# The validation text: stories [0, CALIB_STORIES) calibrate KVTC; the prompts
# and the loss evaluation use only the stories after them (held out).
CALIB_STORIES = 50
PREFIX_STORY = 50        # the shared prefix: the start of stories 50, 51
PREFIX_TOKENS = 264      # BOS included; not a page multiple on purpose
SUFFIX_TOKENS = 32       # each prompt's own part
A_SUFFIX_STORIES = (52, 53, 54)  # worker A's prompts
B_SUFFIX_STORIES = (55, 56, 57, 58, 59)  # worker B's new prompts
EVAL_STORIES = range(60, 100)    # teacher-forced loss
GEN_TOKENS = 200


def geometry(cfg):
    return kvharbor.Geometry(num_layers=cfg.n_layers, num_kv_heads=cfg.n_kv_heads,
                             head_dim=cfg.head_dim, page_size=PAGE_SIZE,
                             dtype=kvharbor.DType.FP32,
                             layout=kvharbor.PageLayout.KV_LAYER_TOKEN_HEAD_DIM,
                             rope_theta=cfg.rope_theta)


def load(model_dir, device=None):
    m = Model(os.path.join(model_dir, "stories260K.bin"), device)
    tok = Tokenizer(os.path.join(model_dir, "tok512.bin"), m.cfg.vocab_size)
    stories = load_stories(os.path.join(model_dir, "validation_100.txt"))
    return m, tok, stories


def shared_prefix(tok, stories):
    text = stories[PREFIX_STORY] + "\n" + stories[PREFIX_STORY + 1]
    ids = tok.encode(text, bos=True)
    if len(ids) < PREFIX_TOKENS:
        raise ValueError(f"prefix: only {len(ids)} tokens")
    return ids[:PREFIX_TOKENS]


def prompt(tok, stories, prefix, story):
    return prefix + tok.encode("\n" + stories[story], bos=False)[:SUFFIX_TOKENS]


def eval_sequences(tok, stories, max_tokens):
    """Held-out stories, BOS + text, cut to whole pages (<= max_tokens)."""
    out = []
    for i in EVAL_STORIES:
        ids = tok.encode(stories[i], bos=True)[:max_tokens]
        n = len(ids) // PAGE_SIZE * PAGE_SIZE
        if n >= 2 * PAGE_SIZE:
            out.append(ids[:n])
    return out


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device):
    sync(device)
    return time.perf_counter()


def host_buffer(shape, dtype, device):
    """A CPU tensor for kvharbor to read or write (pinned with CUDA)."""
    return torch.empty(shape, dtype=dtype, pin_memory=device.type == "cuda")


def page_shape(cfg, pages):
    return (pages, 2, cfg.n_layers, PAGE_SIZE, cfg.n_kv_heads, cfg.head_dim)


def write_kv_samples(path, k, v, positions, cfg, source):
    """A KV sample file (docs/kv_samples.md) of stories260K's cache: k, v
    [tokens][layers][kv_heads][head_dim] float32 (roped keys, interleaved
    RoPE theta 10000) and positions."""
    kv_samples.write_kv_samples(
        path, np.asarray(k, dtype=np.float32), np.asarray(v, dtype=np.float32),
        positions, "interleaved", cfg.rope_theta, model="stories260K",
        source=source)


def tier_stats(client, ns):
    """{tier name: (pages, bytes)} of a namespace, from the per-tier stats
    (raw: page bytes; cold tiers: codec buffer bytes)."""
    st = client.stats(ns).namespace(ns)
    if st is None:
        raise RuntimeError(f"stats: no namespace {ns}")
    return {tier_name(t.tier): (t.pages, t.bytes) for t in st.tiers}


def tier_name(tier):
    """Tier.HOST_COMPRESSED -> "host_compressed" (an unknown int as is)."""
    return tier.name.lower() if isinstance(tier, kvharbor.Tier) else str(tier)


def bytes_out(client, ns):
    return client.stats(ns).namespace(ns).bytes_out


def save_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def load_json(path):
    with open(path) as f:
        return json.load(f)


__all__ = ["kvharbor", "BOS", "KVCache", "Model", "Tokenizer", "load_stories"]
