#!/usr/bin/env bash
# One H200: reduce-scatter, all-gather, all-to-all, broadcast and reduce on the two-shot kernel's
# barriers, two and four processes sharing the GPU under MPS (correctness, and A/B against the
# ring through the scratch).
set -uo pipefail
B=${BUNDLE:?a folder with bin/ and tests/}
OUT=${OUT:-/tmp/out}
STAGE=${STAGE:-all}
mkdir -p "$OUT"
export RUST_BACKTRACE=1 NCCL_NVLS_ENABLE=0 RINGCCL_TIMEOUT=30
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
nvidia-smi --query-gpu=driver_version,name --format=csv >> "$OUT/gpus.txt" 2>&1
nproc >> "$OUT/gpus.txt"
UCX=(UCX_TLS=tcp UCX_NET_DEVICES=lo)
SUMMARY=()
T0=$SECONDS
step() { # name timeout cmd...
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  if [ $((SECONDS - T0 + limit)) -gt "${BUDGET:-560}" ]; then
    limit=$(( ${BUDGET:-560} - (SECONDS - T0) ))
    if [ "$limit" -lt 10 ]; then echo "=== $name: SKIPPED (time)" | tee -a "$OUT/steps.log"; SUMMARY+=("$name: SKIPPED (time)"); return; fi
  fi
  echo "=== $name: $*" | tee -a "$OUT/steps.log"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  tail -n 4 "$OUT/$name.log"
  SUMMARY+=("$name: exit $rc, $((SECONDS - t0)) s; $(grep -E 'test result|wrong elements|mismatches|passed' "$OUT/$name.log" | tail -n 3 | tr '\n' ' ' | cut -c1-300)")
}
P=$B/bin/bin-ringccl-perf
has() { [ "$STAGE" = all ] || [[ ",$STAGE," == *",$1,"* ]]; }
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS started" | tee -a "$OUT/steps.log"
MP=($B/tests/test-multi_process --include-ignored --nocapture --test-threads=1)
if has suite; then
  step h-kernels 60 $B/tests/test-kernels --include-ignored --test-threads=1
  step h-suite 150 env RINGCCL_TEST_PROCESSES=2 "${MP[@]}" every_collective_across_processes
  step h-two 150 env RINGCCL_TEST_PROCESSES=2 RINGCCL_ALGO=twoshot "${MP[@]}" every_collective_across_processes
  step h-ring 150 env RINGCCL_TEST_PROCESSES=2 RINGCCL_ALGO=ring "${MP[@]}" every_collective_across_processes
  step h-four 150 env RINGCCL_TEST_PROCESSES=4 "${MP[@]}" every_collective_across_processes
  step h-four-two 150 env RINGCCL_TEST_PROCESSES=4 RINGCCL_ALGO=twoshot "${MP[@]}" every_collective_across_processes
  step h-machines 150 env "${UCX[@]}" "${MP[@]}" every_collective_across_two_machines
fi
two_on_one() { # name env...: two processes on GPU 0
  local name=$1 port=$((29700 + RANDOM % 200)); shift
  echo "=== $name: 2 processes on GPU 0 (MPS), env $*: ringccl-perf --procs 2 ${PA[*]}" | tee -a "$OUT/steps.log"
  for r in 0 1; do
    env RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" \
      timeout 100 $P --procs 2 "${PA[@]}" --json "$OUT/$name.json" > "$OUT/$name-r$r.log" 2>&1 &
  done
  wait; tail -n 30 "$OUT/$name-r0.log"; SUMMARY+=("$name: done")
}
if has perf; then
  PA=(--lib ringccl -t reduce_scatter,all_gather,all_to_all,broadcast,reduce -d float -b 64K -e 64M -f 2 -n 50 -w 5 --no-progress)
  for i in 1 2; do
    two_on_one p-twoshot-$i RINGCCL_ALGO=twoshot
    two_on_one p-ring-$i RINGCCL_ALGO=ring
  done
  PA=(--lib ringccl -t reduce_scatter,reduce -d bfloat16 -b 64K -e 16M -f 4 -n 50 -w 5 --no-progress)
  two_on_one p-bf16-twoshot RINGCCL_ALGO=twoshot
  two_on_one p-bf16-ring RINGCCL_ALGO=ring
  PA=(--lib ringccl -t all_reduce,all_gather,broadcast -d float -b 8 -e 4M -f 8 -n 50 -w 5 --no-progress)
  two_on_one p-default DEFAULTS=1
  PA=(--lib ringccl -t all_reduce -d float,bfloat16 -b 16K -e 1M -f 2 -n 100 -w 10 --no-progress)
  for i in 1 2; do
    two_on_one p-ar-default-$i DEFAULTS=1
    two_on_one p-ar-twoshot-$i RINGCCL_ONESHOT_MAX_BYTES=8192
  done
fi
echo quit | nvidia-cuda-mps-control
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
echo "total $((SECONDS - T0)) s" | tee -a "$OUT/summary.txt"
tar -C "$OUT" -czf /tmp/all.tgz . && mv /tmp/all.tgz "$OUT/all.tgz"
