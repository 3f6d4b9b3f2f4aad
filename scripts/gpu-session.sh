#!/usr/bin/env bash
# One call on the GPU machine (no Rust there): runs what `cargo xtask gpu-bundle` built.
#   scripts/gpu-session.sh BUNDLE PHASE...   PHASE: tests | bench | perf | perf-full
# Logs go to $OUT (the device tool brings that folder back); a summary is printed last.
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
step() { # name cmd...
  local name=$1 t0=$SECONDS rc
  shift
  echo "=== $name: $*" | tee -a "$OUT/session.log"
  "$@" >"$OUT/$name.log" 2>&1
  rc=$?
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
      # The last call of a session: correctness of everything, then the key sweeps; every step
      # is bounded so that a hang cannot eat the lease.
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
    *) echo "unknown phase $phase" ;;
  esac
done
echo
echo "=== summary"
printf '%s\n' "${SUMMARY[@]}"
