#!/usr/bin/env bash
# The NCCL C API on a machine with GPUs (CUDA toolkit, PyTorch with NCCL, torchrun), in one go:
#   nccl-abi/scripts/gpu-check.sh LIB NCCL_INCLUDE OUT
#     LIB           libringccl_nccl.so (cargo build --release -p nccl-abi)
#     NCCL_INCLUDE  a directory with NCCL 2.28's nccl.h (PyPI wheel nvidia-nccl-cu13==2.28.9)
#     OUT           where the logs go
# Steps, each under a timeout: the C ABI check, the C collectives test in one process
# (ncclCommInitAll) and in two (ncclGetUniqueId + ncclCommInitRank), ncclAllReduce's time per
# size through ringccl and through the system's NCCL (same program), then torch_check.py under
# torchrun with 2 processes through ringccl (LD_PRELOAD) and through PyTorch's own NCCL, and
# torch_compare.py. Exits non-zero if a step failed.
set -uo pipefail
LIB=$(realpath "${1:?libringccl_nccl.so}")
INC=$(realpath "${2:?directory with nccl.h}")
OUT=${3:?output directory}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
NPROC=${NPROC:-2}
CUDA=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
BIN=$OUT/bin
mkdir -p "$BIN"
cp "$LIB" "$BIN/libnccl.so.2"
FAILED=0
SUMMARY=()
step() { # name timeout cmd...
  local name=$1 t=$2 t0=$SECONDS rc
  shift 2
  echo "=== $name: $*" | tee -a "$OUT/steps.log"
  if [ "$(type -t "$1")" = function ]; then
    T=$t "$@" >"$OUT/$name.log" 2>&1
  else
    timeout -k 5 "$t" "$@" >"$OUT/$name.log" 2>&1
  fi
  rc=$?
  [ "$rc" -ne 0 ] && FAILED=$((FAILED + 1))
  tail -n 8 "$OUT/$name.log"
  SUMMARY+=("$name: exit $rc, $((SECONDS - t0)) s")
}
build() {
  local cc=(cc -std=c11 -O2 -Wall -Wextra -Werror)
  "${cc[@]}" -I "$HERE/tests/c/cuda-stub" -I "$INC" "$HERE/tests/c/abi_check.c" -L "$BIN" -l:libnccl.so.2 -ldl \
    -Wl,-rpath,"$BIN" -o "$BIN/abi_check" &&
    "${cc[@]}" -I "$CUDA/include" -I "$INC" "$HERE/tests/gpu/collectives.c" -L "$BIN" -l:libnccl.so.2 -ldl \
      -L "$CUDA/lib64" -lcudart -lm -Wl,-rpath,"$BIN" -Wl,-rpath,"$CUDA/lib64" -o "$BIN/collectives" &&
    ldd "$BIN/collectives"
}
mp() { # MODE [VAR=VALUE...]: NPROC processes, one GPU each, the environment amended
  local mode=$1 id=$OUT/id-$1-$RANDOM.bin pids=() rc=0
  shift
  rm -f "$id"
  for r in $(seq 0 $((NPROC - 1))); do
    env "$@" timeout -k 5 "$T" "$BIN/collectives" "$mode" "$r" "$NPROC" "$id" >"$OUT/$mode-rank$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  cat "$OUT"/"$mode"-rank*.log
  return $rc
}
# The system's NCCL, for the same C program through NCCL itself.
SYS_NCCL=$(dirname "$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')" 2>/dev/null)
nvidia-smi --query-gpu=index,name,driver_version --format=csv >"$OUT/gpus.txt" 2>&1
step build 40 build
step abi 15 "$BIN/abi_check"
step sp 60 "$BIN/collectives" sp
step mp 60 mp mp NCCL_DEBUG=VERSION
step perf-ringccl 60 mp perf
[ -n "$SYS_NCCL" ] && step perf-nccl 60 mp perf LD_LIBRARY_PATH="$SYS_NCCL"
TC=$HERE/scripts/torch_check.py
step torch-ringccl 300 env LD_PRELOAD="$LIB" torchrun --nproc-per-node "$NPROC" --master-port 29611 "$TC" --out "$OUT/torch/ringccl"
step torch-nccl 300 torchrun --nproc-per-node "$NPROC" --master-port 29621 "$TC" --out "$OUT/torch/nccl"
step compare 30 python3 "$HERE/scripts/torch_compare.py" "$OUT/torch/nccl" "$OUT/torch/ringccl"
echo
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
grep -h -E "^collectives|^abi check|^\[rank [0-9]\]|^compare|^rank |^library|^perf" "$OUT"/*.log | sort -u | tee -a "$OUT/summary.txt"
exit $((FAILED > 0))
