"""Tables and targets of bench/ttft_bench.py: the report dict (written as
JSON) and its markdown print-out. Pure functions over the measured rows."""

TARGET_TOKENS = 32768
LINK_NAMES = {"h2d": "pinned H2D", "d2h": "pinned D2H", "d2d": "device-to-device",
              "tcp1": "loopback TCP, 1 connection", "tcp4": "loopback TCP, 4 connections",
              "tcp8": "loopback TCP, 8 connections"}
# A path over TCP (the bulk data plane) against its link: issue 31's bar.
TCP_TARGET = 0.6
# Copy stages of TransferResult.stages -> (link, what they copy): h2d moves
# the bytes the path moved (bytes_moved: raw pages; h2d_bytes when set: a
# compressed path's merged batches), scatter and gather the raw K/V of the
# prefix within the GPU. The target: each >= 0.7 of its link.
COPY_STAGES = {"h2d": ("h2d", "bytes_moved"), "scatter": ("d2d", "kv_bytes"),
               "gather": ("d2d", "kv_bytes")}
STAGE_TARGET = 0.7


def stage_links(row, links):
    """{path: {stage: {gbps, link, fraction}}} for the copy stages of `row`."""
    out = {}
    for name, rec in row.get("paths", {}).items():
        stages = rec.get("stages") or {}
        for stage, (link, what) in COPY_STAGES.items():
            seconds = stages.get(stage)
            nbytes = (rec.get("h2d_bytes") or rec.get("bytes_moved") or row.get("kv_bytes")
                      if what == "bytes_moved" else row.get("kv_bytes"))
            if not seconds or not nbytes or link not in links:
                continue
            gbps = nbytes / seconds / 1e9
            out.setdefault(name, {})[stage] = {
                "gbps": gbps, "link": link, "fraction": gbps / links[link]}
    return out


def build(rows, links, paths, args):
    targets = []
    at = next((r for r in rows if r["tokens"] == TARGET_TOKENS), None)
    for name, _, _, _, _, _, target in paths:
        if target is None:
            continue
        rec = (at or {}).get("paths", {}).get(name, {})
        ratio = rec.get("prefill_over_load")
        status = ("not measured" if ratio is None
                  else "MET" if ratio >= target else "NOT MET")
        targets.append({"path": name, "target_prefill_over_load": target,
                        "measured": ratio, "status": status})
        link, fraction = rec.get("link", ""), rec.get("link_fraction")
        if link.startswith("tcp"):
            targets.append({"path": name, "target_link_fraction": TCP_TARGET, "link": link,
                            "measured": fraction,
                            "status": ("not measured" if fraction is None else
                                       "MET" if fraction >= TCP_TARGET else "NOT MET")})
    return {"benchmark": "bench/ttft_bench.py",
            "model": f"LlamaForCausalLM, {args.model_name}, SDPA",
            "hf_only": args.hf_only, "page_size": 16,
            "repeats": {"below_16k": args.repeats, "from_16k": args.long_repeats},
            "kvtc": {"ratio": args.kvtc_ratio, "components": args.kvtc_components,
                     "calibration_tokens": args.calib_tokens},
            "links_gbps": links, "rows": rows, "targets": targets,
            "stage_links": stage_links(rows[-1], links) if rows else {}}


def _ms(s):
    return "-" if s is None else f"{s * 1e3:.2f}"


def _x(v):
    return "-" if v is None else f"{v:.1f}x"


def print_report(rep):
    print("\n## Links (torch copies of 1 GiB, cudaMemcpy underneath, median of 5)\n")
    print("| link | GB/s |\n|---|---:|")
    for k, v in rep["links_gbps"].items():
        print(f"| {LINK_NAMES.get(k, k)} | {v:.1f} |")
    print("\n## Time to first token (prompt = N cached tokens + 1; medians, warm-up "
          "excluded)\n")
    print("| N | path | served by | load ms | TTFT ms | prefill/load | prefill/TTFT | "
          "GB/s | of link | first token | K/V |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    for row in rep["rows"]:
        n = row["tokens"]
        print(f"| {n} | prefill (recompute) | HF forward of {n + 1} tokens | - | "
              f"{_ms(row['prefill_s'])} | - | 1.0x | - | - | {row['prefill_token']} | - |")
        for name, rec in row["paths"].items():
            if "error" in rec or "skipped" in rec:
                print(f"| {n} | {name} | {rec.get('error') or 'skipped: ' + rec['skipped']} "
                      "| | | | | | | | |")
                continue
            kv = "exact" if rec["kv_exact"] is True else rec["kv_exact"]
            print(f"| {n} | {name} | {rec['served_by']} | {_ms(rec['load_s'])} | "
                  f"{_ms(rec['ttft_s'])} | {_x(rec['prefill_over_load'])} | "
                  f"{_x(rec['prefill_over_ttft'])} | {rec['link_gbps']:.1f} | "
                  + ("-" if rec["link_fraction"] is None
                     else f"{rec['link_fraction']:.2f}") + f" of {rec['link']} | "
                  f"{'= reference' if rec['first_token_ok'] else 'DIFFERS'} | {kv} |")
    _print_stages(rep)
    if rep["targets"]:
        print(f"\n## Targets at {TARGET_TOKENS} tokens (prefill / load)\n")
        print("| path | target | measured | status |\n|---|---:|---:|---|")
        for t in rep["targets"]:
            if "target_link_fraction" in t:
                measured = "-" if t["measured"] is None else f"{t['measured']:.2f}"
                print(f"| {t['path']} | >= {t['target_link_fraction']} of {t['link']} | "
                      f"{measured} | {t['status']} |")
                continue
            print(f"| {t['path']} | >= {t['target_prefill_over_load']}x | "
                  f"{_x(t['measured'])} | {t['status']} |")


def _print_stages(rep):
    """Stage times the client reported (TransferResult.stages), largest N."""
    if not rep["rows"]:
        return
    row = rep["rows"][-1]
    lines = []
    for name, rec in row["paths"].items():
        stages = rec.get("stages") or {}
        if stages:
            parts = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in stages.items())
            lines.append(f"- {name}: {parts} (bytes moved {rec.get('bytes_moved', 0)})")
    if lines:
        print(f"\n## Stages at {row['tokens']} tokens (medians)\n")
        print("\n".join(lines))
    fractions = rep.get("stage_links") or {}
    if fractions:
        print(f"\n## Copy stages vs their links at {row['tokens']} tokens "
              f"(target >= {STAGE_TARGET} of the link)\n")
        for name, stages in fractions.items():
            parts = ", ".join(
                f"{stage} {v['gbps']:.1f} GB/s = {v['fraction']:.2f} of "
                f"{LINK_NAMES[v['link']]}"
                f" ({'MET' if v['fraction'] >= STAGE_TARGET else 'NOT MET'})"
                for stage, v in stages.items())
            print(f"- {name}: {parts}")
