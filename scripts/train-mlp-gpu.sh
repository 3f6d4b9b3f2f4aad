#!/usr/bin/env bash
# Runs the train_mlp measurements on a machine with 2 GPUs, in one call: the equality checks in
# both process modes, the step times (overlap / all-reduce after backward / no communication) in
# both process modes, and the PyTorch DistributedDataParallel anchor with torchrun.
#   scripts/train-mlp-gpu.sh DIR     DIR holds train_mlp, ringccl-run and ddp_mlp_torch.py
# Logs go to $OUT (default /tmp/train-mlp-out): one <step>.log per step, steps.log (the
# commands), the loss plot and CSV; a summary of the step times is printed last.
set -uo pipefail
D=${1:?directory with train_mlp, ringccl-run and ddp_mlp_torch.py}
OUT=${OUT:-/tmp/train-mlp-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
# cuBLAS for train_mlp: the CUDA toolkit's, else the one PyTorch's wheels bring.
if ! ldconfig -p | grep -q 'libcublas\.so\.13'; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
      "$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null)"; do
    if [ -n "$d" ] && [ -e "$d/libcublas.so.13" ]; then
      export LD_LIBRARY_PATH=$d:${LD_LIBRARY_PATH:-}
      break
    fi
  done
fi
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" >"$OUT/env.txt"
nvidia-smi >"$OUT/gpus.txt" 2>&1
nvidia-smi topo -m >>"$OUT/gpus.txt" 2>&1
T="$D/train_mlp"
RUN="$D/ringccl-run"
step() { # name timeout cmd...
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "=== $name: $*" | tee -a "$OUT/steps.log"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "--- $name: exit $rc, $((SECONDS - t0)) s" | tee -a "$OUT/steps.log"
  tail -n 4 "$OUT/$name.log"
}
STEPS=110
WARM=10
# In order of importance, each under its own timeout.
# 1. Checks in one process: bit-identical parameters on every rank, and single-GPU training on
#    the combined batch; the loss plot.
step check-1proc 60 "$T" --steps 200 --check --plot "$OUT/loss.svg" --csv "$OUT/loss.csv" --print-every 10
# 2. Step times, one process per GPU (as PyTorch DDP runs), and the PyTorch anchor.
step time-2proc-overlap 30 "$RUN" -n 2 "$T" --steps $STEPS --warmup $WARM --comm overlap --print-every 1000
step torch-ddp 90 torchrun --nproc-per-node 2 "$D/ddp_mlp_torch.py" --steps $STEPS --warmup $WARM --comm ddp
step torch-none 90 torchrun --nproc-per-node 2 "$D/ddp_mlp_torch.py" --steps $STEPS --warmup $WARM --comm none
step time-2proc-after 30 "$RUN" -n 2 "$T" --steps $STEPS --warmup $WARM --comm after --print-every 1000
step time-2proc-none 30 "$RUN" -n 2 "$T" --steps $STEPS --warmup $WARM --comm none --print-every 1000
# 3. The checks one process per GPU (with a pre-scaled sum instead of the average).
step check-2proc 60 "$RUN" -n 2 "$T" --steps 60 --check --reduction sum --print-every 10
# 4. Step times with one process for both GPUs.
for m in overlap after none; do
  step "time-1proc-$m" 30 "$T" --steps $STEPS --warmup $WARM --comm $m --print-every 1000
done
# 5. The peer-block cap of ringccl's all-reduce under a concurrent GEMM, and repeats (noise).
step time-2proc-overlap-b16 30 env RINGCCL_PEER_BLOCKS=16 RINGCCL_PEER_DUPLEX_BLOCKS=16 "$RUN" -n 2 "$T" --steps $STEPS --warmup $WARM --comm overlap --print-every 1000
step time-2proc-overlap-again 30 "$RUN" -n 2 "$T" --steps $STEPS --warmup $WARM --comm overlap --print-every 1000
step torch-ddp-again 90 torchrun --nproc-per-node 2 "$D/ddp_mlp_torch.py" --steps $STEPS --warmup $WARM --comm ddp
echo "=== summary"
grep -h "step time\|bit-identical\|combined batch\|error" "$OUT"/*.log | sort | uniq | tee "$OUT/summary.txt"
