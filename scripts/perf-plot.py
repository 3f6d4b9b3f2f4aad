#!/usr/bin/env python3
"""One SVG plot per collective (and element type) from ringccl-perf JSON files: bus bandwidth
against message size (log2 axis), ringccl out of place and in place against NCCL. Plain SVG,
no plotting library needed.
Usage: scripts/perf-plot.py [--label TEXT] OUT_DIR FILE.json [FILE.json ...]
Writes OUT_DIR/<collective>-<type>.svg (-<n>procs for jobs of processes) and prints each path;
TEXT (e.g. "network path, loopback TCP") is added to every title."""
import json
import math
import os
import sys

W, H = 760, 440
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 40, 60
STYLES = {
    ("ringccl", False): ("#c0392b", ""),
    ("ringccl", True): ("#e67e22", "6,4"),
    ("nccl", False): ("#2c3e50", ""),
    ("nccl", True): ("#7f8c8d", "6,4"),
}


def size_label(b):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b // div} {unit}"
    return f"{b} B"


def plot(title, series, path):
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    x0, x1 = math.log2(min(xs)), math.log2(max(xs))
    if x1 == x0:
        x1 = x0 + 1
    ymax = max(ys) * 1.1 or 1.0
    step = 10 ** math.floor(math.log10(ymax / 4)) if ymax > 0 else 1
    while ymax / step > 8:
        step *= 2
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x):
        return LEFT + (math.log2(x) - x0) / (x1 - x0) * pw

    def py(y):
        return TOP + ph - y / ymax * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="13">{title}</text>']
    y = 0.0
    while y <= ymax:
        out.append(f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{LEFT + pw}" y2="{py(y):.1f}" '
                   f'stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        y += step
    for b in sorted(set(xs)):
        out.append(f'<text x="{px(b):.1f}" y="{TOP + ph + 18}" text-anchor="middle">'
                   f'{size_label(b)}</text>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 16}" text-anchor="middle">message size '
               f'(bytes per rank, as nccl-tests)</text>')
    out.append(f'<text x="18" y="{TOP + ph / 2}" transform="rotate(-90 18 {TOP + ph / 2})" '
               f'text-anchor="middle">busbw (GB/s)</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" '
               f'stroke="#333"/>')
    for i, (key, pts) in enumerate(sorted(series.items())):
        colour, dash = STYLES.get(key, ("#000", ""))
        d = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v in sorted(pts))
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="2"{extra}/>')
        for x, v in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(v):.1f}" r="2.5" fill="{colour}"/>')
        ly = TOP + 14 + 20 * i
        out.append(f'<line x1="{LEFT + pw + 14}" y1="{ly}" x2="{LEFT + pw + 44}" y2="{ly}" '
                   f'stroke="{colour}" stroke-width="2"{extra}/>')
        name = f"{key[0]}{' in place' if key[1] else ''}"
        out.append(f'<text x="{LEFT + pw + 50}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    args = sys.argv[1:]
    label = ""
    if args[:1] == ["--label"] and len(args) > 1:
        label, args = f" ({args[1]})", args[2:]
    if len(args) < 2:
        sys.exit(__doc__)
    out_dir = args[0]
    os.makedirs(out_dir, exist_ok=True)
    plots = {}
    for p in args[1:]:
        doc = json.load(open(p))
        procs = doc["meta"].get("procs", 1)
        for r in doc["records"]:
            bw = r.get("busbw")
            if r.get("op") not in (None, "sum", "none") or not bw or r["bytes"] <= 0:
                continue
            key = (r["collective"], r["dtype"], procs)
            plots.setdefault(key, {}).setdefault((r["lib"], r["inplace"]), []).append(
                (r["bytes"], bw))
    for (coll, dtype, procs), series in sorted(plots.items()):
        how = "one process" if procs == 1 else f"{procs} processes"
        path = os.path.join(out_dir, f"{coll}-{dtype}{'' if procs == 1 else f'-{procs}procs'}.svg")
        plot(f"{coll} {dtype}, 2 GPUs, {how}{label}: ringccl vs NCCL", series, path)
        print(path)


if __name__ == "__main__":
    main()
