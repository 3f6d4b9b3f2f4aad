#!/usr/bin/env bash
# The network transport on a GPU machine, from a bundle built by `cargo xtask gpu-bundle`: two
# processes, their traffic forced through UCX over loopback TCP; then four processes as two
# machines (CUDA IPC inside a machine, UCX across, hierarchical collectives).
#   scripts/gpu-net.sh BUNDLE
# Needs UCX's libucp.so.0 (system libucx0, or a wheel's lib directory on LD_LIBRARY_PATH) and
# NCCL for the side-by-side step (as scripts/gpu-run.sh finds it). Logs go to $OUT (default
# /tmp/ringccl-out): net-<step>.log, net-sendrecv.json, net-allreduce.json; a summary is printed last, and the script
# exits non-zero if a step failed.
set -uo pipefail
B=${1:?bundle dir}
OUT=${OUT:-/tmp/ringccl-out}
mkdir -p "$OUT"
export RUST_BACKTRACE=1
# cudarc looks for libnccl.so (not libnccl.so.2).
if ! ldconfig -p | grep 'libnccl\.so ' >/dev/null; then
  lib=$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')
  [ -z "$lib" ] && lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  if [ -n "$lib" ]; then
    mkdir -p /tmp/ncclso && ln -sf "$lib" /tmp/ncclso/libnccl.so
    export LD_LIBRARY_PATH=/tmp/ncclso:${LD_LIBRARY_PATH:-}
  fi
fi
UCX=(UCX_TLS=tcp UCX_NET_DEVICES=lo)
NCCL_SOCKETS=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo)
SUMMARY=()
FAILED=0
step() { # name timeout-seconds cmd...
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "=== net-$name: $*" | tee -a "$OUT/steps.log"
  timeout "$limit" "$@" >"$OUT/net-$name.log" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && FAILED=$((FAILED + 1))
  tail -n 8 "$OUT/net-$name.log"
  SUMMARY+=("net-$name: exit $rc, $((SECONDS - t0)) s; $(grep -E 'test result|wrong' "$OUT/net-$name.log" | tail -n 2 | tr '\n' ' ' | cut -c1-200)")
}
# 1. The CPU tests of the transport against this machine's UCX (threads and processes).
step cpu 300 env RINGCCL_REQUIRE_UCX=1 "$B/tests/lib-ringccl" transport::net --include-ignored --test-threads=1
# 2. The executor on CUDA streams: 1 B to 64 MiB each way between two processes.
step gpu-p2p 400 env "${UCX[@]}" "$B/tests/test-net" --include-ignored --nocapture net_p2p_across_two_processes
# 3. The multi-process suite with every pair through the network.
FORCED=(RINGCCL_NET=ucx RINGCCL_P2P_DISABLE=1)
step multi-process 600 env "${FORCED[@]}" "${UCX[@]}" "$B/tests/test-multi_process" \
  --include-ignored --nocapture --test-threads=1 every_collective_across_processes
# 3b. Four processes as two machines of two ranks (RINGCCL_HOST_ID per rank, set by the test):
#     CUDA IPC inside a machine, UCX across, hierarchical collectives. Four processes on fewer
#     than four GPUs need the MPS daemon (nvidia-cuda-mps-control -d), or their kernels take
#     turns and the job crawls: without either, the step is skipped and says so.
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -ge 4 ] || pgrep -x nvidia-cuda-mps >/dev/null; then
  step machines 600 env "${UCX[@]}" "$B/tests/test-multi_process" \
    --include-ignored --nocapture --test-threads=1 every_collective_across_two_machines
else
  echo "=== net-machines: SKIPPED ($gpus GPUs and no MPS daemon)" | tee -a "$OUT/steps.log"
  SUMMARY+=("net-machines: SKIPPED, not run ($gpus GPUs and no MPS daemon)")
fi
# 4. Side by side: ringccl's ring shift and all-reduce through UCX, NCCL's through its socket
#    transport, in the same two processes.
step sendrecv 600 env "${FORCED[@]}" "${UCX[@]}" "${NCCL_SOCKETS[@]}" "$B/bin/bin-ringccl-run" -n 2 \
  "$B/bin/bin-ringccl-perf" --procs 2 -t send_recv -d float -b 1K -e 256M -f 4 -n 10 -w 3 \
  --no-progress --json "$OUT/net-sendrecv.json"
step allreduce 600 env "${FORCED[@]}" "${UCX[@]}" "${NCCL_SOCKETS[@]}" "$B/bin/bin-ringccl-run" -n 2 \
  "$B/bin/bin-ringccl-perf" --procs 2 -t all_reduce -d float -b 1K -e 256M -f 4 -n 10 -w 3 \
  --no-progress --json "$OUT/net-allreduce.json"
echo
echo "=== summary"
printf '%s\n' "${SUMMARY[@]}"
exit $((FAILED > 0))
