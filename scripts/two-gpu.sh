#!/usr/bin/env bash
# The two-GPU verification and side-by-side comparison with NCCL, in one run on a machine with
# two GPUs (no Rust needed there):
#   scripts/two-gpu.sh DIR [LIMIT_S]
# DIR holds release binaries built elsewhere: test-<name> (`cargo test --release -p
# ringccl-tests --no-run`, each copied as DIR/test-<name>), ringccl-perf (`cargo build --release
# -p ringccl-benches`), and libringccl_nccl.so (`cargo build --release -p nccl-abi`, the
# NCCL-compatible library, for the PyTorch steps). Steps whose binary is missing are skipped and
# named in the summary. Every step runs under a timeout; a step that would start after LIMIT_S
# seconds (default 1500) is skipped, so a hang cannot hold up the run. STEPS="name ..." runs
# only those steps. Logs and JSON go to $OUT (default /tmp/ringccl-two-gpu): <step>.log,
# <step>.json; a summary is printed last; the exit status is non-zero if a step failed.
#
# Steps (names as in the summary):
#   correctness: collectives (every one-process collective test, two-shot included), stress
#     (against NCCL), multi-process (one process per GPU), capture, split, premul, nccl-api,
#     ll, p2p-kernel, registered, driver-calls (the driver calls per call, counted by CUPTI:
#     RINGCCL_TEST_CUPTI names libcupti.so where it is not found),
#     reliability (scripts/reliability-run.sh, kill steps included), torch-check (the PyTorch
#     check through NCCL and through ringccl, same script and values)
#   one process, NCCL in the same process: perf1-f32, perf1-bf16, perf1-graph, perf1-twoshot
#   two processes, NCCL in the same processes: perf2, perf2-graph, perf2-small (--untracked,
#     with host_us), perf2-registered (--register); ringccl alone with its switches turned the
#     other way: perf2-no-ll (the LL kernels off), perf2-zero-copy (registered buffers read in
#     place), perf2-p2p-kernel (every transfer on the point-to-point kernel)
#   PyTorch: torch-allreduce-{nccl,ringccl}, torch-{ddp,fsdp2}-{nccl,ringccl} (alternated twice)
#   profile: ncu of the one-shot kernel (range replay)
# PROCS (default 2): processes of the test suites and the PyTorch checks.
# ONE_GPU=1 dry-runs the script on one GPU: the processes of a job share GPU 0 under MPS
# (started here, stopped at the end), NCCL is left out where it would put two ranks on one GPU
# (it refuses that), and the one-process steps that need two GPUs are skipped.
set -uo pipefail
D=$(cd "${1:?directory with the binaries}" && pwd)
LIMIT=${2:-1500}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/ringccl-two-gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# RINGCCL_TIMEOUT is left to the caller: the PyTorch check's child jobs keep one rank away
# from the default group for longer than a short timeout (every step has its own limit).
export NCCL_NVLS_ENABLE=0 RUST_BACKTRACE=1
ONE=${ONE_GPU:-0}
# cudarc looks for libnccl.so (not libnccl.so.2).
if ! ldconfig -p | grep -q 'libnccl\.so '; then
  lib=$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')
  if [ -n "$lib" ]; then
    mkdir -p /tmp/ncclso && ln -sf "$lib" /tmp/ncclso/libnccl.so
    export LD_LIBRARY_PATH=/tmp/ncclso:${LD_LIBRARY_PATH:-}
  fi
fi
SUMMARY=()
FAILED=0
T0=$SECONDS
MPS=0
if [ "$ONE" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if ! echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then
    nvidia-cuda-mps-control -d && MPS=1
  fi
fi
want() { [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" $1 "* ]]; }
# step NAME TIMEOUT CMD...: runs CMD under TIMEOUT seconds (the whole process group is killed).
step() {
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  want "$name" || return 0
  if [ $((SECONDS - T0)) -ge "$LIMIT" ]; then
    SUMMARY+=("$name: SKIPPED (time limit of $LIMIT s reached)")
    return 0
  fi
  echo "=== $name: $*" | tee -a "$OUT/steps.log"
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && FAILED=$((FAILED + 1))
  SUMMARY+=("$name: exit $rc, $((SECONDS - t0)) s; $(grep -E 'test result|passed|failed|wrong|step_ms|Avg bus' "$OUT/$name.log" | tail -n 2 | tr '\n' ' ' | cut -c1-240)")
}
skip() { want "$1" && SUMMARY+=("$1: SKIPPED ($2)"); return 0; }
have() { [ -x "$D/$1" ]; }
# ranks NAME TIMEOUT N CMD...: N processes of one job (RANK/WORLD_SIZE/MASTER_* as torchrun sets
# them), one GPU each, or all on GPU 0 with ONE_GPU=1.
ranks() {
  local name=$1 limit=$2 n=$3 port=$((29600 + RANDOM % 300)) r
  shift 3
  local cmd=("$@")
  step "$name" "$limit" bash -c '
    n=$1; port=$2; one=$3; shift 3; pids=()
    for ((r = 0; r < n; r++)); do
      lr=$r; [ "$one" = 1 ] && lr=0
      RANK=$r WORLD_SIZE=$n LOCAL_RANK=$lr LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=$port "$@" > >(sed "s/^/[rank $r] /") 2>&1 & pids+=($!)
    done
    rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; exit $rc' _ "$n" "$port" "$ONE" "${cmd[@]}"
}
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv >"$OUT/gpus.txt" 2>&1
nvidia-smi topo -m >>"$OUT/gpus.txt" 2>&1
if [ "$ONE" != 1 ] && [ "$NGPU" -lt 2 ]; then
  echo "this machine has $NGPU GPU(s); run with ONE_GPU=1 to dry-run on one" >&2
  exit 2
fi
T=(--include-ignored --test-threads=1 --nocapture)
P=${PROCS:-2}  # processes of the job steps (PROCS=4 on one GPU: four under MPS)

# 1. Correctness.
if [ "$ONE" = 1 ]; then
  skip collectives "needs two GPUs in one process"
  skip stress "needs two GPUs (NCCL refuses two ranks on one)"
else
  have test-collectives && step collectives 300 "$D/test-collectives" "${T[@]}"
  have test-stress && step stress 300 "$D/test-stress" "${T[@]}"
fi
# The suites of a job of processes: every test on two GPUs; on one GPU the tests of processes
# only (the others need two GPUs in one process).
for t in multi_process:every_collective_across_processes capture:captured_calls_replay_across_processes \
  split:split_across_processes premul:across_processes nccl_api:nccl_job_of_processes \
  ll:ll_all_reduce_across_processes p2p_kernel:p2p_groups_across_processes \
  registered:registered_buffers_across_processes driver_calls:driver_calls_per_call_across_processes; do
  bin=${t%%:*} filter=${t#*:} name=${bin//_/-}
  [ "$ONE" = 1 ] || filter=
  if have "test-$bin"; then
    step "$name" 240 env RINGCCL_TEST_PROCESSES=$P "$D/test-$bin" "${T[@]}" $filter
  else
    skip "$name" "no $D/test-$bin"
  fi
done
if want reliability; then
  step reliability 600 env ONE_GPU="$ONE" OUT="$OUT/reliability" bash "$HERE/reliability-run.sh" "$D" 590
fi
TORCHRUN=(python3 -m torch.distributed.run --nproc-per-node $P --master-port)
port() { echo $((29000 + RANDOM % 500)); }
if [ -f "$D/libringccl_nccl.so" ] && python3 -c 'import torch' 2>/dev/null; then
  LIB=$D/libringccl_nccl.so
  if [ "$ONE" = 1 ]; then
    skip torch-check-nccl "NCCL refuses two ranks on one GPU"
  else
    step torch-check-nccl 400 "${TORCHRUN[@]}" "$(port)" "$HERE/../nccl-abi/scripts/torch_check.py" --out "$OUT/torch-check-nccl.json"
  fi
  step torch-check-ringccl 400 env LD_PRELOAD="$LIB" "${TORCHRUN[@]}" "$(port)" "$HERE/../nccl-abi/scripts/torch_check.py" --out "$OUT/torch-check-ringccl.json"
else
  skip torch-check "no $D/libringccl_nccl.so or no torch"
fi

# 2. One process driving both GPUs, NCCL in the same process.
PERF=$D/ringccl-perf
COLLS=all_reduce,all_gather,reduce_scatter,broadcast,reduce,all_to_all,send_recv
if ! have ringccl-perf; then
  skip perf "no $D/ringccl-perf"
elif [ "$ONE" = 1 ]; then
  skip perf1 "one process needs two GPUs"
else
  step perf1-f32 500 "$PERF" --ngpus 2 -t "$COLLS" -d float -b 8 -e 1G -f 4 -n 20 -w 5 --no-progress --json "$OUT/perf1-f32.json"
  step perf1-bf16 300 "$PERF" --ngpus 2 -t all_reduce -d bfloat16 -b 8 -e 1G -f 4 -n 20 -w 5 --no-progress --json "$OUT/perf1-bf16.json"
  step perf1-graph 300 "$PERF" --ngpus 2 -t "$COLLS" -d float -b 8 -e 64M -f 8 -n 20 -w 5 -G 1 --no-progress --json "$OUT/perf1-graph.json"
  step perf1-twoshot 200 env RINGCCL_ALGO=twoshot "$PERF" --ngpus 2 -t all_gather,reduce_scatter,broadcast -d float -b 256K -e 32M -f 2 -n 20 -w 5 --no-progress --json "$OUT/perf1-twoshot.json"
fi

# 3. Two processes, one GPU each (NCCL in the same processes; ringccl alone on one GPU).
if have ringccl-perf; then
  L=both
  [ "$ONE" = 1 ] && L=ringccl
  ranks perf2 500 2 "$PERF" --procs 2 --lib $L -t "$COLLS" -d float -b 8 -e 1G -f 4 -n 50 -w 5 --no-progress --json "$OUT/perf2.json"
  ranks perf2-graph 300 2 "$PERF" --procs 2 --lib $L -t "$COLLS" -d float -b 8 -e 64M -f 8 -n 50 -w 5 -G 1 --no-progress --json "$OUT/perf2-graph.json"
  SMALL=(-t all_reduce,all_gather,reduce_scatter,broadcast,reduce,send_recv -d float -b 8 -e 64K -f 8 -n 200 -w 20 --untracked --no-progress)
  ranks perf2-small 200 2 "$PERF" --procs 2 --lib $L "${SMALL[@]}" --json "$OUT/perf2-small.json"
  ranks perf2-registered 200 2 "$PERF" --procs 2 --lib $L --register -t all_reduce,all_gather,reduce_scatter -d float -b 32K -e 16M -f 4 -n 50 -w 5 --untracked --no-progress --json "$OUT/perf2-registered.json"
  # ringccl's switches the other way: the LL kernels off (the small calls on one-shot and
  # two-shot), the peers' reads in place of registered buffers, and the point-to-point kernel
  # for every size (the default takes the copy engines above 1 MiB).
  ranks perf2-no-ll 200 2 env RINGCCL_LL_MAX_BYTES=0 "$PERF" --procs 2 --lib ringccl "${SMALL[@]}" --json "$OUT/perf2-no-ll.json"
  ranks perf2-zero-copy 200 2 env RINGCCL_ZERO_COPY_READS=1 "$PERF" --procs 2 --lib ringccl --register -t all_reduce -d float -b 32K -e 1M -f 2 -n 100 -w 10 --untracked --no-progress --json "$OUT/perf2-zero-copy.json"
  ranks perf2-p2p-kernel 200 2 env RINGCCL_P2P_KERNEL_MAX_BYTES=1G "$PERF" --procs 2 --lib ringccl -t send_recv -d float -b 256K -e 64M -f 2 -n 50 -w 5 --no-progress --json "$OUT/perf2-p2p-kernel.json"
fi

# 4. Through PyTorch, NCCL and ringccl alternated.
if [ -n "${LIB:-}" ]; then
  for i in 1 2; do
    for lib in nccl ringccl; do
      pre=()
      if [ "$lib" = ringccl ]; then
        pre=(env LD_PRELOAD="$LIB")
      elif [ "$ONE" = 1 ]; then
        continue
      fi
      step "torch-allreduce-$lib-$i" 200 "${pre[@]}" "${TORCHRUN[@]}" "$(port)" "$HERE/torch-nccl-allreduce.py"
      for mode in ddp fsdp2; do
        step "torch-$mode-$lib-$i" 300 "${pre[@]}" "${TORCHRUN[@]}" "$(port)" "$HERE/torch_step_time.py" --mode $mode --json "$OUT/torch-steps.json"
      done
    done
  done
fi

# 5. The one-shot kernel under ncu (range replay: the two ranks' kernels meet each other).
if have ringccl-perf && command -v ncu >/dev/null && [ "$ONE" != 1 ]; then
  step ncu-oneshot 300 ncu --replay-mode application --kernel-name regex:oneshot --launch-count 4 \
    --section SpeedOfLight --csv "$PERF" --ngpus 2 -t all_reduce -d float -b 64K -e 64K -n 4 -w 1 --lib ringccl --no-progress
else
  skip ncu-oneshot "needs ncu and two GPUs"
fi

[ "$MPS" = 1 ] && echo quit | nvidia-cuda-mps-control
echo
echo "=== summary ($((SECONDS - T0)) s, $NGPU GPU(s), ONE_GPU=$ONE)"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
[ "$FAILED" -eq 0 ] || { echo "=== $FAILED step(s) failed"; exit 1; }
