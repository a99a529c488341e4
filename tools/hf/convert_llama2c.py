#!/usr/bin/env python3
"""Converts a llama2.c "legacy" checkpoint into a Hugging Face Llama folder.

    python3 tools/hf/convert_llama2c.py stories260K.bin OUT_DIR [--format auto|safetensors|bin]

OUT_DIR receives config.json and the weights (model.safetensors when the
`safetensors` package imports, else pytorch_model.bin; --format forces one),
which transformers.LlamaForCausalLM.from_pretrained(OUT_DIR) loads. The
tokenizer stays llama2.c's (tok512.bin): read it with
tools/hf/llama2c_tokenizer.py.

The checkpoint (tools/llama2c_model.h has the C++ reader): 7 int32 header
fields (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size -- negative
when the classifier is not shared -- and seq_len), then float32 weights in
llama2.c's order, each matrix [out][in] like torch.nn.Linear's weight.

RoPE: llama2.c rotates interleaved pairs (2i, 2i+1) of each head, HF's Llama
rotates half-split pairs (i, i + head_dim/2), both with inv_freq[i] =
theta^(-2i/head_dim). The rows of the q and k projections are therefore
permuted per head to [0, 2, 4, ..., 1, 3, 5, ...]; attention scores do not
change (q and k get the same permutation), and the HF model's cached keys
are llama2.c's keys in half-split order (unpermute_heads maps them back).

read_llama2c needs NumPy only; writing the weights needs torch.
"""

import argparse
import json
import os
import struct
import subprocess
import sys

import numpy as np

ROPE_THETA = 10000.0  # llama2.c's run.c


class Llama2cConfig:
    """The checkpoint header (vocab_size as its absolute value)."""

    FIELDS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads",
              "vocab_size", "seq_len")

    def __init__(self, header):
        for name, value in zip(self.FIELDS, header):
            setattr(self, name, abs(value) if name == "vocab_size" else value)
        self.shared_classifier = header[5] > 0
        self.head_dim = self.dim // self.n_heads if self.n_heads > 0 else 0
        self.kv_dim = self.n_kv_heads * self.head_dim


def read_llama2c(path):
    """(Llama2cConfig, {name: float32 array}) with llama2.c's names and
    shapes: emb [vocab][dim], rms_att [L][dim], wq [L][dim][dim],
    wk/wv [L][kv_dim][dim], wo [L][dim][dim], rms_ffn [L][dim],
    w1/w3 [L][hidden][dim], w2 [L][dim][hidden], rms_final [dim],
    wcls [vocab][dim] (the embedding when shared). Checks the header as
    Llama2cModel::Load does; errors name the field."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 28:
        raise ValueError(f"{path}: header: file is shorter than 28 bytes")
    header = struct.unpack("<7i", data[:28])
    c = Llama2cConfig(header)
    for name in Llama2cConfig.FIELDS:
        v = getattr(c, name)
        if not 1 <= v <= 1 << 20:
            raise ValueError(f"{path}: header.{name}: {v} is out of range [1, 2^20]")
    if c.dim % c.n_heads or c.n_heads % c.n_kv_heads or c.head_dim % 2:
        raise ValueError(f"{path}: header: dim {c.dim}, n_heads {c.n_heads}, "
                         f"n_kv_heads {c.n_kv_heads} do not give an even "
                         "head_dim shared by whole groups")
    d, hd, L, kv, V = c.dim, c.hidden_dim, c.n_layers, c.kv_dim, c.vocab_size
    shapes = [("emb", (V, d)), ("rms_att", (L, d)), ("wq", (L, d, d)),
              ("wk", (L, kv, d)), ("wv", (L, kv, d)), ("wo", (L, d, d)),
              ("rms_ffn", (L, d)), ("w1", (L, hd, d)), ("w2", (L, d, hd)),
              ("w3", (L, hd, d)), ("rms_final", (d,)),
              ("freq_cis", (c.seq_len * c.head_dim,))]  # unused
    if not c.shared_classifier:
        shapes.append(("wcls", (V, d)))
    need = sum(int(np.prod(s)) for _, s in shapes)
    if len(data) != 28 + 4 * need:
        raise ValueError(f"{path}: weights: the header implies {28 + 4 * need} "
                         f"bytes, the file has {len(data)}")
    flat = np.frombuffer(data, dtype="<f4", offset=28)
    w, off = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        w[name] = flat[off:off + n].reshape(shape).astype(np.float32)
        off += n
    del w["freq_cis"]
    if c.shared_classifier:
        w["wcls"] = w["emb"]
    return c, w


def permute_heads(w, n_heads):
    """Rows of a q/k projection [n_heads * head_dim][in] from interleaved to
    half-split rotation order, per head."""
    rows, cols = w.shape
    hd = rows // n_heads
    return (w.reshape(n_heads, hd // 2, 2, cols).transpose(0, 2, 1, 3)
            .reshape(rows, cols))


def unpermute_heads(x, head_dim):
    """The inverse on the last axis of vectors laid out [..., heads*head_dim]
    or [..., head_dim]: half-split order back to interleaved (e.g. an HF key
    back to llama2.c's)."""
    shape = x.shape
    n = shape[-1] // head_dim
    y = x.reshape(*shape[:-1], n, 2, head_dim // 2)
    return y.swapaxes(-1, -2).reshape(shape)


def hf_config(c):
    """config.json of the converted model (keys every transformers 4.4x and
    5.x Llama reads; rope_theta is converted to rope_parameters by 5.x as for
    any hub checkpoint)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.dim,
        "intermediate_size": c.hidden_dim,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.seq_len,
        "rms_norm_eps": 1e-5,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": c.shared_classifier,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def hf_state_dict(c, w):
    """{HF parameter name: float32 array} (no lm_head.weight when the
    classifier is the embedding: the config ties them)."""
    sd = {"model.embed_tokens.weight": w["emb"],
          "model.norm.weight": w["rms_final"]}
    for l in range(c.n_layers):
        p = f"model.layers.{l}."
        sd[p + "input_layernorm.weight"] = w["rms_att"][l]
        sd[p + "self_attn.q_proj.weight"] = permute_heads(w["wq"][l], c.n_heads)
        sd[p + "self_attn.k_proj.weight"] = permute_heads(w["wk"][l], c.n_kv_heads)
        sd[p + "self_attn.v_proj.weight"] = w["wv"][l]
        sd[p + "self_attn.o_proj.weight"] = w["wo"][l]
        sd[p + "post_attention_layernorm.weight"] = w["rms_ffn"][l]
        sd[p + "mlp.gate_proj.weight"] = w["w1"][l]
        sd[p + "mlp.up_proj.weight"] = w["w3"][l]
        sd[p + "mlp.down_proj.weight"] = w["w2"][l]
    if not c.shared_classifier:
        sd["lm_head.weight"] = w["wcls"]
    return sd


def _have_safetensors():
    try:
        import safetensors.torch  # noqa: F401
        return True
    except ImportError:
        return False


def convert(src, out_dir, fmt="auto"):
    """Writes out_dir/config.json and the weights; returns the weights'
    path."""
    import torch

    if fmt not in ("auto", "safetensors", "bin"):
        raise ValueError(f"--format: '{fmt}' is not auto, safetensors or bin")
    c, w = read_llama2c(src)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(c), f, indent=2)
    state = {k: torch.from_numpy(np.ascontiguousarray(v))
             for k, v in hf_state_dict(c, w).items()}
    if fmt == "auto":
        fmt = "safetensors" if _have_safetensors() else "bin"
    if fmt == "safetensors":
        from safetensors.torch import save_file
        path = os.path.join(out_dir, "model.safetensors")
        save_file(state, path, metadata={"format": "pt"})
    else:
        path = os.path.join(out_dir, "pytorch_model.bin")
        torch.save(state, path)
    return path


def load_hf_folder(out_dir):
    """(config dict, {name: torch tensor}) of a converted folder, without
    transformers (for the pure-torch reference, tools/hf/torch_llama.py)."""
    import torch

    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    st = os.path.join(out_dir, "model.safetensors")
    if os.path.exists(st):
        from safetensors.torch import load_file
        return cfg, load_file(st)
    return cfg, torch.load(os.path.join(out_dir, "pytorch_model.bin"))


def _clone_origin(repo):
    """The checkout `repo` was cloned from, when its origin is a local
    folder (a CI clone such as /tmp/ci-check), else None."""
    try:
        url = subprocess.run(
            ["git", "-C", repo, "config", "--get", "remote.origin.url"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if url.startswith("file://"):
        url = url[len("file://"):]
    return url if url and os.path.isdir(url) else None


def find_stories260k(repo, explicit=""):
    """The stories260K folder: `explicit`, $STORIES260K_DIR, the GPU
    bundle's copy (repo/.gpu/share/stories260K), then ../shared/stories260K
    and ../../shared/stories260K from the checkout `repo` (a worktree one
    level deeper), then the same from the checkout `repo` was cloned from
    when that is a local folder (a clone elsewhere, as CI's)."""
    tried = [explicit, os.environ.get("STORIES260K_DIR", ""),
             os.path.join(repo, ".gpu", "share", "stories260K")]
    for base in (repo, _clone_origin(repo)):
        if base:
            tried += [os.path.join(base, "..", "shared", "stories260K"),
                      os.path.join(base, "..", "..", "shared", "stories260K")]
    for d in tried:
        if d and os.path.isfile(os.path.join(d, "stories260K.bin")):
            return os.path.abspath(d)
    raise FileNotFoundError("stories260K: not found (set STORIES260K_DIR); tried "
                            + ", ".join(d for d in tried if d))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="llama2.c legacy checkpoint (.bin)")
    ap.add_argument("out_dir", help="folder for config.json and the weights")
    ap.add_argument("--format", default="auto",
                    help="auto (safetensors when it imports), safetensors or bin")
    a = ap.parse_args(argv)
    try:
        path = convert(a.checkpoint, a.out_dir, a.format)
    except (OSError, ValueError) as e:
        print(f"convert_llama2c: {e}", file=sys.stderr)
        return 1
    print(f"convert_llama2c: wrote {a.out_dir}/config.json and {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
