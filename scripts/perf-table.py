#!/usr/bin/env python3
"""Markdown tables from ringccl-perf JSON files: one row per (collective, dtype, op, size),
ringccl and NCCL busbw / time for out-of-place and in-place, and the ratios.
Usage: scripts/perf-table.py FILE.json [FILE.json ...] [--min-bytes N]"""
import json
import sys

args = [a for a in sys.argv[1:] if not a.startswith("--")]
min_bytes = 0
if "--min-bytes" in sys.argv:
    min_bytes = int(sys.argv[sys.argv.index("--min-bytes") + 1])
    args = [a for a in args if a != str(min_bytes)]

def fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"

for path in args:
    doc = json.load(open(path))
    meta, recs = doc["meta"], doc["records"]
    print(f"### `{' '.join(meta['command'][1:])}`\n")
    print(f"{meta['date']}, {len(meta['gpus'])} × {meta['gpus'][0]['name']}, CUDA driver API "
          f"{meta['driver_version']}, NCCL {meta['nccl_version']}, ringccl {meta['ringccl_version']}"
          f"{', CUDA graphs' if meta.get('graph_requested') else ''}\n")
    groups = {}
    for r in recs:
        key = (r["collective"], r["dtype"], r["op"], r["bytes"])
        groups.setdefault(key, {})[(r["lib"], r["inplace"])] = r
    print("| collective | type | op | bytes | ringccl µs | NCCL µs | ringccl busbw | NCCL busbw | ratio | ringccl µs (in place) | NCCL µs (in place) | ratio (in place) | #wrong |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (coll, dt, op, nbytes), g in sorted(groups.items()):
        if nbytes < min_bytes:
            continue
        ro, no = g.get(("ringccl", False)), g.get(("nccl", False))
        ri, ni = g.get(("ringccl", True)), g.get(("nccl", True))
        ratio = ro["busbw"] / no["busbw"] if ro and no and no["busbw"] else None
        ratio_i = ni["time_us"] / ri["time_us"] if ri and ni and ri["time_us"] else None
        wrong = sum((r or {}).get("wrong") or 0 for r in (ro, no, ri, ni))
        print(f"| {coll} | {dt} | {op} | {nbytes} | {fmt(ro and ro['time_us'])} | {fmt(no and no['time_us'])} | "
              f"{fmt(ro and ro['busbw'])} | {fmt(no and no['busbw'])} | {fmt(ratio, 3)} | "
              f"{fmt(ri and ri['time_us'])} | {fmt(ni and ni['time_us'])} | {fmt(ratio_i, 3)} | {wrong} |")
    print()
