"""The kvharbor side of bench/ttft_bench.py: two local kvharbord processes
(one with a device pool and CUDA IPC allowed, one with host pools and the
shared-memory socket), a KVTC calibration from the model's own KV, the
namespaces, storing a prefix from the model's cache and timing each hit
path into the tensors the model reads. docs/ttft.md describes the paths.

Owns the daemons and clients (close() stops them); used from one thread.
"""

import os
import statistics
import time

import torch

import bench_model
import hf_kv
import local_daemon

PAGE = 16


def _now():
    torch.cuda.synchronize()
    return time.perf_counter()


class Hits:
    def __init__(self, bench, args, work, paths, ns):
        """bench: the ttft_bench.Bench (model, destination tensors, checks);
        paths: ttft_bench.PATHS; ns: (device ns, host ns, KVTC ns)."""
        import kvharbor
        self.kvh, self.b, self.args, self.paths = kvharbor, bench, args, paths
        self.ns_dev, self.ns_host, self.ns_kvtc = ns
        daemon_bin = local_daemon.find_tool(args.kvharbord, "KVHARBORD", "kvharbord",
                                            "build/server/kvharbord")
        cal_bin = local_daemon.find_tool(args.calibrate, "KVHARBOR_CALIBRATE",
                                         "kvharbor-calibrate", "build/tools/kvharbor-calibrate")
        self.calibration = self.calibrate(cal_bin, work)
        self.daemons, self.local, self.remote = {}, {}, {}
        try:
            self.start(daemon_bin, work)
        except BaseException:
            self.close()
            raise
        print(f"daemons: device pool {self.daemons['dev'].address}, host pools "
              f"{self.daemons['host'].address}; client library "
              f"{os.environ.get('KVHARBOR_LIB', '?')}", flush=True)

    def start(self, daemon_bin, work):
        """The two daemons, their clients and the namespaces."""
        import kvharbor
        args, sh = self.args, self.b.shape
        self.page_bytes = PAGE * sh.bytes_per_token
        ns_bytes = max(args.lengths) // PAGE * self.page_bytes + (64 << 20)
        self.daemons["dev"] = local_daemon.Kvharbord(
            daemon_bin, workdir=work, name="ttft_device", config={"store": {
                "device_pool_bytes": 2 * ns_bytes + (256 << 20), "device": 0,
                "allow_ipc": True}, "data_plane": {"listen": "127.0.0.1:0"}})
        self.daemons["host"] = local_daemon.Kvharbord(
            daemon_bin, workdir=work, name="ttft_host", config={"store": {
                "pool_budget_bytes": ns_bytes + (256 << 20),
                "host_ipc_socket": os.path.join(work, "kvh.sock")},
                "data_plane": {"listen": "127.0.0.1:0"}})
        # Remote clients by bulk data plane connections (the PATHS column).
        for k, d in self.daemons.items():
            self.local[k] = kvharbor.Client(d.address)
            for n in sorted({p[3] for p in self.paths if p[3]}):
                self.remote[(k, n)] = kvharbor.Client(
                    d.address, host_fetch="off", device_ipc=False,
                    data_plane_connections=n)
        geom = kvharbor.Geometry(sh.layers, sh.kv_heads, sh.head_dim, PAGE,
                                 dtype=kvharbor.DType.BF16, rope_theta=sh.rope_theta)
        self.local["dev"].create_namespace(self.ns_dev, geom, capacity_bytes=ns_bytes)
        self.local["host"].create_namespace(self.ns_host, geom, capacity_bytes=ns_bytes)
        self.local["dev"].create_namespace(
            self.ns_kvtc, geom, capacity_bytes=ns_bytes, codec="kvtc",
            calibration_path=self.calibration, host_compressed_bytes=ns_bytes,
            disk_dir=os.path.join(work, "disk"))
        self.layout = kvharbor.PagedKvLayout.from_dense(self.b.dst_k, self.b.dst_v, PAGE)

    def close(self):
        for c in list(self.local.values()) + list(self.remote.values()):
            c.close()
        for d in self.daemons.values():
            d.stop()

    def calibrate(self, binary, work):
        """KV samples from a prefill of --calib-tokens random tokens, then
        kvharbor-calibrate on the GPU; the calibration file's path."""
        a, model = self.args, self.b.model
        ids = self.b.random_ids(a.calib_tokens, a.seed + 1)
        t0 = time.perf_counter()
        _, cache = hf_kv.forward(model, ids, None, last_only=True)
        kv = hf_kv.layer_kv(cache)
        k = torch.stack([x[0].transpose(0, 1) for x, _ in kv], dim=1)  # [T][L][H][D]
        v = torch.stack([x[0].transpose(0, 1) for _, x in kv], dim=1)
        del cache, kv
        path = bench_model.kvtc_calibration(
            binary, work, k, v, self.b.shape.rope_theta, ratio=a.kvtc_ratio, raw_dtype="bf16",
            device="gpu", components=a.kvtc_components, model=a.model_name,
            source="bench/ttft_bench.py")
        del k, v
        print(f"KVTC calibration: {a.calib_tokens} tokens of this model's KV, ratio "
              f"{a.kvtc_ratio} vs bf16, {a.kvtc_components} components, "
              f"{time.perf_counter() - t0:.1f} s -> {path}", flush=True)
        return path

    def store(self, row, ids, keys, values):
        """Inserts the prefix into the three namespaces (timed) and demotes
        the KVTC one to host_compressed."""
        n = row["tokens"]
        tokens, blocks = ids[:n].tolist(), list(range(n // PAGE))
        src = self.kvh.PagedKvLayout.from_dense(keys, values, PAGE)
        row["stores"] = {}
        for daemon, ns in (("dev", self.ns_dev), ("host", self.ns_host), ("dev", self.ns_kvtc)):
            t0 = _now()
            r = self.local[daemon].insert_from_layout(ns, tokens, src, blocks)
            t = _now() - t0
            fallbacks = getattr(getattr(r, "transfer", None), "fallbacks", [])
            row["stores"][ns] = {"seconds": t, "path": getattr(r, "path", "?"),
                                 "pages_stored": r.pages_stored,
                                 "fallbacks": fallbacks}
            # device_ipc into the device-pool daemon (DeviceInsert by CUDA
            # IPC), pinned into the host-pool one (its fallback says why).
            print(f"[{n}] stored {r.pages_stored} pages in {ns} in {t * 1e3:.1f} ms "
                  f"({n * self.page_bytes / PAGE / t / 1e9:.1f} GB/s) by {getattr(r, 'path', '?')}"
                  + (f" (not device_ipc: {fallbacks[0]})" if fallbacks else ""),
                  flush=True)
        self.demote(row, self.kvh.Tier.HOST_COMPRESSED)

    def demote(self, row, tier):
        t0 = time.perf_counter()
        moved = self.local["dev"].demote(self.ns_kvtc, tier)
        t = time.perf_counter() - t0
        st = self.local["dev"].stats(self.ns_kvtc).namespace(self.ns_kvtc).tier(tier)
        raw = row["tokens"] * self.page_bytes // PAGE
        row.setdefault("demotes", {})[tier.name.lower()] = {
            "seconds": t, "pages": moved, "stored_bytes": st.bytes,
            "ratio_vs_bf16": raw / st.bytes if st.bytes else 0.0}
        print(f"[{row['tokens']}] demoted {moved} pages to {tier.name.lower()} in "
              f"{t * 1e3:.0f} ms: {st.pages} pages, {st.bytes} bytes there "
              f"({raw / max(st.bytes, 1):.1f}x smaller than bf16)", flush=True)

    def run_length(self, row, ids, keys, values):
        self.store(row, ids, keys, values)
        for path in self.paths:
            if path[0] == "disk":
                self.demote(row, self.kvh.Tier.DISK)
            try:
                self.measure(row, path, ids, keys, values)
            except Exception as e:  # a path that fails is reported, the others still run
                row["paths"][path[0]] = {"error": f"{type(e).__name__}: {e}"}
                self.b.failures.append(f"{row['tokens']}: {path[0]}: {type(e).__name__}: {e}")
                print(f"[{row['tokens']}] {path[0]}: ERROR {type(e).__name__}: {e}", flush=True)
        for daemon, ns in (("dev", self.ns_dev), ("host", self.ns_host), ("dev", self.ns_kvtc)):
            self.local[daemon].evict_all(ns)

    def fetch_once(self, client, ns, tokens, blocks, fmt, n, ids):
        """(load s, TransferResult, first token, forward s, matched, tiers)."""
        t0 = _now()
        lease = client.match(ns, tokens, lock=True)
        try:
            res = lease.fetch_to_layout(self.layout, blocks, format=fmt)
            t_load = _now() - t0
            tok, t_fwd, _ = self.b.first_token(n, ids)
        finally:
            lease.release()
        tiers = sorted({getattr(t, "name", str(t)).lower() for t in lease.page_tiers})
        return t_load, res, tok, t_fwd, lease.matched_tokens, tiers

    def measure(self, row, path, ids, keys, values):
        name, daemon, ns, remote, fmt, link, _ = path
        client = self.remote[(daemon, remote)] if remote else self.local[daemon]
        fmt = None if fmt is None else getattr(self.kvh.FetchFormat, fmt)
        n = row["tokens"]
        tokens, blocks = ids[:n].tolist(), list(range(n // PAGE))
        loads, ttfts, stages, token_ok, cold = [], [], [], True, None
        for r in range(1 + self.b.reps(n)):
            if r and self.b.elapsed() > self.args.budget_s:
                print(f"[{n}] {name}: time budget ({self.args.budget_s} s) spent after "
                      f"{r - 1} timed repeat(s)", flush=True)
                break
            self.b.clear_dst(n)
            t_load, res, tok, t_fwd, matched, tiers = self.fetch_once(
                client, ns, tokens, blocks, fmt, n, ids)
            if matched != n:
                raise RuntimeError(f"matched {matched} of {n} tokens")
            token_ok = token_ok and tok == row["reference_token"]
            if r == 0:
                cold = t_load
                exact = (self.b.dst_equal(n, keys, values) if name in self.b.lossless
                         else "rel. err K %.4f V %.4f" % tuple(self.b.dst_rel_err(n, keys, values)))
            else:
                loads.append(t_load)
                ttfts.append(t_load + t_fwd)
                stages.append(dict(getattr(res, "stages", {}) or {}))
        if not loads:
            row["paths"][name] = {"skipped": "time budget"}
            return
        keys_ = sorted({k for s in stages for k in s})
        med_stages = {k: statistics.median(s.get(k, 0.0) for s in stages) for k in keys_}
        moved = getattr(res, "bytes_moved", 0) or n * self.page_bytes // PAGE
        self.b.path_record(row, name, res.path, loads, ttfts, moved, link, token_ok, exact,
                           stages=med_stages, tiers=tiers, cold_load_s=cold,
                           bytes_moved=getattr(res, "bytes_moved", 0),
                           h2d_bytes=getattr(res, "h2d_bytes", 0))
        if name in self.b.lossless and not (token_ok and exact is True):
            self.b.failures.append(f"{n}: {name}: first token OK {token_ok}, K/V exact {exact}")
