#!/usr/bin/env python3
"""Plots a kvharbor-kv-quality CSV (bench/kv_quality.sh) as an SVG.

Compression ratio vs bf16 (log2 x axis) against loss increase in nats/token
(symlog y axis: linear below 1e-3, logarithmic above); one line per KVTC
calibration family ("kvtc per_token.16x" -> "KVTC per_token"), one marker per
other codec. Standard library only (the build machines have no matplotlib).

usage: kv_quality_plot.py TABLE.csv OUT.svg TITLE
"""
import csv
import math
import sys

W, H = 760, 480
LEFT, RIGHT, TOP, BOTTOM = 70, 230, 40, 50
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
          "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#aa3377"]
LINTHRESH = 1e-3


def symlog(y):
    y = max(y, 0.0)
    return y / LINTHRESH if y < LINTHRESH else 1.0 + math.log10(y / LINTHRESH)


def main(argv):
    rows = list(csv.DictReader(open(argv[1])))
    series = {}
    for r in rows:
        codec = r["codec"]
        if codec.startswith("kvtc"):
            name = "KVTC " + codec.split()[1].rsplit(".", 1)[0]
        else:
            name = codec.split(" (")[0]
        series.setdefault(name, []).append(
            (float(r["ratio_vs_bf16"]), float(r["loss_increase"])))
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [symlog(y) for pts in series.values() for _, y in pts]
    x0 = math.floor(math.log2(min(xs)))
    x1 = math.ceil(math.log2(max(xs)))
    y1 = math.ceil(max(ys))
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x):
        return LEFT + (math.log2(x) - x0) / max(x1 - x0, 1) * pw

    def py(y):
        return TOP + ph - symlog(y) / max(y1, 1) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" '
           f'height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="13">{argv[3]}</text>']
    for e in range(x0, x1 + 1):
        x = LEFT + (e - x0) / max(x1 - x0, 1) * pw
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" '
                   f'y2="{TOP + ph}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + ph + 15}" '
                   f'text-anchor="middle">{2 ** e:g}</text>')
    ticks = [0.0] + [LINTHRESH * 10 ** k for k in range(0, y1)]
    for t in ticks:
        y = py(t)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" '
                   f'y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 5}" y="{y + 4:.1f}" '
                   f'text-anchor="end">{t:g}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" '
               f'fill="none" stroke="black"/>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 12}" text-anchor="middle">'
               'compression ratio vs bf16 (every stored byte counted)</text>')
    out.append(f'<text transform="translate(16,{TOP + ph / 2}) rotate(-90)" '
               'text-anchor="middle">loss increase (nats/token)</text>')
    for i, (name, pts) in enumerate(sorted(series.items())):
        color = COLORS[i % len(COLORS)]
        pts.sort()
        if len(pts) > 1:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
            out.append(f'<polyline points="{path}" fill="none" '
                       f'stroke="{color}" stroke-width="1.5"/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" '
                       f'fill="{color}"/>')
        ly = TOP + 10 + 16 * i
        out.append(f'<circle cx="{LEFT + pw + 15}" cy="{ly}" r="4" '
                   f'fill="{color}"/>')
        out.append(f'<text x="{LEFT + pw + 25}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    with open(argv[2], "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv)
