#!/usr/bin/env python3
"""The PyTorch anchor of train_mlp: the same multilayer perceptron (N layers of width x width,
f32, ReLU between, mean squared error against a fixed random linear teacher, SGD), trained with
torch.nn.parallel.DistributedDataParallel over NCCL, or without communication (--comm none).

    torchrun --nproc-per-node 2 scripts/ddp_mlp_torch.py [--layers 4] [--width 4096]
        [--batch 2048] [--steps 60] [--warmup 10] [--lr 0.05] [--comm ddp|none]
        [--bucket-mib 25] [--no-grad-view]

Prints the mean step time over steps warmup..steps on every rank (host wall clock between two
torch.cuda.synchronize() calls, as train_mlp measures), and the loss of the last step.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--batch", type=int, default=2048, help="samples per rank and step")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--data-batches", type=int, default=8)
    p.add_argument("--comm", choices=["ddp", "none"], default="ddp")
    p.add_argument("--bucket-mib", type=float, default=25.0)
    p.add_argument("--no-grad-view", action="store_true",
                   help="DDP without gradient_as_bucket_view (copies gradients into buckets)")
    a = p.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False  # plain f32 products, as cuBLAS's default
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(1)
    layers = []
    for l in range(a.layers):
        lin = nn.Linear(a.width, a.width)
        nn.init.uniform_(lin.weight, -(6.0 / a.width) ** 0.5, (6.0 / a.width) ** 0.5)
        nn.init.uniform_(lin.bias, -(1.0 / a.width) ** 0.5, (1.0 / a.width) ** 0.5)
        layers.append(lin)
        if l + 1 < a.layers:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers).to(dev)
    if a.comm == "ddp":
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[local], bucket_cap_mb=a.bucket_mib,
            gradient_as_bucket_view=not a.no_grad_view)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)

    g = torch.Generator(device=dev)
    g.manual_seed(3)
    teacher = (torch.rand(a.width, a.width, device=dev, generator=g) * 2 - 1) * (3.0 / a.width) ** 0.5
    g.manual_seed(100 + rank)
    xs = [torch.rand(a.batch, a.width, device=dev, generator=g) * 2 - 1 for _ in range(a.data_batches)]
    ys = [x @ teacher.T for x in xs]

    loss_fn = nn.MSELoss()
    loss = None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in range(a.steps):
        if step == a.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        x, y = xs[step % len(xs)], ys[step % len(ys)]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / (a.steps - a.warmup)
    print(f"rank {rank}: torch step time {ms:.3f} ms (mean of steps {a.warmup}..{a.steps}, "
          f"comm {a.comm}, world {world}, batch {a.batch}, {a.layers} x {a.width}^2 f32, "
          f"torch {torch.__version__}, nccl {'.'.join(map(str, torch.cuda.nccl.version()))}); "
          f"last loss {loss.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
