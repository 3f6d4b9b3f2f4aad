//! One process per GPU: every process is one rank; they join through the launcher's
//! environment, all-reduce, and check the sum.
//!
//! ```text
//! cargo build --release -p ringccl --example multi_process --bin ringccl-run
//! target/release/ringccl-run -n 2 target/release/examples/multi_process
//! torchrun --no-python --nproc-per-node 2 target/release/examples/multi_process   # the same, with torchrun
//! ```
//!
//! Each rank holds `(rank + 1) * (i % 7 + 1)` at element `i`; after a sum all-reduce every
//! rank must hold `n(n+1)/2 * (i % 7 + 1)`. With `--sweep`, it then times all-reduces of
//! 8 B to 1 GiB (f32, in place; CUDA events around batches of 20 back-to-back calls on the
//! stream, the median of 5 batches after a warm-up batch) and rank 0 prints the time per call
//! and the bus bandwidth.

use std::process::ExitCode;

use ringccl::{Communicator, Io, RedOp};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("multi_process example failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let comm = Communicator::from_env()?;
    let (n, rank) = (comm.nranks(), comm.local_ranks()[0]);
    let count = 1 << 22;
    let stream = comm.stream(rank);
    let host: Vec<f32> = (0..count)
        .map(|i| ((rank + 1) * (i % 7 + 1)) as f32)
        .collect();
    let mut buf = stream.clone_htod(&host)?;
    comm.all_reduce(&mut [Io::in_place(&mut buf)], count, RedOp::Sum, &[stream])?;
    stream.synchronize()?;
    let out = stream.clone_dtoh(&buf)?;
    let ranks_sum = (n * (n + 1) / 2) as f32;
    let wrong = out
        .iter()
        .enumerate()
        .filter(|&(i, &x)| x != ranks_sum * (i % 7 + 1) as f32)
        .count();
    println!(
        "rank {rank} of {n} on device {}: {count} elements, {wrong} wrong",
        comm.ordinal(rank)
    );
    if wrong > 0 {
        return Err(format!("{wrong} wrong elements").into());
    }
    if std::env::args().any(|a| a == "--sweep") {
        sweep(&comm, rank)?;
    }
    Ok(())
}

/// Times in-place f32 all-reduces from 8 B to 1 GiB (factor 4).
fn sweep(comm: &Communicator, rank: usize) -> Result<(), Box<dyn std::error::Error>> {
    use cudarc::driver::sys::CUevent_flags;
    let n = comm.nranks();
    let stream = comm.stream(rank);
    let ctx = comm.context(rank);
    let max = 1usize << 28; // elements: 1 GiB of f32
    let mut buf = stream.alloc_zeros::<f32>(max)?;
    if rank == 0 {
        println!("{:>12} {:>10} {:>10}", "bytes", "time_us", "busbw_GB/s");
    }
    let mut count = 2usize;
    while count <= max {
        const BATCH: usize = 20;
        let mut times = Vec::new();
        for batch in 0..6 {
            let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            start.record(stream)?;
            for _ in 0..BATCH {
                comm.all_reduce(&mut [Io::in_place(&mut buf)], count, RedOp::Sum, &[stream])?;
            }
            end.record(stream)?;
            end.synchronize()?;
            if batch > 0 {
                times.push(start.elapsed_ms(&end)? * 1000.0 / BATCH as f32);
            }
        }
        times.sort_by(f32::total_cmp);
        let us = times[times.len() / 2];
        let bytes = count * 4;
        let busbw = bytes as f64 / (f64::from(us) * 1e-6) * 2.0 * (n - 1) as f64 / n as f64 / 1e9;
        if rank == 0 {
            println!("{bytes:>12} {us:>10.2} {busbw:>10.2}");
        }
        count *= 4;
    }
    Ok(())
}
