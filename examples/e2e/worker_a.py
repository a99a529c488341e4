"""Worker A: the producer. Calibrates KVTC on the model's own KV, creates the
namespaces, prefills prompts that share a long prefix and stores their KV
pages in kvharbord; then demotes the KVTC namespace's pages to the
host_compressed tier (stored as KVTC buffers). Everything goes through the
Python client (namespaces with their codec, calibration and tier budget,
inserts, demote, per-tier stats).

    python3 worker_a.py --addr HOST:PORT --model-dir DIR --work DIR \
        --calibrate kvharbor-calibrate [--kvtc-ratio 16]

Keys are cached after RoPE (as inference engines do), so the KV samples say
keys_roped=true and the calibration undoes RoPE itself (interleaved, theta
10000). Pages use the daemon's default layout KV_LAYER_TOKEN_HEAD_DIM:
[K|V][layer][token][kv_head][head_dim], fp32 (the model's dtype, so the
identity path can be checked bit for bit).
"""

import argparse
import glob
import os
import subprocess
import sys
import time

import torch

import common as C
from common import kvharbor
from model import KVCache, cache_to_pages, pick_device, self_check


def capture_samples(model, tok, stories, path):
    """KV of the calibration stories (positions from 0) -> a sample file."""
    ks, vs, ps = [], [], []
    for s in stories[:C.CALIB_STORIES]:
        ids = tok.encode(s, bos=True)[:model.cfg.seq_len]
        cache = KVCache(model.cfg, len(ids), model.device)
        model.prefill(ids, cache, C.PAGE_SIZE)
        ks.append(cache.k[:, :len(ids)].transpose(0, 1).cpu())  # [T][L][H][D]
        vs.append(cache.v[:, :len(ids)].transpose(0, 1).cpu())
        ps.append(torch.arange(len(ids), dtype=torch.int64))
    k, v, p = torch.cat(ks), torch.cat(vs), torch.cat(ps)
    C.write_kv_samples(path, k.numpy(), v.numpy(), p.numpy(), model.cfg,
                       f"validation_100.txt stories [0, {C.CALIB_STORIES})")
    return int(p.numel())


def calibrate(args, samples, out_prefix):
    cmd = [args.calibrate, "--samples", samples, "--out", out_prefix,
           "--ratios", str(args.kvtc_ratio), "--raw-dtype", "fp32",
           "--page-size", str(C.PAGE_SIZE), "--sink-tokens", "4", "--quiet"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout}")
    files = glob.glob(out_prefix + ".*x.kvtc")
    if len(files) != 1:
        raise RuntimeError(f"calibration: expected one {out_prefix}.*x.kvtc, got {files}")
    return os.path.abspath(files[0]), r.stdout.strip()


def create_namespaces(client, args, cfg, calibration):
    geom = C.geometry(cfg)
    for ns in (C.NS_RAW, C.NS_KVTC):
        try:
            client.delete_namespace(ns, force=True)
        except kvharbor.NotFoundError:
            pass
    client.create_namespace(C.NS_RAW, geom, capacity_bytes=args.ns_bytes,
                            codec="identity")
    # calibration_path is a path on the daemon's machine (this one); a remote
    # daemon would take the file's bytes: calibration=open(path, "rb").read().
    info = client.create_namespace(
        C.NS_KVTC, geom, capacity_bytes=args.ns_bytes, codec="kvtc",
        calibration_path=calibration,
        host_compressed_bytes=args.ns_bytes).info
    if (info.codec != "kvtc" or info.geometry != geom
            or info.host_compressed_bytes != args.ns_bytes
            or not info.calibration_fingerprint):
        raise RuntimeError(f"{C.NS_KVTC}: created as {info}")
    cal = client.get_calibration(C.NS_KVTC)
    if cal.codec != "kvtc" or cal.fingerprint != info.calibration_fingerprint \
            or not cal.bytes:
        raise RuntimeError(f"{C.NS_KVTC}: get_calibration returned codec "
                           f"{cal.codec!r}, {len(cal.bytes)} bytes, fingerprint "
                           f"{cal.fingerprint:016x} (namespace: "
                           f"{info.calibration_fingerprint:016x})")
    return geom, {"fingerprint": f"{cal.fingerprint:016x}",
                  "bytes": len(cal.bytes)}


def prefill_pages(model, ids):
    """Prefill from scratch; the pages of the whole pages of `ids`."""
    cache = KVCache(model.cfg, len(ids), model.device)
    t0 = C.now(model.device)
    model.prefill(ids, cache, C.PAGE_SIZE)
    dt = C.now(model.device) - t0
    n = len(ids) // C.PAGE_SIZE * C.PAGE_SIZE
    pages = cache_to_pages(cache.k[:, :n], cache.v[:, :n], C.PAGE_SIZE).cpu()
    return pages, n, dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--addr", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--calibrate", required=True, help="kvharbor-calibrate")
    ap.add_argument("--kvtc-ratio", type=float, default=16,
                    help="KVTC target ratio vs fp32 rows")
    ap.add_argument("--ns-bytes", type=int, default=64 << 20)
    ap.add_argument("--device", default=None)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    device = pick_device(args.device)
    model, tok, stories = C.load(args.model_dir, device)
    cfg = model.cfg
    ok, text = self_check(model, tok)
    print(f"[A] {cfg} on {device}; greedy from BOS: {text!r}", flush=True)
    if not ok:
        print("[A] FAILED: the model does not reproduce the Lily sentence")
        return 1
    out = {"device": str(device), "torch": torch.__version__, "lily": text}

    t0 = time.perf_counter()
    samples = os.path.join(args.work, "kv_samples.safetensors")
    out["calib_tokens"] = capture_samples(model, tok, stories, samples)
    cal, report = calibrate(args, samples, os.path.join(args.work, "stories260K"))
    out["calibration"], out["calibrate_report"] = cal, report
    out["calibrate_s"] = time.perf_counter() - t0
    print(f"[A] KVTC calibration from {out['calib_tokens']} tokens of real KV: "
          f"{cal}\n    {report}", flush=True)

    with kvharbor.Client(args.addr) as client:
        client.wait_connected(10)
        _, out["kvtc_calibration"] = create_namespaces(client, args, cfg, cal)
        print(f"[A] namespaces {C.NS_RAW} (identity), {C.NS_KVTC} (kvtc, "
              f"calibration {out['kvtc_calibration']['fingerprint']}, "
              f"{out['kvtc_calibration']['bytes']} bytes in canonical form)",
              flush=True)
        prefix = C.shared_prefix(tok, stories)
        out["prompts"] = []
        for story in C.A_SUFFIX_STORIES:
            ids = C.prompt(tok, stories, prefix, story)
            pages, n, dt = prefill_pages(model, ids)
            t1 = time.perf_counter()
            r_raw = client.insert(C.NS_RAW, ids[:n], pages)
            t_ins = time.perf_counter() - t1
            r_kvtc = client.insert(C.NS_KVTC, ids[:n], pages)
            out["prompts"].append({
                "story": story, "tokens": len(ids), "pages": n // C.PAGE_SIZE,
                "prefill_s": dt, "insert_s": t_ins, "bytes": pages.numel() * 4,
                "already_present_tokens": r_raw.already_present_tokens,
                "pages_stored": r_raw.pages_stored,
                "kvtc_pages_stored": r_kvtc.pages_stored})
            print(f"[A] prompt (prefix {len(prefix)} + story {story}): {len(ids)} "
                  f"tokens, prefill {dt * 1e3:.1f} ms, inserted {n // C.PAGE_SIZE} "
                  f"pages ({r_raw.already_present_tokens} tokens already there, "
                  f"{r_raw.pages_stored} stored) in {t_ins * 1e3:.1f} ms", flush=True)
        seqs = C.eval_sequences(tok, stories, cfg.seq_len)
        for ids in seqs:
            pages, n, _ = prefill_pages(model, ids)
            client.insert(C.NS_RAW, ids, pages)
            client.insert(C.NS_KVTC, ids, pages)
        out["eval_sequences"] = len(seqs)
        out["eval_tokens"] = sum(len(s) for s in seqs)
        print(f"[A] stored {len(seqs)} held-out stories ({out['eval_tokens']} "
              "tokens) for the loss check", flush=True)
        moved = client.demote(C.NS_KVTC, kvharbor.Tier.HOST_COMPRESSED)
        out["demoted_pages"] = moved
        out["kvtc_tiers"] = C.tier_stats(client, C.NS_KVTC)
        out["raw_tiers"] = C.tier_stats(client, C.NS_RAW)
        print(f"[A] demote {C.NS_KVTC} to host_compressed: {moved} pages moved;"
              f" tiers {out['kvtc_tiers']}", flush=True)
        cold = out["kvtc_tiers"].get("host_compressed", (0, 0))[0]
        if moved == 0 or cold < moved:
            raise RuntimeError(f"demote: {moved} pages moved, host_compressed "
                               f"holds {cold}")
    C.save_json(os.path.join(args.work, "worker_a.json"), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
