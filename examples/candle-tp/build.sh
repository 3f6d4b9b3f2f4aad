#!/usr/bin/env bash
# Builds the candle-tp example on a machine with no CUDA toolkit (and no GPU).
#
# candle's CUDA backend compiles its kernels with `nvcc` at build time (candle-kernels' build
# script) and links `libcudart`. Both come here from NVIDIA's pip wheels, installed into a
# virtual environment of this directory:
#   nvidia-cuda-nvcc     nvcc, ptxas, nvlink, fatbinary, cudafe++, libnvvm
#   nvidia-cuda-runtime  cuda_runtime.h and the other headers, libcudart.so.13
#   nvidia-cuda-cccl     the CUDA C++ core libraries' headers (cub, thrust, libcu++)
#   nvidia-cuda-crt, nvidia-nvvm   nvcc's own dependencies, pinned too: unpinned, pip takes the
#                        newest (13.5), whose PTX (ISA 9.5) the 13.0 ptxas refuses and a CUDA
#                        13.0 driver could not load
# The wheels of CUDA 13.0 unpack into one tree, site-packages/nvidia/cu13/{bin,include,lib},
# laid out like a toolkit; CUDA_HOME, NVCC and PATH point at it.
#
# The program is target/release/candle-tp; dist/ holds it with ringccl's launcher
# (ringccl-run) and libcudart.so.13, which the program finds beside itself (its run path is
# $ORIGIN): copy dist/ to a GPU machine, no Rust needed there.
#
# Environment: PYTHON (default python3), CUDA_COMPUTE_CAP (default 90: H100/H200),
# CUDAFORGE_THREADS (parallel nvcc jobs, default: all cores), CARGO_TARGET_DIR.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

python=${PYTHON:-python3}
venv=$here/.venv
cuda_version="13.0.*"

# 1. The toolkit from the wheels.
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "nvidia-cuda-nvcc==$cuda_version" \
    "nvidia-cuda-runtime==$cuda_version" \
    "nvidia-cuda-cccl==$cuda_version" \
    "nvidia-cuda-crt==$cuda_version" \
    "nvidia-nvvm==$cuda_version"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cuda=$site/nvidia/cu13
for f in bin/nvcc bin/ptxas include/cuda_runtime.h lib/libcudart.so.13; do
    if [ ! -e "$cuda/$f" ]; then
        echo "build.sh: $cuda/$f is missing (the wheels' layout changed?)" >&2
        exit 1
    fi
done
# The linker's -lcudart wants the unversioned name.
ln -sf libcudart.so.13 "$cuda/lib/libcudart.so"

# 2. candle-core 0.11.1 with cudarc's `dynamic-loading` (see Cargo.toml's [patch.crates-io]).
patched=$here/.patched/candle-core
if [ ! -f "$patched/Cargo.toml" ]; then
    cargo fetch --manifest-path "$here/fetch-candle/Cargo.toml"
    crate=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/candle-core-0.11.1.crate | head -n 1)
    rm -rf "$here/.patched"
    mkdir -p "$here/.patched"
    tar -xzf "$crate" -C "$here/.patched"
    mv "$here/.patched/candle-core-0.11.1" "$patched"
    # The one change: in [dependencies.cudarc], "dynamic-linking" becomes "dynamic-loading".
    sed -i '/^\[dependencies.cudarc\]/,/^\[/ s/"dynamic-linking"/"dynamic-loading"/' \
        "$patched/Cargo.toml"
    if grep -q '"dynamic-linking"' "$patched/Cargo.toml" \
        || ! grep -q '"dynamic-loading"' "$patched/Cargo.toml"; then
        echo "build.sh: could not switch candle-core's cudarc to dynamic-loading" >&2
        exit 1
    fi
fi

# 3. The build.
export CUDA_HOME=$cuda CUDA_ROOT=$cuda CUDA_PATH=$cuda NVCC=$cuda/bin/nvcc
export PATH=$cuda/bin:$PATH
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
export RUSTFLAGS="-L native=$cuda/lib -C link-arg=-Wl,-rpath,\$ORIGIN"
target=${CARGO_TARGET_DIR:-$here/target}
cargo build --release --manifest-path "$here/Cargo.toml" "$@"
# ringccl's launcher, from the same build (its dependencies are built already).
cargo build --release --manifest-path "$here/Cargo.toml" -p ringccl --bin ringccl-run

# 4. dist/: what a GPU machine with no Rust needs, in one folder.
dist=$here/dist
rm -rf "$dist"
mkdir -p "$dist"
cp -f "$target/release/candle-tp" "$target/release/ringccl-run" "$cuda/lib/libcudart.so.13" "$dist/"
cp -f "$cuda/lib/libcudart.so.13" "$target/release/"
echo "built $dist: candle-tp, ringccl-run, libcudart.so.13"
