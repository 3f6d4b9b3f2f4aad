#!/usr/bin/env bash
# Runs the reliability suite, the stress test, the collective and multi-process suites and the
# sanitizer runs on a GPU machine, from release test binaries built elsewhere
# (`cargo test --release -p ringccl-tests --no-run`, copied as DIR/test-<name>).
#   scripts/reliability-run.sh DIR [LIMIT_S]
# Every step runs under a timeout, and the whole run under a time limit of LIMIT_S seconds
# (default 280): a step that would start after it is skipped and named in the summary, so a
# hang cannot hold up the run. STEPS="name ..." runs only those steps, in that order
# (names as in the summary). Logs go to $OUT (default /tmp/ringccl-reliability), one
# <step>.log per step, re-packed into $OUT/logs.tar.gz after each step; a summary is printed
# last, and the script exits non-zero if a step failed.
# ONE_GPU=1: the processes of a job share one GPU: the script starts MPS
# (nvidia-cuda-mps-control -d, pipes in /tmp/mps-pipe, logs in /tmp/mps-log) unless it runs,
# stops it at the end if it started it, and the multi-process steps run RINGCCL_TEST_PROCESSES
# processes on GPU 0. The kill steps (kill-2, kill-4, kill-init, kill-exit: 52 kills in all,
# about 2.5 min) kill one rank of each job and print one summary line each with the kills made
# and the slowest time to error; KILL_TIMEOUT (default 3) is their RINGCCL_TIMEOUT. Their jobs
# run one at a time (RINGCCL_KILL_PARALLEL, default 1): jobs that share a GPU (always, on one
# GPU) each size their kernels' grids as if alone there, and one job's spinning blocks can hold
# the SMs another's need to meet at their barriers (timeouts with no death at all).
set -uo pipefail
D=${1:?directory with the test binaries}
LIMIT=${2:-280}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/ringccl-reliability}
mkdir -p "$OUT/logs"
export NCCL_NVLS_ENABLE=0
export RUST_BACKTRACE=1
if ! ldconfig -p | grep -q 'libnccl\.so '; then
  lib=$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')
  if [ -n "$lib" ]; then
    mkdir -p /tmp/ncclso && ln -sf "$lib" /tmp/ncclso/libnccl.so
    export LD_LIBRARY_PATH=/tmp/ncclso:${LD_LIBRARY_PATH:-}
  fi
fi
SUMMARY=()
FAILED=0
MPS_STARTED=0
if [ "${ONE_GPU:-0}" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if ! echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then
    nvidia-cuda-mps-control -d && MPS_STARTED=1 && echo "MPS started (pipes in $CUDA_MPS_PIPE_DIRECTORY)"
  fi
  export RINGCCL_TEST_PROCESSES=${RINGCCL_TEST_PROCESSES:-2}
fi
stop_mps() {
  if [ "$MPS_STARTED" = 1 ]; then
    cp "$CUDA_MPS_LOG_DIRECTORY"/*.log "$OUT/logs/" 2>/dev/null
    echo quit | nvidia-cuda-mps-control && MPS_STARTED=0 && echo "MPS stopped"
  fi
}
trap stop_mps EXIT
# PACK_TO (optional): a directory that also gets the packed logs after each step.
pack() {
  tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs 2>/dev/null
  [ -n "${PACK_TO:-}" ] && cp "$OUT/logs.tar.gz" "$PACK_TO/" 2>/dev/null
  return 0
}
step() { # name limit cmd...
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  if [ $((SECONDS + 5)) -ge "$LIMIT" ]; then
    SUMMARY+=("$name: skipped (the run's time limit of $LIMIT s was reached)")
    return
  fi
  [ $((SECONDS + limit)) -gt "$LIMIT" ] && limit=$((LIMIT - SECONDS))
  echo "=== $name (<= $limit s): $*" | tee -a "$OUT/logs/steps.log"
  timeout "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && FAILED=$((FAILED + 1))
  tail -n 4 "$OUT/logs/$name.log"
  SUMMARY+=("$name: exit $rc, $((SECONDS - t0)) s; $(grep -E 'test result|stress:|ERROR SUMMARY|every sanitizer|us per call|kill summary' "$OUT/logs/$name.log" | tail -n 2 | tr '\n' ' ' | cut -c1-220)")
  pack
}
nvidia-smi --query-gpu=index,name,driver_version --format=csv >"$OUT/logs/gpus.txt" 2>&1
R="$D/test-reliability"
T=(--include-ignored --test-threads=1 --nocapture --exact)
run_step() {
  case $1 in
    late-peer) step late-peer 30 "$R" "${T[@]}" a_late_peer_times_out_and_the_gpus_stay_usable ;;
    injected) step injected 20 "$R" "${T[@]}" an_injected_launch_failure_releases_the_launched_ranks ;;
    fault) step fault 40 "$R" "${T[@]}" a_fault_on_one_gpu_is_reported_in_time ;;
    fault-procs) step fault-procs 60 "$R" "${T[@]}" a_fault_in_one_process_leaves_the_other_usable ;;
    graphs) step graphs 40 "$R" "${T[@]}" a_graph_replays_after_its_communicator_is_dropped separate_captures_are_rejected ;;
    untracked) step untracked 60 "$R" "${T[@]}" untracked_buffers_are_kept_until_the_call_is_done ;;
    foreign) step foreign 20 "$R" "${T[@]}" foreign_streams_and_buffers_are_rejected ;;
    launch-blocking) step launch-blocking 40 "$R" "${T[@]}" launch_blocking_small_all_reduces_complete ;;
    process-timeouts) step process-timeouts 30 "$R" "${T[@]}" process_ranks_time_out_and_abort ;;
    kill-9) step kill-9 60 "$R" "${T[@]}" a_killed_process_makes_its_peer_fail_in_time ;;
    kill-2 | kill-4 | kill-init | kill-exit)
      # Jobs of about 2.5 s (kill, exit) to 4 s (init: a survivor may wait out the join).
      local n=2 jobs=24 mode=kill limit=120 par=${RINGCCL_KILL_PARALLEL:-1}
      case $1 in
        kill-4) n=4 jobs=10 limit=75 ;;
        kill-init) jobs=10 mode=init limit=75 ;;
        kill-exit) jobs=8 mode=exit limit=45 ;;
      esac
      step "$1" "$limit" env RINGCCL_KILL_RANKS=$n RINGCCL_KILL_JOBS=$jobs RINGCCL_KILL_PARALLEL=$par \
        RINGCCL_KILL_MODE=$mode RINGCCL_TIMEOUT="${KILL_TIMEOUT:-3}" \
        "$D/test-kill" "${T[@]}" killed_ranks_end_their_peers_calls_in_time ;;
    kill-abort) step kill-abort 60 "$D/test-kill" "${T[@]}" abort_ends_a_call_blocked_on_the_host ;;
    stress) step stress 90 "$D/test-stress" --include-ignored --test-threads=1 --nocapture ;;
    collectives) step collectives 120 "$D/test-collectives" --include-ignored --test-threads=1 --nocapture ;;
    multi-process) step multi-process 60 "$D/test-multi_process" --include-ignored --test-threads=1 \
      --nocapture every_collective_across_processes ;;
    memcheck) step memcheck 100 env OUT="$OUT/logs/sanitize" SANITIZE_TESTS="oneshot injected stress" \
      bash "$HERE/sanitize.sh" "$D" memcheck ;;
    racecheck) step racecheck 40 env OUT="$OUT/logs/sanitize" SANITIZE_TESTS="oneshot" \
      bash "$HERE/sanitize.sh" "$D" racecheck ;;
    synccheck) step synccheck 60 env OUT="$OUT/logs/sanitize" SANITIZE_TESTS="oneshot late-peer" \
      bash "$HERE/sanitize.sh" "$D" synccheck ;;
    *) SUMMARY+=("$1: unknown step"); FAILED=$((FAILED + 1)) ;;
  esac
}
ALL="late-peer injected fault fault-procs graphs untracked foreign launch-blocking process-timeouts \
kill-9 kill-2 kill-4 kill-init kill-exit kill-abort stress collectives \
multi-process memcheck racecheck synccheck"
for s in ${STEPS:-$ALL}; do
  run_step "$s"
done
echo
echo "=== summary"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/logs/summary.txt"
pack
[ "$FAILED" -eq 0 ] || { echo "=== $FAILED step(s) failed"; exit 1; }
