"""Worker B: the consumer, another process. Gets new prompts that share worker
A's prefix, matches them in kvharbord, fetches the cached pages (RAW from the
identity namespace; COMPRESSED from the KVTC namespace, decoded by the SDK
on this side), rebuilds the cache tensors and continues generation from them
instead of recomputing the prefix. Checks the results against a full
recompute, measures time to first token and bytes moved, prints a table and
exits 1 when a check fails.

    python3 worker_b.py --addr HOST:PORT --model-dir DIR --work DIR
"""

import argparse
import os
import statistics
import sys

import torch

import common as C
from common import kvharbor
from model import KVCache, pages_to_cache, pick_device, self_check

FMT = kvharbor.FetchFormat


class Checks:
    def __init__(self):
        self.rows = []

    def add(self, name, ok, detail):
        self.rows.append((name, bool(ok), detail))
        print(f"[B] {'PASS' if ok else 'FAIL'}: {name}: {detail}", flush=True)

    @property
    def ok(self):
        return all(ok for _, ok, _ in self.rows)


def fetch_pages(client, ns, ids, fmt, model, release=True):
    """match(lock) + fetch (RAW or COMPRESSED, decoded by the SDK) into a
    (pinned) host tensor + copy to the device.
    Returns (pages on device [P][2][L][S][H][D], lease)."""
    lease = client.match(ns, ids, lock=True)
    buf = C.host_buffer(C.page_shape(model.cfg, lease.num_pages), torch.float32,
                        model.device)
    if lease.num_pages:
        lease.fetch_into(buf, format=fmt)
    if release:
        lease.release()
    return buf.to(model.device, non_blocking=True), lease


def ttft_recompute(model, ids):
    t0 = C.now(model.device)
    cache = KVCache(model.cfg, len(ids) + 1, model.device)
    first = int(torch.argmax(model.prefill(ids, cache, C.PAGE_SIZE)))
    return C.now(model.device) - t0, first


def ttft_hit(client, ns, model, ids, fmt):
    """Time to first token with the prefix from kvharbord; the last token is
    never matched so at least one position is computed."""
    t0 = C.now(model.device)
    pages, lease = fetch_pages(client, ns, ids[:-1], fmt, model, release=False)
    cache = KVCache(model.cfg, len(ids) + 1, model.device)
    cache.load(*pages_to_cache(pages))
    t_fetch = C.now(model.device) - t0
    first = int(torch.argmax(model.prefill(ids, cache, C.PAGE_SIZE)))
    dt = C.now(model.device) - t0
    lease.release()
    return dt, first, t_fetch


def continue_from(model, ids, k, v):
    cache = KVCache(model.cfg, len(ids) + C.GEN_TOKENS + 1, model.device)
    cache.load(k, v)
    return model.generate(ids, cache, C.GEN_TOKENS, C.PAGE_SIZE)


def rel_err(a, b):
    return float((a - b).double().norm() / b.double().norm())


def check_prompt(client, model, ids, story, checks, res):
    cfg = model.cfg
    ref_cache = KVCache(cfg, len(ids) + C.GEN_TOKENS + 1, model.device)
    ref_toks, ref_logits = model.generate(ids, ref_cache, C.GEN_TOKENS, C.PAGE_SIZE)

    # Identity namespace, RAW fetch: must be the recompute, bit for bit.
    b0 = C.bytes_out(client, C.NS_RAW)
    pages, lease = fetch_pages(client, C.NS_RAW, ids[:-1], FMT.RAW, model)
    raw_bytes = C.bytes_out(client, C.NS_RAW) - b0
    m = lease.matched_tokens
    k, v = pages_to_cache(pages)
    checks.add(f"story {story}: prefix hit", m >= C.PREFIX_TOKENS // C.PAGE_SIZE * C.PAGE_SIZE,
               f"matched {m} of {len(ids)} tokens ({lease.num_pages} pages)")
    same_kv = torch.equal(k, ref_cache.k[:, :m]) and torch.equal(v, ref_cache.v[:, :m])
    checks.add(f"story {story}: fetched KV == KV recomputed here", same_kv,
               "bitwise (worker A's process vs this one)")
    toks, logits = continue_from(model, ids, k, v)
    checks.add(f"story {story}: identity continuation == recompute",
               toks == ref_toks and torch.equal(logits, ref_logits),
               f"{C.GEN_TOKENS} greedy tokens and every logit bitwise equal")
    b0 = C.bytes_out(client, C.NS_RAW)
    cpages, _ = fetch_pages(client, C.NS_RAW, ids[:-1], FMT.COMPRESSED, model)
    id_comp_bytes = C.bytes_out(client, C.NS_RAW) - b0
    checks.add(f"story {story}: identity COMPRESSED fetch == RAW",
               torch.equal(cpages, pages), "bitwise")

    # KVTC namespace (pages demoted to host_compressed by worker A).
    b0 = C.bytes_out(client, C.NS_KVTC)
    kpages, klease = fetch_pages(client, C.NS_KVTC, ids[:-1], FMT.COMPRESSED, model)
    kvtc_bytes = C.bytes_out(client, C.NS_KVTC) - b0
    dpages, dlease = fetch_pages(client, C.NS_KVTC, ids[:-1], FMT.RAW, model)
    # Lease.page_tiers: where each page was at match time; worker A demoted
    # them all, and fetches (RAW included) leave them there.
    tiers = {C.tier_name(t) for t in klease.page_tiers + dlease.page_tiers}
    checks.add(f"story {story}: KVTC decoded by the SDK == decoded by the daemon",
               torch.equal(kpages, dpages) and tiers == {"host_compressed"},
               "COMPRESSED (client-side decode) vs RAW of cold pages, bitwise; "
               f"page tiers at match: {', '.join(sorted(tiers))}")
    kk, kv = pages_to_cache(kpages)
    km = klease.matched_tokens
    ktoks, klogits = continue_from(model, ids, kk, kv)
    agree = sum(a == b for a, b in zip(ktoks, ref_toks))
    first_div = next((i for i, (a, b) in enumerate(zip(ktoks, ref_toks)) if a != b),
                     C.GEN_TOKENS)
    # Teacher-forced along the exact continuation: the top-1 prediction at
    # each of its positions with the KVTC prefix vs the exact prefix (one
    # flip does not derail the rest, unlike free-running agreement).
    full = ids + ref_toks[:-1]
    tf = []
    for pk, pv in ((kk, kv), (ref_cache.k[:, :km], ref_cache.v[:, :km])):
        cache = KVCache(model.cfg, len(full), model.device)
        cache.load(pk, pv)
        tf.append(model.prefill(full, cache, C.PAGE_SIZE, all_logits=True)[-C.GEN_TOKENS:])
    tf_agree = int((tf[0].argmax(-1) == tf[1].argmax(-1)).sum())
    res["prompts"].append({
        "tf_agree": tf_agree, "tf_max_logit_diff": float((tf[0] - tf[1]).abs().max()),
        "story": story, "tokens": len(ids), "matched": m, "kvtc_matched": km,
        "raw_fetch_bytes": raw_bytes, "identity_compressed_bytes": id_comp_bytes,
        "kvtc_fetch_bytes": kvtc_bytes, "kvtc_page_tiers": sorted(tiers),
        "k_rel_err": rel_err(kk, ref_cache.k[:, :km]),
        "v_rel_err": rel_err(kv, ref_cache.v[:, :km]),
        "agree": agree, "first_divergence": first_div,
        "max_logit_diff": float((klogits[:first_div + 1] - ref_logits[:first_div + 1]).abs().max()),
        "text_ref": model_text(ref_toks), "text_kvtc": model_text(ktoks)})


_TOK = None


def model_text(toks):
    return _TOK.decode(toks, prev=0)


def timings(client, model, ids, repeats, res):
    for _ in range(2):  # warm-up (allocator, channel)
        ttft_recompute(model, ids)
        ttft_hit(client, C.NS_RAW, model, ids, FMT.RAW)
    for _ in range(repeats):
        dt, f0 = ttft_recompute(model, ids)
        res["ttft_recompute"].append(dt)
        dt, f1, tf = ttft_hit(client, C.NS_RAW, model, ids, FMT.RAW)
        res["ttft_hit_raw"].append(dt)
        res["fetch_raw"].append(tf)
        dt, _, tf = ttft_hit(client, C.NS_KVTC, model, ids, FMT.COMPRESSED)
        res["ttft_hit_kvtc"].append(dt)
        res["fetch_kvtc"].append(tf)
        if f0 != f1:
            raise RuntimeError("first token differs between recompute and hit")


def loss_check(client, model, tok, stories, checks, res):
    seqs = C.eval_sequences(tok, stories, model.cfg.seq_len)
    tot = {"clean": 0.0, "identity": 0.0, "kvtc": 0.0}
    count, kbytes, rbytes = 0, 0, 0
    identical = True
    for ids in seqs:
        cache = KVCache(model.cfg, len(ids), model.device)
        model.prefill(ids, cache, C.PAGE_SIZE)
        clean = (cache.k, cache.v)
        b0 = C.bytes_out(client, C.NS_RAW)
        rp, rl = fetch_pages(client, C.NS_RAW, ids, FMT.RAW, model)
        rbytes += C.bytes_out(client, C.NS_RAW) - b0
        b0 = C.bytes_out(client, C.NS_KVTC)
        kp, kl = fetch_pages(client, C.NS_KVTC, ids, FMT.COMPRESSED, model)
        kbytes += C.bytes_out(client, C.NS_KVTC) - b0
        if rl.matched_tokens != len(ids) or kl.matched_tokens != len(ids):
            raise RuntimeError(f"eval sequence: matched {rl.matched_tokens}/"
                               f"{kl.matched_tokens} of {len(ids)} tokens")
        s_clean, n = model.loss_with_history(ids, *clean)
        s_id, _ = model.loss_with_history(ids, *pages_to_cache(rp))
        s_kvtc, _ = model.loss_with_history(ids, *pages_to_cache(kp))
        identical &= s_id == s_clean
        tot["clean"] += s_clean
        tot["identity"] += s_id
        tot["kvtc"] += s_kvtc
        count += n
    res["loss"] = {k: v / count for k, v in tot.items()}
    res["loss"].update(tokens=count, sequences=len(seqs), kvtc_bytes=kbytes,
                       raw_bytes=rbytes)
    checks.add("loss with fetched identity cache == clean", identical,
               f"{res['loss']['clean']:.6f} nats/token over {count} predicted "
               f"tokens of {len(seqs)} held-out stories, bitwise")
    return res["loss"]


def main():
    global _TOK
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--addr", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-loss-delta", type=float, default=0.03,
                    help="KVTC check: loss increase in nats/token at most")
    ap.add_argument("--min-agreement", type=float, default=0.95,
                    help="KVTC check: mean fraction of teacher-forced top-1 "
                    "predictions equal to the exact cache's")
    args = ap.parse_args()
    device = pick_device(args.device)
    model, tok, stories = C.load(args.model_dir, device)
    _TOK = tok
    checks = Checks()
    ok, text = self_check(model, tok)
    checks.add("model reproduces the Lily sentence", ok, repr(text))
    a = C.load_json(os.path.join(args.work, "worker_a.json"))
    res = {"device": str(device), "torch": torch.__version__, "prompts": [],
           "ttft_recompute": [], "ttft_hit_raw": [], "ttft_hit_kvtc": [],
           "fetch_raw": [], "fetch_kvtc": []}
    with kvharbor.Client(args.addr) as client:
        client.wait_connected(10)
        prefix = C.shared_prefix(tok, stories)
        for story in C.B_SUFFIX_STORIES:
            ids = C.prompt(tok, stories, prefix, story)
            check_prompt(client, model, ids, story, checks, res)
            timings(client, model, ids, args.repeats, res)
        loss = loss_check(client, model, tok, stories, checks, res)
        res["kvtc_tiers"] = C.tier_stats(client, C.NS_KVTC)
    delta = loss["kvtc"] - loss["clean"]
    checks.add("KVTC loss increase", delta <= args.max_loss_delta,
               f"{delta:+.4f} nats/token (limit {args.max_loss_delta})")
    agree = statistics.mean(p["tf_agree"] / C.GEN_TOKENS for p in res["prompts"])
    checks.add("KVTC top-1 agreement", agree >= args.min_agreement,
               f"{agree:.1%} of the next-token predictions along {len(res['prompts'])}"
               f" exact {C.GEN_TOKENS}-token greedy continuations equal the exact "
               f"cache's (limit {args.min_agreement:.0%})")
    res["checks"] = checks.rows
    C.save_json(os.path.join(args.work, "worker_b.json"), res)
    print_table(model, a, res, checks)
    return 0 if checks.ok else 1


def print_table(model, a, res, checks):
    cfg = model.cfg
    ms = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    p0 = res["prompts"]
    tok_bytes = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4
    host = a["kvtc_tiers"].get("host_compressed", (0, 0))
    page_raw = tok_bytes * C.PAGE_SIZE
    stored_ratio = page_raw * host[0] / host[1] if host[1] else float("nan")
    raw_b = statistics.mean(p["raw_fetch_bytes"] for p in p0)
    kvtc_b = statistics.mean(p["kvtc_fetch_bytes"] for p in p0)
    loss = res["loss"]
    print()
    print(f"== kvharbor end-to-end, stories260K on {res['device']} "
          f"(torch {res['torch']}) ==")
    rows = [
        ("prompt tokens / matched (mean)",
         f"{statistics.mean(p['tokens'] for p in p0):.0f} / "
         f"{statistics.mean(p['matched'] for p in p0):.0f}"),
        ("TTFT recompute (median)", f"{ms(res['ttft_recompute']):.2f} ms"),
        ("TTFT hit, RAW identity (median)", f"{ms(res['ttft_hit_raw']):.2f} ms"
         f"  ({ms(res['ttft_recompute']) / ms(res['ttft_hit_raw']):.2f}x faster; "
         f"match+fetch+rebuild {ms(res['fetch_raw']):.2f} ms)"),
        ("TTFT hit, KVTC COMPRESSED (median)", f"{ms(res['ttft_hit_kvtc']):.2f} ms"
         f"  ({ms(res['ttft_recompute']) / ms(res['ttft_hit_kvtc']):.2f}x faster; "
         f"match+fetch+decode+rebuild {ms(res['fetch_kvtc']):.2f} ms)"),
        ("bytes moved per hit, RAW", f"{raw_b:,.0f} B ({tok_bytes} B/token fp32)"),
        ("bytes moved per hit, KVTC", f"{kvtc_b:,.0f} B ({raw_b / kvtc_b:.2f}x less)"),
        ("KVTC stored (host_compressed)", f"{host[0]} pages, {host[1]:,} B, "
         f"{stored_ratio:.2f}x vs fp32 pages"),
        ("KVTC K / V relative error (prefix)",
         f"{statistics.mean(p['k_rel_err'] for p in p0):.4f} / "
         f"{statistics.mean(p['v_rel_err'] for p in p0):.4f}"),
        ("KVTC top-1 agreement, teacher-forced",
         f"{sum(p['tf_agree'] for p in p0)}/{C.GEN_TOKENS * len(p0)} "
         f"(max |logit diff| {max(p['tf_max_logit_diff'] for p in p0):.3f})"),
        ("KVTC free-running greedy, same tokens",
         ", ".join(f"{p['agree']}/{C.GEN_TOKENS}" for p in p0)
         + " (first divergence at " + ", ".join(
             str(p["first_divergence"]) for p in p0) + f"; {C.GEN_TOKENS} = none)"),
        ("loss clean / identity / KVTC", f"{loss['clean']:.5f} / {loss['identity']:.5f}"
         f" / {loss['kvtc']:.5f} nats/token ({loss['tokens']} tokens)"),
        ("KVTC loss increase", f"{loss['kvtc'] - loss['clean']:+.5f} nats/token"),
    ]
    w = max(len(r[0]) for r in rows)
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")
    # What the same hit means for Llama-3.1-8B: 32 layers, 8 KV heads,
    # head_dim 128, bf16.
    big = 2 * 32 * 8 * 128 * 2
    print(f"  {'Llama-3.1-8B KV per token (bf16)':<{w}}  {big:,} B = {big // 1024} KiB;"
          f" a {C.PREFIX_TOKENS // C.PAGE_SIZE * C.PAGE_SIZE}-token prefix = "
          f"{big * (C.PREFIX_TOKENS // C.PAGE_SIZE * C.PAGE_SIZE) / 2**20:.0f} MiB raw")
    print(f"checks: {sum(ok for _, ok, _ in checks.rows)}/{len(checks.rows)} passed"
          + ("" if checks.ok else "; FAILED: " + ", ".join(
              n for n, ok, _ in checks.rows if not ok)))


if __name__ == "__main__":
    sys.exit(main())
