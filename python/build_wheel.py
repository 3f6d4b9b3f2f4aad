#!/usr/bin/env python3
"""Builds the ``ringccl`` wheel from the cargo-built library, with the standard library only.

    cargo build --release -p nccl-abi
    python3 python/build_wheel.py [--lib target/release/libringccl_nccl.so] [--out target/wheels]

The wheel holds the package ``ringccl`` (``python/ringccl/``), the library as
``ringccl/lib/libnccl.so.2``, and a ``.dist-info`` (METADATA, WHEEL, entry_points.txt,
RECORD with sha256 hashes). Its platform tag is ``manylinux_2_<N>_<arch>`` with ``N`` the newest
``GLIBC_2.N`` symbol version the library needs (``objdump -T``); the build fails if the library
needs any shared library beyond glibc's and ``libgcc_s`` (``readelf -d``), so the tag is honest:
at run time the library needs only glibc and the NVIDIA driver, which it loads itself.
"""

import argparse
import base64
import hashlib
import os
import re
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NAME = "ringccl"

# What a manylinux wheel may link against (PEP 600 / the manylinux policies), of what a Rust
# cdylib can need.
ALLOWED_NEEDED = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
    "libgcc_s.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
}


def workspace_version():
    text = open(os.path.join(ROOT, "Cargo.toml")).read()
    m = re.search(r'\[workspace\.package\][^\[]*?\bversion\s*=\s*"([^"]+)"', text, re.S)
    if not m:
        sys.exit("build_wheel: no [workspace.package] version in Cargo.toml")
    return m.group(1)


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def glibc_floor(lib):
    """(major, minor) of the newest GLIBC_x.y symbol version `lib` needs."""
    versions = {
        tuple(int(p) for p in v.split("."))
        for v in re.findall(r"GLIBC_([0-9]+\.[0-9]+(?:\.[0-9]+)?)", run(["objdump", "-T", lib]))
    }
    if not versions:
        sys.exit("build_wheel: objdump -T found no GLIBC symbol versions in %s" % lib)
    return max(versions)[:2]


def check_needed(lib):
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run(["readelf", "-d", lib]))
    bad = [n for n in needed if n not in ALLOWED_NEEDED]
    if bad:
        sys.exit("build_wheel: %s needs %s: not allowed in a manylinux wheel" % (lib, ", ".join(bad)))
    soname = re.findall(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", run(["readelf", "-d", lib]))
    if soname != ["libnccl.so.2"]:
        sys.exit("build_wheel: %s has SONAME %s, not libnccl.so.2" % (lib, soname))
    return needed


def machine(lib):
    header = run(["readelf", "-h", lib])
    if "X86-64" in header:
        return "x86_64"
    if "AArch64" in header:
        return "aarch64"
    sys.exit("build_wheel: unknown machine in %s" % lib)


def record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=os.path.join(ROOT, "target", "release", "libringccl_nccl.so"))
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "wheels"))
    args = ap.parse_args()
    lib = args.lib
    if not os.path.isfile(lib):
        sys.exit("build_wheel: %s not found: run `cargo build --release -p nccl-abi` first" % lib)
    version = workspace_version()
    needed = check_needed(lib)
    major, minor = glibc_floor(lib)
    tag = "py3-none-manylinux_%d_%d_%s" % (major, minor, machine(lib))
    dist = "%s-%s.dist-info" % (NAME, version)

    files = []  # (path in the wheel, bytes, executable)
    pkg = os.path.join(HERE, NAME)
    for base, dirs, names in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and d != "lib")
        for n in sorted(names):
            if n.endswith(".py"):
                full = os.path.join(base, n)
                rel = os.path.relpath(full, HERE).replace(os.sep, "/")
                files.append((rel, open(full, "rb").read(), False))
    files.append((NAME + "/lib/libnccl.so.2", open(lib, "rb").read(), True))

    readme = (
        "ringccl: collective communications for NVIDIA GPUs, written in Rust (NCCL's C ABI).\n\n"
        "`import ringccl.torch` before `import torch` makes PyTorch use ringccl; "
        "`ringccl.torch.check()` confirms it. `ringccl-torchrun` is torchrun with the library "
        "preloaded. `ringccl.library_path()` is the library (for LD_PRELOAD).\n\n"
        "The library needs glibc %d.%d or newer and, at run time, the NVIDIA driver.\n"
        % (major, minor)
    )
    metadata = (
        "Metadata-Version: 2.1\n"
        "Name: %s\n"
        "Version: %s\n"
        "Summary: ringccl: NCCL-compatible collective communications for NVIDIA GPUs, in Rust\n"
        "License: MIT OR Apache-2.0\n"
        "Requires-Python: >=3.8\n"
        "Classifier: Operating System :: POSIX :: Linux\n"
        "Classifier: Environment :: GPU :: NVIDIA CUDA\n"
        "Description-Content-Type: text/markdown\n\n%s" % (NAME, version, readme)
    )
    wheel = (
        "Wheel-Version: 1.0\n"
        "Generator: ringccl build_wheel.py\n"
        "Root-Is-Purelib: false\n"
        "Tag: %s\n" % tag
    )
    entry_points = "[console_scripts]\nringccl-torchrun = ringccl._torchrun:main\n"
    files += [
        (dist + "/METADATA", metadata.encode(), False),
        (dist + "/WHEEL", wheel.encode(), False),
        (dist + "/entry_points.txt", entry_points.encode(), False),
        (dist + "/top_level.txt", (NAME + "\n").encode(), False),
    ]
    record = "".join(record_line(p, d) + "\n" for p, d, _ in files) + dist + "/RECORD,,\n"
    files.append((dist + "/RECORD", record.encode(), False))

    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, "%s-%s-%s.whl" % (NAME, version, tag))
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data, exe in files:
            info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = ((0o755 if exe else 0o644) | 0o100000) << 16
            z.writestr(info, data)
    print("%s (needs %s; GLIBC_%d.%d at most)" % (out, ", ".join(needed), major, minor))
    return out


if __name__ == "__main__":
    main()
