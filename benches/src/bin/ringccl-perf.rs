//! `ringccl-perf`: ringccl's collectives next to NCCL's, in the style of nccl-tests.
//!
//! ```text
//! cargo run --release -p ringccl-benches --bin ringccl-perf -- -b 8 -e 1G -f 2 -t all_reduce
//! ```
//!
//! One process per GPU (each process one rank, ringccl and NCCL measured in the same
//! processes, rank 0 printing and writing the results):
//!
//! ```text
//! cargo build --release -p ringccl-benches --bin ringccl-perf
//! cargo build --release -p ringccl --bin ringccl-run
//! target/release/ringccl-run -n 2 target/release/ringccl-perf --procs 2 -b 8 -e 1G -f 2
//! ```
//!
//! `--help` lists the options. Without a GPU (or without the CUDA driver) it says so in one
//! line and exits with status 1; on a wrong element or a failed measurement it also exits
//! with status 1, after the table.

#[path = "../perf/mod.rs"]
mod perf;

use std::process::ExitCode;

use perf::args;

fn main() -> ExitCode {
    let opts = match args::parse(std::env::args_os().skip(1)) {
        Ok(o) => o,
        // `--help` (status 0) or a bad argument (status 2).
        Err(e) => e.exit(),
    };
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match perf::gpu::run(opts, argv) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ringccl-perf: error: {e}");
            ExitCode::FAILURE
        }
    }
}
