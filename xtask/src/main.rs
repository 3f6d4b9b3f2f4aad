//! ringccl's build driver: `cargo xtask <command>`.
//!
//! * `build-ptx [--check]`: compile `gpu-kernels` to PTX (`target/ptx-out/ringccl_sm{90,80}.ptx`),
//!   assemble each into a cubin with ptxas, and write the zstd-compressed PTX and cubins to
//!   `gpu-kernels/ptx/` (with `--check`: build, check, and compare with the committed files
//!   instead); then
//!   the same for the training example's kernels (`examples/train-mlp/ptx/train_mlp.ptx`).
//! * `gpu-bundle [--out DIR]`: release test/bench binaries + kernels + `run-all.sh` for a GPU
//!   machine.

mod bundle;
mod ptx;
mod ptxas;
mod train_ptx;

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command>
  build-ptx [--check]     compile gpu-kernels to target/ptx-out/ringccl_sm{90,80}.ptx, assemble the
                          cubins with ptxas, write the compressed PTX and cubins (*.zst, cubins.txt);
                          --check: build and compare with the committed files instead of writing them;
                          also the training example's examples/train-mlp/ptx/train_mlp.ptx
  gpu-bundle [--out DIR]  release test and bench binaries + kernels + run-all.sh in DIR (default gpu-bundle/)
environment: RINGCCL_PTX_RUSTC (nvptx compiler), PTXAS (ptxas: cubins, register/spill checks)";

fn run(args: &[String]) -> Result<(), String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["build-ptx"] => ptx::build_ptx(false).and_then(|()| train_ptx::build_train_ptx(false)),
        ["build-ptx", "--check"] => {
            ptx::build_ptx(true).and_then(|()| train_ptx::build_train_ptx(true))
        }
        ["gpu-bundle"] => bundle::gpu_bundle(None),
        ["gpu-bundle", "--out", dir] => bundle::gpu_bundle(Some(PathBuf::from(dir))),
        ["help" | "--help" | "-h"] => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(format!("unknown arguments {args:?}\n{USAGE}")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
