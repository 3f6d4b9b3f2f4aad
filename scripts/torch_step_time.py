#!/usr/bin/env python3
"""Training step time of a GPT-2-small-sized transformer (12 layers, width 768, 12 heads,
vocabulary 50257, sequence 512: 124 M parameters) under DistributedDataParallel or FSDP2
(`fully_shard`), over whatever `libnccl.so.2` PyTorch loaded: PyTorch's NCCL, or ringccl's
library (preloaded, e.g. by `ringccl-torchrun`).

    torchrun --nproc-per-node 2 scripts/torch_step_time.py --mode ddp|fsdp2
        [--steps 30] [--warmup 5] [--batch 8] [--seq 512] [--layers 12] [--json FILE]

Every rank runs the same seeded model on its own seeded batch (bf16 autocast, AdamW). The step
time is the host wall clock between two `torch.cuda.synchronize()` calls, averaged over the
steps after the warm-up; rank 0 prints one line `mode=… lib=… step_ms=… loss=…` and, with
--json, appends the same as a JSON object to FILE. The loss of the last step is printed so two
runs (NCCL and ringccl) can be compared: with the same seeds they agree to the last bits only
if every collective returned the same values.
"""
import argparse
import ctypes
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, vocab, width, heads, layers, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=idx.device), diagonal=1)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def library():
    """Which NCCL the process has: ringccl's library answers `ringcclGetVersionString`."""
    try:
        lib = ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_NOLOAD)
        f = lib.ringcclGetVersionString
        f.restype = ctypes.c_char_p
        return "ringccl " + f().decode()
    except (OSError, AttributeError):
        return "nccl " + ".".join(map(str, torch.cuda.nccl.version()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["ddp", "fsdp2"], default="ddp")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--json")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    torch.manual_seed(0)
    model = Gpt(50257, 768, 12, a.layers, a.seq).to(dev)
    if a.mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    else:
        from torch.distributed.fsdp import fully_shard

        for b in model.blocks:
            fully_shard(b)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device=dev).manual_seed(1000 + rank)
    idx = torch.randint(0, 50257, (a.batch, a.seq), device=dev, generator=g)
    loss = None
    for step in range(a.steps):
        if step == a.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / (a.steps - a.warmup)
    loss = loss.detach()
    dist.all_reduce(loss)
    rec = {
        "mode": a.mode,
        "lib": library(),
        "world": world,
        "step_ms": round(ms, 3),
        "loss": float(loss) / world,
        "params": sum(p.numel() for p in model.parameters()),
    }
    if rank == 0:
        print(" ".join(f"{k}={v}" for k, v in rec.items()), flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(rec) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
