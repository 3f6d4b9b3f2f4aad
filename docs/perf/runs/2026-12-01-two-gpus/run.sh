#!/usr/bin/env bash
# 2 x H200: network side by side with NCCL sockets, rank threads, ncu, machines under MPS.
set -uo pipefail
B=${BUNDLE:?a folder with bin/ and tests/}
OUT=${OUT:-/tmp/out}
STAGE=${STAGE:-all}
mkdir -p "$OUT"
export RUST_BACKTRACE=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
nvidia-smi --query-gpu=driver_version,name --format=csv >> "$OUT/gpus.txt" 2>&1
nvidia-smi topo -m >> "$OUT/gpus.txt" 2>&1
nproc >> "$OUT/gpus.txt"; ucx_info -v >> "$OUT/gpus.txt" 2>&1
if ! ldconfig -p | grep 'libnccl\.so ' >/dev/null; then
  lib=$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')
  mkdir -p /tmp/ncclso && ln -sf "$lib" /tmp/ncclso/libnccl.so
  export LD_LIBRARY_PATH=/tmp/ncclso:${LD_LIBRARY_PATH:-}
  echo "nccl: $lib" >> "$OUT/gpus.txt"
fi
UCX=(UCX_TLS=tcp UCX_NET_DEVICES=lo)
FORCED=(RINGCCL_NET=ucx RINGCCL_P2P_DISABLE=1)
NCCL_SOCKETS=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo)
SUMMARY=()
T0=$SECONDS
step() { # name timeout cmd...
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  if [ $((SECONDS - T0 + limit)) -gt "${BUDGET:-540}" ]; then
    limit=$(( ${BUDGET:-540} - (SECONDS - T0) ))
    if [ "$limit" -lt 10 ]; then echo "=== $name: SKIPPED (time)" | tee -a "$OUT/steps.log"; SUMMARY+=("$name: SKIPPED (time)"); return; fi
  fi
  echo "=== $name: $*" | tee -a "$OUT/steps.log"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  tail -n 4 "$OUT/$name.log"
  SUMMARY+=("$name: exit $rc, $((SECONDS - t0)) s; $(grep -E 'test result|wrong elements|mismatches|passed|stress:' "$OUT/$name.log" | tail -n 3 | tr '\n' ' ' | cut -c1-300)")
}
P=$B/bin/bin-ringccl-perf
R=$B/bin/bin-ringccl-run
has() { [ "$STAGE" = all ] || [[ ",$STAGE," == *",$1,"* ]]; }
if has net; then
  step net-coll 300 env "${FORCED[@]}" "${UCX[@]}" "${NCCL_SOCKETS[@]}" $R -n 2 $P --procs 2 \
    -t all_reduce,all_gather,reduce_scatter,broadcast,reduce,all_to_all,send_recv -d float -b 1M -e 256M -f 4 -n 10 -w 3 --no-progress --json "$OUT/net-coll.json"
  step net-small 200 env "${FORCED[@]}" "${UCX[@]}" "${NCCL_SOCKETS[@]}" $R -n 2 $P --procs 2 \
    -t all_reduce,broadcast,all_gather -d float -b 128K -e 4M -f 2 -n 30 -w 5 --no-progress --json "$OUT/net-small.json"
  step net-trace 120 env "${FORCED[@]}" "${UCX[@]}" RINGCCL_DEBUG=trace $R -n 2 $P --procs 2 --lib ringccl \
    -t all_reduce,broadcast -d float -b 1M -e 1M -n 20 -w 3 --no-progress
  step net-p2p 200 env "${UCX[@]}" $B/tests/test-net --include-ignored --nocapture net_p2p_across_two_processes
  step net-multi-process 240 env "${FORCED[@]}" "${UCX[@]}" $B/tests/test-multi_process \
    --include-ignored --nocapture --test-threads=1 every_collective_across_processes
fi
if has rt; then
  step rt-tests 200 env RINGCCL_RANK_THREADS=1 $B/tests/test-collectives --include-ignored --test-threads=1 all_reduce oneshot
  step rt-stress 90 env RINGCCL_RANK_THREADS=1 $B/tests/test-stress --include-ignored --nocapture
  for i in 1 2; do
    step small-default-$i 60 $P -t all_reduce -d float -b 8 -e 256K -f 4 -n 200 -w 20 --no-progress --json "$OUT/small-default-$i.json"
    step small-rt-$i 60 env RINGCCL_RANK_THREADS=1 $P -t all_reduce -d float -b 8 -e 256K -f 4 -n 200 -w 20 --no-progress --json "$OUT/small-rt-$i.json"
    step small-untracked-$i 60 $P --untracked -t all_reduce -d float -b 8 -e 256K -f 4 -n 200 -w 20 --no-progress --json "$OUT/small-untracked-$i.json"
    step small-rt-untracked-$i 60 env RINGCCL_RANK_THREADS=1 $P --untracked -t all_reduce -d float -b 8 -e 256K -f 4 -n 200 -w 20 --no-progress --json "$OUT/small-rt-untracked-$i.json"
  done
  step procs-small 90 $R -n 2 $P --procs 2 -t all_reduce -d float -b 8 -e 1M -f 4 -n 100 -w 10 --no-progress --json "$OUT/procs-small.json"
fi
if has two; then
  export RINGCCL_TIMEOUT=30
  step two-suite 200 $B/tests/test-collectives --include-ignored --test-threads=1
  step two-forced 120 env RINGCCL_ALGO=twoshot $B/tests/test-collectives --include-ignored --test-threads=1 all_reduce
  step two-stress 90 $B/tests/test-stress --include-ignored --nocapture
  AR=(-t all_reduce -d float,bfloat16 -b 256K -e 32M -f 2 -n 50 -w 10 --no-progress)
  for i in 1 2; do
    step two-default-$i 90 $P "${AR[@]}" --json "$OUT/two-default-$i.json"
    step two-ring-$i 90 env RINGCCL_TWOSHOT_MAX_BYTES=0 $P "${AR[@]}" --json "$OUT/two-ring-$i.json"
  done
  step two-large 90 env RINGCCL_ALGO=twoshot $P --lib ringccl -t all_reduce -d float -b 8M -e 256M -f 2 -n 20 -w 5 --no-progress --json "$OUT/two-large.json"
  step two-procs 60 $R -n 2 $P --procs 2 -t all_reduce -d float -b 8 -e 1M -f 8 -n 50 -w 5 --no-progress --json "$OUT/two-procs.json"
fi
if has procs2; then
  export RINGCCL_TIMEOUT=30
  step p2-suite 150 $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step p2-forced 150 env RINGCCL_ALGO=twoshot $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step p2-inproc-forced 120 $B/tests/test-collectives --include-ignored --test-threads=1 --nocapture all_reduce_two_shot
  PA=(-t all_reduce -d float,bfloat16 -b 256K -e 32M -f 2 -n 30 -w 5 --no-progress)
  for i in 1 2; do
    step p2-default-$i 90 $R -n 2 $P --procs 2 "${PA[@]}" --json "$OUT/p2-default-$i.json"
    step p2-ring-$i 90 env RINGCCL_TWOSHOT_MAX_BYTES=0 $R -n 2 $P --procs 2 "${PA[@]}" --json "$OUT/p2-ring-$i.json"
  done
  step p2-small 60 $R -n 2 $P --procs 2 -t all_reduce -d float -b 8 -e 256K -f 8 -n 100 -w 10 --no-progress --json "$OUT/p2-small.json"
fi
if has mps1; then
  export RINGCCL_TIMEOUT=30 CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "MPS started" | tee -a "$OUT/steps.log"
  step m1-suite 150 env RINGCCL_TEST_PROCESSES=2 $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step m1-forced 150 env RINGCCL_TEST_PROCESSES=2 RINGCCL_ALGO=twoshot $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step m1-oneshot 150 env RINGCCL_TEST_PROCESSES=2 RINGCCL_ALGO=oneshot $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step m1-four 150 env RINGCCL_TEST_PROCESSES=4 $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step m1-machines 150 env "${UCX[@]}" $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_two_machines
  PA=(--lib ringccl -t all_reduce -d float -b 256K -e 32M -f 2 -n 30 -w 5 --no-progress)
  two_on_one() { # name env...: two processes on GPU 0
    local name=$1 port=$((29700 + RANDOM % 200)); shift
    echo "=== $name: 2 processes on GPU 0 (MPS), env $*: ringccl-perf --procs 2 ${PA[*]}" | tee -a "$OUT/steps.log"
    for r in 0 1; do
      env RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" \
        timeout 80 $P --procs 2 "${PA[@]}" --json "$OUT/$name.json" > "$OUT/$name-r$r.log" 2>&1 &
    done
    wait; tail -n 12 "$OUT/$name-r0.log"; SUMMARY+=("$name: done")
  }
  two_on_one m1-default DEFAULTS=1
  two_on_one m1-ring RINGCCL_TWOSHOT_MAX_BYTES=0
  PA=(--lib ringccl -t all_reduce -d float -b 8 -e 256K -f 8 -n 200 -w 20 --no-progress)
  two_on_one m1-small DEFAULTS=1
  echo quit | nvidia-cuda-mps-control
fi
if has ab; then
  export RINGCCL_TIMEOUT=30 CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "MPS started" | tee -a "$OUT/steps.log"
  step ab-suite 150 env RINGCCL_TEST_PROCESSES=2 $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step ab-oneshot 150 env RINGCCL_TEST_PROCESSES=2 RINGCCL_ALGO=oneshot $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  ab_run() { # name perf-binary
    local name=$1 bin=$2 port=$((29700 + RANDOM % 200))
    echo "=== $name: 2 processes on GPU 0 (MPS): $bin --procs 2 ${PA[*]}" | tee -a "$OUT/steps.log"
    for r in 0 1; do
      env RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        timeout 80 $bin --procs 2 "${PA[@]}" --json "$OUT/$name.json" > "$OUT/$name-r$r.log" 2>&1 &
    done
    wait; tail -n 10 "$OUT/$name-r0.log"; SUMMARY+=("$name: done")
  }
  PA=(--lib ringccl -t all_reduce -d float -b 8 -e 256K -f 8 -n 200 -w 20 --no-progress)
  for i in 1 2 3; do
    ab_run ab-kernel-$i $P
    ab_run ab-memcpy-$i $B/bin/bin-ringccl-perf-memcpy
  done
  echo quit | nvidia-cuda-mps-control
fi
if has final; then
  export RINGCCL_TIMEOUT=30
  step f-suite 200 $B/tests/test-collectives --include-ignored --test-threads=1 --nocapture
  step f-stress 60 $B/tests/test-stress --include-ignored --nocapture
  step f-procs 120 $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step f-procs-two 120 env RINGCCL_ALGO=twoshot $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step f-two 60 $P -t all_reduce -d float,bfloat16 -b 256K -e 32M -f 2 -n 50 -w 10 --no-progress --json "$OUT/f-two.json"
  for i in 1 2; do
    step f-procs-ar-$i 90 $R -n 2 $P --procs 2 -t all_reduce -d float,bfloat16 -b 8 -e 32M -f 4 -n 50 -w 10 --no-progress --json "$OUT/f-procs-ar-$i.json"
  done
  step f-small 60 $P -t all_reduce -d float -b 8 -e 256K -f 8 -n 200 -w 20 --no-progress --json "$OUT/f-small.json"
fi
if has last1; then
  export RINGCCL_TIMEOUT=30 CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "MPS started" | tee -a "$OUT/steps.log"
  step l-suite 150 env RINGCCL_TEST_PROCESSES=2 $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step l-two 150 env RINGCCL_TEST_PROCESSES=2 RINGCCL_ALGO=twoshot $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step l-one 150 env RINGCCL_TEST_PROCESSES=2 RINGCCL_ALGO=oneshot $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step l-four 150 env RINGCCL_TEST_PROCESSES=4 $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step l-machines 150 env "${UCX[@]}" $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_two_machines
  PA=(--lib ringccl -t all_reduce -d float -b 8 -e 32M -f 8 -n 100 -w 10 --no-progress)
  ab_run2() { # name
    local name=$1 port=$((29700 + RANDOM % 200))
    echo "=== $name: 2 processes on GPU 0 (MPS): ringccl-perf --procs 2 ${PA[*]}" | tee -a "$OUT/steps.log"
    for r in 0 1; do
      env RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        timeout 80 $P --procs 2 "${PA[@]}" --json "$OUT/$name.json" > "$OUT/$name-r$r.log" 2>&1 &
    done
    wait; tail -n 10 "$OUT/$name-r0.log"; SUMMARY+=("$name: done")
  }
  ab_run2 l-perf
  echo quit | nvidia-cuda-mps-control
fi
if has netab; then
  export RINGCCL_TIMEOUT=30 CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "MPS started" | tee -a "$OUT/steps.log"
  step n-suite 150 env RINGCCL_TEST_PROCESSES=2 "${FORCED[@]}" "${UCX[@]}" $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_processes
  step n-machines 150 env "${UCX[@]}" $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_two_machines
  PA=(--lib ringccl -t all_reduce,broadcast,all_gather,send_recv -d float -b 64K -e 2M -f 2 -n 30 -w 5 --no-progress)
  net_run() { # name perf-binary
    local name=$1 bin=$2 port=$((29700 + RANDOM % 200))
    echo "=== $name: 2 processes on GPU 0 (MPS), every pair on UCX: $bin --procs 2 ${PA[*]}" | tee -a "$OUT/steps.log"
    for r in 0 1; do
      env RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "${FORCED[@]}" "${UCX[@]}" \
        timeout 100 $bin --procs 2 "${PA[@]}" --json "$OUT/$name.json" > "$OUT/$name-r$r.log" 2>&1 &
    done
    wait; SUMMARY+=("$name: done")
  }
  for i in 1 2; do
    net_run n-old-$i $B/bin/bin-ringccl-perf-old
    net_run n-new-$i $B/bin/bin-ringccl-perf-new
  done
  echo quit | nvidia-cuda-mps-control
fi
if has ncu; then
  NCU=(ncu --clock-control none --set full)
  step ncu-ring 150 env RINGCCL_ALGO=ring "${NCU[@]}" -k regex:ringccl_reduce_copy -c 2 $P --lib ringccl -t all_reduce -d float -b 256M -e 256M -n 1 -w 0 -c 0 --no-progress
  step ncu-ce 150 "${NCU[@]}" -k regex:ringccl_ -c 3 $P --lib ringccl -t all_reduce -d float -b 256M -e 256M -n 1 -w 0 -c 0 --no-progress
  step ncu-oneshot 60 "${NCU[@]}" -k regex:oneshot -c 2 $P --lib ringccl -t all_reduce -d float -b 64K -e 64K -n 1 -w 0 -c 0 --no-progress
fi
if has mps; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "MPS started" | tee -a "$OUT/steps.log"
  step machines 200 env "${UCX[@]}" $B/tests/test-multi_process --include-ignored --nocapture --test-threads=1 every_collective_across_two_machines
  echo quit | nvidia-cuda-mps-control
fi
echo
echo "=== summary ($((SECONDS - T0)) s)"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz . && find . -type f ! -name all.tgz ! -name summary.txt -delete; ls -la "$OUT"
