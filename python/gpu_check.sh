#!/usr/bin/env bash
# The wheel with PyTorch on a machine with GPUs: torch.distributed through the *installed*
# wheel, no LD_PRELOAD typed by hand.
#   python/gpu_check.sh WHEEL OUT     (NPROC=2 by default; one GPU needs the MPS daemon)
# The wheel is installed into a folder on PYTHONPATH, beside the interpreter that has torch;
# then, each under a timeout:
#  1. import order: `import ringccl.torch; import torch` passes ringccl.torch.check() (torch
#     bound to ringccl: no other libnccl mapped, torch.cuda.nccl.version() is ringccl's);
#     `import torch; import ringccl.torch` raises;
#  2. nccl-abi/scripts/torch_check.py under torchrun after `import ringccl.torch`
#     (python/tests/torch_via_import.py);
#  3. the same under `ringccl-torchrun` (LD_PRELOAD set by the console script).
# Exits non-zero if a step failed.
set -uo pipefail
WHEEL=$(realpath "${1:?the ringccl wheel}")
OUT=$(realpath -m "${2:?output directory}")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NPROC=${NPROC:-2}
mkdir -p "$OUT"
# The wheel goes into a folder of its own on PYTHONPATH, beside the interpreter that has torch
# (a virtual environment made from an interpreter that is itself one does not see its packages).
SITE=$OUT/site
rm -rf "$SITE"
python3 -m pip install --quiet --disable-pip-version-check --no-index --no-deps --target "$SITE" "$WHEEL" || exit 1
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
PY=python3
TC=$HERE/nccl-abi/scripts/torch_check.py
FAILED=0
step() { # name timeout cmd...
  local name=$1 t=$2
  shift 2
  echo "=== $name: $*"
  timeout -k 5 "$t" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  [ "$rc" -ne 0 ] && FAILED=$((FAILED + 1))
  tail -n 6 "$OUT/$name.log"
  echo "=== $name: exit $rc"
}
step import-order 60 "$PY" -c '
import ringccl.torch, torch
r = ringccl.torch.check()
assert isinstance(r.get("torch_nccl"), tuple), r
print("import ringccl.torch, torch:", r)
'
step import-too-late 60 "$PY" -c '
import torch
try:
    import ringccl.torch
except RuntimeError as e:
    print("import after torch refused:", e)
else:
    raise SystemExit("import ringccl.torch after torch was not refused")
'
step torch-via-import 120 "$PY" -m torch.distributed.run --nproc-per-node "$NPROC" --master-port 29631 \
  "$HERE/python/tests/torch_via_import.py" "$TC" --out "$OUT/torch/import"
step torch-via-ringccl-torchrun 120 env PATH="$SITE/bin:$PATH" "$SITE/bin/ringccl-torchrun" \
  --nproc-per-node "$NPROC" --master-port 29641 "$TC" --out "$OUT/torch/torchrun"
grep -h -E "^library|ringccl.torch.check|^\[rank" "$OUT"/torch-*.log | sort -u | head -20
exit $((FAILED > 0))
