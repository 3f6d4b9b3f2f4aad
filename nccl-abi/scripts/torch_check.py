"""torch.distributed through whichever libnccl.so.2 is loaded: results, a DDP run, timings.

Run once with NCCL and once with ringccl's library preloaded, then compare:
    cargo build --release -p nccl-abi          # target/release/libringccl_nccl.so (libnccl.so.2)
    torchrun --nproc-per-node 2 torch_check.py --out DIR/nccl
    LD_PRELOAD=$PWD/target/release/libringccl_nccl.so \
        torchrun --nproc-per-node 2 torch_check.py --out DIR/ringccl
    python3 torch_compare.py DIR/nccl DIR/ringccl
(nccl-abi/scripts/gpu-check.sh runs all three.) Two processes may share one GPU (under MPS).

Each rank writes DIR/rank<r>.pt (every result tensor, the DDP losses, the timings) and prints
a summary. Every result is also checked against a CPU reference here; the compare script
checks that both libraries gave the same tensors.

Besides the collectives and DDP, and each in a function of its own:
* PreMulSum (`dist._make_nccl_premul_sum`, what FSDP2 uses for a custom gradient divide
  factor): all_reduce and reduce_scatter_tensor with a float factor (NCCL's
  ncclScalarHostImmediate) and with a tensor factor (ncclScalarDevice), exact expected values.
  A library that refuses PreMulSum makes these FAIL with the DistBackendError it raised; a
  wrong value FAILs too; never a silent pass.
* the watchdog path, in a job of its own (two child processes of rank 0, same environment,
  LD_PRELOAD included): a process group with a 10 s timeout, TORCH_NCCL_ASYNC_ERROR_HANDLING=2
  (the watchdog aborts the communicators) and TORCH_NCCL_BLOCKING_WAIT=1; rank 1 skips an
  all_reduce. PASS when rank 0 ends with PyTorch's own timeout error (and destroys its group
  after it); FAIL on std::terminate / SIGABRT, or on an error of the library's
  ncclCommAbort/ncclCommDestroy in its output.
* registration, in a job of its own: TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 (every
  allocator segment registered with ncclCommRegister, deregistered when freed), and a
  torch.cuda.MemPool on the process group's NCCL allocator (ncclMemAlloc) and one of PyTorch's
  caching allocator, each registered with register_mem_pool; exact all_reduce results in all.
  SKIP (reported) where this torch lacks the API; the NCCL-allocator pool NOT APPLICABLE (with
  the evidence) where torch itself refuses it on a GPU without multicast (see
  register_pool_child).
* fp8 (torch.float8_e4m3fn, torch.float8_e5m2: ncclFloat8e4m3 / ncclFloat8e5m2):
  all_gather_into_tensor, all_reduce sum and max, reduce_scatter_tensor sum, on values whose
  sums are exact in any order, and (2 ranks) a sum that must round to nearest even once, as
  NCCL's sm_90 fp8 sum does; a reduction this torch itself refuses for fp8 is reported as not
  applicable, with torch's message.
Their lines start with `[rank 0] premul`, `[rank 0] fp8`, `[rank 0] watchdog`,
`[rank 0] register`.
"""

import argparse
import copy
import ctypes
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
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


FP8_TYPES = tuple(t for t in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if t)


def fp8_inputs(rank, world, n, dtype, exact):
    """Rank `rank`'s fp8 input (on the CPU, as float32) of n elements.

    exact: integers of [-k, k], k = 16 (e4m3) or 8 (e5m2) divided by the rank count, half of
    them scaled by 1/8: every partial sum over the ranks, in any order, is exactly
    representable in the type (and in half), so the result is the same whatever order and
    precision the library sums in. Otherwise (2 ranks only) values of [1, 16) with the type's
    mantissa, whose pairwise sum is exact in half but not always in fp8: the library must round
    the exact sum to nearest (ties to even) once, as NCCL does on sm_90 (the sum in half, then
    one conversion to fp8), and as torch's float32 -> fp8 conversion does here."""
    i = torch.arange(n, dtype=torch.int64)
    if exact:
        k = max(1, (8 if dtype == torch.float8_e5m2 else 16) // world)
        v = ((i * 7 + rank * 3) % (2 * k + 1) - k).to(torch.float32)
        v = torch.where(i % 2 == 1, v / 8, v)
    else:
        mant = 4 if dtype == torch.float8_e5m2 else 8  # steps per binade
        e = (i + rank) % 4  # binades [1, 2) .. [8, 16)
        m = (i * 3 + rank * 5) % mant
        v = (2.0 ** e.to(torch.float32)) * (1 + m.to(torch.float32) / mant)
    assert torch.equal(v.to(dtype).to(torch.float32), v), "inputs are fp8 values"
    return v


def fp8_checks(rank, world, dev, results, failures):
    """fp8 (torch.float8_e4m3fn -> ncclFloat8e4m3, float8_e5m2 -> ncclFloat8e5m2, PyTorch with
    NCCL >= 2.24): all_gather_into_tensor (bit-exact), all_reduce sum and max and
    reduce_scatter_tensor sum, expected values computed here exactly (fp8_inputs). A reduction
    that this torch itself refuses for fp8 is reported as such (not applicable), not a pass;
    any other error, or a wrong element, FAILs.

    Returns one line per type."""
    lines = []
    n = 1024
    for dtype in FP8_TYPES:
        name = str(dtype).replace("torch.", "")
        parts, ok = [], True

        def run(key, fn):
            nonlocal ok
            try:
                got, want = fn()
                torch.cuda.synchronize()
                before = len(failures)
                # Compared as float32 (every fp8 value is exact there), bit for bit.
                check(f"fp8/{key}/{name}", got.float(), want, results, failures, 0)
                if len(failures) == before:
                    parts.append(f"{key} ok")
                else:
                    ok = False
                    parts.append(f"{key} FAIL {failures[-1]}")
            except Exception as e:  # noqa: BLE001 - reported below
                msg = str(e).splitlines()[0][:200] if str(e) else ""
                if "Float8" in msg and "not" in msg and "supported" in msg:
                    parts.append(f"{key} not applicable: this torch refuses it ({type(e).__name__}: {msg})")
                else:
                    ok = False
                    failures.append(f"fp8/{key}/{name}: {type(e).__name__}: {msg}")
                    parts.append(f"{key} FAIL {type(e).__name__}: {msg}")

        every = [fp8_inputs(r, world, world * n, dtype, True) for r in range(world)]
        mine = lambda m=n: every[rank][:m].to(dtype).to(dev)

        def gather():
            out = torch.empty(world * n, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, mine())
            return out, torch.cat([e[:n] for e in every])

        def reduce(op, is_sum):
            def go():
                t = mine()
                dist.all_reduce(t, op=op)
                xs = torch.stack([e[:n] for e in every])
                return t, (xs.sum(0) if is_sum else xs.max(0).values)
            return go

        def scatter():
            out = torch.empty(n, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(out, every[rank].to(dtype).to(dev))
            return out, torch.stack(every).sum(0)[rank * n:(rank + 1) * n]

        run("all_gather_into_tensor", gather)
        run("all_reduce-sum", reduce(dist.ReduceOp.SUM, True))
        run("all_reduce-max", reduce(dist.ReduceOp.MAX, False))
        run("reduce_scatter_tensor-sum", scatter)
        if world == 2:
            def rounded():
                xs = [fp8_inputs(r, world, n, dtype, False) for r in range(world)]
                t = xs[rank].to(dtype).to(dev)
                dist.all_reduce(t)
                # The exact sum (float32 holds it), rounded once to nearest even by torch.
                return t, (xs[0] + xs[1]).to(dtype).to(torch.float32)
            run("all_reduce-sum-rounded", rounded)
        na = any("not applicable" in p for p in parts)
        status = "FAIL " if not ok else ("PASS (parts NOT APPLICABLE, not passed) " if na else "PASS ")
        lines.append(status + f"{name}: " + "; ".join(parts))
    if not FP8_TYPES:
        lines.append("not applicable: this torch has no float8_e4m3fn / float8_e5m2")
    dist.barrier()
    return lines


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


def premul_sum(rank, world, dev, results, failures):
    """all_reduce / reduce_scatter_tensor with PreMulSum (host and device factors); exact values.

    Returns one line per case: "ok", or why it failed (the exception, or the max error)."""
    lines = []
    n = 1000
    every = [inputs(r, n * world, torch.float32, "cpu").to(torch.float64) for r in range(world)]
    cases = [
        ("all_reduce/host-0.5", 0.5, False),
        ("all_reduce/device-0.25", 0.25, True),
        ("reduce_scatter_tensor/host-0.5", 0.5, False),
    ]
    for name, factor, on_device in cases:
        key = f"premul_sum/{name}"
        try:
            f = torch.tensor(factor, dtype=torch.float32, device=dev) if on_device else factor
            op = dist._make_nccl_premul_sum(f)
            if name.startswith("all_reduce"):
                t = inputs(rank, n, torch.float32, dev)
                dist.all_reduce(t, op=op)
                want = factor * torch.stack([e[:n] for e in every]).sum(0)
            else:
                t = torch.empty(n, dtype=torch.float32, device=dev)
                dist.reduce_scatter_tensor(t, inputs(rank, n * world, torch.float32, dev), op=op)
                want = factor * torch.stack(every).sum(0)[rank * n:(rank + 1) * n]
            torch.cuda.synchronize()
            before = len(failures)
            # The factors are powers of two and the inputs small integers: exact in float32.
            check(key, t, want, results, failures, 0)
            lines.append(f"{name}: ok" if len(failures) == before else f"{name}: FAIL {failures[-1]}")
        except Exception as e:  # noqa: BLE001 - a refusal is a failure, reported, never a pass
            msg = f"{key}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            failures.append(msg)
            lines.append(f"{name}: FAIL {msg}")
    return lines


def graph_capture(rank, world, dev, results, failures):
    """dist.all_reduce captured in torch.cuda.graph (PyTorch's default, global capture mode) and
    replayed, against eager calls and exact expected values; then a small training step (a tiny
    MLP, its gradient all-reduce inside the graph) captured and replayed against the same steps
    run eagerly on a copy of the model.

    All-reduce: float32 of 1 element to 2 Mi (8 MiB: one-shot and two-shot) and bfloat16, in one
    graph; before each of 5 replays the captured tensors get new inputs (small integers plus the
    replay's number: sums exact), and an eager all_reduce of the same inputs runs between
    replays; replay and eager must both equal the sum computed here. Training step: SGD on an
    MLP 16-32-4, each rank its own data, gradients summed over ranks and divided by the world
    size inside the graph; 3 warm-up steps eager (on a side stream, as PyTorch asks), then 5
    replays, the parameters compared after each with the eager copy's (tolerance 1e-5: cuBLAS
    may pick other kernels under capture). Returns one line per part: "ok", or why it failed;
    a library that refuses the capture FAILs with the error it raised."""
    lines = []
    key = "graph/all_reduce"
    try:
        sizes = [(1, torch.float32), (1000, torch.float32), (65537, torch.float32), (300001, torch.float32),
                 (2 << 20, torch.float32), (4097, torch.bfloat16), (100000, torch.bfloat16)]
        bufs = [torch.zeros(n, dtype=dt, device=dev) for n, dt in sizes]

        def value(r, n, dt, k):
            return inputs(r, n, torch.float64, "cpu") + k

        def fill(k):
            for b in bufs:
                b.copy_(value(rank, b.numel(), b.dtype, k).to(b.dtype).to(dev))

        # Warm up on a side stream (PyTorch's rule for what a graph captures).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for b in bufs:
                dist.all_reduce(b)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for b in bufs:
                dist.all_reduce(b)
        before = len(failures)
        for k in range(5):
            fill(k)
            g.replay()
            eager = [value(rank, b.numel(), b.dtype, k).to(b.dtype).to(dev) for b in bufs]
            for e in eager:
                dist.all_reduce(e)
            torch.cuda.synchronize()
            for b, e, (n, dt) in zip(bufs, eager, sizes):
                want = sum(value(r, n, dt, k) for r in range(world))
                name = f"{key}/{str(dt).replace('torch.', '')}/{n}"
                if k == 4:
                    # The last replay's tensors are kept (and compared across libraries).
                    check(f"{name}/replay", b, want, results, failures, 0)
                    check(f"{name}/eager", e, want, results, failures, 0)
                elif not torch.equal(b.cpu().to(torch.float64), want):
                    failures.append(f"{name}/replay{k}: wrong values")
                if not torch.equal(b, e):
                    failures.append(f"{name}/replay{k}: differs from the eager call")
        del g
        lines.append("all_reduce: ok" if len(failures) == before else f"all_reduce: FAIL {failures[-1]}")
    except Exception as e:  # noqa: BLE001 - a refusal is a failure, reported, never a pass
        msg = f"{key}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        failures.append(msg)
        lines.append(f"all_reduce: FAIL {msg}")

    key = "graph/train_step"
    try:
        torch.manual_seed(5)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(dev)
        twin = copy.deepcopy(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(2000 + rank)
        data = [(torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)) for _ in range(8)]
        static_x = torch.zeros(8, 16, device=dev)
        static_y = torch.zeros(8, 4, device=dev)

        def step(m, o, x, y):
            o.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            for p in m.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(world)
            o.step()
            return loss

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for x, y in data[:3]:
                static_x.copy_(x.to(dev))
                static_y.copy_(y.to(dev))
                step(model, opt, static_x, static_y)
        torch.cuda.current_stream().wait_stream(side)
        for x, y in data[:3]:
            step(twin, twin_opt, x.to(dev), y.to(dev))
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step(model, opt, static_x, static_y)
        before = len(failures)
        for i, (x, y) in enumerate(data[3:]):
            static_x.copy_(x.to(dev))
            static_y.copy_(y.to(dev))
            g.replay()
            step(twin, twin_opt, x.to(dev), y.to(dev))
            torch.cuda.synchronize()
            got = torch.cat([p.detach().flatten() for p in model.parameters()])
            want = torch.cat([p.detach().flatten() for p in twin.parameters()])
            check(f"{key}/replay{i}", got, want, results, failures, 1e-5)
        del g
        lines.append("train_step: ok" if len(failures) == before else f"train_step: FAIL {failures[-1]}")
    except Exception as e:  # noqa: BLE001 - a refusal is a failure, reported, never a pass
        msg = f"{key}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        failures.append(msg)
        lines.append(f"train_step: FAIL {msg}")
    return lines


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_job(mode, nproc, env_extra, timeout):
    """Runs `nproc` processes of this script in child mode `mode` (their own process group,
    their own port, this process's environment plus `env_extra`); returns [(rc, output)]."""
    port = free_port()
    procs = []
    for r in range(nproc):
        # torchrun's variables (its agent store above all) stay out: the child job has its own
        # rendezvous on its own port.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TORCHELASTIC_", "TORCH_ELASTIC_")) and k not in (
                   "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                   "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                   "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT",
                   "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK")}
        env.update(env_extra)
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        cmd = [sys.executable, os.path.abspath(__file__), "--out", "-", "--child", mode,
               "--child-rank", str(r), "--child-world", str(nproc)]
        if "ringccl.torch" in sys.modules:
            # This job came to ringccl through `import ringccl.torch` (no LD_PRELOAD for the
            # children to inherit): the child job comes the same way.
            cmd[1:1] = ["-c", "import ringccl.torch, runpy, sys; sys.argv = sys.argv[1:]; "
                        "runpy.run_path(sys.argv[0], run_name='__main__')"]
        # Output to files, not pipes: a child never blocks on a full pipe while another is read.
        log = tempfile.TemporaryFile(mode="w+")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True), log))
    out = []
    deadline = time.time() + timeout
    for p, log in procs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
            note = ""
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            note = "\n[killed: the child ran past its time limit]"
        log.seek(0)
        rc = p.returncode if not note else None
        out.append((rc, log.read() + note))
        log.close()
    return out


def child_init(rank, world, timeout_s=None):
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    kw = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev, **kw)
    return dev


def watchdog_child(rank, world):
    """Rank 1 skips the second all_reduce; rank 0's times out after 10 s. Exits 0 after
    PyTorch's timeout error (and destroy_process_group) on rank 0."""
    dev = child_init(rank, world, timeout_s=10)
    t = torch.ones(1024, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    if rank != 0:
        time.sleep(30)
        os._exit(0)
    try:
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        torch.cuda.synchronize()
        print("WATCHDOG-CHILD: no timeout error", flush=True)
        os._exit(3)
    except Exception as e:  # noqa: BLE001 - the expected timeout
        first = str(e).splitlines()[0][:300] if str(e) else ""
        print(f"WATCHDOG-CHILD: timeout error: {type(e).__name__}: {first}", flush=True)
    try:
        dist.destroy_process_group()
        print("WATCHDOG-CHILD: destroy_process_group ok", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"WATCHDOG-CHILD: destroy_process_group: {type(e).__name__}: {e}", flush=True)
    os._exit(0)


def watchdog_check():
    """The watchdog path (see the header): one line, PASS or FAIL with why."""
    env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2", "TORCH_NCCL_BLOCKING_WAIT": "1"}
    (rc0, out0), (_, out1) = child_job("watchdog", 2, env, timeout=120)
    lib_errors = [l for l in out0.splitlines()
                  if "ringccl: ncclCommAbort" in l or "ringccl: ncclCommDestroy" in l
                  or "ringccl: ncclCommFinalize" in l]
    terminated = ("terminate called" in out0 or rc0 == -6 or "watchdog thread terminated with exception" in out0)
    timed_out = "WATCHDOG-CHILD: timeout error" in out0
    if rc0 == 0 and timed_out and not lib_errors and not terminated:
        detail = [l for l in out0.splitlines() if l.startswith("WATCHDOG-CHILD")]
        return True, "PASS: " + " | ".join(detail)
    tail = "\n".join(out0.splitlines()[-15:])
    why = (f"exit {rc0}; PyTorch timeout error seen: {timed_out}; terminate/SIGABRT: {terminated}; "
           f"library abort/destroy errors: {lib_errors[:3]}")
    return False, f"FAIL: {why}\n--- rank 0 output (tail) ---\n{tail}\n--- rank 1 (tail) ---\n" + \
        "\n".join(out1.splitlines()[-5:])


def register_hook_child(rank, world):
    """TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 (set by the parent): every allocator
    segment is registered with ncclCommRegister, and deregistered when freed."""
    dev = child_init(rank, world)
    bad = 0
    n = 1 << 18
    for i in range(3):
        t = torch.full((n,), float(rank + 1 + i), device=dev)
        dist.all_reduce(t)
        want = sum(r + 1 + i for r in range(world))
        if not torch.equal(t.cpu(), torch.full((n,), float(want))):
            bad += 1
        del t
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # frees the segments: the hook deregisters them
    dist.destroy_process_group()
    print(f"REGISTER-CHILD: allocator hook: 3 all_reduce, {bad} wrong", flush=True)
    os._exit(1 if bad else 0)


def device_multicast(dev):
    """CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED (132) of `dev` from the driver, or None."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(-1)
        ordinal = ctypes.c_int(torch.cuda.current_device() if dev is None else dev.index)
        handle = ctypes.c_int(0)
        if cuda.cuDeviceGet(ctypes.byref(handle), ordinal) != 0:
            return None
        if cuda.cuDeviceGetAttribute(ctypes.byref(v), 132, handle) != 0:
            return None
        return v.value
    except OSError:
        return None


def nccl_version_loaded():
    """ncclGetVersion of the libnccl.so.2 this process resolves (ringccl's when preloaded)."""
    try:
        v = ctypes.c_int(0)
        ctypes.CDLL(None).ncclGetVersion(ctypes.byref(v))
        return v.value
    except (AttributeError, OSError):
        pass
    try:
        # Not in the global scope (PyTorch's own libnccl.so.2): the version torch reports.
        major, minor, patch = torch.cuda.nccl.version()[:3]
        return major * 10000 + minor * 100 + patch
    except Exception:  # noqa: BLE001
        return None


def pool_all_reduce(rank, world, dev, backend, pool, what):
    """A tensor allocated in `pool`, the pool registered (register_mem_pool), an all_reduce
    on the tensor checked exactly, the pool deregistered; returns (ok, line)."""
    n = 1 << 18
    with torch.cuda.use_mem_pool(pool):
        t = torch.full((n,), float(rank + 1), device=dev)
    backend.register_mem_pool(pool)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    ok = torch.equal(t.cpu(), torch.full((n,), float(sum(r + 1 for r in range(world)))))
    if hasattr(backend, "deregister_mem_pool"):
        backend.deregister_mem_pool(pool)
    del t
    return ok, f"{what} registered: all_reduce {'ok' if ok else 'WRONG'}"


def register_pool_child(rank, world):
    """torch.cuda.MemPool registered with register_mem_pool: a pool on the process group's NCCL
    allocator (ncclMemAlloc), and a pool of PyTorch's own caching allocator (its segments
    registered with ncclCommRegister). Exits 0 with a SKIP line where this torch lacks the API.

    PyTorch's ProcessGroupNCCL::getMemAllocator raises "NCCL mem allocator is not supported in
    this NCCL version" when its supportsTensorAlloc(device) is false, before any ncclMemAlloc
    call: ncclGetVersion below 2.19, or (PyTorch 2.8 on) c10d::cuda::deviceSupportsMulticast
    false (CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, a property of the GPU and driver). With the
    library's version >= 2.19 and the device reporting no multicast, the NCCL-allocator pool is
    reported NOT APPLICABLE with that evidence (PyTorch's own NCCL meets the same refusal
    there); with multicast supported, the refusal is a failure."""
    dev = child_init(rank, world)
    try:
        backend = dist.group.WORLD._get_backend(dev)
    except Exception as e:  # noqa: BLE001
        print(f"REGISTER-CHILD: SKIP mem pool: no backend object ({e})", flush=True)
        os._exit(0)
    # `mem_allocator` is a property whose getter raises where torch refuses the allocator, so
    # its presence is asked of the type, not the object (hasattr would call the getter).
    if not (hasattr(type(backend), "mem_allocator") and hasattr(backend, "register_mem_pool")
            and hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
        print("REGISTER-CHILD: SKIP mem pool: this torch has no MemPool/register_mem_pool", flush=True)
        os._exit(0)
    good = True
    try:
        allocator = backend.mem_allocator
        pool = torch.cuda.MemPool(allocator)
        ok, line = pool_all_reduce(rank, world, dev, backend, pool, "mem pool (ncclMemAlloc)")
        good &= ok
        del pool
    except RuntimeError as e:
        msg = str(e).splitlines()[0][:200]
        mc, v = device_multicast(dev), nccl_version_loaded()
        if "mem allocator is not supported" in msg and mc == 0 and v is not None and v >= 21900:
            line = (f"mem pool (ncclMemAlloc) NOT APPLICABLE: torch {torch.__version__} refuses it before "
                    f"calling the library ({msg!r}): its supportsTensorAlloc needs multicast, and "
                    f"CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 0 on this GPU (ncclGetVersion = {v})")
        else:
            good = False
            line = f"mem pool (ncclMemAlloc) FAIL: {msg} (multicast attribute {mc}, ncclGetVersion {v})"
    print(f"REGISTER-CHILD: {line}", flush=True)
    # PyTorch's own caching allocator in a pool of its own, registered the same way.
    try:
        pool = torch.cuda.MemPool()
        ok, line = pool_all_reduce(rank, world, dev, backend, pool, "mem pool (caching allocator)")
        good &= ok
        del pool
    except Exception as e:  # noqa: BLE001 - reported as a failure
        good = False
        line = f"mem pool (caching allocator) FAIL: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    print(f"REGISTER-CHILD: {line}", flush=True)
    dist.destroy_process_group()
    os._exit(0 if good else 1)


def register_check():
    """Registration hooks (see the header): one line, PASS/FAIL (SKIP parts named)."""
    lines, ok = [], True
    for mode, env in (("register-hook", {"TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": "1"}),
                      ("register-pool", {})):
        out = child_job(mode, 2, env, timeout=120)
        lines += [l for l in out[0][1].splitlines() if l.startswith("REGISTER-CHILD")]
        if not all(rc == 0 for rc, _ in out):
            ok = False
            lines += [f"--- {mode} rank {r} exit {rc} ---\n" + "\n".join(o.splitlines()[-12:])
                      for r, (rc, o) in enumerate(out)]
    na = any("NOT APPLICABLE" in l for l in lines)
    status = "FAIL: " if not ok else ("PASS (one part NOT APPLICABLE, not passed): " if na else "PASS: ")
    return ok, status + " | ".join(lines)


def child_main(args):
    rank, world = args.child_rank, args.child_world
    if args.child == "watchdog":
        watchdog_child(rank, world)
    elif args.child == "register-hook":
        register_hook_child(rank, world)
    elif args.child == "register-pool":
        register_pool_child(rank, world)
    sys.exit(f"unknown child mode {args.child}")


def child_checks(rank, failures):
    """Rank 0 runs the watchdog and registration jobs (their own processes); the others wait."""
    lines = []
    if rank == 0:
        for name, f in (("watchdog", watchdog_check), ("register", register_check)):
            try:
                ok, line = f()
            except Exception as e:  # noqa: BLE001
                ok, line = False, f"FAIL: {type(e).__name__}: {e}"
            lines.append(f"{name}: {line}")
            if not ok:
                failures.append(f"{name}: {line.splitlines()[0]}")
    dist.barrier()
    return lines


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
    ap.add_argument("--skip-children", action="store_true", help="no watchdog/registration jobs")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-world", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    # Several ranks may share a GPU (under MPS): rank r uses GPU LOCAL_RANK % the GPUs seen.
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
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
    # PreMulSum and the child jobs last: a library that refuses them must not take the rest down.
    premul = premul_sum(rank, world, dev, results, failures)
    graphs = graph_capture(rank, world, dev, results, failures)
    fp8 = fp8_checks(rank, world, dev, results, failures)
    children = [] if args.skip_children else child_checks(rank, failures)
    torch.save({"lib": lib, "results": results, "failures": failures, "losses": losses, "params": params,
                "timing": rows, "p2p": p2p, "a2a": a2a, "groups": groups, "premul": premul, "graphs": graphs,
                "fp8": fp8, "children": children},
               os.path.join(args.out, f"rank{rank}.pt"))
    print(f"[rank {rank}] {lib}: {len(results)} results checked, {len(failures)} failed "
          f"({t1 - t0:.1f} s); DDP 50 steps loss {losses[0]:.4f} -> {losses[-1]:.4f} ({t2 - t1:.1f} s); "
          f"timing {t3 - t2:.1f} s; all_to_all: {a2a}; send/recv: {p2p}; sub-groups: {groups}", flush=True)
    for line in premul:
        print(f"[rank {rank}] premul {line}", flush=True)
    for line in graphs:
        print(f"[rank {rank}] graph {line}", flush=True)
    for line in fp8:
        print(f"[rank {rank}] fp8 {line}", flush=True)
    for line in children:
        print(f"[rank {rank}] {line}", flush=True)
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
