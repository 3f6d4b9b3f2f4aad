//! Jobs of processes for the GPU suites: each rank is a process running one test of the calling
//! test binary, with the job's id, rank and size in its environment.
//!
//! ```no_run
//! use std::time::Duration;
//! let n = ringccl_tests::jobs::job_size(2);
//! ringccl_tests::jobs::run_ranks("my_rank_test", n, Duration::from_secs(60), |r| {
//!     vec![("MY_RANK".into(), r.to_string())]
//! });
//! ```

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The number of ranks of a job: `RINGCCL_TEST_PROCESSES` when set (more processes than GPUs
/// need the MPS daemon, rank r on GPU `r % gpus`), else `default`.
///
/// ```
/// std::env::remove_var("RINGCCL_TEST_PROCESSES");
/// assert_eq!(ringccl_tests::jobs::job_size(4), 4);
/// ```
pub fn job_size(default: usize) -> usize {
    match std::env::var("RINGCCL_TEST_PROCESSES") {
        Ok(v) => v.parse().expect("RINGCCL_TEST_PROCESSES: a process count"),
        Err(_) => default,
    }
}

/// Runs `test` of this binary (exactly, with the ignored tests included, one thread) as each of
/// the `n` ranks of a job, rank r with the environment `env(r)`, and panics unless every rank
/// passes within `limit` (a rank still running then is killed).
pub fn run_ranks(
    test: &str,
    n: usize,
    limit: Duration,
    env: impl Fn(usize) -> Vec<(String, String)>,
) {
    let exe = std::env::current_exe().expect("this test binary");
    let mut children: Vec<_> = (0..n)
        .map(|r| {
            Command::new(&exe)
                .args([
                    test,
                    "--exact",
                    "--include-ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .envs(env(r))
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    let deadline = Instant::now() + limit;
    let mut status = vec![None; n];
    while status.iter().any(Option::is_none) && Instant::now() < deadline {
        for (r, child) in children.iter_mut().enumerate() {
            if status[r].is_none() {
                status[r] = child.try_wait().expect("wait for a rank");
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (r, child) in children.iter_mut().enumerate() {
        if status[r].is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    for (r, s) in status.iter().enumerate() {
        match s {
            Some(s) if s.success() => {}
            Some(s) => panic!("rank {r} failed: {s}"),
            None => panic!("rank {r} did not finish within {limit:?}"),
        }
    }
}
