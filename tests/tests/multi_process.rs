//! GPU test of one process per GPU: every collective of a job of processes, checked element by
//! element against the values computed on the host.
//!
//! `every_collective_across_processes` (2+ GPUs) makes a [`UniqueId`], starts one process per
//! GPU (this test binary again, running `rank_of_a_job` with the id, the rank and the rank
//! count in its environment), and waits for all of them (bounded). `rank_of_a_job` joins the
//! job as its rank and runs the checks; started alone (no job in its environment) it is a job
//! of one rank on GPU 0.
//!
//! Run on a GPU machine: `cargo test -p ringccl-tests --test multi_process -- --include-ignored
//! --test-threads=1 --nocapture`.

use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use ringccl::{Communicator, DeviceElement, Io, PeerOp, RedOp, UniqueId};
use ringccl_tests::jobs::{run_job, this_rank, JobRank};

/// When set to `M`, the ranks count as on `M` machines (rank r on machine `r · M / n`, through
/// `Config::host_id`), so that one machine runs the job as several.
const ENV_MACHINES: &str = "RINGCCL_TEST_JOB_MACHINES";

/// The element types the checks run over: small integers are exact in all of them.
trait Elem: DeviceElement + PartialEq + cudarc::driver::ValidAsZeroBits {
    fn from_small(v: i64) -> Self;
    fn to_f64(self) -> f64;
}

impl Elem for f32 {
    fn from_small(v: i64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

impl Elem for bf16 {
    fn from_small(v: i64) -> Self {
        bf16::from_f32(v as f32)
    }
    fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }
}

impl Elem for i32 {
    fn from_small(v: i64) -> Self {
        v as i32
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

/// Rank `r`'s input element `i`.
fn input(r: usize, i: usize) -> i64 {
    ((r * 7 + i * 3) % 13) as i64 - 4
}

fn inputs<T: Elem>(r: usize, len: usize) -> Vec<T> {
    (0..len).map(|i| T::from_small(input(r, i))).collect()
}

/// `op` over the ranks' inputs at `i` (as exact integers; avg of an integer type truncates).
fn reduce_at(op: RedOp, n: usize, i: usize, float: bool) -> f64 {
    let vals = (0..n).map(|q| input(q, i));
    match op {
        RedOp::Sum => vals.sum::<i64>() as f64,
        RedOp::Max => vals.max().unwrap_or(0) as f64,
        RedOp::Min => vals.min().unwrap_or(0) as f64,
        RedOp::Prod => vals.product::<i64>() as f64,
        RedOp::Avg => {
            let s: i64 = vals.sum();
            if float {
                s as f64 / n as f64
            } else {
                (s / n as i64) as f64
            }
        }
    }
}

struct Job {
    comm: Communicator,
    rank: usize,
    n: usize,
}

impl Job {
    fn stream(&self) -> &std::sync::Arc<CudaStream> {
        self.comm.stream(self.rank)
    }
    fn up<T: Elem>(&self, v: &[T]) -> CudaSlice<T> {
        self.stream().clone_htod(v).expect("upload")
    }
    fn zeros<T: Elem>(&self, len: usize) -> CudaSlice<T> {
        self.stream().alloc_zeros::<T>(len.max(1)).expect("alloc")
    }
    fn down<T: Elem>(&self, b: &CudaSlice<T>) -> Vec<T> {
        self.stream().synchronize().expect("synchronize");
        self.stream().clone_dtoh(b).expect("download")
    }
}

fn check<T: Elem>(
    what: &str,
    got: &[T],
    want: impl Fn(usize) -> f64,
    range: std::ops::Range<usize>,
) -> usize {
    let mut bad = 0;
    for i in range.clone() {
        let w = want(i - range.start);
        if got[i].to_f64() != w {
            if bad < 5 {
                eprintln!("{what}: element {i} = {} but {w} expected", got[i].to_f64());
            }
            bad += 1;
        }
    }
    bad
}

/// Every collective for type `T`: out of place and in place, several counts, two roots.
fn check_type<T: Elem>(job: &Job, float: bool) -> (usize, usize) {
    let (r, n) = (job.rank, job.n);
    let s = [job.stream()];
    let ty = T::DTYPE.name();
    let (mut cases, mut bad) = (0usize, 0usize);
    let ops: &[RedOp] = if float {
        &[RedOp::Sum, RedOp::Max, RedOp::Avg]
    } else {
        &[RedOp::Sum, RedOp::Min, RedOp::Avg]
    };
    for &c in &[0usize, 1, 4097, (1 << 20) + 3] {
        for &in_place in &[false, true] {
            let tag = |name: &str| format!("{name} {ty} count {c} in place {in_place} rank {r}");
            for &op in ops {
                // All-reduce.
                let what = tag(&format!("all_reduce {op:?}"));
                let input_v = inputs::<T>(r, c);
                let got = if in_place {
                    let mut b = job.up(&input_v);
                    job.comm
                        .all_reduce(&mut [Io::in_place(&mut b)], c, op, &s)
                        .expect(&what);
                    job.down(&b)
                } else {
                    let a = job.up(&input_v);
                    let mut b = job.zeros::<T>(c);
                    job.comm
                        .all_reduce(&mut [Io::out_of_place(&a, &mut b)], c, op, &s)
                        .expect(&what);
                    job.down(&b)
                };
                bad += check(&what, &got, |i| reduce_at(op, n, i, float), 0..c);
                cases += 1;

                // Reduce-scatter.
                let what = tag(&format!("reduce_scatter {op:?}"));
                let input_v = inputs::<T>(r, n * c);
                let (got, at) = if in_place {
                    let mut b = job.up(&input_v);
                    job.comm
                        .reduce_scatter(&mut [Io::in_place(&mut b)], c, op, &s)
                        .expect(&what);
                    (job.down(&b), r * c)
                } else {
                    let a = job.up(&input_v);
                    let mut b = job.zeros::<T>(c);
                    job.comm
                        .reduce_scatter(&mut [Io::out_of_place(&a, &mut b)], c, op, &s)
                        .expect(&what);
                    (job.down(&b), 0)
                };
                bad += check(
                    &what,
                    &got,
                    |i| reduce_at(op, n, r * c + i, float),
                    at..at + c,
                );
                cases += 1;

                // Reduce to each root.
                for root in [0, n - 1] {
                    let what = tag(&format!("reduce {op:?} root {root}"));
                    let input_v = inputs::<T>(r, c);
                    let got = if in_place {
                        let mut b = job.up(&input_v);
                        job.comm
                            .reduce(&mut [Io::in_place(&mut b)], c, op, root, &s)
                            .expect(&what);
                        job.down(&b)
                    } else {
                        let a = job.up(&input_v);
                        let mut b = job.zeros::<T>(c);
                        job.comm
                            .reduce(&mut [Io::out_of_place(&a, &mut b)], c, op, root, &s)
                            .expect(&what);
                        job.down(&b)
                    };
                    if r == root {
                        bad += check(&what, &got, |i| reduce_at(op, n, i, float), 0..c);
                    }
                    cases += 1;
                }
            }

            // All-gather.
            let what = tag("all_gather");
            let mine = inputs::<T>(r, c);
            let got = if in_place {
                let mut full = vec![T::from_small(99); n * c];
                full[r * c..(r + 1) * c].copy_from_slice(&mine);
                let mut b = job.up(&full);
                job.comm
                    .all_gather(&mut [Io::in_place(&mut b)], c, &s)
                    .expect(&what);
                job.down(&b)
            } else {
                let a = job.up(&mine);
                let mut b = job.zeros::<T>(n * c);
                job.comm
                    .all_gather(&mut [Io::out_of_place(&a, &mut b)], c, &s)
                    .expect(&what);
                job.down(&b)
            };
            bad += check(
                &what,
                &got,
                |k| input(k / c.max(1), k % c.max(1)) as f64,
                0..n * c,
            );
            cases += 1;

            // All-to-all (out of place only, as in NCCL).
            if !in_place {
                let what = tag("all_to_all");
                let a = job.up(&inputs::<T>(r, n * c));
                let mut b = job.zeros::<T>(n * c);
                job.comm
                    .all_to_all(&mut [Io::out_of_place(&a, &mut b)], c, &s)
                    .expect(&what);
                let got = job.down(&b);
                bad += check(
                    &what,
                    &got,
                    |k| input(k / c.max(1), r * c + k % c.max(1)) as f64,
                    0..n * c,
                );
                cases += 1;
            }

            for root in [0, n - 1] {
                // Broadcast.
                let what = tag(&format!("broadcast root {root}"));
                let got = if r == root && !in_place {
                    let a = job.up(&inputs::<T>(r, c));
                    let mut b = job.zeros::<T>(c);
                    job.comm
                        .broadcast(&mut [Io::out_of_place(&a, &mut b)], c, root, &s)
                        .expect(&what);
                    job.down(&b)
                } else if r == root {
                    let mut b = job.up(&inputs::<T>(r, c));
                    job.comm
                        .broadcast(&mut [Io::in_place(&mut b)], c, root, &s)
                        .expect(&what);
                    job.down(&b)
                } else {
                    let mut b = job.zeros::<T>(c);
                    job.comm
                        .broadcast(&mut [Io::recv_only(&mut b)], c, root, &s)
                        .expect(&what);
                    job.down(&b)
                };
                bad += check(&what, &got, |i| input(root, i) as f64, 0..c);
                cases += 1;

                // Gather.
                let what = tag(&format!("gather root {root}"));
                let mine = inputs::<T>(r, c);
                if r == root {
                    let got = if in_place {
                        let mut full = vec![T::from_small(99); n * c];
                        full[r * c..(r + 1) * c].copy_from_slice(&mine);
                        let mut b = job.up(&full);
                        job.comm
                            .gather(&mut [Io::in_place(&mut b)], c, root, &s)
                            .expect(&what);
                        job.down(&b)
                    } else {
                        let a = job.up(&mine);
                        let mut b = job.zeros::<T>(n * c);
                        job.comm
                            .gather(&mut [Io::out_of_place(&a, &mut b)], c, root, &s)
                            .expect(&what);
                        job.down(&b)
                    };
                    bad += check(
                        &what,
                        &got,
                        |k| input(k / c.max(1), k % c.max(1)) as f64,
                        0..n * c,
                    );
                } else {
                    let a = job.up(&mine);
                    job.comm
                        .gather(&mut [Io::send_only(&a)], c, root, &s)
                        .expect(&what);
                    job.stream().synchronize().expect("synchronize");
                }
                cases += 1;

                // Scatter.
                let what = tag(&format!("scatter root {root}"));
                if r == root {
                    let all = inputs::<T>(r, n * c);
                    let (got, at) = if in_place {
                        let mut b = job.up(&all);
                        job.comm
                            .scatter(&mut [Io::in_place(&mut b)], c, root, &s)
                            .expect(&what);
                        (job.down(&b), r * c)
                    } else {
                        let a = job.up(&all);
                        let mut b = job.zeros::<T>(c);
                        job.comm
                            .scatter(&mut [Io::out_of_place(&a, &mut b)], c, root, &s)
                            .expect(&what);
                        (job.down(&b), 0)
                    };
                    bad += check(&what, &got, |i| input(root, r * c + i) as f64, at..at + c);
                } else {
                    let mut b = job.zeros::<T>(c);
                    job.comm
                        .scatter(&mut [Io::recv_only(&mut b)], c, root, &s)
                        .expect(&what);
                    let got = job.down(&b);
                    bad += check(&what, &got, |i| input(root, r * c + i) as f64, 0..c);
                }
                cases += 1;
            }
        }
    }
    (cases, bad)
}

/// Point-to-point groups of this rank (each rank makes the same calls, naming its own side):
/// a ring shift, an exchange with every rank (itself included) with a different count per
/// pair, and sends split differently from the receives; counts from 0 to several chunks of
/// the peers' scratch. Every element is checked; a collective follows each group.
fn check_peer_ops<T: Elem>(job: &Job) -> (usize, usize) {
    let (r, n) = (job.rank, job.n);
    let s = [job.stream()];
    let ty = T::DTYPE.name();
    let (mut cases, mut bad) = (0usize, 0usize);
    for &c in &[0usize, 1, 4097, (1 << 20) + 3, (3 << 20) + 5] {
        // Ring shift.
        let what = format!("peer_ops ring shift {ty} count {c} rank {r}");
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let a = job.up(&inputs::<T>(r, c));
        let mut b = job.zeros::<T>(c);
        job.comm
            .peer_ops(
                &mut [
                    PeerOp::send(r, next, &a, c),
                    PeerOp::recv(r, prev, &mut b, c),
                ],
                &s,
            )
            .expect(&what);
        let got = job.down(&b);
        bad += check(&what, &got, |i| input(prev, i) as f64, 0..c);
        cases += 1;
        // Every rank to every rank, count depending on the pair; received in two pieces.
        let what = format!("peer_ops all to all {ty} count {c} rank {r}");
        let len = |from: usize, to: usize| c / (1 + from + 2 * to) + from;
        let sends: Vec<CudaSlice<T>> = (0..n)
            .map(|q| job.up(&inputs::<T>(r * 10 + q, len(r, q).max(1))))
            .collect();
        let mut recvs: Vec<(CudaSlice<T>, CudaSlice<T>)> = (0..n)
            .map(|q| {
                let l = len(q, r);
                (job.zeros::<T>(l / 3), job.zeros::<T>(l - l / 3))
            })
            .collect();
        let mut ops = Vec::new();
        for (q, buf) in sends.iter().enumerate() {
            ops.push(PeerOp::send(r, q, buf, len(r, q)));
        }
        for (q, (x, y)) in recvs.iter_mut().enumerate() {
            let l = len(q, r);
            ops.push(PeerOp::recv(r, q, x, l / 3));
            ops.push(PeerOp::recv(r, q, y, l - l / 3));
        }
        job.comm.peer_ops(&mut ops, &s).expect(&what);
        drop(ops);
        for (q, (x, y)) in recvs.iter().enumerate() {
            let l = len(q, r);
            let mut got = job.down(x);
            got.truncate(l / 3);
            got.extend(job.down(y).into_iter().take(l - l / 3));
            bad += check(
                &format!("{what} from {q}"),
                &got,
                |i| input(q * 10 + r, i) as f64,
                0..l,
            );
        }
        cases += 1;
        // A collective right after: the groups left the scratch and the counters in step.
        let what = format!("all_reduce after peer_ops {ty} count {c} rank {r}");
        let x = job.up(&inputs::<T>(r, c));
        let mut y = job.zeros::<T>(c);
        job.comm
            .all_reduce(&mut [Io::out_of_place(&x, &mut y)], c, RedOp::Sum, &s)
            .expect(&what);
        let got = job.down(&y);
        bad += check(&what, &got, |i| reduce_at(RedOp::Sum, n, i, true), 0..c);
        cases += 1;
    }
    (cases, bad)
}

/// One rank of a job: joins with the id from the environment (or alone, as a job of one rank)
/// and checks every collective.
#[test]
#[ignore = "needs a CUDA GPU; started by every_collective_across_processes as each rank"]
fn rank_of_a_job() {
    let (comm, rank, n) = match this_rank() {
        Some(JobRank {
            id,
            rank,
            nranks: n,
        }) => {
            let mut config = ringccl::Config::from_env().expect("the RINGCCL_ variables");
            if let Ok(m) = std::env::var(ENV_MACHINES) {
                let m: usize = m.parse().expect("a machine count");
                config.host_id = Some(format!("test-machine-{}", rank * m / n));
            }
            // More ranks than GPUs share them (two processes on a GPU run together under MPS).
            (ringccl_tests::jobs::join(&id, rank, n, config), rank, n)
        }
        None => {
            let id = UniqueId::new().expect("a unique id");
            (
                Communicator::init_rank(1, &id, 0, 0).expect("init_rank"),
                0,
                1,
            )
        }
    };
    assert_eq!((comm.nranks(), comm.local_ranks()), (n, &[rank][..]));
    let job = Job { comm, rank, n };
    let t0 = Instant::now();
    let mut cases = 0;
    let mut bad = 0;
    for (c, b) in [
        check_type::<f32>(&job, true),
        check_type::<bf16>(&job, true),
        check_type::<i32>(&job, false),
        check_peer_ops::<f32>(&job),
        check_peer_ops::<i32>(&job),
    ] {
        cases += c;
        bad += b;
    }
    job.comm.synchronize().expect("synchronize");
    println!(
        "rank {rank} of {n}: {cases} cases, {bad} wrong elements ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(bad, 0, "rank {rank}: wrong elements");
}

/// Runs `test` of this binary as each of the `n` ranks of a new job (one process each, the job's
/// id, rank and size in their environment, plus `env`), and fails unless every rank passes
/// within `limit` (a rank still running then is killed).
fn run_ranks(test: &str, n: usize, env: &[(&str, &str)], limit: Duration) {
    run_job(test, n, limit, |_| {
        env.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    });
}

/// The ranks' processes of a job of every visible GPU (at most 8), each running
/// `rank_of_a_job`; `RINGCCL_TEST_PROCESSES=N` runs N processes instead, rank r on GPU
/// `r % gpus` (more processes than GPUs need the MPS daemon, so that the processes sharing a
/// GPU run at once).
#[test]
#[ignore = "needs 2+ CUDA GPUs (or RINGCCL_TEST_PROCESSES and MPS)"]
fn every_collective_across_processes() {
    let ctx = cudarc::driver::CudaContext::device_count().expect("the CUDA driver");
    let n = ringccl_tests::jobs::job_size((ctx as usize).min(8));
    assert!(n >= 2, "this test needs 2+ CUDA GPUs; {n} visible");
    run_ranks("rank_of_a_job", n, &[], Duration::from_secs(240));
    println!("{n} processes: every rank passed");
}

/// A job of four processes that counts as two machines of two ranks (`Config::host_id`), with
/// the network transport on (UCX over loopback TCP unless `UCX_TLS` is set): the ranks of a
/// machine reach each other over CUDA IPC, the others over UCX, and all-reduce, all-gather and
/// broadcast are hierarchical; every collective and `peer_ops` checked as in the job of one
/// machine. With fewer than four GPUs, processes share a GPU: start the MPS daemon first
/// (`nvidia-cuda-mps-control -d`), or their kernels take turns and the job crawls.
#[test]
#[ignore = "needs a CUDA GPU and UCX (libucp.so.0); with fewer than 4 GPUs, MPS"]
fn every_collective_across_two_machines() {
    let mut env = vec![("RINGCCL_NET", "ucx"), (ENV_MACHINES, "2")];
    if std::env::var_os("UCX_TLS").is_none() {
        env.extend([("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", "lo")]);
    }
    run_ranks("rank_of_a_job", 4, &env, Duration::from_secs(480));
    println!("4 processes as 2 machines: every rank passed");
}

/// Two ranks as two threads of this process (like `ncclCommInitRank` per device from threads):
/// the ranks reach each other's buffers by address with peer access instead of CUDA IPC.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn ranks_as_threads_of_one_process() {
    let ctx = cudarc::driver::CudaContext::device_count().expect("the CUDA driver");
    assert!(ctx >= 2, "this test needs 2+ CUDA GPUs; {ctx} visible");
    let id = UniqueId::new().expect("a unique id");
    let results: Vec<(usize, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let comm = Communicator::init_rank(2, &id, rank, rank).expect("init_rank");
                    let job = Job { comm, rank, n: 2 };
                    let (c, b) = check_type::<f32>(&job, true);
                    let (c2, b2) = check_peer_ops::<bf16>(&job);
                    job.comm.synchronize().expect("synchronize");
                    (c + c2, b + b2)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank's thread"))
            .collect()
    });
    for (rank, (cases, bad)) in results.iter().enumerate() {
        println!("thread rank {rank}: {cases} cases, {bad} wrong elements");
        assert_eq!(*bad, 0, "rank {rank}: wrong elements");
    }
}

/// The same point-to-point API with one process holding both ranks: sends matched with
/// receives, a ring shift and an exchange of different counts.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn peer_ops_in_one_process() {
    let comm = Communicator::new(&[0, 1]).expect("a communicator of GPUs 0 and 1");
    let c = (3 << 20) + 7;
    let a: Vec<CudaSlice<f32>> = (0..2)
        .map(|r| {
            comm.stream(r)
                .clone_htod(&inputs::<f32>(r, c))
                .expect("upload")
        })
        .collect();
    let mut b: Vec<CudaSlice<f32>> = (0..2)
        .map(|r| comm.stream(r).alloc_zeros::<f32>(c).expect("alloc"))
        .collect();
    let (b0, b1) = b.split_at_mut(1);
    let mut ops = [
        PeerOp::send(0, 1, &a[0], c),
        PeerOp::recv(1, 0, &mut b1[0], c),
        PeerOp::send(1, 0, &a[1], c - 5),
        PeerOp::recv(0, 1, &mut b0[0], c - 5),
    ];
    comm.peer_ops(&mut ops, comm.streams()).expect("peer_ops");
    let mut bad = 0;
    for (r, buf) in b.iter().enumerate() {
        comm.stream(r).synchronize().expect("synchronize");
        let got = comm.stream(r).clone_dtoh(buf).expect("download");
        let count = if r == 0 { c - 5 } else { c };
        bad += check(
            &format!("peer_ops rank {r}"),
            &got,
            |i| input(1 - r, i) as f64,
            0..count,
        );
    }
    // A send without its receive is refused before anything is enqueued.
    let mut lone = [PeerOp::send(0, 1, &a[0], 16)];
    let e = comm.peer_ops(&mut lone, comm.streams()).unwrap_err();
    assert!(e.to_string().contains("no matching receive"), "{e}");
    println!("peer_ops in one process: 2 transfers of {c} elements, {bad} wrong elements");
    assert_eq!(bad, 0);
}

/// One rank of `mismatched_calls_fail_on_every_rank` (with `RINGCCL_CHECK_CALLS=1` in its
/// environment): a call whose count differs from the peer's, and a point-to-point group whose
/// byte counts do not pair up, each fail before anything is enqueued, naming the other rank;
/// matching calls afterwards work.
#[test]
#[ignore = "needs a CUDA GPU; started by mismatched_calls_fail_on_every_rank as each rank"]
fn rank_with_a_mismatched_call() {
    let Some(JobRank { id, rank, .. }) = this_rank() else {
        // Started alone: a job of one rank with the check on runs its calls.
        let id = UniqueId::new().expect("a unique id");
        let mut config = ringccl::Config::from_env().expect("config");
        config.check_calls = true;
        let comm = Communicator::init_rank_with_config(1, &id, 0, 0, config).expect("init_rank");
        let job = Job {
            comm,
            rank: 0,
            n: 1,
        };
        let mut b = job.up(&inputs::<f32>(0, 100));
        job.comm
            .all_reduce(
                &mut [Io::in_place(&mut b)],
                100,
                RedOp::Sum,
                &[job.stream()],
            )
            .expect("an all-reduce with the check on");
        let got = job.down(&b);
        assert_eq!(
            check("one rank, checked", &got, |i| input(0, i) as f64, 0..100),
            0
        );
        return;
    };
    // Two processes on one GPU share it (under MPS).
    let comm =
        ringccl_tests::jobs::join(&id, rank, 2, ringccl::Config::from_env().expect("config"));
    assert!(comm.config().check_calls, "RINGCCL_CHECK_CALLS=1 expected");
    let job = Job { comm, rank, n: 2 };
    let s = [job.stream()];
    let other = 1 - rank;
    // A collective with a different count on each rank.
    let mut b = job.up(&inputs::<f32>(rank, 101));
    let e = job
        .comm
        .all_reduce(&mut [Io::in_place(&mut b)], 100 + rank, RedOp::Sum, &s)
        .expect_err("the counts differ");
    println!("rank {rank}: {e}");
    assert_eq!(e.rank(), Some(other), "{e}");
    assert!(e.to_string().contains("calls differ"), "{e}");
    // A point-to-point group where rank 1 expects more than rank 0 sends.
    let a = job.up(&inputs::<f32>(rank, 64));
    let mut r = job.zeros::<f32>(64);
    let mut ops = [
        PeerOp::send(rank, other, &a, 32),
        PeerOp::recv(rank, other, &mut r, 32 + 8 * rank),
    ];
    let e = job
        .comm
        .peer_ops(&mut ops, &s)
        .expect_err("the byte counts differ");
    println!("rank {rank}: {e}");
    assert!(e.to_string().contains("bytes"), "{e}");
    // Nothing was enqueued: matching calls work.
    let mut b = job.up(&inputs::<f32>(rank, 100));
    job.comm
        .all_reduce(&mut [Io::in_place(&mut b)], 100, RedOp::Sum, &s)
        .expect("a matching all-reduce");
    let got = job.down(&b);
    let bad = check(
        "all_reduce after the mismatch",
        &got,
        |i| reduce_at(RedOp::Sum, 2, i, true),
        0..100,
    );
    assert_eq!(bad, 0);
    println!("rank {rank}: mismatches refused, the next call correct");
}

/// Two processes with `RINGCCL_CHECK_CALLS=1`, each running `rank_with_a_mismatched_call`.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn mismatched_calls_fail_on_every_rank() {
    run_ranks(
        "rank_with_a_mismatched_call",
        2,
        &[("RINGCCL_CHECK_CALLS", "1")],
        Duration::from_secs(60),
    );
}
