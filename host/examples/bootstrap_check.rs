//! One rank of a job started by a launcher (`ringccl-run`, `torchrun`, …): joins the world
//! from the launcher's variables, gathers every rank's number and checks the table. It uses
//! ringccl's internal bootstrap (`ringccl::bootstrap`, public with the `internals` feature, which
//! the crate's examples are built with): no GPU is needed.
//!
//! ```sh
//! cargo build -p ringccl --example bootstrap_check --bin ringccl-run
//! target/debug/ringccl-run -n 4 target/debug/examples/bootstrap_check
//! ```

use std::process::ExitCode;
use std::time::Duration;

use ringccl::bootstrap::Bootstrap;
use ringccl::LaunchEnv;

fn check() -> Result<String, Box<dyn std::error::Error>> {
    let env = LaunchEnv::from_env()?
        .ok_or("RANK and WORLD_SIZE are unset: start this program with ringccl-run or torchrun")?;
    let boot = Bootstrap::join_env(&env, Duration::from_secs(30))?;
    let table = boot.all_gather(&(env.rank as u64).to_le_bytes())?;
    for (r, bytes) in table.iter().enumerate() {
        let got = <[u8; 8]>::try_from(bytes.as_slice())
            .ok()
            .map(u64::from_le_bytes);
        if got != Some(r as u64) {
            return Err(format!("rank {r}'s entry is {bytes:?}").into());
        }
    }
    boot.barrier()?;
    Ok(format!(
        "rank {} of {} (local rank {}): all {} ranks gathered in order",
        env.rank, env.world_size, env.local_rank, env.world_size
    ))
}

fn main() -> ExitCode {
    match check() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bootstrap_check: {e}");
            ExitCode::FAILURE
        }
    }
}
