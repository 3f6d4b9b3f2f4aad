"""Compares two torch_check.py runs (NCCL and ringccl): same results, same DDP losses, and the
all-reduce time per size side by side (markdown on stdout).

    python3 torch_compare.py DIR/nccl DIR/ringccl
"""

import os
import sys

import torch


def load(d, r):
    return torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False)


def main():
    a_dir, b_dir = sys.argv[1], sys.argv[2]
    ranks = sorted(int(f[4:-3]) for f in os.listdir(a_dir) if f.startswith("rank") and f.endswith(".pt"))
    bad = 0
    for r in ranks:
        a, b = load(a_dir, r), load(b_dir, r)
        same, differ = 0, []
        for k, va in a["results"].items():
            vb = b["results"].get(k)
            if vb is None:
                differ.append(f"{k}: missing")
            elif torch.equal(va, vb):
                same += 1
            else:
                d = (va.double() - vb.double()).abs().max().item()
                differ.append(f"{k}: max difference {d:g}")
        la, lb = torch.tensor(a["losses"]), torch.tensor(b["losses"])
        dl = (la - lb).abs().max().item()
        dp = (a["params"] - b["params"]).abs().max().item()
        print(f"rank {r}: {a['lib']} vs {b['lib']}: {same} of {len(a['results'])} results bit-identical; "
              f"DDP loss max |difference| over 50 steps {dl:.3g} (final {la[-1]:.6f} vs {lb[-1]:.6f}); "
              f"parameters max |difference| {dp:.3g}; all_to_all: {a.get('a2a')} | {b.get('a2a')}; send/recv: {a['p2p']} | {b['p2p']}")
        for d in differ:
            print(f"  differs: {d}")
        for k in ("premul", "children"):
            for la_, lb_ in zip(a.get(k) or [], b.get(k) or []):
                print(f"  {k}: {la_.splitlines()[0]} | {lb_.splitlines()[0]}")
        # Bit-identical or within float tolerance (bf16/f16 avg may round differently).
        bad += sum(1 for d in differ if "missing" in d or float(d.rsplit(" ", 1)[1]) > 1e-2)
        bad += dl > 1e-3
    a, b = load(a_dir, 0), load(b_dir, 0)
    if a["timing"] and b["timing"]:
        print()
        print(f"| bytes | {a['lib']} µs | {b['lib']} µs | {a['lib']} busbw GB/s | {b['lib']} busbw GB/s |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for ra, rb in zip(a["timing"], b["timing"]):
            print(f"| {ra['bytes']} | {ra['us']:.1f} | {rb['us']:.1f} | {ra['busbw_GBps']:.1f} | {rb['busbw_GBps']:.1f} |")
    print(f"compare: {'PASS' if bad == 0 else 'FAIL'} ({bad} problems)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
