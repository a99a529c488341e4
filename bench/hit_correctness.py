#!/usr/bin/env python3
"""Cache hits through a real generation loop are correct (issue 20, item 7).

stories260K (llama2.c) converted to a Hugging Face Llama
(tools/hf/convert_llama2c.py) runs in transformers' LlamaForCausalLM, or,
where transformers is not installed, in tools/hf/torch_llama.py (the same
HF semantics in plain torch; the report names the engine). One kvharbord is
started here; then two separate Python processes:

1. store: calibrates KVTC on the model's own KV (validation stories 0-29,
   keys half-split roped, `kvharbor-calibrate --device cpu`, ratio 8 vs
   fp32: 5 layers x 4 KV heads x 8 dims = 160 features), creates an identity
   and a KVTC namespace (fp32 pages of 16 tokens), prefills the prompts
   (stories 40.., BOS + up to 200 - 17i tokens) and stores each prompt's whole
   pages with Client.insert_from_layout straight from the model's cache
   (PagedKvLayout.from_dense), records the greedy continuation of a full
   prefill (no cache), demotes the KVTC namespace to host_compressed, exits.
2. hit: for each prompt, Match(prompt[:-1]) with a lease and
   Lease.fetch_to_layout into fresh per-layer tensors, which become the
   model's cache; the rest of the prompt is run and 64 tokens are decoded
   greedily. Identity pages must give (exit 1 otherwise): K/V bitwise equal
   to this process's own prefill of the prefix, a continuation whose tokens
   and logits are bitwise those of the same loop from that local cache, and
   the tokens process 1 decoded after a full prefill. KVTC pages (cold,
   decoded by the client) must be hit as well; their K/V relative error,
   top-1 agreement and teacher-forced loss increase (nats/token) over the
   exact continuation are reported.

CPU or CUDA (--device; TF32 off): on CPU the fetch takes the client's "cpu"
path, on a GPU whichever path serves device memory; each fetch's
TransferResult.path is printed. --hf-only skips kvharbor: it checks that
transformers loads the conversion, its logits match tools/hf/torch_llama.py
(max |diff| < 1e-3), greedy decoding from BOS begins "Once upon a time, there
was a little girl named Lily.", and a cache rebuilt from copied tensors
(tools/hf/hf_kv.py) continues exactly like a full prefill.

Binaries: --kvharbord / $KVHARBORD, --calibrate / $KVHARBOR_CALIBRATE,
$KVHARBOR_LIB (defaults: the GPU bundle .gpu/, then build/). Model:
--model-dir / $STORIES260K_DIR, else .gpu/share/stories260K,
../shared/stories260K, ../../shared/stories260K.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

import bench_paths  # noqa: F401  (python/ and tools/hf on sys.path)

import convert_llama2c
import hf_kv
import kv_samples
import local_daemon
from llama2c_tokenizer import BOS, Tokenizer, load_stories
from torch_llama import DenseKv, TorchLlama

PAGE = 16
NS_RAW = "hit_stories260k_raw"
NS_KVTC = "hit_stories260k_kvtc"
CALIB_STORIES = range(0, 30)
FIRST_PROMPT_STORY = 40
PROMPT_TOKENS = 200
GEN = 64
LILY = "Once upon a time, there was a little girl named Lily."


def have_transformers():
    try:
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


class Engine:
    """The model behind one interface: run tokens on a cache state, start a
    state from per-layer tensors [1][H][capacity][D] holding a prefix."""

    def __init__(self, hf_dir, device, kind):
        self.device = torch.device(device)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.kind = kind if kind != "auto" else ("hf" if have_transformers() else "torch")
        with open(os.path.join(hf_dir, "config.json")) as f:
            cfg = json.load(f)
        self.layers, self.kv_heads = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
        self.head_dim, self.vocab = cfg["head_dim"], cfg["vocab_size"]
        self.zero_copy = None  # HF: whether the last start() avoided a copy
        if self.kind == "hf":
            from transformers import LlamaForCausalLM
            self.model = LlamaForCausalLM.from_pretrained(hf_dir).to(self.device).float().eval()
            self.config = self.model.config
        else:
            _, state = convert_llama2c.load_hf_folder(hf_dir)
            self.model = TorchLlama(cfg, state, self.device)

    def describe(self):
        if self.kind == "hf":
            import transformers
            return (f"transformers {transformers.__version__} LlamaForCausalLM "
                    f"(attention {getattr(self.config, '_attn_implementation', '?')})")
        return "tools/hf/torch_llama.py (transformers not installed)"

    def dense(self, capacity):
        """Zeroed per-layer K and V tensors for at least `capacity` tokens,
        whole pages (what PagedKvLayout.from_dense describes)."""
        shape = (1, self.kv_heads, -(-capacity // PAGE) * PAGE, self.head_dim)
        mk = lambda: torch.zeros(shape, dtype=torch.float32, device=self.device)  # noqa: E731
        return [mk() for _ in range(self.layers)], [mk() for _ in range(self.layers)]

    def fresh(self, capacity):
        return None if self.kind == "hf" else self.model.new_cache(capacity)

    def start(self, keys, values, length):
        if self.kind == "hf":
            cache, self.zero_copy = hf_kv.cache_from_tensors(self.config, keys, values, length)
            return cache
        return DenseKv(keys, values, length)

    @torch.no_grad()
    def run(self, state, tokens):
        """(logits [T][vocab], state after the tokens)."""
        if self.kind == "hf":
            ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
            return hf_kv.forward(self.model, ids, state)
        return self.model.forward(tokens, state), state

    def kv(self, state, n):
        """Contiguous copies of the first n tokens' K and V, per layer."""
        pairs = (hf_kv.layer_kv(state) if self.kind == "hf"
                 else list(zip(state.k, state.v)))
        return ([k[:, :, :n].contiguous() for k, _ in pairs],
                [v[:, :, :n].contiguous() for _, v in pairs])


def greedy(engine, state, logits, n):
    """n greedy tokens from `logits` (the last position's); (tokens, logit
    rows [n][vocab]: row i produced token i)."""
    toks, rows = [], []
    for i in range(n):
        rows.append(logits)
        toks.append(int(torch.argmax(logits)))
        if i + 1 < n:
            out, state = engine.run(state, [toks[-1]])
            logits = out[-1]
    return toks, torch.stack(rows)


def continue_from(engine, keys, values, m, prompt, n):
    """The generation loop on a cache whose first m tokens are in
    keys/values: run prompt[m:], then n greedy tokens."""
    out, state = engine.run(engine.start(keys, values, m), prompt[m:])
    return greedy(engine, state, out[-1], n)


def prompts_of(tok, stories, count):
    """BOS + story 40+i, cut to 200 - 17i tokens (a different page count and
    tail per prompt)."""
    out = []
    for i in range(FIRST_PROMPT_STORY, FIRST_PROMPT_STORY + count):
        ids = tok.encode(stories[i], bos=True)[:PROMPT_TOKENS - 17 * (i - FIRST_PROMPT_STORY)]
        if len(ids) > 2 * PAGE:
            out.append(ids)
    return out


def lily_check(engine, tok):
    out, state = engine.run(engine.fresh(48), [BOS])
    toks, _ = greedy(engine, state, out[-1], 40)
    text = tok.decode(toks)
    return text.startswith(LILY), text


def load(args):
    engine = Engine(os.path.join(args.work, "hf"), args.device, args.engine)
    tok = Tokenizer(os.path.join(args.model_dir, "tok512.bin"), engine.vocab)
    stories = load_stories(os.path.join(args.model_dir, "validation_100.txt"))
    return engine, tok, stories


def layout(keys, values):
    import kvharbor
    return kvharbor.PagedKvLayout.from_dense(keys, values, PAGE)


# ---- process 1 ----

def calibrate(engine, tok, stories, args):
    ks, vs, pos = [], [], []
    for i in CALIB_STORIES:
        ids = tok.encode(stories[i], bos=True)[:512]
        _, st = engine.run(engine.fresh(len(ids)), ids)
        k, v = engine.kv(st, len(ids))
        ks.append(torch.stack([x[0].transpose(0, 1) for x in k], dim=1).cpu())  # [T][L][H][D]
        vs.append(torch.stack([x[0].transpose(0, 1) for x in v], dim=1).cpu())
        pos.append(torch.arange(len(ids)))
    samples = os.path.join(args.work, "kv_samples.safetensors")
    kv_samples.write_kv_samples(samples, torch.cat(ks), torch.cat(vs), torch.cat(pos),
                                "half_split", 10000.0, model="stories260K (HF conversion)",
                                source="bench/hit_correctness.py")
    prefix = os.path.join(args.work, "stories260k_hf")
    cmd = [args.calibrate, "--samples", samples, "--out", prefix, "--ratios", "8",
           "--raw-dtype", "fp32", "--page-size", str(PAGE), "--sink-tokens", "4",
           "--device", "cpu", "--quiet"]
    subprocess.run(cmd, check=True)
    print(f"[store] KVTC calibrated on {sum(len(p) for p in pos)} tokens of stories "
          f"{CALIB_STORIES.start}-{CALIB_STORIES.stop - 1}: {prefix}.8x.kvtc")
    return prefix + ".8x.kvtc"


def role_store(args):
    import kvharbor
    engine, tok, stories = load(args)
    ok, text = lily_check(engine, tok)
    print(f"[store] engine: {engine.describe()} on {engine.device}; Lily check "
          f"{'OK' if ok else 'FAILED'}: {text[:80]!r}")
    if not ok:
        return 1
    cal = calibrate(engine, tok, stories, args)
    geom = kvharbor.Geometry(engine.layers, engine.kv_heads, engine.head_dim, PAGE,
                             dtype=kvharbor.DType.FP32, rope_theta=10000.0)
    c = kvharbor.Client(args.addr)
    c.create_namespace(NS_RAW, geom, capacity_bytes=64 << 20)
    c.create_namespace(NS_KVTC, geom, capacity_bytes=64 << 20, codec="kvtc",
                       calibration_path=cal, host_compressed_bytes=64 << 20)
    records = []
    for p in prompts_of(tok, stories, args.prompts):
        out, st = engine.run(engine.fresh(len(p) + GEN), p)
        n = (len(p) - 1) // PAGE * PAGE
        keys, values = engine.kv(st, n)
        cont, _ = greedy(engine, st, out[-1], GEN)
        paths = []
        for ns in (NS_RAW, NS_KVTC):
            r = c.insert_from_layout(ns, p[:n], layout(keys, values), list(range(n // PAGE)))
            paths.append(getattr(r, "path", "?"))
        records.append({"prompt": p, "stored_tokens": n, "continuation": cont,
                        "insert_paths": paths})
        print(f"[store] prompt of {len(p)} tokens: stored {n} ({n // PAGE} pages) "
              f"by {paths[0]} / {paths[1]}")
    moved = c.demote(NS_KVTC, kvharbor.Tier.HOST_COMPRESSED)
    cold = c.stats(NS_KVTC).namespace(NS_KVTC).tier(kvharbor.Tier.HOST_COMPRESSED)
    print(f"[store] demoted {moved} KVTC pages; host_compressed holds {cold.pages} "
          f"pages, {cold.bytes} bytes")
    with open(os.path.join(args.work, "store.json"), "w") as f:
        json.dump(records, f)
    c.close()
    return 0


# ---- process 2 ----

def fetch(client, ns, prompt, engine, capacity):
    """(matched tokens, keys, values, TransferResult, page tiers)."""
    keys, values = engine.dense(capacity)
    with client.match(ns, prompt[:-1], lock=True) as lease:
        r = lease.fetch_to_layout(layout(keys, values), list(range(lease.num_pages)))
        return lease.matched_tokens, keys, values, r, sorted({t.name for t in lease.page_tiers})


def rel_err(a, b):
    num = sum(float((x - y).double().norm() ** 2) for x, y in zip(a, b))
    den = sum(float(y.double().norm() ** 2) for y in b)
    return (num / max(den, 1e-30)) ** 0.5


class HitChecks:
    """Process 2's checks and KVTC sums, one prompt at a time."""

    def __init__(self, client, engine):
        self.c, self.engine = client, engine
        self.failures, self.agree, self.total, self.nll_exact, self.nll_kvtc = 0, 0, 0, 0.0, 0.0

    def check(self, name, ok, detail):
        self.failures += 0 if ok else 1
        print(f"[hit] {'PASS' if ok else 'FAIL'}: {name}: {detail}")

    def identity(self, i, p, rec):
        """Fetch, compare with a local prefill and continue; returns what
        the KVTC part needs: (m, local cache tensors rk/rv, local K/V, exact
        continuation)."""
        eng, cap = self.engine, len(p) + GEN
        m, keys, values, r, tiers = fetch(self.c, NS_RAW, p, eng, cap)
        self.check(f"prompt {i}: hit", m == rec["stored_tokens"],
                   f"matched {m} of {len(p)} tokens ({rec['stored_tokens']} stored), "
                   f"path {r.path}, {r.bytes_moved} bytes, tiers {tiers}")
        _, st = eng.run(eng.fresh(cap), p[:m])
        lk, lv = eng.kv(st, m)
        same_kv = all(torch.equal(k[:, :, :m], x) for k, x in zip(keys + values, lk + lv))
        self.check(f"prompt {i}: fetched K/V", same_kv, "bitwise equal to this process's prefill")
        rk, rv = eng.dense(cap)
        for dst, src in zip(rk + rv, lk + lv):
            dst[:, :, :m].copy_(src)
        ref_toks, ref_rows = continue_from(eng, rk, rv, m, p, GEN)
        hit_toks, hit_rows = continue_from(eng, keys, values, m, p, GEN)
        note = "" if eng.zero_copy is None else f", cache zero-copy {eng.zero_copy}"
        self.check(f"prompt {i}: identity continuation",
                   hit_toks == ref_toks and torch.equal(hit_rows, ref_rows),
                   f"{GEN} tokens and every logit bitwise equal to the local cache's{note}")
        self.check(f"prompt {i}: vs full prefill (process 1)", hit_toks == rec["continuation"],
                   f"{sum(a == b for a, b in zip(hit_toks, rec['continuation']))}/{GEN} "
                   "tokens equal")
        return m, rk, rv, lk, lv, ref_toks

    def kvtc(self, i, p, m, rk, rv, lk, lv, ref_toks):
        eng = self.engine
        mk, kk, kv_, r, tiers = fetch(self.c, NS_KVTC, p, eng, len(p) + GEN)
        self.check(f"prompt {i}: KVTC hit", mk == m,
                   f"matched {mk} tokens, path {r.path}, {r.bytes_moved} bytes, tiers {tiers}")
        # Teacher-forced over the exact continuation: row j predicts ref_toks[j].
        seq, lo = p[m:] + ref_toks[:-1], len(p) - m - 1
        exact = eng.run(eng.start(rk, rv, m), seq)[0][lo:lo + GEN]
        lossy = eng.run(eng.start(kk, kv_, m), seq)[0][lo:lo + GEN]
        target = torch.tensor(ref_toks, device=exact.device)
        ce = torch.nn.functional.cross_entropy
        self.nll_exact += float(ce(exact.double(), target, reduction="sum"))
        self.nll_kvtc += float(ce(lossy.double(), target, reduction="sum"))
        self.agree += int((exact.argmax(-1) == lossy.argmax(-1)).sum())
        self.total += GEN
        print(f"[hit] prompt {i}: KVTC K/V relative error "
              f"{rel_err([k[:, :, :m] for k in kk], lk):.4f} / "
              f"{rel_err([v[:, :, :m] for v in kv_], lv):.4f}")

    def summary(self):
        n = max(self.total, 1)
        print(f"[hit] KVTC top-1 agreement (teacher-forced): {self.agree}/{self.total} "
              f"({100.0 * self.agree / n:.1f}%)")
        print(f"[hit] KVTC loss increase: {(self.nll_kvtc - self.nll_exact) / n:+.5f} "
              f"nats/token ({self.nll_exact / n:.5f} -> {self.nll_kvtc / n:.5f} "
              f"over {self.total} tokens)")
        print(f"[hit] {self.failures} check(s) failed")


def role_hit(args):
    import kvharbor
    engine, tok, stories = load(args)
    with open(os.path.join(args.work, "store.json")) as f:
        records = json.load(f)
    c = kvharbor.Client(args.addr)
    print(f"[hit] engine: {engine.describe()} on {engine.device}")
    checks = HitChecks(c, engine)
    prompts = prompts_of(tok, stories, args.prompts)
    checks.check("prompts", [r["prompt"] for r in records] == prompts,
                 f"{len(prompts)} prompts, the same token ids in both processes")
    for i, (p, rec) in enumerate(zip(prompts, records)):
        checks.kvtc(i, p, *checks.identity(i, p, rec))
    checks.summary()
    c.close()
    return 1 if checks.failures else 0


# ---- --hf-only ----

def hf_only(args):
    engine, tok, stories = load(args)
    ok, text = lily_check(engine, tok)
    print(f"engine: {engine.describe()} on {engine.device}")
    print(f"Lily check: {'OK' if ok else 'FAILED'}: {text!r}")
    bad = 0 if ok else 1
    prompts = prompts_of(tok, stories, args.prompts)
    if engine.kind == "hf":
        # transformers against tools/hf/torch_llama.py, which CI checks
        # against the C++ model (tests/python/test_llama2c_hf.py).
        ref = Engine(os.path.join(args.work, "hf"), args.device, "torch")
        a = engine.run(engine.fresh(len(prompts[0])), prompts[0])[0]
        b = ref.run(ref.fresh(len(prompts[0])), prompts[0])[0]
        diff = float((a - b).abs().max())
        bad += 0 if diff < 1e-3 else 1
        print(f"logits of transformers vs tools/hf/torch_llama.py over {len(prompts[0])} "
              f"positions: max |diff| {diff:.2e} (limit 1e-3)")
    for i, p in enumerate(prompts):
        out, st = engine.run(engine.fresh(len(p) + GEN), p)
        full, _ = greedy(engine, st, out[-1], GEN)
        m = (len(p) - 1) // PAGE * PAGE
        _, st = engine.run(engine.fresh(len(p) + GEN), p[:m])
        lk, lv = engine.kv(st, m)
        keys, values = engine.dense(len(p) + GEN)
        for dst, src in zip(keys + values, lk + lv):
            dst[:, :, :m].copy_(src)
        toks, _ = continue_from(engine, keys, values, m, p, GEN)
        same = toks == full
        bad += 0 if same else 1
        print(f"prompt {i}: {len(p)} tokens, cache of {m} rebuilt from copied tensors "
              f"(zero-copy {engine.zero_copy}): {sum(a == b for a, b in zip(toks, full))}"
              f"/{GEN} greedy tokens equal to a full prefill's{'' if same else ' FAILED'}")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", default="")
    ap.add_argument("--work", default="", help="outputs (default: a new temp folder)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--engine", default="auto", help="auto | hf | torch")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--kvharbord", default="")
    ap.add_argument("--calibrate", default="")
    ap.add_argument("--device-pool-bytes", default="0",
                    help="the daemon's store.device_pool_bytes (0: host pools)")
    ap.add_argument("--hf-only", action="store_true", help="no kvharbor: the HF checks only")
    ap.add_argument("--role", default="", help=argparse.SUPPRESS)
    ap.add_argument("--addr", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.model_dir = convert_llama2c.find_stories260k(bench_paths.REPO, args.model_dir)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.role:
        local_daemon.use_library()
        return role_store(args) if args.role == "store" else role_hit(args)
    args.work = args.work or tempfile.mkdtemp(prefix="kvh-hit-")
    os.makedirs(args.work, exist_ok=True)
    convert_llama2c.convert(os.path.join(args.model_dir, "stories260K.bin"),
                            os.path.join(args.work, "hf"))
    if args.hf_only:
        return hf_only(args)
    calibrate_bin = local_daemon.find_tool(args.calibrate, "KVHARBOR_CALIBRATE",
                                           "kvharbor-calibrate", "build/tools/kvharbor-calibrate")
    daemon_bin = local_daemon.find_tool(args.kvharbord, "KVHARBORD", "kvharbord",
                                        "build/server/kvharbord")
    store = {"pool_budget_bytes": "1GiB",
             "host_ipc_socket": os.path.join(args.work, "kvh.sock")}
    if args.device_pool_bytes not in ("", "0"):
        store.update(device_pool_bytes=args.device_pool_bytes, allow_ipc=True)
    with local_daemon.Kvharbord(daemon_bin, config={"store": store}, workdir=args.work,
                                name="hit_correctness") as d:
        common = [sys.executable, os.path.abspath(__file__), "--addr", d.address,
                  "--work", args.work, "--model-dir", args.model_dir, "--device",
                  args.device, "--engine", args.engine, "--prompts", str(args.prompts)]
        rc = subprocess.run(common + ["--role", "store", "--calibrate", calibrate_bin]).returncode
        if rc == 0:
            rc = subprocess.run(common + ["--role", "hit"]).returncode
        if rc:
            print("kvharbord log (tail):\n" + "".join(d.log[-30:]))
    print(f"hit_correctness: {'PASSED' if rc == 0 else 'FAILED'} (outputs in {args.work})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
