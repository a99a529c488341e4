#!/usr/bin/env python3
"""Time to first token on a kvharbor hit against prefill, in a real HF
generation loop (issue 20, item 6). Runs on the GPU machine
(scripts/gpu_checks.sh); see docs/ttft.md for what every number means.

Model: transformers' LlamaForCausalLM from the Llama-3.1-8B config (32
layers, 32 heads, 8 KV heads, head_dim 128, hidden 4096, intermediate 14336,
vocab 128256, rope_theta 500000 with llama3 scaling, bf16, SDPA) with RANDOM
weights: no download, and timing does not depend on the weights (the same
kernels run on the same shapes whatever the values). Prompts of N + 1
random tokens for N in --lengths (default 1K, 4K, 16K, 32K): N cached
tokens (N / 16 pages) and the last prompt token.

Per N:
- prefill: one forward of the N + 1 prompt tokens (logits of the last one
  only), cuda-synchronized, one warm-up, median of the repeats;
- reference: prefill of the N-token prefix, then the forward of the last
  token on that cache: the first token every hit must reproduce;
- the prefix's K/V stored in kvharbor with Client.insert_from_layout straight
  from the model's cache (PagedKvLayout.from_dense), into an identity
  namespace of a daemon with a device pool (CUDA IPC allowed), one of a
  daemon with host pools (shared-memory socket), and a KVTC namespace of the
  device daemon (calibrated here on this model's own KV with
  kvharbor-calibrate --device gpu; pages demoted with Client.demote);
- for each hit path: load = Match + Lease.fetch_to_layout (+ decode +
  scatter) until the per-layer tensors the model reads hold the prefix;
  TTFT = load + building the HF cache around those tensors (no copy) + the
  forward of the last prompt token. Lossless paths must give the reference
  token and bitwise the stored K/V (exit 1 otherwise); KVTC paths report
  the K/V relative error and whether the token matches.

Paths: device_ipc (device tier, same host), host_shm (host raw tier, same
host), host_kvtc (host-compressed KVTC, same host), disk (KVTC files, page
cache warm), remote_kvtc and remote_raw (loopback without shared memory or
IPC: Client(host_fetch="off", device_ipc=False), COMPRESSED from the KVTC
namespace over gRPC, RAW from the host-pool one over the daemons' bulk data
plane, docs/data_plane.md: remote_raw with 4 connections against the
4-connection TCP ceiling, remote_raw_8 with 8 against the 8-connection one). Also measured in the same
run: pinned H2D / D2H and D2D bandwidth (torch copies of 1 GiB, cudaMemcpy
underneath) and a plain device-to-device copy of the prefix into the same
tensors (the best a same-GPU load can do).

--hf-only runs the model parts only (no kvharbor): links, prefill,
reference, and the load from a D2D copy with the HF cache built around the
copied tensors; it checks the first token there.

Output: the tables on stdout, JSON to --json (default $OUT/ttft_bench.json
when $OUT is set). Exit 1 on a correctness failure or a path error;
targets not met are reported, not failed.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import bench_paths  # noqa: F401  (python/ and tools/hf on sys.path)

import hf_kv
import local_daemon
import ttft_report
from bench_model import (LLAMA31_8B, PAGE, Shape,
                         build_model, random_ids, timed, write_json)

DEVICE = "cuda"
NS_DEV, NS_HOST, NS_KVTC = "ttft_device", "ttft_host", "ttft_kvtc"
# (name, daemon, namespace, remote client (False: same host; N: another
# host's client opening N bulk data plane connections), fetch format, link,
# target at 32K)
PATHS = [("device_ipc", "dev", NS_DEV, False, None, "d2d", 50),
         ("host_shm", "host", NS_HOST, False, None, "h2d", 12),
         ("remote_raw", "host", NS_HOST, 4, "RAW", "tcp4", 3),
         ("remote_raw_8", "host", NS_HOST, 8, "RAW", "tcp8", 3),
         ("host_kvtc", "dev", NS_KVTC, False, None, "h2d", 40),
         ("remote_kvtc", "dev", NS_KVTC, 4, "COMPRESSED", "h2d", 30),
         ("disk", "dev", NS_KVTC, False, None, "h2d", None)]
LOSSLESS = {"device_ipc", "host_shm", "remote_raw", "remote_raw_8"}


def measure_tcp_links():
    """GB/s of loopback TCP with 1, 4 and 8 connections (tcp1, tcp4, tcp8):
    bench/tcp_link_bench.cc, the network's stand-in for remote_raw, which
    loads over the bulk data plane's TCP connections (docs/data_plane.md).
    From $KVHARBOR_TCP_LINK_BENCH or build/bench/; {} when neither exists
    (remote_raw is then measured against h2d)."""
    exe = os.environ.get("KVHARBOR_TCP_LINK_BENCH") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "build", "bench",
        "kvharbor_bench_tcp_link_bench")
    if not os.path.exists(exe):
        print(f"links: no {exe}: the loopback TCP ceiling is not measured", flush=True)
        return {}
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        r = subprocess.run([exe, "--gib", "4", "--connections", "1,4,8", "--json", out.name],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(r.stdout, end="", flush=True)
        if r.returncode:
            raise RuntimeError(f"{exe}: exit {r.returncode}")
        got = json.load(open(out.name))["connections"]
    return {f"tcp{k}": v for k, v in got.items()}


def measure_links(nbytes=1 << 30, reps=5):
    """GB/s of pinned H2D, pinned D2H and D2D torch copies (median), and of
    loopback TCP (measure_tcp_links)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    dev2 = torch.empty_like(dev)
    out = {}
    for name, fn in (("h2d", lambda: dev.copy_(host, non_blocking=True)),
                     ("d2h", lambda: host.copy_(dev, non_blocking=True)),
                     ("d2d", lambda: dev2.copy_(dev))):
        timed(fn)
        out[name] = nbytes / statistics.median(timed(fn)[0] for _ in range(reps)) / 1e9
    out.update(measure_tcp_links())
    return out


class Bench:
    """The model side: prefill, reference token, the destination tensors
    (per layer [1][kv_heads][max N][head_dim]) and the checks on them."""

    lossless = LOSSLESS

    def __init__(self, args, model, cfg, shape, links, t_start):
        self.args, self.model, self.cfg, self.links = args, model, cfg, links
        self.shape, self.t_start, self.failures = shape, t_start, []
        self.dst_k, self.dst_v = shape.dense(max(args.lengths))

    def random_ids(self, n, seed):
        return random_ids(n, self.shape.vocab, seed)

    def elapsed(self):
        return time.monotonic() - self.t_start

    def reps(self, n):
        return self.args.long_repeats if n >= 16384 else self.args.repeats

    def first_token(self, n, ids):
        """(load-free TTFT pieces) forward of ids[n] on a cache built around
        dst[:n]; returns (token, seconds of cache build + forward, zero_copy)."""
        def step():
            cache, zc = hf_kv.cache_from_tensors(self.cfg, self.dst_k, self.dst_v, n)
            logits, _ = hf_kv.forward(self.model, ids[n:n + 1], cache, last_only=True)
            return int(torch.argmax(logits)), zc
        t, (tok, zc) = timed(step)
        return tok, t, zc

    def dst_equal(self, n, keys, values):
        return all(torch.equal(d[:, :, :n], s) for d, s in zip(self.dst_k, keys)) and all(
            torch.equal(d[:, :, :n], s) for d, s in zip(self.dst_v, values))

    def dst_rel_err(self, n, keys, values):
        out = []
        for dst, src in ((self.dst_k, keys), (self.dst_v, values)):
            num = sum(float((d[:, :, :n].float() - s.float()).norm() ** 2) for d, s in zip(dst, src))
            den = sum(float(s.float().norm() ** 2) for s in src)
            out.append((num / max(den, 1e-30)) ** 0.5)
        return out

    def clear_dst(self, n):
        for t in self.dst_k + self.dst_v:
            t[:, :, :n].zero_()

    def prefill_and_reference(self, n):
        """Row with prefill timing and the reference token; (row, ids, K, V)."""
        ids = self.random_ids(n + 1, self.args.seed + n)
        reps = self.reps(n)
        times = []
        for r in range(1 + reps):
            t, (logits, _) = timed(lambda: hf_kv.forward(self.model, ids, None, last_only=True))
            if r:
                times.append(t)
        prefill_token = int(torch.argmax(logits))
        _, cache = hf_kv.forward(self.model, ids[:n], None, last_only=True)
        keys = [k for k, _ in hf_kv.layer_kv(cache)]
        values = [v for _, v in hf_kv.layer_kv(cache)]
        logits, _ = hf_kv.forward(self.model, ids[n:], cache, last_only=True)
        ref_token = int(torch.argmax(logits))
        row = {"tokens": n, "prefill_s": statistics.median(times), "prefill_all_s": times,
               "repeats": reps, "prefill_token": prefill_token, "reference_token": ref_token,
               "kv_bytes": n * self.shape.bytes_per_token, "paths": {}}
        same = ("same" if ref_token == prefill_token else
                "differs: bf16 rounding of a 1-token step vs an (N+1)-token prefill")
        print(f"[{n}] prefill of {n + 1} tokens: median {row['prefill_s'] * 1e3:.1f} ms "
              f"over {reps} (warm-up excluded); first token {prefill_token}; prefix "
              f"prefill + last-token forward gives {ref_token} ({same})", flush=True)
        return row, ids, keys, values

    def d2d_row(self, row, ids, keys, values):
        """The load as a plain device copy into the model's tensors."""
        n = row["tokens"]
        loads, ttfts, fwds, ok = [], [], [], True
        for r in range(1 + self.reps(n)):
            self.clear_dst(n)

            def copy():
                for d, s in zip(self.dst_k + self.dst_v, keys + values):
                    d[:, :, :n].copy_(s)
            t_load, _ = timed(copy)
            tok, t_fwd, zc = self.first_token(n, ids)
            ok = ok and tok == row["reference_token"]
            if r:
                loads.append(t_load)
                ttfts.append(t_load + t_fwd)
                fwds.append(t_fwd)
        row["last_token_forward_s"] = statistics.median(fwds)
        print(f"[{n}] cache built around the tensors + last-token forward: median "
              f"{row['last_token_forward_s'] * 1e3:.1f} ms", flush=True)
        exact = self.dst_equal(n, keys, values)
        rec = self.path_record(row, "d2d_copy", "torch copy_", loads, ttfts,
                               n * self.shape.bytes_per_token, "d2d", ok, exact, zero_copy=zc)
        if not (ok and exact):
            self.failures.append(f"{n}: d2d_copy: token {ok}, K/V exact {exact}")
        return rec

    def path_record(self, row, name, served_by, loads, ttfts, link_bytes, link, token_ok,
                    exact, **extra):
        load, ttft = statistics.median(loads), statistics.median(ttfts)
        gbps = link_bytes / load / 1e9
        rec = {"served_by": served_by, "load_s": load, "ttft_s": ttft, "load_all_s": loads,
               "prefill_over_load": row["prefill_s"] / load,
               "prefill_over_ttft": row["prefill_s"] / ttft, "link_bytes": link_bytes,
               "link_gbps": gbps, "link": link,
               "link_fraction": gbps / self.links[link] if link in self.links else None,
               "first_token_ok": token_ok,
               "kv_exact": exact, **extra}
        row["paths"][name] = rec
        print(f"[{row['tokens']}] {name:<12} ({served_by}): load {load * 1e3:8.2f} ms, "
              f"TTFT {ttft * 1e3:8.2f} ms, prefill/load {rec['prefill_over_load']:7.1f}x, "
              f"{gbps:7.1f} GB/s = "
              + (f"{rec['link_fraction']:.2f} of {link}" if rec["link_fraction"] is not None
                 else f"({link} not measured)") + "; first token "
              f"{'OK' if token_ok else 'DIFFERS'}; K/V "
              f"{'exact' if exact is True else exact}"
              + "".join(f"; {k} {v}" for k, v in extra.items() if k in ("tiers", "zero_copy")),
              flush=True)
        return rec


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1024,4096,16384,32768",
                    help="cached prefix lengths N, multiples of 16 (prompts are N + 1)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats below 16K")
    ap.add_argument("--long-repeats", type=int, default=2, help="timed repeats at >= 16K")
    ap.add_argument("--hf-only", action="store_true", help="no kvharbor: the model parts")
    ap.add_argument("--kvtc-ratio", default="16", help="kvharbor-calibrate --ratios")
    ap.add_argument("--kvtc-components", type=int, default=1024)
    ap.add_argument("--calib-tokens", type=int, default=4096)
    ap.add_argument("--budget-s", type=float, default=330.0,
                    help="stop timing more repeats after this many seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kvharbord", default="")
    ap.add_argument("--calibrate", default="")
    ap.add_argument("--work", default="", help="daemon configs, samples, disk tier")
    ap.add_argument("--json", default="", help="default: $OUT/ttft_bench.json when $OUT is set")
    ap.add_argument("--model-config", default="",
                    help="a config.json to use instead of Llama-3.1-8B's (random weights too)")
    a = ap.parse_args()
    a.lengths = [int(x) for x in a.lengths.split(",") if x]
    bad = [n for n in a.lengths if n <= 0 or n % PAGE]
    if bad:
        ap.error(f"--lengths: {bad} are not positive multiples of {PAGE}")
    a.config = dict(LLAMA31_8B)
    a.model_name = "Llama-3.1-8B config, random bf16 weights"
    if a.model_config:
        with open(a.model_config) as f:
            a.config = json.load(f)
        a.model_name = f"{a.model_config}, random bf16 weights"
    if not a.json and os.environ.get("OUT"):
        a.json = os.path.join(os.environ["OUT"], "ttft_bench.json")
    return a


def main():
    args = parse_args()
    if not torch.cuda.is_available():
        print("ttft_bench: needs a CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    import transformers
    t_start = time.monotonic()
    local_daemon.use_library()
    print(f"ttft_bench: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}", flush=True)
    with torch.inference_mode():
        t, (model, cfg) = timed(lambda: build_model(args.config))
        print(f"model: LlamaForCausalLM, {args.model_name} ({hf_kv.rope_description(cfg)}), "
              f"attention {getattr(model.config, '_attn_implementation', '?')}, bf16, "
              f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters; the weights "
              f"are random: timing does not depend on them; built in {t:.1f} s", flush=True)
        links = measure_links()
        print("links: " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in links.items()), flush=True)
        bench = Bench(args, model, cfg, Shape(args.config), links, t_start)
        hits = None
        if not args.hf_only:
            import ttft_hits
            work = args.work or tempfile.mkdtemp(prefix="kvh-ttft-")
            hits = ttft_hits.Hits(bench, args, work, PATHS, (NS_DEV, NS_HOST, NS_KVTC))
        rows = []
        try:
            for n in args.lengths:
                row, ids, keys, values = bench.prefill_and_reference(n)
                bench.d2d_row(row, ids, keys, values)
                if hits:
                    hits.run_length(row, ids, keys, values)
                rows.append(row)
                # Written after every length, so a run cut short by its time
                # limit still leaves the rows it measured.
                write_json(args, ttft_report.build(rows, links, PATHS, args))
                print(f"ttft_bench: {n} tokens done at {bench.elapsed():.0f} s", flush=True)
                del keys, values
                torch.cuda.empty_cache()
        finally:
            if hits:
                hits.close()
    report = ttft_report.build(rows, links, PATHS, args)
    ttft_report.print_report(report)
    if write_json(args, report):
        print(f"wrote {args.json}")
    for f in bench.failures:
        print(f"FAILED: {f}")
    print(f"ttft_bench: {len(bench.failures)} failure(s), {bench.elapsed():.0f} s")
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
