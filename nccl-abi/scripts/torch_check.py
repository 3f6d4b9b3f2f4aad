"""torch.distributed through whichever libnccl.so.2 is loaded: results, a DDP run, timings.

Run once with NCCL and once with ringccl's library preloaded, then compare:
    torchrun --nproc-per-node 2 torch_check.py --out DIR/nccl
    LD_PRELOAD=.../libringccl_nccl.so torchrun --nproc-per-node 2 torch_check.py --out DIR/ringccl
    python3 torch_compare.py DIR/nccl DIR/ringccl

Each rank writes DIR/rank<r>.pt (every result tensor, the DDP losses, the timings) and prints
a summary. Every result is also checked against a CPU reference here; the compare script
checks that both libraries gave the same tensors.
"""

import argparse
import ctypes
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def library_name():
    """Which NCCL the process runs: ringccl's library exports ringcclGetVersionString."""
    try:
        f = ctypes.CDLL(None).ringcclGetVersionString
        f.restype = ctypes.c_char_p
        return f().decode()
    except AttributeError:
        v = torch.cuda.nccl.version()
        return "NCCL " + ".".join(str(x) for x in v)


def inputs(rank, n, dtype, dev):
    """Rank `rank`'s deterministic input of n elements (small integers: exact in every type)."""
    base = (torch.arange(n, dtype=torch.int64) % 7) + 1 + 2 * rank
    return base.to(dtype).to(dev)


def check(name, got, want, results, failures, tol):
    results[name] = got.detach().cpu()
    g = got.detach().cpu().to(torch.float64)
    w = want.detach().cpu().to(torch.float64)
    if g.shape != w.shape or not torch.allclose(g, w, rtol=tol, atol=tol):
        err = (g - w).abs().max().item() if g.shape == w.shape else "shape"
        failures.append(f"{name}: max error {err}")


def correctness(rank, world, dev, results, failures):
    n = 1000
    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    all_in = lambda dtype, m=n: [inputs(r, m, dtype, "cpu").to(torch.float64) for r in range(world)]
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32):
        tol = 1e-6 if dtype in (torch.float32, torch.int32) else 1e-2
        for opname, op in ops.items():
            if opname == "avg" and dtype == torch.int32:
                continue
            t = inputs(rank, n, dtype, dev)
            dist.all_reduce(t, op=op)
            xs = torch.stack(all_in(dtype))
            want = {"sum": xs.sum(0), "avg": xs.mean(0), "min": xs.min(0).values, "max": xs.max(0).values}[opname]
            check(f"all_reduce/{opname}/{dtype}", t, want, results, failures, tol)
    for dtype in (torch.float32, torch.bfloat16):
        t = inputs(rank, n, dtype, dev)
        dist.broadcast(t, src=world - 1)
        check(f"broadcast/{dtype}", t, inputs(world - 1, n, dtype, "cpu"), results, failures, 0)
        out = torch.empty(world * n, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(out, inputs(rank, n, dtype, dev))
        check(f"all_gather_into_tensor/{dtype}", out, torch.cat(all_in(dtype)), results, failures, 0)
        out = torch.empty(n, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(out, inputs(rank, world * n, dtype, dev))
        want = torch.stack(all_in(dtype, world * n)).sum(0)[rank * n:(rank + 1) * n]
        check(f"reduce_scatter_tensor/{dtype}", out, want, results, failures, 1e-2)
    dist.barrier()
    torch.cuda.synchronize()


def ddp(rank, dev, steps=50):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10)).to(dev)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 512, generator=g).to(dev)
        y = torch.randint(0, 10, (64,), generator=g).to(dev)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # The mean loss over ranks, as a single number per step.
    t = torch.tensor(losses, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    params = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    return t.cpu().tolist(), params


def timing(dev, world):
    rows = []
    for nbytes in (8, 1 << 10, 32 << 10, 128 << 10, 1 << 20, 8 << 20, 32 << 20, 128 << 20, 512 << 20, 1 << 30):
        for dtype in (torch.float32,):
            n = max(1, nbytes // 4)
            t = torch.ones(n, dtype=dtype, device=dev)
            iters = 20 if nbytes <= (128 << 20) else 10
            for _ in range(5):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            dist.barrier()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            for _ in range(iters):
                dist.all_reduce(t)
            end.record()
            torch.cuda.synchronize()
            us = start.elapsed_time(end) * 1000 / iters
            wall = (time.perf_counter() - t0) * 1e6 / iters
            busbw = 2 * (world - 1) / world * n * 4 / (us * 1e-6) / 1e9
            rows.append({"bytes": n * 4, "us": us, "wall_us": wall, "busbw_GBps": busbw})
            del t
    return rows


def subgroups(rank, world, dev, results, failures):
    """dist.new_group with 1, 2 and 4 ranks and init_device_mesh("cuda", (2, 2)), each group's
    all-reduce interleaved with the default group's. The default group is bound to a device
    (init_process_group(..., device_id=...)), so PyTorch makes every sub-group's communicator
    with ncclCommSplit, the ranks outside a group with NCCL_SPLIT_NOCOLOR. Returns a status
    line."""
    n = 1000

    def want(ranks, dtype=torch.float32):
        return sum(inputs(r, n, dtype, "cpu").to(torch.float64) for r in ranks)

    def reduce_in(name, ranks, group):
        # The group's all-reduce and the default group's, both in flight before either waits.
        t = inputs(rank, n, torch.float32, dev)
        u = inputs(rank, n, torch.float32, dev)
        a = dist.all_reduce(t, group=group, async_op=True)
        b = dist.all_reduce(u, async_op=True)
        a.wait()
        b.wait()
        check(f"{name}/all_reduce", t, want(ranks), results, failures, 0)
        check(f"{name}/world_all_reduce", u, want(range(world)), results, failures, 0)

    made = 0
    # new_group is collective over the world: every rank makes every group, in the same order.
    pairs = [list(range(i, min(i + 2, world))) for i in range(0, world, 2)]
    groups = [dist.new_group(p) for p in pairs]
    made += len(groups)
    for p, g in zip(pairs, groups):
        if rank in p:
            reduce_in(f"new_group{p}", p, g)
            out = torch.empty(len(p) * n, device=dev)
            dist.all_gather_into_tensor(out, inputs(rank, n, torch.float32, dev), group=g)
            check(f"new_group{p}/all_gather", out, torch.cat([inputs(r, n, torch.float32, "cpu") for r in p]),
                  results, failures, 0)
    # A group of rank 0 alone: every other rank takes part with NCCL_SPLIT_NOCOLOR.
    solo = dist.new_group([0])
    made += 1
    if rank == 0:
        t = inputs(0, n, torch.float32, dev)
        dist.all_reduce(t, group=solo)
        check("new_group[0]/all_reduce", t, want([0]), results, failures, 0)
    if world >= 4:
        four = [0, 1, 2, 3]
        g4 = dist.new_group(four)
        made += 1
        if rank in four:
            reduce_in("new_group[0, 1, 2, 3]", four, g4)
    if world == 4:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cuda", (2, 2))
        made += 2
        # The mesh is arange(4).view(2, 2): dimension 0 groups the columns, 1 the rows.
        col = [rank % 2, rank % 2 + 2]
        row = [rank // 2 * 2, rank // 2 * 2 + 1]
        reduce_in("mesh(2,2)/dim0", col, mesh.get_group(0))
        reduce_in("mesh(2,2)/dim1", row, mesh.get_group(1))
    torch.cuda.synchronize()
    splits = "unknown"
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(dev)
        splits = backend.comm_split_count()
        # Rank 0 is in a group smaller than the world, which must come from a split.
        if rank == 0 and splits < 1:
            failures.append(f"subgroups: the default group made no ncclCommSplit ({made} groups)")
    except (AttributeError, RuntimeError):
        pass
    return f"ok ({made} groups, {splits} splits of the default group)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-timing", action="store_true")
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    # Bound to the device, as PyTorch recommends: sub-groups are then made with ncclCommSplit.
    dist.init_process_group("nccl", device_id=dev)
    lib = library_name()
    os.makedirs(args.out, exist_ok=True)
    results, failures = {}, []
    t0 = time.time()
    correctness(rank, world, dev, results, failures)
    t1 = time.time()
    losses, params = ddp(rank, dev)
    t2 = time.time()
    rows = [] if args.skip_timing else timing(dev, world)
    t3 = time.time()
    # all_to_all and send/recv last: a library that refuses them (PyTorch may build all_to_all
    # from sends and receives) must not take the rest down.
    a2a = "ok"
    try:
        n = 1000
        for dtype in (torch.float32, torch.bfloat16):
            out = torch.empty(world * n, dtype=dtype, device=dev)
            dist.all_to_all_single(out, inputs(rank, world * n, dtype, dev))
            every = [inputs(r, world * n, dtype, "cpu") for r in range(world)]
            want = torch.cat([every[p][rank * n:(rank + 1) * n] for p in range(world)])
            check(f"all_to_all_single/{dtype}", out, want, results, failures, 0)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - recorded, reported
        a2a = f"error: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    p2p = "ok"
    try:
        if rank == 0:
            dist.send(inputs(0, 100, torch.float32, dev), dst=1)
        elif rank == 1:
            r = torch.empty(100, device=dev)
            dist.recv(r, src=0)
            check("send_recv/float32", r, inputs(0, 100, torch.float32, "cpu"), results, failures, 0)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - recorded, reported
        p2p = f"error: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    try:
        groups = subgroups(rank, world, dev, results, failures)
    except Exception as e:  # noqa: BLE001 - recorded, reported
        groups = f"error: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        failures.append(f"subgroups: {groups}")
    torch.save({"lib": lib, "results": results, "failures": failures, "losses": losses, "params": params,
                "timing": rows, "p2p": p2p, "a2a": a2a, "groups": groups}, os.path.join(args.out, f"rank{rank}.pt"))
    print(f"[rank {rank}] {lib}: {len(results)} results checked, {len(failures)} failed "
          f"({t1 - t0:.1f} s); DDP 50 steps loss {losses[0]:.4f} -> {losses[-1]:.4f} ({t2 - t1:.1f} s); "
          f"timing {t3 - t2:.1f} s; all_to_all: {a2a}; send/recv: {p2p}; sub-groups: {groups}", flush=True)
    for f in failures[:20]:
        print(f"[rank {rank}] FAIL {f}", flush=True)
    if rank == 0 and rows:
        print(json.dumps({"lib": lib, "all_reduce_f32": rows}), flush=True)
    try:
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        print(f"[rank {rank}] destroy_process_group: {e}", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
