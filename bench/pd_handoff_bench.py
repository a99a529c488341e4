#!/usr/bin/env python3
"""Prefill-to-decode handoff through kvharbord, two processes (issue 31,
item 6 and target 8). Runs on the GPU machine (scripts/gpu_checks.sh) and,
with --cpu, in CI (tests/python/test_pd_handoff.py); docs/data_plane.md
"P/D handoff benchmark" says what every number means.

- PREFILL process (this one): prefills a prompt of N + 1 random tokens
  (one forward, logits of the last token: the prompt's first output token),
  stores the N-token prefix's K/V with Client.insert_from_layout straight
  from the model's cache (PagedKvLayout.from_dense), with a default client
  (the daemon is on this host), and for KVTC demotes the namespace to
  host_compressed (the daemon encodes). Then it tells the decode process.
- DECODE process (multiprocessing, spawn): built once, waits for requests.
  Its clients are told the daemon is on another host: Client(host_fetch=
  "off", device_ipc=False) -- no shared memory, no CUDA IPC; the bulk data
  plane stays on (RAW pages, and the KVTC pages' codec buffers with
  FetchFormat.COMPRESSED, come over its TCP connections; the client decodes
  the KVTC ones). It
  matches the prefix with a lease, loads it with Lease.fetch_to_layout into
  per-layer tensors the model then attends to, runs the last prompt token
  (its first token) and decodes --decode-tokens greedily in the HF loop.

Per variant (raw: identity namespace of a host-pool daemon; kvtc: KVTC
namespace with a calibration made from this model's own KV, of a daemon
with a device pool on a GPU, host pools on CPU) and N, after one warm-up
handoff, medians of the timed repeats (each with its own prompt):
prefill (measured in the same handoff), insert, demote (kvtc), handoff =
from prefill done to the decode process's KV loaded and first token out
(insert + demote + notify + Match + fetch + first forward; both processes
read CLOCK_MONOTONIC), prefill / handoff (the end-to-end ratio of target
8), the TransferResult.path of both sides and the bytes each moved.

Checks (exit 1 when one fails, or on any error): the decode process matched
all N tokens; raw: its K/V are bit-identical to what was stored (an
order-sensitive integer digest computed in both processes) and its tokens
are those of the same loop run in the prefill process on the stored
tensors; with fp32 K/V (--cpu) also: its first token equals the first token
of the decode without the cache (the prefill's own). KVTC tokens are
reported, not checked (lossy). Targets (at 32768 tokens: KVTC >= 10x
faster than prefill end to end, raw >= 2x) are reported, not failed.

GPU default: Llama-3.1-8B config with RANDOM bf16 weights (transformers,
SDPA; timing does not depend on the weights), N = 4K, 16K, 32K. --cpu:
stories260K (or a tiny random Llama when it is not found) in
tools/hf/torch_llama.py (no transformers), fp32, N = 32 and 96.

Output: the table on stdout, JSON to --json (default
$OUT/pd_handoff_bench.json when $OUT is set).
"""

import argparse
import multiprocessing
import os
import sys
import tempfile
import time

import torch

import bench_paths

import bench_model
import local_daemon
import pd_engines
import pd_report
from bench_model import LLAMA31_8B, PAGE

NS = {"raw": "pd_raw", "kvtc": "pd_kvtc"}
FORMATS = {"raw": "RAW", "kvtc": "COMPRESSED"}
# TransferResult.path values only a client on the daemon's host gets.
SAME_HOST_PATHS = {"device_ipc", "host_shm", "compressed_local"}


def clock(device):
    """CLOCK_MONOTONIC (one clock for every process of the host) after the
    device's queued work is done."""
    bench_model.sync(device)
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def digest(tensors, n):
    """An order-sensitive integer digest of the first n tokens of each
    tensor's bits: exact (integer sums), so equal bytes give equal digests
    in any process."""
    total = 0
    for i, t in enumerate(tensors):
        x = t[:, :, :n].contiguous()
        bits = x.view(torch.int16 if x.element_size() == 2 else torch.int32).flatten().long()
        w = torch.arange(bits.numel(), device=bits.device) % 65521 + 1 + i
        total += int((bits * w).sum())
    return total


def greedy(engine, state, logits, count):
    toks = [int(torch.argmax(logits))]
    for _ in range(count - 1):
        logits, state = engine.step(state, toks[-1])
        toks.append(int(torch.argmax(logits)))
    return toks


# ---- the decode process ----

def decode_main(conn, spec, device, addresses, connections, data_plane, capacity):
    """Entry point of the decode process: builds the model and remote
    clients, answers "ready", then serves handoff requests until None."""
    clients = {}
    try:
        import kvharbor
        with torch.inference_mode():
            t0 = time.perf_counter()
            engine = pd_engines.make_engine(spec, device)
            for variant, addr in addresses.items():
                clients[variant] = kvharbor.Client(
                    addr, host_fetch="off", device_ipc=False, data_plane=data_plane,
                    data_plane_connections=connections)
            dst_k, dst_v = engine.dense(capacity)
            layout = kvharbor.PagedKvLayout.from_dense(dst_k, dst_v, PAGE)
            conn.send({"ready": True, "build_s": time.perf_counter() - t0,
                       "engine": engine.describe()})
            while True:
                req = conn.recv()
                if req is None:
                    break
                try:
                    conn.send(serve(engine, clients[req["variant"]], layout, dst_k, dst_v,
                                    req, device, kvharbor))
                except Exception as e:  # reported by the prefill process
                    conn.send({"error": f"{type(e).__name__}: {e}"})
    except Exception as e:
        conn.send({"error": f"decode process: {type(e).__name__}: {e}", "fatal": True})
    finally:
        for c in clients.values():
            c.close()


def serve(engine, client, layout, dst_k, dst_v, req, device, kvharbor):
    """One handoff on the decode side: Match, fetch_to_layout, first token,
    then the rest of the greedy decode."""
    n, ids = req["tokens"], req["ids"]
    fmt = getattr(kvharbor.FetchFormat, req["format"])
    t_recv = clock(device)
    lease = client.match(req["namespace"], ids[:n], lock=True)
    try:
        if lease.matched_tokens != n:
            raise RuntimeError(f"matched {lease.matched_tokens} of {n} tokens")
        res = lease.fetch_to_layout(layout, list(range(n // PAGE)), format=fmt)
        t_loaded = clock(device)
        state = engine.start(dst_k, dst_v, n)
        logits, state = engine.step(state, ids[n])
        first = int(torch.argmax(logits))
        t_first = clock(device)
        tiers = sorted({getattr(t, "name", str(t)).lower() for t in lease.page_tiers})
    finally:
        lease.release()
    toks = [first] + greedy(engine, state, logits, req["decode_tokens"])[1:]
    t_done = clock(device)
    kv_digest = digest(dst_k + dst_v, n)
    for t in dst_k + dst_v:  # the next handoff starts from zeros (untimed)
        t.zero_()
    return {"t_recv": t_recv, "t_loaded": t_loaded, "t_first": t_first, "t_done": t_done,
            "tokens": toks, "digest": kv_digest, "tiers": tiers, "path": res.path,
            "bytes_moved": res.bytes_moved, "h2d_bytes": res.h2d_bytes,
            "stages": dict(res.stages), "fallbacks": list(res.fallbacks),
            "fetch_s": res.seconds, "shm_pages": client.host_fetch_stats().shm_pages}


# ---- the prefill process ----

class DecodeDied(RuntimeError):
    """The decode process is gone: no further handoff can run. .row: the
    row it ended."""

    def __init__(self, message, row):
        super().__init__(message)
        self.row = row


class Prefill:
    """The prefill side: daemons, calibration, namespaces, the prefill
    client and the decode process. close() stops them."""

    def __init__(self, args, engine, spec, work):
        import kvharbor
        self.kvh, self.args, self.engine, self.work = kvharbor, args, engine, work
        self.daemons, self.clients, self.proc, self.conn = {}, {}, None, None
        self.failures, self.t_start = [], time.monotonic()
        daemon_bin = local_daemon.find_tool(args.kvharbord, "KVHARBORD", "kvharbord",
                                            "build/server/kvharbord")
        sh = engine.shape
        self.page_bytes = PAGE * sh.bytes_per_token
        self.capacity = -(-(max(args.lengths) + 1 + args.decode_tokens) // PAGE) * PAGE
        self.dst_k, self.dst_v = engine.dense(self.capacity)
        try:
            self.calibration = None
            if "kvtc" in args.variants:
                self.calibration = self.calibrate()
            self.start_daemons(daemon_bin)
            self.start_decode(spec)
        except BaseException:
            self.close()
            raise

    def elapsed(self):
        return time.monotonic() - self.t_start

    def calibrate(self):
        a, eng = self.args, self.engine
        cal_bin = local_daemon.find_tool(a.calibrate, "KVHARBOR_CALIBRATE",
                                         "kvharbor-calibrate", "build/tools/kvharbor-calibrate")
        t0 = time.perf_counter()
        ids = bench_model.random_ids(a.calib_tokens, eng.shape.vocab, a.seed + 1, a.device)
        _, _, keys, values = eng.prefill(ids)
        k = torch.stack([x[0].transpose(0, 1) for x in keys], dim=1)  # [T][L][H][D]
        v = torch.stack([x[0].transpose(0, 1) for x in values], dim=1)
        raw = "bf16" if eng.shape.dtype == torch.bfloat16 else "fp32"
        path = bench_model.kvtc_calibration(
            cal_bin, self.work, k, v, eng.shape.rope_theta, ratio=a.kvtc_ratio, raw_dtype=raw,
            device="gpu" if a.device == "cuda" else "cpu", components=a.kvtc_components,
            model=a.model_name, source="bench/pd_handoff_bench.py")
        print(f"KVTC calibration: {a.calib_tokens} tokens of this model's KV, ratio "
              f"{a.kvtc_ratio} vs {raw}, {time.perf_counter() - t0:.1f} s -> {path}", flush=True)
        return path

    def start_daemons(self, daemon_bin):
        """raw: host pools with the shared-memory socket (--raw-pool device:
        a device pool on a GPU); kvtc: a device pool on a GPU (Demote
        encodes there), host pools on CPU. Both serve the bulk data plane on
        loopback."""
        kvh, a, sh = self.kvh, self.args, self.engine.shape
        ns_bytes = max(a.lengths) // PAGE * self.page_bytes + (64 << 20)
        geom = kvh.Geometry(sh.layers, sh.kv_heads, sh.head_dim, PAGE,
                            dtype=kvh.DType.BF16 if sh.dtype == torch.bfloat16
                            else kvh.DType.FP32, rope_theta=sh.rope_theta)
        for variant in a.variants:
            store = {"pool_budget_bytes": ns_bytes + (256 << 20),
                     "host_ipc_socket": os.path.join(self.work, f"{variant}.sock")}
            if a.device == "cuda" and (variant == "kvtc" or a.raw_pool == "device"):
                store = {"device_pool_bytes": ns_bytes + (256 << 20), "device": 0,
                         "allow_ipc": True}
            d = local_daemon.Kvharbord(daemon_bin, workdir=self.work, name=f"pd_{variant}",
                                       config={"store": store,
                                               "data_plane": {"listen": "127.0.0.1:0"}})
            self.daemons[variant] = d
            opts = ({"host_fetch": "off", "device_ipc": False, "data_plane": a.data_plane,
                     "data_plane_connections": a.connections} if a.prefill_remote else {})
            c = self.clients[variant] = kvh.Client(d.address, **opts)
            if variant == "raw":
                c.create_namespace(NS[variant], geom, capacity_bytes=ns_bytes)
            else:
                c.create_namespace(NS[variant], geom, capacity_bytes=ns_bytes, codec="kvtc",
                                   calibration_path=self.calibration,
                                   host_compressed_bytes=ns_bytes)
            print(f"daemon {variant}: {d.address} ({', '.join(store)}), namespace "
                  f"{NS[variant]}", flush=True)

    def start_decode(self, spec):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=decode_main, name="pd_decode",
            args=(child, spec, self.args.device,
                  {v: d.address for v, d in self.daemons.items()},
                  self.args.connections, self.args.data_plane, self.capacity))
        self.proc.start()
        child.close()
        msg = self.recv(self.args.decode_start_timeout)
        if not msg.get("ready"):
            raise RuntimeError(msg.get("error", f"decode process: {msg}"))
        print(f"decode process {self.proc.pid}: {msg['engine']}, built in "
              f"{msg['build_s']:.1f} s; remote clients (host_fetch off, device_ipc off, "
              f"data_plane {self.args.data_plane}, {self.args.connections} connections)",
              flush=True)

    def recv(self, timeout):
        if not self.conn.poll(timeout):
            raise RuntimeError(f"decode process: no answer in {timeout} s "
                               f"(exit code {self.proc.exitcode})")
        try:
            return self.conn.recv()
        except EOFError:
            self.proc.join(5)
            raise RuntimeError("decode process: ended without an answer (exit code "
                               f"{self.proc.exitcode})") from None

    def close(self):
        if self.conn is not None:
            try:
                self.conn.send(None)
            except OSError:
                pass
        if self.proc is not None:
            self.proc.join(30)
            if self.proc.is_alive():
                self.proc.terminate()
                self.proc.join(10)
        for c in self.clients.values():
            c.close()
        for d in self.daemons.values():
            d.stop()

    def reps(self, n):
        return self.args.long_repeats if n >= 16384 else self.args.repeats

    def run(self, variant, n):
        """Warm-up + timed handoffs of N tokens; the row."""
        row = {"variant": variant, "tokens": n, "kv_bytes": n * self.page_bytes // PAGE,
               "runs": []}
        for r in range(1 + self.reps(n)):
            if r > 1 and self.elapsed() > self.args.budget_s:
                print(f"[{variant} {n}] time budget ({self.args.budget_s} s) spent after "
                      f"{r - 1} timed repeat(s)", flush=True)
                break
            try:
                run = self.handoff(variant, n, seed=self.args.seed + 7919 * n + r)
            except Exception as e:  # reported in the row; the other rows still run
                run = {"error": f"{type(e).__name__}: {e}"}
                self.failures.append(f"{variant} {n}: {run['error']}")
                self.clients[variant].evict_all(NS[variant])
                if self.proc.exitcode is not None:
                    row["runs"].append(run)
                    pd_report.summarize(row)
                    raise DecodeDied(f"decode process ended (exit code {self.proc.exitcode})",
                                     row) from e
            run["warmup"] = r == 0
            row["runs"].append(run)
            pd_report.print_run(variant, n, run)
        pd_report.summarize(row)
        return row

    def handoff(self, variant, n, seed):
        a, eng, kvh, dev = self.args, self.engine, self.kvh, self.args.device
        client, ns = self.clients[variant], NS[variant]
        ids_t = bench_model.random_ids(n + 1, eng.shape.vocab, seed, dev)
        ids = ids_t.tolist()
        t0 = clock(dev)
        logits, state, keys, values = eng.prefill(ids_t, spare=a.decode_tokens)
        t_prefill = clock(dev)
        ks, vs = [k[:, :, :n] for k in keys], [v[:, :, :n] for v in values]
        ins = client.insert_from_layout(ns, ids[:n], kvh.PagedKvLayout.from_dense(ks, vs, PAGE),
                                        list(range(n // PAGE)))
        t_insert = clock(dev)
        demoted = None
        if variant == "kvtc":
            demoted = client.demote(ns, kvh.Tier.HOST_COMPRESSED)
        t_stored = clock(dev)
        self.conn.send({"variant": variant, "namespace": ns, "tokens": n, "ids": ids,
                        "format": FORMATS[variant], "decode_tokens": a.decode_tokens})
        rep = self.recv(a.handoff_timeout)
        run = {"prefill_s": t_prefill - t0, "insert_s": t_insert - t_prefill,
               "insert_path": ins.path, "insert_bytes": ins.transfer.bytes_moved,
               "insert_fallbacks": list(ins.transfer.fallbacks),
               "pages_stored": ins.pages_stored}
        if variant == "kvtc":
            st = client.stats(ns).namespace(ns).tier(kvh.Tier.HOST_COMPRESSED)
            run.update(demote_s=t_stored - t_insert, demoted_pages=demoted,
                       compressed_bytes=st.bytes)
        if "error" in rep:
            run["error"] = rep["error"]
            self.failures.append(f"{variant} {n}: decode: {rep['error']}")
            client.evict_all(ns)
            if rep.get("fatal"):
                raise RuntimeError(rep["error"])
            return run
        run.update(
            handoff_s=rep["t_first"] - t_prefill, notify_s=rep["t_recv"] - t_stored,
            load_s=rep["t_loaded"] - rep["t_recv"], first_forward_s=rep["t_first"] - rep["t_loaded"],
            decode_s=rep["t_done"] - rep["t_first"], fetch_path=rep["path"],
            fetch_bytes=rep["bytes_moved"], fetch_h2d_bytes=rep["h2d_bytes"],
            fetch_stages=rep["stages"], fetch_fallbacks=rep["fallbacks"], tiers=rep["tiers"],
            decode_tokens=rep["tokens"], decode_shm_pages=rep["shm_pages"])
        run["prefill_over_handoff"] = run["prefill_s"] / run["handoff_s"]
        # Untimed: the references the decode process must reproduce.
        no_cache = greedy(eng, state, logits, a.decode_tokens)
        del state, logits
        for d, s in zip(self.dst_k + self.dst_v, ks + vs):
            d[:, :, :n].copy_(s)
        st2 = eng.start(self.dst_k, self.dst_v, n)
        lg, st2 = eng.step(st2, ids[n])
        same_bytes = greedy(eng, st2, lg, a.decode_tokens)
        del st2, lg
        run.update(no_cache_tokens=no_cache, stored_bytes_tokens=same_bytes,
                   first_token_ok=rep["tokens"][0] == no_cache[0],
                   tokens_equal_no_cache=sum(x == y for x, y in zip(rep["tokens"], no_cache)),
                   tokens_equal_stored=sum(x == y for x, y in zip(rep["tokens"], same_bytes)),
                   kv_exact=rep["digest"] == digest(ks + vs, n))
        self.check(variant, n, run, rep["tokens"], same_bytes)
        client.evict_all(ns)
        return run

    def check(self, variant, n, run, toks, same_bytes):
        bad = []
        # The decode process is "on another host": no same-host path may serve it.
        if run["decode_shm_pages"] or SAME_HOST_PATHS & set(run["fetch_path"].split("+")):
            bad.append(f"served by {run['fetch_path']}, {run['decode_shm_pages']} pages "
                       "through shared memory: not a remote path")
        if variant == "raw":
            if not run["kv_exact"]:
                bad.append("K/V are not the stored bytes")
            # Exact K/V give the same first token as the same loop on the
            # stored K/V; later tokens are compared only where the K/V are
            # fp32 (strict): in bf16 with random weights, two processes'
            # kernels round differently and greedy decoding diverges after
            # a few near-tie steps (seen at 11-15 of 16 on the H200).
            if self.args.strict_first_token and toks != same_bytes:
                bad.append(f"tokens {toks} != {same_bytes} of the same loop on the stored K/V")
            elif toks[:1] != same_bytes[:1]:
                bad.append(f"first token {toks[:1]} != {same_bytes[:1]} of the same loop "
                           "on the stored K/V")
            if self.args.strict_first_token and not run["first_token_ok"]:
                bad.append(f"first token {toks[0]} != {run['no_cache_tokens'][0]} of the "
                           "decode without the cache")
        for b in bad:
            self.failures.append(f"{variant} {n}: {b}")


def model_spec(args, work):
    """The engine spec both processes build their model from."""
    if args.model == "stories260k":
        hf_dir = pd_engines.stories_hf_dir(bench_paths.REPO, work, args.model_dir)
        return {"kind": "torch_llama", "hf_dir": hf_dir}
    config, name = dict(LLAMA31_8B), "Llama-3.1-8B config, RANDOM bf16 weights"
    if args.model_config:
        config = pd_engines.load_config(args.model_config)
        name = f"{args.model_config}, RANDOM bf16 weights"
    return {"kind": "hf", "config": config, "name": name}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true",
                    help="the CI mode: --device cpu --model stories260k, N 32 and 96, 8 tokens")
    ap.add_argument("--device", default="", help="cuda | cpu (default cuda; cpu with --cpu)")
    ap.add_argument("--model", default="", help="llama31-8b (random weights) | stories260k")
    ap.add_argument("--model-config", default="", help="another config.json (random weights)")
    ap.add_argument("--model-dir", default="", help="stories260K folder")
    ap.add_argument("--lengths", default="", help="prefix lengths N, multiples of 16")
    ap.add_argument("--variants", default="raw,kvtc")
    ap.add_argument("--decode-tokens", type=int, default=0, help="default 16 (8 with --cpu)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats below 16K")
    ap.add_argument("--long-repeats", type=int, default=2, help="timed repeats at >= 16K")
    ap.add_argument("--connections", type=int, default=4,
                    help="the decode client's data_plane_connections")
    ap.add_argument("--data-plane", default="auto", choices=("auto", "on", "off"),
                    help="the decode client's data_plane (off: everything over gRPC)")
    ap.add_argument("--prefill-remote", action="store_true",
                    help="the prefill client is told the daemon is on another host too")
    ap.add_argument("--raw-pool", default="host", choices=("host", "device"),
                    help="the raw daemon's pools (device: store.device_pool_bytes, GPU only)")
    ap.add_argument("--kvtc-ratio", default="")
    ap.add_argument("--kvtc-components", type=int, default=-1)
    ap.add_argument("--calib-tokens", type=int, default=0)
    ap.add_argument("--strict-first-token", default="auto", choices=("auto", "on", "off"),
                    help="fail when the raw decode's first token differs from the no-cache "
                    "decode's (auto: with fp32 K/V)")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="no further timed repeats after this many seconds")
    ap.add_argument("--decode-start-timeout", type=float, default=300.0)
    ap.add_argument("--handoff-timeout", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kvharbord", default="")
    ap.add_argument("--calibrate", default="")
    ap.add_argument("--work", default="")
    ap.add_argument("--json", default="", help="default: $OUT/pd_handoff_bench.json")
    a = ap.parse_args(argv)
    cpu = a.cpu
    a.device = a.device or ("cpu" if cpu else "cuda")
    a.model = a.model or ("stories260k" if cpu else "llama31-8b")
    if a.model not in ("llama31-8b", "stories260k"):
        ap.error(f"--model: {a.model!r} is not llama31-8b or stories260k")
    a.lengths = [int(x) for x in (a.lengths or ("32,96" if cpu else "4096,16384,32768"))
                 .split(",") if x]
    bad = [n for n in a.lengths if n <= 0 or n % PAGE]
    if bad:
        ap.error(f"--lengths: {bad} are not positive multiples of {PAGE}")
    a.variants = [v for v in a.variants.split(",") if v]
    if not a.variants or any(v not in NS for v in a.variants):
        ap.error(f"--variants: {a.variants} must be raw and/or kvtc")
    a.decode_tokens = a.decode_tokens or (8 if cpu else 16)
    if a.decode_tokens < 1:
        ap.error("--decode-tokens: must be >= 1")
    a.kvtc_ratio = a.kvtc_ratio or ("8" if a.model == "stories260k" else "16")
    if a.kvtc_components < 0:
        a.kvtc_components = None if a.model == "stories260k" else 1024
    a.calib_tokens = a.calib_tokens or (480 if a.model == "stories260k" else 4096)
    if not a.json and os.environ.get("OUT"):
        a.json = os.path.join(os.environ["OUT"], "pd_handoff_bench.json")
    return a


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("pd_handoff_bench: needs a CUDA GPU (torch.cuda.is_available() is False); "
              "--cpu runs the CI mode")
        return 2
    local_daemon.use_library()
    work = args.work or tempfile.mkdtemp(prefix="kvh-pd-")
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(args.seed)
    rows, bench = [], None
    with torch.inference_mode():
        spec = model_spec(args, work)
        t, engine = bench_model.timed(lambda: pd_engines.make_engine(spec, args.device),
                                      args.device)
        args.model_name = engine.describe()
        strict = args.strict_first_token
        args.strict_first_token = (strict == "on" or strict == "auto"
                                   and engine.shape.dtype == torch.float32)
        print(f"pd_handoff_bench: {args.device}"
              + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "")
              + f", torch {torch.__version__}; model: {args.model_name}; built in {t:.1f} s",
              flush=True)
        bench = Prefill(args, engine, spec, work)
        try:
            for n in args.lengths:
                for variant in args.variants:
                    rows.append(bench.run(variant, n))
                    bench_model.write_json(args, pd_report.build(rows, args, bench.failures))
        except DecodeDied as e:
            rows.append(e.row)
            bench.failures.append(str(e))
        finally:
            bench.close()
    report = pd_report.build(rows, args, bench.failures)
    pd_report.print_report(report)
    if bench_model.write_json(args, report):
        print(f"wrote {args.json}")
    for f in bench.failures:
        print(f"FAILED: {f}")
    print(f"pd_handoff_bench: {len(bench.failures)} failure(s), {bench.elapsed():.0f} s "
          f"(outputs in {work})")
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
