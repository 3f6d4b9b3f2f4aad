#!/usr/bin/env bash
# The NCCL C API on a machine with GPUs (gcc/cc, the CUDA toolkit's headers and libcudart,
# PyTorch for the last steps; no Rust: the library is built elsewhere), in one go:
#   nccl-abi/scripts/gpu-check.sh LIB [NCCL_INCLUDE] OUT
#     LIB           libringccl_nccl.so (cargo build --release -p nccl-abi)
#     NCCL_INCLUDE  a directory with NCCL 2.28's nccl.h, or `auto` (the default): the nvidia-nccl
#                   wheel beside torch (python3 -c 'import nvidia.nccl'), else $CUDA/include,
#                   else /usr/include
#     OUT           where the logs go
# Environment: NPROC (processes of the multi-process steps, 2), PY (the interpreter with torch,
# python3), TORCH=0 (no PyTorch steps), TORCH_ARGS (extra torch_check.py arguments, e.g.
# --skip-timing), CUDA_HOME. With more processes than GPUs the processes share GPUs: the MPS
# daemon is started (pipes in /tmp/mps-pipe) unless one answers, and stopped at the end; the
# steps through NCCL itself (which refuses two ranks on one GPU) are skipped then.
# Steps, each under a timeout: the C ABI check; the C collectives test (PreMulSum included) in
# one process (ncclCommInitAll over every GPU) and in NPROC (ncclGetUniqueId +
# ncclCommInitRank); the C split test (ncclCommSplit, NCCL_SPLIT_NOCOLOR, ncclCommShrink) in
# NPROC processes; ncclAllReduce's time per size through ringccl and through the system's NCCL
# (same program); torch_check.py under torchrun with NPROC processes through ringccl
# (LD_PRELOAD) and through PyTorch's own NCCL, and torch_compare.py. Prints one summary line
# per step and the tests' own result lines (also in OUT/summary.txt); exits non-zero if a step
# failed.
set -uo pipefail
if [ $# -eq 2 ]; then set -- "$1" auto "$2"; fi
LIB=$(realpath "${1:?libringccl_nccl.so}")
INC_ARG=${2:-auto}
OUT=$(realpath -m "${3:?output directory}")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OUT"
[ -f "$LIB" ] || { echo "gpu-check: no library at $LIB" >&2; exit 2; }
export NCCL_NVLS_ENABLE=0
NPROC=${NPROC:-2}
PY=${PY:-python3}
CUDA=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
# The nvidia-nccl wheel's folder (include/, lib/), if the interpreter has one.
WHEEL_NCCL=$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
if [ "$INC_ARG" = auto ]; then
  INC=
  for d in ${WHEEL_NCCL:+"$WHEEL_NCCL/include"} "$CUDA/include" /usr/include; do
    [ -f "$d/nccl.h" ] && { INC=$d; break; }
  done
  [ -n "$INC" ] || { echo "gpu-check: no nccl.h found (give NCCL_INCLUDE)" >&2; exit 2; }
else
  INC=$(realpath "$INC_ARG")
fi
[ -f "$INC/nccl.h" ] || { echo "gpu-check: no nccl.h in $INC" >&2; exit 2; }
[ -f "$CUDA/include/cuda_runtime.h" ] || { echo "gpu-check: no cuda_runtime.h in $CUDA/include (set CUDA_HOME)" >&2; exit 2; }
CUDA_LIB=$CUDA/lib64
[ -d "$CUDA_LIB" ] || CUDA_LIB=$CUDA/lib
BIN=$OUT/bin
mkdir -p "$BIN"
cp "$LIB" "$BIN/libnccl.so.2"
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
echo "gpu-check: $GPUS GPU(s), $NPROC processes, nccl.h from $INC, CUDA from $CUDA" | tee "$OUT/steps.log"
MPS_STARTED=0
if [ "$NPROC" -gt "$GPUS" ] && command -v nvidia-cuda-mps-control >/dev/null; then
  if ! echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if ! echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then
      nvidia-cuda-mps-control -d && MPS_STARTED=1 && echo "gpu-check: MPS started (pipes in $CUDA_MPS_PIPE_DIRECTORY)"
    fi
  fi
fi
stop_mps() {
  if [ "$MPS_STARTED" = 1 ]; then
    echo quit | nvidia-cuda-mps-control && MPS_STARTED=0 && echo "gpu-check: MPS stopped"
  fi
}
trap stop_mps EXIT
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
skip() { # name why
  echo "=== $1: skipped ($2)" | tee -a "$OUT/steps.log"
  SUMMARY+=("$1: skipped ($2)")
}
build() {
  local cc=(cc -std=c11 -O2 -Wall -Wextra -Werror)
  local link=(-L "$BIN" -l:libnccl.so.2 -ldl -L "$CUDA_LIB" -lcudart -lm -Wl,-rpath,"$BIN" -Wl,-rpath,"$CUDA_LIB")
  "${cc[@]}" -I "$HERE/tests/c/cuda-stub" -I "$INC" "$HERE/tests/c/abi_check.c" -L "$BIN" -l:libnccl.so.2 -ldl \
    -Wl,-rpath,"$BIN" -o "$BIN/abi_check" &&
    "${cc[@]}" -I "$CUDA/include" -I "$INC" "$HERE/tests/gpu/collectives.c" "${link[@]}" -o "$BIN/collectives" &&
    "${cc[@]}" -I "$CUDA/include" -I "$INC" "$HERE/tests/gpu/split.c" "${link[@]}" -o "$BIN/split" &&
    ldd "$BIN/collectives" && echo "build: abi_check, collectives, split"
}
job() { # NAME [VAR=VALUE...] -- PROGRAM [ARGS...]: NPROC processes, each `PROGRAM ARGS... RANK NPROC IDFILE`
  local name=$1 id=$OUT/id-$1-$RANDOM.bin pids=() rc=0 vars=()
  shift
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  rm -f "$id"
  for r in $(seq 0 $((NPROC - 1))); do
    env "${vars[@]}" timeout -k 5 "$T" "$@" "$r" "$NPROC" "$id" >"$OUT/$name-rank$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  cat "$OUT"/"$name"-rank*.log
  return $rc
}
# The system's NCCL (else the wheel's), for the same C program through NCCL itself.
SYS_NCCL=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
[ -n "$SYS_NCCL" ] && SYS_NCCL=$(dirname "$SYS_NCCL")
[ -z "$SYS_NCCL" ] && [ -n "$WHEEL_NCCL" ] && [ -f "$WHEEL_NCCL/lib/libnccl.so.2" ] && SYS_NCCL=$WHEEL_NCCL/lib
NCCL_OK=1
[ "$NPROC" -gt "$GPUS" ] && NCCL_OK=0
nvidia-smi --query-gpu=index,name,driver_version --format=csv >"$OUT/gpus.txt" 2>&1
step build 60 build
step abi 15 "$BIN/abi_check"
step sp 120 "$BIN/collectives" sp
step mp 180 job mp NCCL_DEBUG=VERSION -- "$BIN/collectives" mp
step split 120 job split -- "$BIN/split"
step perf-ringccl 120 job perf -- "$BIN/collectives" perf
if [ -z "$SYS_NCCL" ]; then
  skip perf-nccl "no libnccl.so.2 on this machine"
elif [ "$NCCL_OK" = 0 ]; then
  skip perf-nccl "NCCL refuses ranks that share a GPU ($NPROC processes, $GPUS GPUs)"
else
  step perf-nccl 120 job perf-nccl LD_LIBRARY_PATH="$SYS_NCCL" -- "$BIN/collectives" perf
fi
TC=$HERE/scripts/torch_check.py
read -r -a TARGS <<<"${TORCH_ARGS:-}"
if [ "${TORCH:-1}" = 0 ]; then
  skip torch-ringccl "TORCH=0"
elif ! "$PY" -c 'import torch' 2>/dev/null; then
  skip torch-ringccl "$PY has no torch"
  TORCH=0
else
  step torch-ringccl 600 env LD_PRELOAD="$LIB" "$PY" -m torch.distributed.run --nproc-per-node "$NPROC" \
    --master-port 29611 "$TC" --out "$OUT/torch/ringccl" "${TARGS[@]}"
fi
if [ "${TORCH:-1}" != 0 ] && [ "$NCCL_OK" = 1 ]; then
  step torch-nccl 600 "$PY" -m torch.distributed.run --nproc-per-node "$NPROC" --master-port 29621 "$TC" \
    --out "$OUT/torch/nccl" "${TARGS[@]}"
  step compare 60 "$PY" "$HERE/scripts/torch_compare.py" "$OUT/torch/nccl" "$OUT/torch/ringccl"
elif [ "${TORCH:-1}" != 0 ]; then
  skip torch-nccl "NCCL refuses ranks that share a GPU ($NPROC processes, $GPUS GPUs)"
  skip compare "no NCCL run to compare with"
fi
echo
{
  printf '%s\n' "${SUMMARY[@]}"
  grep -h -E "^collectives|^abi check|^split \(|^\[rank [0-9]+\]|^compare|^rank |^library|^perf|^build:" "$OUT"/*.log | sort -u
  echo "gpu-check: $FAILED step(s) failed"
} | tee "$OUT/summary.txt"
exit $((FAILED > 0))
