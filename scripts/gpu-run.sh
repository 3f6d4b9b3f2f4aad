#!/usr/bin/env bash
# Runs the GPU suites and sweeps from a bundle built by `cargo xtask gpu-bundle`, in one call on
# the GPU machine (which needs no Rust toolchain).
#   scripts/gpu-run.sh BUNDLE PHASE...   PHASE: tests | bench | perf | perf-full | final
#     tests      kernel, library and collective GPU tests, then the all_reduce example
#     bench      the criterion kernel benches
#     perf       ringccl-perf all_reduce sweep (f32, bf16; 8 B - 1 GiB, factor 4)
#     perf-full  all_reduce (factor 2, eager and CUDA graphs) and the other collectives
#     final      collective suite, two-GPU library tests, example, then the all_reduce sweeps
#                (eager, CUDA graphs, RINGCCL_PEER_BLOCKS=32 and 132), every step under a timeout
# Logs, JSON, CSV and SVG go to $OUT (default /tmp/ringccl-out): one <step>.log per step,
# steps.log (the commands), gpus.txt (nvidia-smi); a summary is printed last, and the script exits
# non-zero if a step failed or a phase is unknown.
set -uo pipefail
B=${1:?bundle dir}
shift
OUT=${OUT:-/tmp/ringccl-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export RUST_BACKTRACE=1
# cudarc looks for libnccl.so (not libnccl.so.2).
if ! ldconfig -p | grep -q 'libnccl\.so '; then
  lib=$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')
  [ -z "$lib" ] && lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  if [ -n "$lib" ]; then
    mkdir -p /tmp/ncclso && ln -sf "$lib" /tmp/ncclso/libnccl.so
    export LD_LIBRARY_PATH=/tmp/ncclso:${LD_LIBRARY_PATH:-}
  fi
fi
SUMMARY=()
FAILED=0
step() { # name cmd...
  local name=$1 t0=$SECONDS rc
  shift
  echo "=== $name: $*" | tee -a "$OUT/steps.log"
  "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && FAILED=$((FAILED + 1))
  tail -n 6 "$OUT/$name.log"
  SUMMARY+=("$name: exit $rc, $((SECONDS - t0)) s; $(grep -E 'test result|passed|mismatch|wrong' "$OUT/$name.log" | tail -n 2 | tr '\n' ' ' | cut -c1-200)")
}
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpus.txt"
nvidia-smi topo -m >>"$OUT/gpus.txt" 2>&1
PERF=$B/bin/bin-ringccl-perf
for phase in "$@"; do
  case $phase in
    tests)
      step kernels "$B/tests/test-kernels" --include-ignored --test-threads=1
      step lib-gpu "$B/tests/lib-ringccl" --include-ignored --test-threads=1
      [ -x "$B/tests/test-collectives" ] && step collectives "$B/tests/test-collectives" --include-ignored --test-threads=1
      step example "$B/examples/example-all_reduce"
      ;;
    bench)
      step bench-kernels "$B/benches/bench-kernels" --bench
      ;;
    perf)
      step perf-ar "$PERF" -t all_reduce -d float,bfloat16 -b 8 -e 1G -f 4 -n 20 -w 5 --no-progress \
        --json "$OUT/perf-ar.json" --svg "$OUT/perf-ar.svg"
      ;;
    perf-full)
      step perf-ar "$PERF" -t all_reduce -d float,bfloat16 -b 8 -e 1G -f 2 -n 20 -w 5 --no-progress \
        --json "$OUT/perf-all_reduce.json" --csv "$OUT/perf-all_reduce.csv" --svg "$OUT/perf-all_reduce.svg"
      step perf-ar-graph "$PERF" -t all_reduce -d float -b 8 -e 64K -f 2 -n 20 -w 5 -G 1 --no-progress \
        --json "$OUT/perf-all_reduce-graph.json"
      step perf-coll "$PERF" -t all_gather,reduce_scatter,broadcast,reduce,all_to_all -d float -b 1K -e 1G -f 4 -n 10 -w 3 --no-progress \
        --json "$OUT/perf-collectives.json" --csv "$OUT/perf-collectives.csv"
      ;;
    final)
      # Correctness of everything, then the key sweeps; every step is bounded so that a hang
      # cannot stall the whole run.
      step collectives timeout 170 "$B/tests/test-collectives" --include-ignored --test-threads=1 --nocapture
      step lib-gpu timeout 30 "$B/tests/lib-ringccl" --include-ignored --test-threads=1 two_gpu
      step example timeout 20 "$B/examples/example-all_reduce"
      step perf-ar timeout 80 "$PERF" -t all_reduce -d float,bfloat16 -b 8 -e 1G -f 4 -n 20 -w 5 --no-progress \
        --json "$OUT/perf-all_reduce.json" --csv "$OUT/perf-all_reduce.csv" --svg "$OUT/perf-all_reduce.svg"
      step perf-ar-graph timeout 30 "$PERF" -t all_reduce -d float -b 8 -e 64K -f 4 -n 20 -w 5 -G 1 --no-progress \
        --json "$OUT/perf-all_reduce-graph.json"
      for pb in 32 132; do
        step "perf-peer$pb" env RINGCCL_PEER_BLOCKS=$pb timeout 30 "$PERF" -t all_reduce -d float -b 64M -e 1G -f 4 -n 10 -w 3 \
          --lib ringccl --no-progress
      done
      ;;
    *) echo "unknown phase $phase (tests | bench | perf | perf-full | final)"; FAILED=$((FAILED + 1)) ;;
  esac
done
echo
echo "=== summary"
printf '%s\n' "${SUMMARY[@]}"
# Non-zero when a step failed or a phase was unknown (every step still ran).
[ "$FAILED" -eq 0 ] || { echo "=== $FAILED step(s) failed"; exit 1; }
