#!/usr/bin/env bash
# Runs ringccl's GPU tests under compute-sanitizer (memcheck, racecheck, synccheck) on a GPU
# machine, from test binaries built elsewhere (`cargo test --release -p ringccl-tests --no-run`).
#   scripts/sanitize.sh DIR [TOOL...]   DIR holds test-collectives, test-reliability, test-stress
#   TOOL: memcheck | racecheck | synccheck (default: all three)
# Each run is bounded by a timeout (a sanitizer slows kernels down 10-100x, so each runs a
# small, representative set: the one-shot all-reduce back to back, the reliability tests that
# end kernels early, and 200 random collectives of every kind (without the stress test's NCCL
# comparison, RINGCCL_STRESS_NCCL=0: NCCL is not what is checked here); SANITIZE_TESTS="oneshot
# late-peer injected stress" picks some; "graphs" (a graph replayed after its communicator is
# dropped) and "untracked" (3 rounds of freed and reused 256 MiB buffers) can be added). The exit status of a test under a sanitizer can also
# be a test assertion (timing bounds are not met at a sanitizer's speed): the ERROR SUMMARY
# line is what counts as the sanitizer's verdict. Logs go to
# $OUT (default /tmp/ringccl-sanitize): one <tool>-<test>.log per run; the script prints the
# sanitizer's ERROR SUMMARY line of each and exits non-zero if any run reported an error or
# failed.
set -uo pipefail
D=${1:?directory with the test binaries}
shift
TOOLS=("$@")
[ ${#TOOLS[@]} -eq 0 ] && TOOLS=(memcheck racecheck synccheck)
OUT=${OUT:-/tmp/ringccl-sanitize}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export RINGCCL_STRESS_CALLS RINGCCL_STRESS_NCCL RINGCCL_TEST_ITERS
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
FAILED=0
TESTS=${SANITIZE_TESTS:-oneshot late-peer injected stress}
run() { # tool name limit binary args...
  local tool=$1 name=$2 limit=$3 bin=$4
  shift 4
  local log="$OUT/$tool-$name.log"
  timeout "$limit" "$CS" --tool "$tool" --error-exitcode 99 --target-processes all \
    "$D/$bin" "$@" >"$log" 2>&1
  local rc=$?
  local summary
  summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1)
  echo "$tool $name: exit $rc; ${summary:-no summary}"
  # 99: the sanitizer found errors; anything else non-zero: the test or the run failed.
  [ "$rc" -ne 0 ] && FAILED=$((FAILED + 1))
}
for tool in "${TOOLS[@]}"; do
  for t in $TESTS; do
    case $t in
      oneshot) run "$tool" oneshot 120 test-collectives --include-ignored --test-threads=1 --exact \
        oneshot_all_reduce_back_to_back ;;
      late-peer) run "$tool" late-peer 120 test-reliability --include-ignored --test-threads=1 --exact \
        a_late_peer_times_out_and_the_gpus_stay_usable ;;
      injected) run "$tool" injected 120 test-reliability --include-ignored --test-threads=1 --exact \
        an_injected_launch_failure_releases_the_launched_ranks ;;
      stress) RINGCCL_STRESS_CALLS=200 RINGCCL_STRESS_NCCL=0 run "$tool" stress 180 test-stress --nocapture \
        --include-ignored --test-threads=1 ;;
      graphs) run "$tool" graphs 120 test-reliability --include-ignored --test-threads=1 --exact \
        a_graph_replays_after_its_communicator_is_dropped ;;
      untracked) RINGCCL_TEST_ITERS=3 run "$tool" untracked 120 test-reliability --include-ignored \
        --test-threads=1 --exact untracked_buffers_are_kept_until_the_call_is_done ;;
      *) echo "unknown test $t"; FAILED=$((FAILED + 1)) ;;
    esac
  done
done
[ "$FAILED" -eq 0 ] || { echo "$FAILED sanitizer run(s) failed or reported errors"; exit 1; }
echo "every sanitizer run: 0 errors"
