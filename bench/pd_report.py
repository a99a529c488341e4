"""Rows, targets and the printed table of bench/pd_handoff_bench.py. Pure
functions over the measured runs (dicts); no kvharbor, no torch."""

import statistics

TARGET_TOKENS = 32768
# Issue 31, target 8: prefill / handoff at 32K, decode on another host.
TARGETS = {"kvtc": 10.0, "raw": 2.0}
MEDIANS = ("prefill_s", "insert_s", "demote_s", "notify_s", "load_s", "first_forward_s",
           "handoff_s", "decode_s")


def _ms(s):
    return "-" if s is None else f"{s * 1e3:.1f}"


def print_run(variant, n, run):
    tag = "warm-up" if run.get("warmup") else "timed"
    if "error" in run:
        print(f"[{variant} {n}] {tag}: ERROR {run['error']}", flush=True)
        return
    extra = (f", demote {_ms(run['demote_s'])} ms ({run['demoted_pages']} pages, "
             f"{run['compressed_bytes']} bytes compressed)" if "demote_s" in run else "")
    print(f"[{variant} {n}] {tag}: prefill {_ms(run['prefill_s'])} ms, insert "
          f"{_ms(run['insert_s'])} ms by {run['insert_path']} ({run['insert_bytes']} bytes)"
          f"{extra}; decode side: notify "
          f"{_ms(run['notify_s'])}, load {_ms(run['load_s'])} ms by {run['fetch_path']} "
          f"({run['fetch_bytes']} bytes), first forward {_ms(run['first_forward_s'])} ms; "
          f"handoff {_ms(run['handoff_s'])} ms = prefill/{run['prefill_over_handoff']:.2f}; "
          f"first token {'= no-cache decode' if run['first_token_ok'] else 'DIFFERS'}, "
          f"{run['tokens_equal_no_cache']}/{len(run['decode_tokens'])} tokens equal, "
          f"K/V {'exact' if run['kv_exact'] else 'not exact'}", flush=True)


def summarize(row):
    """Medians over the timed runs (warm-up excluded) into the row."""
    timed = [r for r in row["runs"] if not r.get("warmup") and "error" not in r]
    row["timed_runs"] = len(timed)
    if not timed:
        return
    for key in MEDIANS:
        vals = [r[key] for r in timed if key in r]
        if vals:
            row[key] = statistics.median(vals)
    row["prefill_over_handoff"] = row["prefill_s"] / row["handoff_s"]
    last = timed[-1]
    for key in ("insert_path", "insert_bytes", "fetch_path", "fetch_bytes", "fetch_h2d_bytes",
                "tiers", "compressed_bytes", "insert_fallbacks", "fetch_fallbacks"):
        if key in last:
            row[key] = last[key]
    row["first_token_ok"] = all(r["first_token_ok"] for r in timed)
    row["kv_exact"] = all(r["kv_exact"] for r in timed)
    row["decode_tokens_per_s"] = statistics.median(
        (len(r["decode_tokens"]) - 1) / r["decode_s"] for r in timed
        if r["decode_s"] > 0 and len(r["decode_tokens"]) > 1) if any(
        len(r["decode_tokens"]) > 1 for r in timed) else None


def build(rows, args, failures):
    targets = []
    for variant, bar in TARGETS.items():
        if variant not in args.variants:
            continue
        row = next((r for r in rows if r["variant"] == variant
                    and r["tokens"] == TARGET_TOKENS), None)
        ratio = (row or {}).get("prefill_over_handoff")
        targets.append({"variant": variant, "tokens": TARGET_TOKENS,
                        "target_prefill_over_handoff": bar, "measured": ratio,
                        "status": ("not measured" if ratio is None
                                   else "MET" if ratio >= bar else "NOT MET")})
    return {"benchmark": "bench/pd_handoff_bench.py", "device": args.device,
            "model": args.model_name,
            "random_weights": "RANDOM" in args.model_name,
            "page_size": 16, "decode_tokens": args.decode_tokens,
            "decode_client": {"host_fetch": "off", "device_ipc": False,
                              "data_plane": args.data_plane,
                              "data_plane_connections": args.connections},
            "prefill_client": "remote" if args.prefill_remote else "same host",
            "raw_pool": args.raw_pool,
            "strict_first_token": getattr(args, "strict_first_token", None),
            "repeats": {"below_16k": args.repeats, "from_16k": args.long_repeats},
            "kvtc": {"ratio": args.kvtc_ratio, "components": args.kvtc_components,
                     "calibration_tokens": args.calib_tokens},
            "rows": rows, "targets": targets, "failures": list(failures)}


def print_report(rep):
    dc = rep["decode_client"]
    print(f"\n## P/D handoff ({rep['model']}; decode process: host_fetch off, device_ipc off, "
          f"data_plane {dc['data_plane']}, {dc['data_plane_connections']} connections; "
          "medians of the timed runs, warm-up excluded)\n")
    print("| variant | N | prefill ms | insert ms (path, bytes) | demote ms | load ms (path, "
          "bytes) | first fwd ms | handoff ms | prefill/handoff | first token | K/V |")
    print("|---|---:|---:|---|---:|---|---:|---:|---:|---|---|")
    for r in rep["rows"]:
        if "handoff_s" not in r:
            errs = "; ".join(x["error"] for x in r["runs"] if "error" in x)
            print(f"| {r['variant']} | {r['tokens']} | {errs or 'no timed run'} "
                  "| | | | | | | | |")
            continue
        print(f"| {r['variant']} | {r['tokens']} | {_ms(r['prefill_s'])} | "
              f"{_ms(r['insert_s'])} ({r['insert_path']}, {r['insert_bytes']}) | "
              f"{_ms(r.get('demote_s'))} | "
              f"{_ms(r['load_s'])} ({r['fetch_path']}, {r['fetch_bytes']}) | "
              f"{_ms(r['first_forward_s'])} | {_ms(r['handoff_s'])} | "
              f"{r['prefill_over_handoff']:.2f}x | "
              f"{'= no-cache decode' if r['first_token_ok'] else 'DIFFERS'} | "
              f"{'exact' if r['kv_exact'] else 'lossy'} |")
    print(f"\n## Target 8 at {TARGET_TOKENS} tokens (prefill / handoff, end to end)\n")
    print("| variant | target | measured | status |\n|---|---:|---:|---|")
    for t in rep["targets"]:
        m = "-" if t["measured"] is None else f"{t['measured']:.2f}x"
        print(f"| {t['variant']} | >= {t['target_prefill_over_handoff']}x | {m} | "
              f"{t['status']} |")
