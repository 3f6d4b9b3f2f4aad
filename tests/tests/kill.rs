//! A killed or vanished process of a job must end its peers' calls within the timeout.
//!
//! Jobs of 2 or 4 processes (rank r on GPU r % GPUs; processes that share a GPU need MPS:
//! `nvidia-cuda-mps-control -d`) run a random stream of calls of
//! every algorithm a job of processes uses: all-reduces from a few elements (one-shot) to tens
//! of MiB (two-shot, the ring through the scratch, scratch growth), the other collectives
//! (two-shot and ring), and point-to-point `peer_ops`; the same stream on every rank (one seed
//! per job). Then one rank dies:
//!
//! | mode (`RINGCCL_KILL_MODE`) | how the rank dies |
//! | --- | --- |
//! | `kill` | SIGKILL at a random point of the stream: a random 0 to `RINGCCL_KILL_DELAY_MS` (500) ms after every rank finished its warm-ups |
//! | `init` | SIGKILL a random 0 to 600 ms after its start: before, during or just after `init_rank` |
//! | `exit` | `std::process::exit(0)` after a random 5 to 149 calls of the stream, without destroying the communicator |
//!
//! Before the stream, every rank makes untimed warm-up calls ([`warm_ups`]: every kind, small
//! and large, so the kernels of every algorithm are loaded) and synchronizes; a rank is never
//! killed before its peers are past them (`kill`, `exit`).
//!
//! Every survivor must return an error that names a rank within `RINGCCL_TIMEOUT` + 2 s
//! (`max(RINGCCL_TIMEOUT, RINGCCL_BOOTSTRAP_TIMEOUT)` + 2 s when the death can fall in the
//! join), drop its communicator, make a new communicator on the same GPU and all-reduce
//! correctly with it, and exit 0 within 40 s. Each time to error is printed, and a summary line
//! with the kills made and the slowest.
//!
//! `abort_ends_a_call_blocked_on_the_host`: with no timeout, a rank alone in its calls is
//! blocked on the host; `abort()` from another thread ends the call within a second.
//!
//! Jobs run one at a time (`RINGCCL_KILL_PARALLEL`, default 1): rank r of every job is on GPU
//! r % GPUs, so parallel jobs share GPUs, and each job sizes its kernels' grids as if it were
//! alone there (the two-shot kernel takes up to one block per SM): one job's spinning blocks
//! can hold the SMs that another job's blocks need to meet at their barriers, and both time out
//! with no death at all (seen on one H200 under MPS with 3 and 6 jobs at a time).
//!
//! Run (one GPU, under MPS, or several GPUs):
//! `RINGCCL_KILL_RANKS=2 RINGCCL_KILL_JOBS=24 RINGCCL_TIMEOUT=3
//! cargo test -p ringccl-tests --test kill -- --include-ignored --test-threads=1 --nocapture
//! killed_ranks_end_their_peers_calls_in_time`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cudarc::driver::CudaContext;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringccl::{Communicator, Config, Error, Io, PeerOp, RedOp, UniqueId};

const ENV_CHILD: &str = "RINGCCL_KILL_CHILD";
const ENV_ID: &str = "RINGCCL_KILL_JOB_ID";
const ENV_RANK: &str = "RINGCCL_KILL_JOB_RANK";
const ENV_NRANKS: &str = "RINGCCL_KILL_JOB_NRANKS";
const ENV_DIR: &str = "RINGCCL_KILL_JOB_DIR";
const ENV_SEED: &str = "RINGCCL_KILL_JOB_SEED";
/// `exit` mode: the rank that exits, and after how many calls.
const ENV_EXIT_AT: &str = "RINGCCL_KILL_EXIT_AT";

/// The largest count of one call, in f32 (32 MiB: the scratch grows past its first 32 MiB).
const MAX_COUNT: usize = 8 << 20;

fn env_or<T: std::str::FromStr>(k: &str, default: T) -> T {
    match std::env::var(k) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{k}={v}: not understood")),
        Err(_) => default,
    }
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// The device of rank `rank`: GPU `rank % gpus` (ranks sharing a GPU need MPS).
fn device_for(rank: usize, _n: usize) -> usize {
    let gpus = CudaContext::device_count().map_or(1, |c| c.max(1) as usize);
    rank % gpus
}

/// One call of the stream, drawn from `rng` (the same on every rank of a job).
#[derive(Debug, Clone, Copy)]
enum Call {
    AllReduce(usize),
    ReduceScatter(usize),
    AllGather(usize),
    Broadcast(usize, usize),
    Reduce(usize, usize),
    AllToAll(usize),
    PeerRing(usize),
}

fn draw(rng: &mut StdRng, n: usize) -> Call {
    // Sizes log-uniform from 1 element to MAX_COUNT / n per rank share (every collective's
    // buffers fit n * share).
    let share_max = MAX_COUNT / n;
    let bits = rng.random_range(0..=share_max.ilog2());
    let c = rng
        .random_range((1usize << bits) / 2..=(1usize << bits))
        .clamp(1, share_max);
    let root = rng.random_range(0..n);
    match rng.random_range(0..10) {
        0..=3 => Call::AllReduce(c * n.min(2)),
        4 => Call::ReduceScatter(c),
        5 => Call::AllGather(c),
        6 => Call::Broadcast(c, root),
        7 => Call::Reduce(c, root),
        8 => Call::AllToAll(c),
        _ => Call::PeerRing(c),
    }
}

/// The calls each rank makes before the stream (and before it can be killed): every kind, of
/// a few elements and of a large share (one-shot, two-shot and the ring through the scratch),
/// within the scratch's first size, so that the stream's largest calls still grow it.
fn warm_ups(n: usize) -> Vec<Call> {
    let big = MAX_COUNT / (2 * n);
    [1000, big]
        .into_iter()
        .flat_map(|c| {
            [
                Call::AllReduce(c * n),
                Call::ReduceScatter(c),
                Call::AllGather(c),
                Call::Broadcast(c, n - 1),
                Call::Reduce(c, 0),
                Call::AllToAll(c),
                Call::PeerRing(c),
            ]
        })
        .collect()
}

/// Why a survivor's call failed, as the error says it: the rank it names, if any.
fn named_rank(e: &Error) -> Option<usize> {
    match e {
        Error::Timeout { peer: Some(p), .. } => Some(*p),
        e => e.rank(),
    }
}

/// A rank of a job started by [`killed_ranks_end_their_peers_calls_in_time`]: joins, runs the
/// stream until a call fails, writes `rank<r>.err` (time, error), then checks the GPU with a
/// new communicator.
#[test]
#[ignore = "started by killed_ranks_end_their_peers_calls_in_time as each rank"]
fn kill_driver() {
    if std::env::var_os(ENV_CHILD).is_none() {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let id: UniqueId = var(ENV_ID).parse().expect("the id");
    let rank: usize = var(ENV_RANK).parse().expect("the rank");
    let n: usize = var(ENV_NRANKS).parse().expect("the rank count");
    let seed: u64 = var(ENV_SEED).parse().expect("the seed");
    let dir = PathBuf::from(var(ENV_DIR));
    let exit_at: Option<(usize, u64)> = std::env::var(ENV_EXIT_AT).ok().map(|v| {
        let (r, k) = v.split_once(':').expect("RANK:CALLS");
        (r.parse().expect("a rank"), k.parse().expect("a call count"))
    });
    let device = device_for(rank, n);
    let fail = |e: Error| -> ! {
        let named = named_rank(&e);
        let line = format!("{}\t{:?}\t{e}\n", now_us(), named);
        std::fs::write(dir.join(format!("rank{rank}.err")), line).expect("the error file");
        println!("rank {rank}: failed: {e} (names rank {named:?})");
        fresh_all_reduce(device);
        println!("rank {rank}: a new communicator on GPU {device} all-reduced correctly");
        std::process::exit(if named.is_some() { 0 } else { 3 });
    };
    let comm = Communicator::init_rank(n, &id, rank, device).unwrap_or_else(|e| fail(e));
    let stream = comm.stream(rank).clone();
    let a = stream
        .clone_htod(&vec![1.0f32; MAX_COUNT])
        .expect("the send buffer");
    let mut b = stream
        .alloc_zeros::<f32>(MAX_COUNT)
        .expect("the receive buffer");
    let s = [&stream];
    let mut run = |call: Call| match call {
        Call::AllReduce(c) => {
            comm.all_reduce(&mut [Io::out_of_place(&a, &mut b)], c, RedOp::Sum, &s)
        }
        Call::ReduceScatter(c) => {
            comm.reduce_scatter(&mut [Io::out_of_place(&a, &mut b)], c, RedOp::Sum, &s)
        }
        Call::AllGather(c) => comm.all_gather(&mut [Io::out_of_place(&a, &mut b)], c, &s),
        Call::Broadcast(c, root) => {
            comm.broadcast(&mut [Io::out_of_place(&a, &mut b)], c, root, &s)
        }
        Call::Reduce(c, root) => {
            comm.reduce(&mut [Io::out_of_place(&a, &mut b)], c, RedOp::Sum, root, &s)
        }
        Call::AllToAll(c) => comm.all_to_all(&mut [Io::out_of_place(&a, &mut b)], c, &s),
        Call::PeerRing(c) => {
            let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
            comm.peer_ops(
                &mut [
                    PeerOp::send(rank, next, &a, c),
                    PeerOp::recv(rank, prev, &mut b, c),
                ],
                &s,
            )
        }
    };
    // Warm-ups, not timed: every kind of call small and large (the kernels of every algorithm
    // are loaded and the first calls' setup is done), then the stream starts.
    let t_warm = Instant::now();
    for call in warm_ups(n) {
        run(call).unwrap_or_else(|e| fail(e));
    }
    comm.synchronize().unwrap_or_else(|e| fail(e));
    println!("rank {rank}: warm-ups done in {:?}", t_warm.elapsed());
    std::fs::write(dir.join(format!("rank{rank}.ready")), b"").expect("the ready file");
    let mut rng = StdRng::seed_from_u64(seed);
    let t0 = Instant::now();
    let mut calls = 0u64;
    let err = loop {
        if exit_at.is_some_and(|(r, k)| r == rank && k == calls) {
            std::fs::write(dir.join(format!("rank{rank}.exit")), now_us().to_string())
                .expect("the exit file");
            println!("rank {rank}: exits after {calls} calls without destroying its communicator");
            std::process::exit(0);
        }
        let call = draw(&mut rng, n);
        let sync = rng.random_range(0..4) == 0;
        let r = run(call).and_then(|()| if sync { comm.synchronize() } else { Ok(()) });
        calls += 1;
        if let Err(e) = r {
            break e;
        }
        if calls.is_multiple_of(200) {
            println!(
                "rank {rank}: {calls} calls, {:.1} s, last {call:?}",
                t0.elapsed().as_secs_f64()
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "rank {rank}: no error in 300 s"
        );
    };
    let named = named_rank(&err);
    let line = format!("{}\t{named:?}\t{err}\n", now_us());
    std::fs::write(dir.join(format!("rank{rank}.err")), line).expect("the error file");
    println!("rank {rank}: call {calls} failed: {err} (names rank {named:?})");
    let t1 = Instant::now();
    drop(comm);
    println!("rank {rank}: communicator dropped in {:?}", t1.elapsed());
    drop((a, b));
    fresh_all_reduce(device);
    println!("rank {rank}: a new communicator on GPU {device} all-reduced correctly");
    if named.is_none() {
        std::process::exit(3);
    }
}

/// A new communicator of this process on `device` all-reduces correctly.
fn fresh_all_reduce(device: usize) {
    let comm = Communicator::new(&[device]).expect("a new communicator");
    let stream = comm.stream(0).clone();
    for count in [1000usize, 3 << 20] {
        let host: Vec<f32> = (0..count).map(|i| (i % 97) as f32).collect();
        let x = stream.clone_htod(&host).expect("upload");
        let mut y = stream.alloc_zeros::<f32>(count).expect("alloc");
        comm.all_reduce(
            &mut [Io::out_of_place(&x, &mut y)],
            count,
            RedOp::Sum,
            &[&stream],
        )
        .expect("all_reduce on the new communicator");
        comm.synchronize()
            .expect("synchronize the new communicator");
        let got = stream.clone_dtoh(&y).expect("download");
        assert_eq!(got, host, "the new communicator's all-reduce of {count}");
    }
}

/// How one job went.
#[derive(Default)]
struct Outcome {
    kills: usize,
    /// Each survivor's time from the death to its error.
    to_error: Vec<Duration>,
    failures: Vec<String>,
    /// The job's wall time (the slowest job, for a summary).
    wall: Duration,
}

fn spawn(
    id: &UniqueId,
    rank: usize,
    n: usize,
    seed: u64,
    dir: &Path,
    extra: &[(&str, String)],
) -> Child {
    let exe = std::env::current_exe().expect("this test binary");
    let timeout = env_or("RINGCCL_TIMEOUT", 3u64).to_string();
    Command::new(exe)
        .args([
            "kill_driver",
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_CHILD, "1")
        .env(ENV_ID, id.to_string())
        .env(ENV_RANK, rank.to_string())
        .env(ENV_NRANKS, n.to_string())
        .env(ENV_SEED, seed.to_string())
        .env(ENV_DIR, dir)
        .env("RINGCCL_TIMEOUT", &timeout)
        .env("RINGCCL_BOOTSTRAP_TIMEOUT", &timeout)
        .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn a rank")
}

/// One job of `n` ranks: starts them, makes one die per `mode`, checks every survivor.
fn one_job(job: usize, n: usize, mode: &str, seed: u64) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9);
    let timeout = Duration::from_secs(env_or("RINGCCL_TIMEOUT", 3u64));
    let limit = timeout + Duration::from_secs(2);
    let dir = std::env::temp_dir().join(format!("ringccl-kill-{}-{job}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let id = UniqueId::new().expect("a unique id");
    let victim = rng.random_range(0..n);
    let mut extra = Vec::new();
    if mode == "exit" {
        extra.push((
            ENV_EXIT_AT,
            format!("{victim}:{}", rng.random_range(5..150u64)),
        ));
    }
    let mut kids: Vec<Child> = (0..n)
        .map(|r| spawn(&id, r, n, seed, &dir, &extra))
        .collect();
    let started = Instant::now();
    let mut out = Outcome::default();
    let fail = |out: &mut Outcome, m: String| {
        println!("job {job}: FAILED: {m}");
        out.failures.push(m);
    };
    // The moment of the death, in the clock the children write.
    let death_us: Option<u128> = match mode {
        "init" => {
            std::thread::sleep(Duration::from_millis(rng.random_range(0..600)));
            let t = now_us();
            let _ = kids[victim].kill();
            Some(t)
        }
        "kill" => {
            let all_ready = |d: &Path| (0..n).all(|r| d.join(format!("rank{r}.ready")).exists());
            while !all_ready(&dir) && started.elapsed() < Duration::from_secs(120) {
                if kids.iter_mut().any(|k| matches!(k.try_wait(), Ok(Some(_)))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if !all_ready(&dir) {
                fail(
                    &mut out,
                    format!("not every rank of {n} started its stream"),
                );
                None
            } else {
                let max_ms = env_or("RINGCCL_KILL_DELAY_MS", 500u64);
                std::thread::sleep(Duration::from_millis(rng.random_range(0..=max_ms)));
                let t = now_us();
                let _ = kids[victim].kill();
                Some(t)
            }
        }
        _ => None, // `exit`: the victim writes the time it exits.
    };
    let _ = kids[victim].wait();
    out.kills = 1;
    let death_us = death_us.or_else(|| {
        std::fs::read_to_string(dir.join(format!("rank{victim}.exit")))
            .ok()
            .and_then(|t| t.trim().parse().ok())
    });
    let death = Instant::now();
    for (r, kid) in kids.iter_mut().enumerate().filter(|(r, _)| *r != victim) {
        let status = loop {
            if let Ok(Some(s)) = kid.try_wait() {
                break Some(s);
            }
            if death.elapsed() > Duration::from_secs(40) {
                let _ = kid.kill();
                let _ = kid.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let err = std::fs::read_to_string(dir.join(format!("rank{r}.err"))).unwrap_or_default();
        let mut fields = err.splitn(3, '\t');
        let at: Option<u128> = fields.next().and_then(|t| t.parse().ok());
        let named = fields.next().unwrap_or("?").to_string();
        let what = fields.next().unwrap_or("").trim().to_string();
        match (status, at, death_us) {
            (None, _, _) => fail(
                &mut out,
                format!("rank {r} still ran 40 s after rank {victim} died"),
            ),
            (Some(s), _, _) if !s.success() => fail(
                &mut out,
                format!("rank {r} exited {s} (error: {what}, names {named})"),
            ),
            (Some(_), Some(at), Some(d)) => {
                let took =
                    Duration::from_micros(u64::try_from(at.saturating_sub(d)).unwrap_or(u64::MAX));
                println!(
                    "job {job} ({n} ranks, {mode}): rank {victim} died; rank {r} failed after {:.3} s naming {named}: {what}",
                    took.as_secs_f64()
                );
                // A death during the join can leave a survivor in the bootstrap's wait, bounded
                // by its own timeout (set alike here).
                if took > limit {
                    fail(
                        &mut out,
                        format!("rank {r} took {took:?} to fail (limit {limit:?})"),
                    );
                }
                out.to_error.push(took);
            }
            _ => fail(
                &mut out,
                format!("rank {r}: no error time or no death time"),
            ),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    out.wall = started.elapsed();
    println!(
        "job {job}: {:.1} s from the start of its ranks to the end of the last",
        out.wall.as_secs_f64()
    );
    out
}

/// Jobs of `RINGCCL_KILL_RANKS` processes (2), `RINGCCL_KILL_JOBS` of them (6),
/// `RINGCCL_KILL_PARALLEL` at a time (1: jobs that share a GPU must not run together), one rank
/// of each killed per `RINGCCL_KILL_MODE` (`kill`, `init`, `exit`); `RINGCCL_KILL_SEED` fixes
/// the random choices, `RINGCCL_KILL_DELAY_MS` (500) the latest kill after the warm-ups.
#[test]
#[ignore = "needs a CUDA GPU per rank, or one GPU under MPS"]
fn killed_ranks_end_their_peers_calls_in_time() {
    let n: usize = env_or("RINGCCL_KILL_RANKS", 2);
    let jobs: usize = env_or("RINGCCL_KILL_JOBS", 6);
    let parallel: usize = env_or::<usize>("RINGCCL_KILL_PARALLEL", 1).max(1);
    let mode: String = env_or("RINGCCL_KILL_MODE", "kill".to_string());
    assert!(
        matches!(mode.as_str(), "kill" | "init" | "exit"),
        "RINGCCL_KILL_MODE={mode}"
    );
    assert!((2..=8).contains(&n), "RINGCCL_KILL_RANKS={n}: 2 to 8");
    let seed: u64 = env_or("RINGCCL_KILL_SEED", (now_us() % 1_000_000_007) as u64);
    println!("kill test: {jobs} jobs of {n} ranks, {parallel} at a time, mode {mode}, seed {seed}");
    if parallel > 1 {
        // Jobs that share a GPU size their kernels' grids as if alone: one job's spinning
        // blocks can hold the SMs another job's blocks need to meet at their barriers.
        println!("kill test: jobs run {parallel} at a time: only sound if no two jobs share a GPU");
    }
    let t0 = Instant::now();
    let mut all = Outcome::default();
    for batch in (0..jobs).collect::<Vec<_>>().chunks(parallel) {
        let outs: Vec<Outcome> = std::thread::scope(|s| {
            let hs: Vec<_> = batch
                .iter()
                .map(|&j| {
                    let mode = mode.as_str();
                    s.spawn(move || one_job(j, n, mode, seed.wrapping_add(j as u64 * 7919)))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("a job's thread"))
                .collect()
        });
        for o in outs {
            all.kills += o.kills;
            all.to_error.extend(o.to_error);
            all.failures.extend(o.failures);
            all.wall = all.wall.max(o.wall);
        }
    }
    let slowest = all.to_error.iter().max().copied().unwrap_or_default();
    println!(
        "kill summary: mode {mode}, {n} ranks, {jobs} jobs, {} kills, {} survivors failed in time, slowest time to error {:.3} s (limit {} s + 2 s), {} failures, {:.1} s (slowest job {:.1} s)",
        all.kills,
        all.to_error.len(),
        slowest.as_secs_f64(),
        env_or("RINGCCL_TIMEOUT", 3u64),
        all.failures.len(),
        t0.elapsed().as_secs_f64(),
        all.wall.as_secs_f64()
    );
    assert!(all.failures.is_empty(), "{:#?}", all.failures);
    assert_eq!(
        all.to_error.len(),
        jobs * (n - 1),
        "every survivor reported"
    );
}

/// Rank 0 of [`abort_ends_a_call_blocked_on_the_host`]: with no timeout, its calls wait for
/// rank 1, which never makes them; another thread aborts after 1 s.
#[test]
#[ignore = "started by abort_ends_a_call_blocked_on_the_host as each rank"]
fn abort_rank() {
    if std::env::var_os(ENV_CHILD).is_none() {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let id: UniqueId = var(ENV_ID).parse().expect("the id");
    let rank: usize = var(ENV_RANK).parse().expect("the rank");
    let dir = PathBuf::from(var(ENV_DIR));
    let device = device_for(rank, 2);
    let mut config = Config::from_env().expect("config");
    config.timeout = None;
    let comm =
        Communicator::init_rank_with_config(2, &id, rank, device, config).expect("init_rank");
    if rank == 1 {
        // Joined, but makes no call until rank 0 is done.
        let t0 = Instant::now();
        while !dir.join("done").exists() && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(20));
        }
        return;
    }
    let stream = comm.stream(0).clone();
    let count = 6usize << 20; // 24 MiB of f32: the scratch grows (or the ring waits)
    let a = stream.alloc_zeros::<f32>(count).expect("alloc");
    let mut b = stream.alloc_zeros::<f32>(count).expect("alloc");
    let aborted_at = std::thread::scope(|s| {
        let aborter = s.spawn(|| {
            std::thread::sleep(Duration::from_secs(1));
            let t = Instant::now();
            let r = comm.abort();
            println!("rank 0: abort() returned {r:?} in {:?}", t.elapsed());
            t
        });
        let t0 = Instant::now();
        let mut result = Ok(());
        // A small call (its device wait blocks), then a large one (it waits on the host for
        // the first, to grow the scratch), then synchronize (a host wait): whichever blocks.
        for c in [1000usize, count] {
            result = comm.all_reduce(
                &mut [Io::out_of_place(&a, &mut b)],
                c,
                RedOp::Sum,
                &[&stream],
            );
            if result.is_err() {
                break;
            }
        }
        let result = result.and_then(|()| comm.synchronize());
        let ended = t0.elapsed();
        let at = aborter.join().expect("the aborting thread");
        println!("rank 0: blocked call ended after {ended:?} with {result:?}");
        assert!(matches!(result, Err(Error::Aborted { .. })), "{result:?}");
        assert!(
            ended < Duration::from_secs(3),
            "the abort took {ended:?} to end the call"
        );
        at
    });
    let t = Instant::now();
    drop(comm);
    println!(
        "rank 0: dropped in {:?} ({:?} after the abort)",
        t.elapsed(),
        aborted_at.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(12));
    std::fs::write(dir.join("done"), b"").expect("the done file");
    drop((a, b));
    fresh_all_reduce(device);
    println!("rank 0: a new communicator on GPU {device} all-reduced correctly");
}

#[test]
#[ignore = "needs a CUDA GPU per rank, or one GPU under MPS"]
fn abort_ends_a_call_blocked_on_the_host() {
    let dir = std::env::temp_dir().join(format!("ringccl-abort-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let id = UniqueId::new().expect("a unique id");
    let exe = std::env::current_exe().expect("this test binary");
    let mut kids: Vec<Child> = (0..2)
        .map(|r| {
            Command::new(&exe)
                .args([
                    "abort_rank",
                    "--exact",
                    "--include-ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(ENV_CHILD, "1")
                .env(ENV_ID, id.to_string())
                .env(ENV_RANK, r.to_string())
                .env(ENV_DIR, &dir)
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    let t0 = Instant::now();
    let mut status = [None, None];
    while status.iter().any(Option::is_none) && t0.elapsed() < Duration::from_secs(90) {
        for (r, k) in kids.iter_mut().enumerate() {
            if status[r].is_none() {
                status[r] = k.try_wait().expect("wait");
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for k in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    for (r, s) in status.iter().enumerate() {
        match s {
            Some(s) if s.success() => {}
            Some(s) => panic!("rank {r} failed: {s}"),
            None => panic!("rank {r} did not finish within 90 s"),
        }
    }
}
