#!/usr/bin/env bash
# Builds the wheel from the release library, installs it into a fresh virtual environment
# (offline, no dependencies), and checks it there without a GPU: the RECORD hashes, the
# library loaded with ctypes (ncclGetVersion, ringcclGetVersionString), `import ringccl.torch`
# and `ringccl.torch.check()` (torch absent), and `ringccl-torchrun --help`.
# Usage: bash python/smoke_test.sh [LIB]   (LIB: default target/release/libringccl_nccl.so)
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
LIB=${1:-$ROOT/target/release/libringccl_nccl.so}
OUT=$ROOT/target/ci/wheels
VENV=$ROOT/target/ci/wheel-venv
rm -rf "$OUT" "$VENV"
python3 python/build_wheel.py --lib "$LIB" --out "$OUT"
WHEEL=$(ls "$OUT"/ringccl-*.whl)
python3 - "$WHEEL" <<'PY'
import base64, hashlib, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
record = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")][0]
rows = [l.split(",") for l in z.read(record).decode().splitlines()]
assert {r[0] for r in rows} == set(z.namelist()), "RECORD does not list every file"
for path, h, size in rows:
    if path == record:
        assert (h, size) == ("", ""), path
        continue
    data = z.read(path)
    want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert (h, int(size)) == (want, len(data)), path
print("RECORD: %d files, hashes and sizes match" % (len(rows) - 1))
PY
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps "$WHEEL"
(cd / && "$VENV/bin/python" - "$VENV" <<'PY'
import ctypes, os, sys
import ringccl
path = ringccl.library_path()
assert path.startswith(os.path.realpath(sys.argv[1])) or path.startswith(sys.argv[1]), path
lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
v = ctypes.c_int(0)
assert lib.ncclGetVersion(ctypes.byref(v)) == 0 and v.value == 22809, v.value
lib.ringcclGetVersionString.restype = ctypes.c_char_p
s = lib.ringcclGetVersionString().decode()
assert s.startswith("ringccl ") and "NCCL" in s, s
assert ringccl.version() == s and ringccl.nccl_version() == 22809
import ringccl.torch
report = ringccl.torch.check()
assert report["ringccl"] == s and "torch_nccl" not in report, report
# Another NCCL's file opened by path with ctypes (as torch/__init__.py opens the nvidia-nccl
# wheel's) is pointed at ringccl's library: still one NCCL mapped.
import shutil, tempfile
other = os.path.join(tempfile.mkdtemp(), "nvidia", "nccl", "lib")
os.makedirs(other)
shutil.copy(path, os.path.join(other, "libnccl.so.2"))
h = ctypes.CDLL(os.path.join(other, "libnccl.so.2"), mode=ctypes.RTLD_GLOBAL)
assert os.path.realpath(h._name) == os.path.realpath(path), h._name
report = ringccl.torch.check()
print("installed wheel: %s, ncclGetVersion %d, check() %s" % (s, v.value, report))
PY
)
HELP=$("$VENV/bin/ringccl-torchrun" --help)
grep -q '^usage: ringccl-torchrun' <<<"$HELP"
echo "ringccl-torchrun --help: ok (torch not installed)"
