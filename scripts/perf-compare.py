#!/usr/bin/env python3
"""Compares ringccl's time per call between two builds, from ringccl-perf JSON files.
Usage: scripts/perf-compare.py BEFORE.json [BEFORE.json ...] -- AFTER.json [AFTER.json ...]
Each side's time for a (dtype, bytes, in-place) point is the median over its files (runs of the
two builds should alternate on one machine); the ratio is after / before (> 1: slower), with the
spread of each side's runs, so run-to-run noise can be told from a change."""
import json
import statistics
import sys


def load(paths):
    runs = []
    for p in paths:
        doc = json.load(open(p))
        runs.append({(r["collective"], r["dtype"], r["bytes"], r["inplace"]): r["time_us"]
                     for r in doc["records"] if r["lib"] == "ringccl" and r["time_us"] is not None})
    return runs


def main(argv):
    if "--" not in argv:
        sys.exit(__doc__)
    i = argv.index("--")
    before, after = load(argv[:i]), load(argv[i + 1:])
    if not before or not after:
        sys.exit(__doc__)
    keys = sorted(set.intersection(*(set(r) for r in before + after)),
                  key=lambda k: (k[0], k[1], k[3], k[2]))
    print("| collective | dtype | bytes | in place | before µs (runs) | after µs (runs) | after / before |")
    print("| --- | --- | ---: | --- | --- | --- | ---: |")
    worst = None
    for k in keys:
        b = [r[k] for r in before]
        a = [r[k] for r in after]
        ratio = statistics.median(a) / statistics.median(b)
        worst = ratio if worst is None else max(worst, ratio)
        span = lambda v: f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})"
        print(f"| {k[0]} | {k[1]} | {k[2]} | {'yes' if k[3] else 'no'} | {span(b)} | {span(a)} | {ratio:.3f} |")
    print(f"\nlargest after / before: {worst:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
