//! All-reduce over every visible GPU: each rank holds `(rank + 1) * (i % 7 + 1)` at element
//! `i`; after a sum all-reduce, every rank must hold `n(n+1)/2 * (i % 7 + 1)`.
//!
//! ```text
//! cargo run --release -p ringccl --example all_reduce [count]
//! ```
//!
//! Without a GPU or driver it says so and exits with status 1. `RINGCCL_DEBUG=info` shows what
//! ringccl chose (devices, peer access, ring, algorithm, chunk).

use std::process::ExitCode;

use ringccl::{Communicator, Io, RedOp};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("all_reduce example failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let count: usize = match std::env::args().nth(1) {
        Some(s) => s
            .parse()
            .map_err(|e| format!("count {s:?} is not a number: {e}"))?,
        None => 1 << 20,
    };
    let t0 = std::time::Instant::now();
    let comm = Communicator::all()?;
    let ready = t0.elapsed();
    let n = comm.nranks();
    let ordinals: Vec<usize> = (0..n).map(|r| comm.ordinal(r)).collect();
    println!(
        "{n} rank(s) on devices {ordinals:?}, {count} f32 elements per rank (communicator ready in {:.0} ms)",
        ready.as_secs_f64() * 1e3
    );

    // One buffer per rank, on that rank's GPU.
    let mut bufs = Vec::with_capacity(n);
    for r in 0..n {
        let host: Vec<f32> = (0..count).map(|i| ((r + 1) * (i % 7 + 1)) as f32).collect();
        bufs.push(comm.stream(r).clone_htod(&host)?);
    }

    {
        let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
        comm.all_reduce(&mut io, count, RedOp::Sum, comm.streams())?;
    }

    let ranks_sum = (n * (n + 1) / 2) as f32;
    let mut wrong = 0usize;
    for (r, buf) in bufs.iter().enumerate() {
        comm.stream(r).synchronize()?;
        let out = comm.stream(r).clone_dtoh(buf)?;
        let bad = out
            .iter()
            .enumerate()
            .filter(|&(i, &x)| x != ranks_sum * (i % 7 + 1) as f32)
            .count();
        let head: Vec<f32> = out.iter().take(8).copied().collect();
        println!("rank {r}: first elements {head:?}, {bad} wrong");
        wrong += bad;
    }
    if wrong > 0 {
        return Err(format!("{wrong} wrong elements in total").into());
    }
    println!("ok: every rank holds the sum over {n} rank(s)");
    Ok(())
}
