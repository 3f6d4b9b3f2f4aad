#!/usr/bin/env python3
"""A rank killed during DDP training: the other rank's process must end by itself, with
PyTorch's error, within its process group's timeout (no hang).

Launcher (what to run):
    python3 scripts/torch_kill_ddp.py --lib .../libringccl_nccl.so [--one-gpu] [--runs 3]
starts 2 worker processes of this script with torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and ringccl's library as libnccl.so.2 through
LD_PRELOAD; waits until both trained a few steps, kills rank 1 with SIGKILL at a random
moment of the loop, and checks rank 0's end:

* passed: rank 0 caught a torch.distributed error in the loop and exited by itself (code
  17), or PyTorch's watchdog took the process down on the communicator's error (SIGABRT
  after its "ProcessGroupNCCL" / "Watchdog" message: its default
  TORCH_NCCL_ASYNC_ERROR_HANDLING=3 tears the process down on an NCCL error), within the
  process group's timeout (20 s) + 10 s of the kill;
* failed: rank 0 still running then (a hang: it is killed), or any other end (another
  signal, a std::terminate without PyTorch's watchdog message, a clean exit without error).

The workers are not started by torchrun itself: its agent kills the surviving workers as
soon as one dies, which would hide whether rank 0 ends by itself. --one-gpu puts both ranks
on GPU 0 (processes sharing a GPU need MPS: nvidia-cuda-mps-control -d).
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import time

TIMEOUT_S = 20
SLACK_S = 10
CAUGHT = 17


def worker(args):
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", timeout=timedelta(seconds=TIMEOUT_S), device_id=dev)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).to(dev)
    ddp = DDP(model, device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(64, 1024, device=dev)
    t0 = time.time()
    step = 0
    try:
        while time.time() - t0 < 300:
            opt.zero_grad()
            loss = ddp(x).square().mean()
            loss.backward()
            opt.step()
            step += 1
            if step % 10 == 0:
                print(f"rank {rank}: step {step}, loss {loss.item():.6f}", flush=True)
            if step == 20:
                open(os.path.join(args.dir, f"rank{rank}.ready"), "w").close()
    except Exception as e:  # PyTorch's error for the communicator's failure
        print(f"rank {rank}: ERROR at step {step} at {time.time():.3f}: {type(e).__name__}: {e}", flush=True)
        try:
            dist.destroy_process_group()
        except Exception as e2:
            print(f"rank {rank}: destroy_process_group: {type(e2).__name__}: {e2}", flush=True)
        sys.stdout.flush()
        os._exit(CAUGHT)
    print(f"rank {rank}: no error within 300 s", flush=True)
    sys.exit(1)


def one_run(args, run):
    import tempfile

    d = tempfile.mkdtemp(prefix="ringccl-torch-kill-")
    port = 29500 + random.randrange(1000)
    procs, logs = [], []
    for r in range(2):
        env = dict(os.environ)
        env.update(
            RANK=str(r),
            WORLD_SIZE="2",
            LOCAL_RANK="0" if args.one_gpu else str(r),
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            LD_PRELOAD=args.lib,
        )
        log = open(os.path.join(d, f"rank{r}.log"), "w+")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", "--dir", d],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    t0 = time.time()
    while not all(os.path.exists(os.path.join(d, f"rank{r}.ready")) for r in range(2)):
        if time.time() - t0 > 180 or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            for log in logs:
                log.seek(0)
                print(log.read()[-3000:])
            return f"run {run}: the ranks did not start training"
        time.sleep(0.05)
    time.sleep(random.uniform(0.0, 2.0))
    procs[1].send_signal(signal.SIGKILL)
    killed = time.time()
    procs[1].wait()
    limit = TIMEOUT_S + SLACK_S
    try:
        rc = procs[0].wait(timeout=limit)
    except subprocess.TimeoutExpired:
        procs[0].kill()
        procs[0].wait()
        rc = None
    took = time.time() - killed
    logs[0].seek(0)
    text = logs[0].read()
    err = [l for l in text.splitlines() if "ERROR" in l or "Watchdog" in l or "NCCL" in l]
    print(f"run {run}: rank 1 killed; rank 0 ended after {took:.2f} s with {rc}")
    for l in err[-6:]:
        print("    " + l[:400])
    if rc is None:
        return f"run {run}: rank 0 still ran {limit} s after the kill (killed)"
    if rc == CAUGHT:
        return None
    if rc == -signal.SIGABRT and ("ProcessGroupNCCL" in text or "Watchdog" in text):
        print(f"run {run}: PyTorch's watchdog took rank 0 down on the communicator's error")
        return None
    print(text[-4000:])
    return f"run {run}: rank 0 ended with {rc}, not with PyTorch's error"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--dir")
    p.add_argument("--lib", help="ringccl's libnccl.so.2 (libringccl_nccl.so)")
    p.add_argument("--one-gpu", action="store_true", help="both ranks on GPU 0 (MPS)")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if not args.lib or not os.path.exists(args.lib):
        sys.exit("--lib: the path of ringccl's libnccl.so.2")
    args.lib = os.path.abspath(args.lib)
    failures = [f for f in (one_run(args, r) for r in range(args.runs)) if f]
    print(f"torch kill summary: {args.runs} kills, {len(failures)} failed")
    for f in failures:
        print("FAILED: " + f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
