//! Jobs of processes for the GPU suites: each rank is a process running one test of the calling
//! test binary, with the job's id, rank and size in its environment ([`run_job`] starts them,
//! [`this_rank`] reads them back in each rank).
//!
//! ```no_run
//! use std::time::Duration;
//! use ringccl_tests::jobs::{job_size, run_job, this_rank};
//!
//! #[test]
//! #[ignore = "started by the_job as each rank"]
//! fn my_rank_test() {
//!     let Some(me) = this_rank() else {
//!         println!("my_rank_test runs as a rank of the_job");
//!         return;
//!     };
//!     let comm = ringccl::Communicator::init_rank(me.nranks, &me.id, me.rank, 0).unwrap();
//!     // ... the rank's checks ...
//! }
//!
//! #[test]
//! #[ignore = "needs a CUDA GPU"]
//! fn the_job() {
//!     run_job("my_rank_test", job_size(2), Duration::from_secs(60), |_| vec![]);
//! }
//! ```

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ringccl::UniqueId;

/// The variable that carries a job's unique id to its ranks.
pub const ENV_ID: &str = "RINGCCL_TEST_JOB_ID";
/// The variable that carries a rank's number.
pub const ENV_RANK: &str = "RINGCCL_TEST_JOB_RANK";
/// The variable that carries the job's size.
pub const ENV_NRANKS: &str = "RINGCCL_TEST_JOB_NRANKS";

/// This process's place in a job started by [`run_job`].
#[derive(Clone, Debug)]
pub struct JobRank {
    /// The job's unique id (every rank has the same).
    pub id: UniqueId,
    /// This process's rank.
    pub rank: usize,
    /// The job's size.
    pub nranks: usize,
}

/// This process's place in a job, read from the variables [`run_job`] sets; `None` where the
/// process was not started as a rank of one (the rank's test run alone, by
/// `--include-ignored` on the whole binary). Panics on variables that are set but malformed.
///
/// ```
/// std::env::remove_var(ringccl_tests::jobs::ENV_ID);
/// assert!(ringccl_tests::jobs::this_rank().is_none());
/// ```
pub fn this_rank() -> Option<JobRank> {
    let id = std::env::var(ENV_ID).ok()?;
    let number = |name: &str| -> usize {
        std::env::var(name)
            .unwrap_or_else(|_| panic!("{name} is not set beside {ENV_ID}"))
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    Some(JobRank {
        id: id.parse().expect("a unique id in RINGCCL_TEST_JOB_ID"),
        rank: number(ENV_RANK),
        nranks: number(ENV_NRANKS),
    })
}

/// Rank `rank`'s GPU: `rank % gpus` (more ranks than GPUs share them, under MPS).
pub fn gpu_of(rank: usize) -> usize {
    let gpus = cudarc::driver::CudaContext::device_count().expect("the CUDA driver") as usize;
    rank % gpus.max(1)
}

/// Rank `rank`'s communicator of the job `id` of `nranks` ranks with `config`, on
/// [`gpu_of`]`(rank)`. Panics if it cannot be made.
pub fn join(
    id: &UniqueId,
    rank: usize,
    nranks: usize,
    config: ringccl::Config,
) -> ringccl::Communicator {
    ringccl::Communicator::init_rank_with_config(nranks, id, rank, gpu_of(rank), config)
        .expect("init_rank")
}

/// Runs `test` of this binary as each of the `n` ranks of a new job (a new unique id; rank r
/// with the job's variables and `extra(r)` in its environment), and panics unless every rank
/// passes within `limit` (a rank still running then is killed). See [`run_ranks`].
pub fn run_job(
    test: &str,
    n: usize,
    limit: Duration,
    extra: impl Fn(usize) -> Vec<(String, String)>,
) {
    let id = UniqueId::new().expect("a unique id").to_string();
    run_ranks(test, n, limit, |r| {
        let mut env = vec![
            (ENV_ID.to_string(), id.clone()),
            (ENV_RANK.to_string(), r.to_string()),
            (ENV_NRANKS.to_string(), n.to_string()),
        ];
        env.extend(extra(r));
        env
    });
}

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
