#!/usr/bin/env python3
"""NCCL's all-reduce through PyTorch, one process per GPU, timed like ringccl's
`multi_process --sweep` example: in-place f32, CUDA events around batches of 20 back-to-back
calls on the current stream, the median of 5 batches after a warm-up batch, 8 B to 1 GiB
(factor 4). Rank 0 prints bytes, time per call (µs) and busbw (GB/s).
Run: torchrun --nproc-per-node 2 scripts/torch-nccl-allreduce.py"""
import os
import statistics

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
dist.init_process_group("nccl")
buf = torch.zeros(1 << 28, dtype=torch.float32, device="cuda")
dist.all_reduce(buf[:2])
torch.cuda.synchronize()
if rank == 0:
    print(f"{'bytes':>12} {'time_us':>10} {'busbw_GB/s':>10}  (NCCL {torch.cuda.nccl.version()})")
count = 2
while count <= 1 << 28:
    view = buf[:count]
    times = []
    for batch in range(6):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            dist.all_reduce(view)
        end.record()
        end.synchronize()
        if batch > 0:
            times.append(start.elapsed_time(end) * 1000.0 / 20)
    us = statistics.median(times)
    nbytes = count * 4
    busbw = nbytes / (us * 1e-6) * 2 * (world - 1) / world / 1e9
    if rank == 0:
        print(f"{nbytes:>12} {us:>10.2f} {busbw:>10.2f}")
    count *= 4
dist.destroy_process_group()
