//! GPU tests of `Communicator::split` and `Communicator::shrink`: children of a job of
//! processes and of a communicator of this process, their all-reduces interleaved with the
//! parent's on different streams, every element checked exactly against the host.
//!
//! `split_across_processes` starts one process per rank (this test binary again, running
//! `split_rank` with the job's id, rank and size in its environment), like
//! `tests/multi_process.rs`: 4 processes by default, rank r on GPU `r % gpus`
//! (`RINGCCL_TEST_PROCESSES=N` for another count; processes sharing a GPU need the MPS
//! daemon). `split_in_one_process` uses every visible GPU (2+).
//!
//! Run on a GPU machine: `cargo test -p ringccl-tests --test split -- --include-ignored
//! --test-threads=1 --nocapture` (`RINGCCL_TEST_ROUNDS=N` for more or fewer interleaved
//! two-shot rounds than 64).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream};
use ringccl::{Communicator, Io, RedOp, UniqueId};
use ringccl_tests::jobs::{run_job, this_rank};

/// Counts that take the small (one-shot) and the large (ring) paths.
const COUNTS: [usize; 3] = [1, 4099, (1 << 20) + 3];

/// Elements (f32) of the interleaved rounds: between the one-shot limit (256 KiB) and the
/// two-shot limit (8 MiB) of the default configuration, so each call runs the two-shot kernel.
const TWO_SHOT_COUNTS: [usize; 3] = [(1 << 17) + 5, 1 << 19, (1 << 20) + 3];

/// Rounds of interleaved parent and child calls (`RINGCCL_TEST_ROUNDS`, default 64).
fn rounds() -> usize {
    std::env::var("RINGCCL_TEST_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// Rank `r`'s input element `i` (small integers: every sum is exact in f32).
fn input(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 3) % 13) as f32 - 4.0
}

/// The sum over the parent ranks `ranks` at `i`.
fn sum_of(ranks: &[usize], i: usize) -> f32 {
    ranks.iter().map(|&r| input(r, i)).sum()
}

/// One rank's all-reduce, issued (not waited for): the input of parent rank `parent_rank`.
struct Pending {
    what: String,
    buf: CudaSlice<f32>,
    stream: Arc<CudaStream>,
    ranks: Vec<usize>,
    count: usize,
}

/// Issues an in-place sum all-reduce on `comm`'s rank `rank` (its own stream).
fn issue(
    comm: &Communicator,
    rank: usize,
    parent_rank: usize,
    ranks: &[usize],
    count: usize,
    what: &str,
) -> Pending {
    let stream = comm.stream(rank).clone();
    let host: Vec<f32> = (0..count).map(|i| input(parent_rank, i)).collect();
    let mut buf = stream.clone_htod(&host).expect("upload");
    comm.all_reduce(&mut [Io::in_place(&mut buf)], count, RedOp::Sum, &[&stream])
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    Pending {
        what: format!("{what} count {count}"),
        buf,
        stream,
        ranks: ranks.to_vec(),
        count,
    }
}

/// Waits for `p` and counts its wrong elements.
fn wrong(p: Pending) -> usize {
    p.stream.synchronize().expect("synchronize");
    let got = p.stream.clone_dtoh(&p.buf).expect("download");
    let mut bad = 0;
    for (i, &g) in got.iter().enumerate().take(p.count) {
        let want = sum_of(&p.ranks, i);
        if g != want {
            if bad < 5 {
                eprintln!("{}: element {i} = {g} but {want} expected", p.what);
            }
            bad += 1;
        }
    }
    bad
}

/// One rank of the job: the splits and the shrink, checked.
#[test]
#[ignore = "needs a CUDA GPU; started by split_across_processes as each rank"]
fn split_rank() {
    // Started alone (no job in the environment): a job of one rank on GPU 0.
    let (id, rank, n) = match this_rank() {
        Some(me) => (me.id, me.rank, me.nranks),
        None => (UniqueId::new().expect("a unique id"), 0, 1),
    };
    let gpus = cudarc::driver::CudaContext::device_count().expect("the CUDA driver") as usize;
    let t0 = Instant::now();
    let world = Communicator::init_rank(n, &id, rank, rank % gpus.max(1)).expect("init_rank");
    let all: Vec<usize> = (0..n).collect();
    let mut bad = 0;

    // Pairs {0, 1}, {2, 3}, …, each ordered by a descending key: child rank = 1 - rank % 2.
    let pair = world
        .split(Some((rank / 2) as i32), -(rank as i32))
        .expect("split into pairs")
        .expect("a color was given");
    let crank = pair.local_ranks()[0];
    // The pair's parent ranks in child rank order (descending keys: the higher rank first).
    let mut ordered: Vec<usize> = (rank / 2 * 2..(rank / 2 * 2 + 2).min(n)).collect();
    ordered.reverse();
    let want = ordered
        .iter()
        .position(|&p| p == rank)
        .expect("in its pair");
    assert_eq!(
        (pair.nranks(), crank),
        (ordered.len(), want),
        "rank {rank}: pair"
    );
    let members = ordered;
    // Parent and child interleaved on their own streams, nothing waited for in between.
    for &c in &COUNTS {
        let a = issue(
            &world,
            rank,
            rank,
            &all,
            c,
            &format!("rank {rank}: parent before"),
        );
        let b = issue(
            &pair,
            crank,
            rank,
            &members,
            c,
            &format!("rank {rank}: pair"),
        );
        let d = issue(
            &world,
            rank,
            rank,
            &all,
            c,
            &format!("rank {rank}: parent after"),
        );
        let e = issue(
            &pair,
            crank,
            rank,
            &members,
            c,
            &format!("rank {rank}: pair again"),
        );
        bad += wrong(a) + wrong(b) + wrong(d) + wrong(e);
    }

    // Many rounds of parent and child calls in the two-shot range, in flight together on their
    // own streams (the order every rank issues them in is the same, as NCCL requires): the
    // two-shot grids of both communicators must fit on a GPU that several ranks share.
    let rounds = rounds();
    let mut in_flight = Vec::new();
    for round in 0..rounds {
        let c = TWO_SHOT_COUNTS[round % TWO_SHOT_COUNTS.len()];
        in_flight.push(issue(
            &world,
            rank,
            rank,
            &all,
            c,
            &format!("rank {rank}: round {round} parent"),
        ));
        in_flight.push(issue(
            &pair,
            crank,
            rank,
            &members,
            c,
            &format!("rank {rank}: round {round} pair"),
        ));
        // A few rounds in flight at a time, then checked.
        if in_flight.len() >= 8 {
            bad += in_flight.drain(..).map(wrong).sum::<usize>();
        }
    }
    bad += in_flight.drain(..).map(wrong).sum::<usize>();
    println!("rank {rank}: {rounds} rounds of parent and child two-shot calls in flight together");

    // NCCL_SPLIT_NOCOLOR for the last rank: the others form one communicator, keyed by rank.
    let last = n - 1;
    let color = (rank != last).then_some(5);
    let rest = world
        .split(color, rank as i32)
        .expect("split with a rank out");
    assert_eq!(
        rest.is_none(),
        rank == last,
        "rank {rank}: no color, no communicator"
    );
    let others: Vec<usize> = (0..last).collect();
    if let Some(rest) = &rest {
        assert_eq!((rest.nranks(), rest.local_ranks()), (last, &[rank][..]));
        for &c in &COUNTS {
            let a = issue(
                rest,
                rank,
                rank,
                &others,
                c,
                &format!("rank {rank}: nocolor child"),
            );
            let b = issue(&world, rank, rank, &all, c, &format!("rank {rank}: parent"));
            let d = issue(
                &pair,
                crank,
                rank,
                &members,
                c,
                &format!("rank {rank}: pair"),
            );
            bad += wrong(a) + wrong(b) + wrong(d);
        }
    } else {
        for &c in &COUNTS {
            let b = issue(&world, rank, rank, &all, c, &format!("rank {rank}: parent"));
            let d = issue(
                &pair,
                crank,
                rank,
                &members,
                c,
                &format!("rank {rank}: pair"),
            );
            bad += wrong(b) + wrong(d);
        }
    }

    // In two steps: the child is built in another thread while the parent runs a call.
    let pending = world
        .split_begin(Some(0), 0)
        .expect("split_begin")
        .expect("a color was given");
    assert_eq!(pending.parent_ranks(), all);
    let builder = std::thread::spawn(move || pending.finish());
    bad += wrong(issue(
        &world,
        rank,
        rank,
        &all,
        4099,
        &format!("rank {rank}: parent while building"),
    ));
    let copy = builder
        .join()
        .expect("the building thread")
        .expect("finish");
    for &c in &COUNTS {
        bad += wrong(issue(
            &copy,
            rank,
            rank,
            &all,
            c,
            &format!("rank {rank}: built in a thread"),
        ));
    }

    // Shrink without rank 0: it does not call shrink and goes on with the parent.
    if rank != 0 && n > 1 {
        let shrunk = world.shrink(&[0]).expect("shrink");
        assert_eq!(
            (shrunk.nranks(), shrunk.local_ranks()),
            (n - 1, &[rank - 1][..])
        );
        let stay: Vec<usize> = (1..n).collect();
        for &c in &COUNTS {
            let a = issue(
                &shrunk,
                rank - 1,
                rank,
                &stay,
                c,
                &format!("rank {rank}: shrunk"),
            );
            bad += wrong(a);
        }
    }
    // The parent is still whole.
    for &c in &COUNTS {
        bad += wrong(issue(
            &world,
            rank,
            rank,
            &all,
            c,
            &format!("rank {rank}: parent at the end"),
        ));
    }
    world.synchronize().expect("synchronize");
    println!(
        "rank {rank} of {n}: splits and shrink, {bad} wrong elements ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(bad, 0, "rank {rank}: wrong elements");
}

/// A job of 4 processes (`RINGCCL_TEST_PROCESSES=N` for another N), each `split_rank`.
#[test]
#[ignore = "needs CUDA GPUs: 4, or fewer with MPS (RINGCCL_TEST_PROCESSES)"]
fn split_across_processes() {
    let n = ringccl_tests::jobs::job_size(4);
    assert!(
        n >= 2 && n.is_multiple_of(2),
        "an even number of processes, 2 or more: {n}"
    );
    run_job("split_rank", n, Duration::from_secs(300), |_| vec![]);
    println!("{n} processes: every rank passed");
}

/// Every visible GPU as one communicator of this process: split into pairs by color, shrunk
/// without rank 0, each child's all-reduce interleaved with the parent's.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn split_in_one_process() {
    let gpus = cudarc::driver::CudaContext::device_count().expect("the CUDA driver") as usize;
    let n = gpus.min(8) & !1;
    assert!(n >= 2, "this test needs 2+ CUDA GPUs; {gpus} visible");
    let ordinals: Vec<usize> = (0..n).collect();
    let world = Communicator::new(&ordinals).expect("a communicator of every GPU");
    let colors: Vec<Option<i32>> = (0..n).map(|r| Some((r / 2) as i32)).collect();
    let keys: Vec<i32> = (0..n).map(|r| -(r as i32)).collect();
    let pairs = world.split_local(&colors, &keys).expect("split_local");
    assert_eq!(pairs.len(), n / 2);
    for (c, p) in &pairs {
        // Descending keys: child rank 0 is the higher device.
        let c = *c as usize;
        assert_eq!(
            (p.nranks(), p.ordinal(0), p.ordinal(1)),
            (2, 2 * c + 1, 2 * c)
        );
    }
    let shrunk = world.shrink(&[0]).expect("shrink");
    assert_eq!(shrunk.nranks(), n - 1);
    let all: Vec<usize> = (0..n).collect();
    let stay: Vec<usize> = (1..n).collect();
    let mut bad = 0;
    for &count in &COUNTS {
        // Every rank of a communicator is called at once: one Io and one stream per rank.
        let run = |comm: &Communicator,
                   parent_ranks: &[usize],
                   what: &str|
         -> (Vec<Arc<CudaStream>>, Vec<CudaSlice<f32>>) {
            let streams: Vec<Arc<CudaStream>> =
                (0..comm.nranks()).map(|r| comm.stream(r).clone()).collect();
            let mut bufs: Vec<CudaSlice<f32>> = parent_ranks
                .iter()
                .zip(&streams)
                .map(|(&p, s)| {
                    s.clone_htod(&(0..count).map(|i| input(p, i)).collect::<Vec<_>>())
                        .expect("upload")
                })
                .collect();
            let refs: Vec<&Arc<CudaStream>> = streams.iter().collect();
            let mut ios: Vec<Io<'_, f32>> = bufs.iter_mut().map(Io::in_place).collect();
            comm.all_reduce(&mut ios, count, RedOp::Sum, &refs)
                .unwrap_or_else(|e| panic!("{what} count {count}: {e}"));
            drop(ios);
            (streams, bufs)
        };
        let mut issued = vec![(run(&world, &all, "parent"), all.clone())];
        for (c, p) in &pairs {
            let c = *c as usize;
            let members = vec![2 * c + 1, 2 * c];
            issued.push((run(p, &members, "pair"), vec![2 * c, 2 * c + 1]));
        }
        issued.push((run(&shrunk, &stay, "shrunk"), stay.clone()));
        issued.push((run(&world, &all, "parent again"), all.clone()));
        for ((streams, bufs), ranks) in issued {
            for (s, b) in streams.iter().zip(&bufs) {
                s.synchronize().expect("synchronize");
                let got = s.clone_dtoh(b).expect("download");
                for (i, &g) in got.iter().enumerate().take(count) {
                    if g != sum_of(&ranks, i) {
                        if bad < 5 {
                            eprintln!(
                                "count {count} ranks {ranks:?}: element {i} = {g}, {} expected",
                                sum_of(&ranks, i)
                            );
                        }
                        bad += 1;
                    }
                }
            }
        }
    }
    println!("{n} GPUs in one process: pairs and shrink, {bad} wrong elements");
    assert_eq!(bad, 0);
}
