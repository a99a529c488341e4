#!/usr/bin/env python3
"""Trains a small Llama-style model on tinyshakespeare for KV-codec quality runs.

The model is what tools/llama2c_model.h runs (llama2.c's architecture):
RMSNorm (eps 1e-5), grouped-query attention with interleaved RoPE (pairs
(2i, 2i+1), theta 10000), SwiGLU feed-forward, classifier tied to the
embedding. It is trained with that RoPE directly, so the exported q/k rows
need no permutation.

Data: /work/shared/text/tinyshakespeare.txt (1,115,394 characters), a
character-level vocabulary (65 characters plus llama2.c's three special
tokens). The first 90% of the characters are the training split, the last
10% the held-out split (never trained on). A sequence is encoded the way
tools/llama2c_model.h's tokenizer encodes text: BOS (1), the dummy-prefix
space, then one token per character; training sequences are random windows
of the training split in that form.

Outputs, in --out:
  model.bin            llama2.c legacy checkpoint (7 int32 header fields, then
                       float32 weights), or model.bin.part-NN pieces of at
                       most --split-mib MiB when it is larger (cat them);
  tokenizer.bin        llama2.c tokenizer format;
  train_log.json       configuration, steps, losses, time, sha256 of model.bin.

Deterministic for a given seed, device type and torch version: fixed seeds,
a CPU generator for the batches, torch.use_deterministic_algorithms and
attention written out (no fused kernels). Training stops after --steps, or
earlier when --time-limit seconds have passed (the log then says so, and the
result depends on the machine's speed).

Only torch and the standard library are needed (torch 1.13 CPU for a smoke
test, torch 2.x on a GPU for the real run: 5 minutes on one H200).

The defaults made the checkpoint docs/kv_quality.md measures (torch 2.11 on
an H200: 6.3M parameters, 5000 steps, sha256 of model.bin 5791cc5a...).
With them the model overfits: its held-out loss is lowest near step 1000
(1.50 nats per character) and 2.06 at step 5000; --steps 1000 gives the
better-generalizing model, not the one measured.
"""
import argparse
import hashlib
import json
import math
import os
import struct
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BOS = 1
SPECIALS = ["<unk>", "\n<s>\n", "\n</s>\n"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="/work/shared/text/tinyshakespeare.txt")
    p.add_argument("--out", required=True)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden-dim", type=int, default=768)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-batches", type=int, default=20)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--time-limit", type=float, default=330.0,
                   help="stop training after this many seconds")
    p.add_argument("--split-mib", type=float, default=15.0,
                   help="split model.bin into parts of at most this size")
    return p.parse_args()


class Vocab:
    def __init__(self, text):
        self.chars = sorted(set(text))
        self.tokens = SPECIALS + self.chars
        self.ids = {c: i + len(SPECIALS) for i, c in enumerate(self.chars)}
        self.space = self.ids[" "]

    def encode(self, s):
        return [self.ids[c] for c in s]

    def write(self, path):
        # llama2.c tokenizer.bin: max_token_length, then (score, len, bytes).
        # Characters get equal scores; no merge exists (single characters).
        encoded = [t.encode("utf-8") for t in self.tokens]
        with open(path, "wb") as f:
            f.write(struct.pack("i", max(len(b) for b in encoded)))
            for b in encoded:
                f.write(struct.pack("fi", 0.0, len(b)))
                f.write(b)


def rope_tables(head_dim, seq_len, theta=10000.0):
    # llama2.c: freq_i = theta^(-2i/head_dim), pairs (2i, 2i+1).
    i = torch.arange(0, head_dim, 2, dtype=torch.float64)
    inv = theta ** (-i / head_dim)
    ang = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    # x [B, H, T, hd]; interleaved pairs.
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cos[: x.shape[2]], sin[: x.shape[2]]
    out = torch.stack((a * c - b * s, a * s + b * c), dim=-1)
    return out.flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (n * self.weight).type_as(x)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.heads, self.kv_heads = a.heads, a.kv_heads
        self.hd = a.dim // a.heads
        self.attention_norm = RMSNorm(a.dim)
        self.wq = nn.Linear(a.dim, a.heads * self.hd, bias=False)
        self.wk = nn.Linear(a.dim, a.kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(a.dim, a.kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(a.heads * self.hd, a.dim, bias=False)
        self.ffn_norm = RMSNorm(a.dim)
        self.w1 = nn.Linear(a.dim, a.hidden_dim, bias=False)
        self.w2 = nn.Linear(a.hidden_dim, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.hidden_dim, bias=False)
        self.drop = nn.Dropout(a.dropout)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.wk(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = self.wv(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Query head h reads kv head h // rep (llama2.c's grouping); expand
        # and reshape, whose backward is a plain (deterministic) sum.
        rep = self.heads // self.kv_heads
        k = k[:, :, None].expand(B, self.kv_heads, rep, T, self.hd)
        v = v[:, :, None].expand(B, self.kv_heads, rep, T, self.hd)
        k = k.reshape(B, self.heads, T, self.hd)
        v = v.reshape(B, self.heads, T, self.hd)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        att = att.masked_fill(mask[:T, :T], float("-inf"))
        att = F.softmax(att.float(), dim=-1).type_as(q)
        y = (att @ v).transpose(1, 2).reshape(B, T, -1)
        x = x + self.drop(self.wo(y))
        h = self.ffn_norm(x)
        return x + self.drop(self.w2(F.silu(self.w1(h)) * self.w3(h)))


class Model(nn.Module):
    def __init__(self, a, vocab_size):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, a.dim)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.dim)
        cos, sin = rope_tables(a.dim // a.heads, a.seq_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        mask = torch.triu(torch.ones(a.seq_len, a.seq_len, dtype=torch.bool), 1)
        self.register_buffer("mask", mask, persistent=False)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2 style scaled init
            if name.endswith("wo.weight") or name.endswith("w2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * a.layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin, self.mask)
        x = self.norm(x)
        return F.linear(x, self.tok_embeddings.weight)  # tied classifier


def make_batch(split, a, gen, prefix, device):
    n = a.seq_len - len(prefix)
    starts = torch.randint(0, len(split) - n - 1, (a.batch,), generator=gen)
    rows = [prefix + split[s:s + n + 1].tolist() for s in starts.tolist()]
    t = torch.tensor(rows, dtype=torch.long)
    # Inputs are the first seq_len tokens, targets the next ones; the last
    # target is the character after the window.
    return t[:, :-1].to(device), t[:, 1:].to(device)


@torch.no_grad()
def estimate(model, split, a, prefix, device, autocast):
    model.eval()
    gen = torch.Generator().manual_seed(a.seed + 1)
    total = 0.0
    for _ in range(a.eval_batches):
        x, y = make_batch(split, a, gen, prefix, device)
        with autocast():
            logits = model(x)
        total += F.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                                 y.reshape(-1)).item()
    model.train()
    return total / a.eval_batches


def lr_at(step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * min(1.0, t)))


def export_llama2c(model, a, vocab_size, path):
    """llama2.c legacy format (version 0): header then float32 weights."""
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    L = a.layers
    parts = [sd["tok_embeddings.weight"]]
    for name in ["attention_norm.weight", "wq.weight", "wk.weight", "wv.weight",
                 "wo.weight", "ffn_norm.weight", "w1.weight", "w2.weight",
                 "w3.weight"]:
        parts += [sd[f"layers.{i}.{name}"] for i in range(L)]
    parts.append(sd["norm.weight"])
    parts += [model.cos.cpu(), model.sin.cpu()]  # unused by the C++ reader
    with open(path, "wb") as f:
        # Positive vocab_size: the classifier is the embedding.
        f.write(struct.pack("iiiiiii", a.dim, a.hidden_dim, a.layers, a.heads,
                            a.kv_heads, vocab_size, a.seq_len))
        for t in parts:
            f.write(t.contiguous().numpy().astype("<f4").tobytes())


def split_file(path, max_bytes):
    size = os.path.getsize(path)
    if size <= max_bytes:
        return [os.path.basename(path)]
    names = []
    with open(path, "rb") as f:
        i = 0
        while True:
            chunk = f.read(max_bytes)
            if not chunk:
                break
            name = f"{os.path.basename(path)}.part-{i:02d}"
            with open(os.path.join(os.path.dirname(path), name), "wb") as o:
                o.write(chunk)
            names.append(name)
            i += 1
    os.remove(path)
    return names


def main():
    a = parse_args()
    t0 = time.time()
    assert a.dim % a.heads == 0 and a.heads % a.kv_heads == 0
    assert (a.dim // a.heads) % 2 == 0
    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device(a.device)
    text = open(a.data, encoding="utf-8").read()
    vocab = Vocab(text)
    cut = int(len(text) * (1 - a.val_fraction))
    train = torch.tensor(vocab.encode(text[:cut]), dtype=torch.int16)
    val = torch.tensor(vocab.encode(text[cut:]), dtype=torch.int16)
    prefix = [BOS, vocab.space]
    model = Model(a, len(vocab.tokens)).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.99))
    use_bf16 = device.type == "cuda"

    def autocast():
        if use_bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    gen = torch.Generator().manual_seed(a.seed)
    history = []
    stopped_early = False
    step = 0
    train_start = time.time()
    for step in range(a.steps):
        if time.time() - t0 > a.time_limit:
            stopped_early = True
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        x, y = make_batch(train, a, gen, prefix, device)
        with autocast():
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                               y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % a.eval_every == 0 or step == a.steps - 1:
            v = estimate(model, val, a, prefix, device, autocast)
            history.append({"step": step, "train_loss": round(loss.item(), 4),
                            "val_loss": round(v, 4),
                            "seconds": round(time.time() - t0, 1)})
            print(json.dumps(history[-1]), flush=True)
    steps_done = step + (0 if stopped_early else 1)
    train_seconds = time.time() - train_start
    final_val = estimate(model, val, a, prefix, device, autocast)
    os.makedirs(a.out, exist_ok=True)
    model_path = os.path.join(a.out, "model.bin")
    export_llama2c(model, a, len(vocab.tokens), model_path)
    sha = hashlib.sha256(open(model_path, "rb").read()).hexdigest()
    size = os.path.getsize(model_path)
    files = split_file(model_path, int(a.split_mib * 1024 * 1024))
    vocab.write(os.path.join(a.out, "tokenizer.bin"))
    log = {
        "config": vars(a), "vocab_size": len(vocab.tokens), "params": n_params,
        "train_chars": cut, "val_chars": len(text) - cut,
        "kv_features_per_token": 2 * a.layers * a.kv_heads * (a.dim // a.heads),
        "steps_done": steps_done, "stopped_by_time_limit": stopped_early,
        "train_seconds": round(train_seconds, 1),
        "final_val_loss": round(final_val, 4), "history": history,
        "model_bin_bytes": size, "model_bin_sha256": sha, "model_files": files,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if use_bf16 else "cpu",
    }
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump(log, f, indent=1)
    print(json.dumps({k: log[k] for k in ["params", "steps_done",
                                          "final_val_loss", "model_bin_bytes",
                                          "model_bin_sha256", "model_files"]}))


if __name__ == "__main__":
    main()
