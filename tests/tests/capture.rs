//! GPU test of CUDA-graph capture in a job of processes: the one-shot and two-shot kernels
//! captured, replayed among eager calls and other graphs, after a scratch growth and after the
//! communicator's drop; what cannot be captured refused with a typed error.
//!
//! `captured_calls_replay_across_processes` (2+ GPUs, or `RINGCCL_TEST_PROCESSES=N` with N
//! processes on fewer GPUs under MPS, rank r on GPU `r % gpus`) starts one process per rank,
//! each running `rank_captures` (this binary again, the job's id, rank and size in its
//! environment), and waits for all of them (bounded). Each rank:
//! 1. runs every call eagerly once, then captures graph A (global capture mode): all-reduces of
//!    f32 (1 to 2 Mi elements, 8 MiB: one-shot and two-shot) and bf16, in and out of place, a
//!    reduce-scatter and an in-place all-gather; graph B (thread-local mode): an all-reduce
//!    (max) of another size;
//! 2. tries what cannot be captured (relaxed mode): a 20 MiB all-reduce that needs more scratch
//!    than there is: refused with `InvalidArgument` on the stream, nothing captured, the
//!    communicator usable after; then graph D: two all-reduces above the limit (25 and 36
//!    MiB), captured as two-shot kernels over chunks, an all-gather and two reduce-scatters (in
//!    and out of place) above the limit and a gather, as point-to-point groups;
//! 3. 20 rounds: new inputs written into the captured buffers, A replayed, eager calls of the
//!    captured and of other sizes (the ring), B and D replayed; every output checked exactly. At round
//!    10 an eager 20 MiB all-reduce grows the scratch; graph C (relaxed mode) then captures
//!    that size and is replayed in the rounds after;
//! 4. drops the communicator, replays A once more (checked), destroys the graphs, and waits for
//!    the communicator's resources to be released.
//!
//! Run on a GPU machine: `RINGCCL_TEST_PROCESSES=2 cargo test -p ringccl-tests --test capture
//! -- --include-ignored --test-threads=1 --nocapture` (also with 4; with fewer GPUs than
//! processes, under MPS: `nvidia-cuda-mps-control -d`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaGraph, CudaSlice, CudaStream};
use half::bf16;
use ringccl::{Arg, Communicator, Config, DeviceElement, Error, Io, RedOp, UniqueId};
use ringccl_tests::jobs::{run_job, this_rank, JobRank};

/// The two-shot limit of the test's communicator: above the default, so that an eager
/// two-shot call can need more than the first scratch (32 MiB).
const TWOSHOT_MAX: usize = 24 << 20;
/// Elements of the f32 all-reduce that needs 40 MiB of scratch (two-shot: the input's copy and
/// the results): captured before any eager call of its size, it is refused.
const GROWS: usize = 5 << 20;

/// The element types: small integers are exact in both.
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

/// Rank `q`'s input element `i` in round `k` (a small integer: sums of 8 are exact in bf16).
fn input(q: usize, k: usize, i: usize) -> i64 {
    ((q * 7 + i * 3 + k * 5) % 13) as i64 - 4
}

/// `op` over the `n` ranks' inputs at `i` in round `k`.
fn reduce_at(op: RedOp, n: usize, k: usize, i: usize) -> f64 {
    let vals = (0..n).map(|q| input(q, k, i));
    match op {
        RedOp::Max => vals.max().unwrap_or(0) as f64,
        RedOp::Min => vals.min().unwrap_or(0) as f64,
        _ => vals.sum::<i64>() as f64,
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    AllReduce(RedOp),
    ReduceScatter(RedOp),
    AllGather,
}

/// One call with its buffers (allocated once: a graph holds their addresses).
struct Call<T> {
    kind: Kind,
    count: usize,
    /// The input, out of place; `None` in place.
    send: Option<CudaSlice<T>>,
    /// The output (in place: the one buffer).
    recv: CudaSlice<T>,
}

impl<T: Elem> Call<T> {
    fn new(stream: &Arc<CudaStream>, n: usize, kind: Kind, count: usize, in_place: bool) -> Self {
        let (inputs, outputs) = match kind {
            Kind::AllReduce(_) => (count, count),
            Kind::ReduceScatter(_) => (n * count, count),
            Kind::AllGather => (count, n * count),
        };
        let alloc = |len: usize| stream.alloc_zeros::<T>(len).expect("alloc");
        let (send, recv) = if in_place {
            (None, alloc(inputs.max(outputs)))
        } else {
            (Some(alloc(inputs)), alloc(outputs))
        };
        Call {
            kind,
            count,
            send,
            recv,
        }
    }

    fn name(&self) -> String {
        let place = if self.send.is_some() {
            "out of place"
        } else {
            "in place"
        };
        format!(
            "{:?} {} count {} {place}",
            self.kind,
            T::DTYPE.name(),
            self.count
        )
    }

    /// Writes round `k`'s input of rank `r` (of `n`) into the call's buffers (after the
    /// stream's earlier work; the output poisoned, so that a result not written shows).
    fn fill(&mut self, stream: &Arc<CudaStream>, r: usize, n: usize, k: usize) {
        let c = self.count;
        let poison = T::from_small(-99);
        let mine = |len: usize, at: usize| -> Vec<T> {
            (0..len)
                .map(|i| T::from_small(input(r, k, at + i)))
                .collect()
        };
        let whole = match self.kind {
            Kind::AllReduce(_) => mine(c, 0),
            Kind::ReduceScatter(_) => mine(n * c, 0),
            // The rank's input is element j of its block; in place it sits at block r.
            Kind::AllGather if self.send.is_some() => {
                (0..c).map(|j| T::from_small(input(r, k, j))).collect()
            }
            Kind::AllGather => {
                let mut v = vec![poison; n * c];
                for j in 0..c {
                    v[r * c + j] = T::from_small(input(r, k, j));
                }
                v
            }
        };
        match &mut self.send {
            Some(send) => {
                stream.memcpy_htod(&whole, send).expect("upload the input");
                let len = self.recv.len();
                stream
                    .memcpy_htod(&vec![poison; len], &mut self.recv)
                    .expect("poison the output");
            }
            None => stream
                .memcpy_htod(&whole, &mut self.recv)
                .expect("upload the input"),
        }
    }

    fn issue(&mut self, comm: &Communicator, stream: &Arc<CudaStream>) -> ringccl::Result<()> {
        let s = [stream];
        let c = self.count;
        let mut io = [match &self.send {
            Some(send) => Io::out_of_place(send, &mut self.recv),
            None => Io::in_place(&mut self.recv),
        }];
        match self.kind {
            Kind::AllReduce(op) => comm.all_reduce(&mut io, c, op, &s),
            Kind::ReduceScatter(op) => comm.reduce_scatter(&mut io, c, op, &s),
            Kind::AllGather => comm.all_gather(&mut io, c, &s),
        }
    }

    /// Wrong elements of rank `r`'s output after round `k` (the stream synchronised first).
    fn check(&self, stream: &Arc<CudaStream>, r: usize, n: usize, k: usize, what: &str) -> usize {
        stream.synchronize().expect("synchronize");
        let got = stream.clone_dtoh(&self.recv).expect("download");
        let c = self.count;
        let (at, want): (usize, Box<dyn Fn(usize) -> f64>) = match self.kind {
            Kind::AllReduce(op) => (0, Box::new(move |i| reduce_at(op, n, k, i))),
            Kind::ReduceScatter(op) => {
                let at = if self.send.is_some() { 0 } else { r * c };
                (at, Box::new(move |i| reduce_at(op, n, k, r * c + i)))
            }
            Kind::AllGather => (0, Box::new(move |j| input(j / c, k, j % c) as f64)),
        };
        let len = match self.kind {
            Kind::AllGather => n * c,
            _ => c,
        };
        let mut bad = 0;
        for i in 0..len {
            let (g, w) = (got[at + i].to_f64(), want(i));
            if g != w {
                if bad < 5 {
                    eprintln!(
                        "rank {r} {what} {}: element {i} = {g}, {w} expected",
                        self.name()
                    );
                }
                bad += 1;
            }
        }
        bad
    }
}

/// Captures what `body` enqueues on `stream` in capture mode `mode` into a graph.
fn capture(
    stream: &Arc<CudaStream>,
    mode: sys::CUstreamCaptureMode,
    body: impl FnOnce() -> Result<(), String>,
) -> Result<CudaGraph, String> {
    stream
        .begin_capture(mode)
        .map_err(|e| format!("begin capture: {e:?}"))?;
    let result = body();
    // End the capture whatever happened inside it.
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    result?;
    graph
        .map_err(|e| format!("end capture: {e:?}"))?
        .ok_or_else(|| "the capture made no graph".to_string())
}

/// A refused capture: `InvalidArgument` on the stream naming this rank, its reason holding
/// `text`.
fn assert_refused(result: ringccl::Result<()>, rank: usize, text: &str, what: &str) {
    match result {
        Err(Error::InvalidArgument {
            rank: Some(q),
            arg: Arg::Stream,
            reason,
        }) if q == rank && reason.contains(text) => {
            println!("rank {rank}: {what} refused: {reason}");
        }
        other => panic!("rank {rank}: {what}: {other:?}, expected a refusal saying \"{text}\""),
    }
}

/// The modes PyTorch captures in (`torch.cuda.graph(capture_error_mode=...)`).
const GLOBAL: sys::CUstreamCaptureMode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
const THREAD_LOCAL: sys::CUstreamCaptureMode =
    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
const RELAXED: sys::CUstreamCaptureMode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

/// One rank of a job: see the module's description.
#[test]
#[ignore = "needs a CUDA GPU; started by captured_calls_replay_across_processes as each rank"]
fn rank_captures() {
    let Some(JobRank {
        id,
        rank: r,
        nranks: n,
    }) = this_rank()
    else {
        // Started alone (the whole binary with --include-ignored): the job's test starts it.
        println!("rank_captures runs as a rank of captured_calls_replay_across_processes' job");
        return;
    };
    let mut config = Config::from_env().expect("the RINGCCL_ variables");
    config.timeout = Some(Duration::from_secs(60));
    config.twoshot_max_bytes = TWOSHOT_MAX;
    let comm = ringccl_tests::jobs::join(&id, r, n, config);
    let ctx = comm.context(r).clone();
    let stream = ctx.new_stream().expect("a stream of the test's own");
    let t0 = Instant::now();

    // Graph A: f32 all-reduces from one element to the two-shot limit of the default
    // configuration (8 MiB), in and out of place; bf16; a reduce-scatter and an all-gather.
    let mut a32: Vec<Call<f32>> = Vec::new();
    for (count, in_place) in [
        (1, false),
        (1000, true),
        (65_536, false),
        (65_537, true),
        (300_001, false),
        (2 << 20, true),
    ] {
        a32.push(Call::new(
            &stream,
            n,
            Kind::AllReduce(RedOp::Sum),
            count,
            in_place,
        ));
    }
    a32.push(Call::new(
        &stream,
        n,
        Kind::ReduceScatter(RedOp::Sum),
        4099,
        false,
    ));
    a32.push(Call::new(
        &stream,
        n,
        Kind::ReduceScatter(RedOp::Min),
        1000,
        true,
    ));
    a32.push(Call::new(&stream, n, Kind::AllGather, 5001, true));
    a32.push(Call::new(&stream, n, Kind::AllGather, 700, false));
    let mut a16: Vec<Call<bf16>> = Vec::new();
    for (count, in_place) in [(777, true), (100_000, false), (4 << 20, true)] {
        a16.push(Call::new(
            &stream,
            n,
            Kind::AllReduce(RedOp::Sum),
            count,
            in_place,
        ));
    }
    // Graph B: another size and operation.
    let mut b = Call::<f32>::new(&stream, n, Kind::AllReduce(RedOp::Max), 12_345, true);
    // Eager calls between the replays: a captured size, and other sizes: a 32 MiB all-reduce
    // (the ring) and a bf16 all-gather of 6 MiB per rank (two-shot up to 4 ranks, the ring
    // above).
    let mut eager_same = Call::<f32>::new(&stream, n, Kind::AllReduce(RedOp::Sum), 65_537, false);
    let mut eager_ring = Call::<f32>::new(&stream, n, Kind::AllReduce(RedOp::Sum), 8 << 20, true);
    let mut eager_gather = Call::<bf16>::new(&stream, n, Kind::AllGather, 3 << 20, false);
    // Graph C: the size that needs the scratch to grow first.
    let mut grows = Call::<f32>::new(&stream, n, Kind::AllReduce(RedOp::Sum), GROWS, false);

    // 1. Every captured call once eagerly (kernels loaded), checked.
    let mut bad = 0;
    for c in a32.iter_mut().chain(std::iter::once(&mut b)) {
        c.fill(&stream, r, n, 100);
        c.issue(&comm, &stream).expect("eager call");
        bad += c.check(&stream, r, n, 100, "eager first");
    }
    for c in &mut a16 {
        c.fill(&stream, r, n, 100);
        c.issue(&comm, &stream).expect("eager call");
        bad += c.check(&stream, r, n, 100, "eager first");
    }
    assert_eq!(bad, 0, "rank {r}: the eager calls are wrong");
    stream.synchronize().expect("synchronize");
    let held_before = Communicator::held_by_graphs();

    let graph_a = capture(&stream, GLOBAL, || {
        for c in &mut a32 {
            c.issue(&comm, &stream)
                .map_err(|e| format!("{}: {e}", c.name()))?;
        }
        for c in &mut a16 {
            c.issue(&comm, &stream)
                .map_err(|e| format!("{}: {e}", c.name()))?;
        }
        Ok(())
    })
    .expect("graph A");
    let graph_b = capture(&stream, THREAD_LOCAL, || {
        b.issue(&comm, &stream).map_err(|e| e.to_string())
    })
    .expect("graph B");
    assert_eq!(
        Communicator::held_by_graphs() - held_before,
        a32.len() + a16.len() + 1,
        "each captured call holds the communicator's resources"
    );

    // 2. What cannot be captured: refused before anything is enqueued; the capture ends clean.
    // (Buffers are allocated before the capture: an allocation on the stream would be
    // captured.)
    let gathered: Vec<f32> = (0..64).map(|i| (r * 1000 + i) as f32).collect();
    let send = stream.clone_htod(&gathered).expect("upload");
    let mut out = stream.alloc_zeros::<f32>(64 * n).expect("alloc");
    stream.synchronize().expect("synchronize");
    let refusals = capture(&stream, RELAXED, || {
        assert_refused(
            grows.issue(&comm, &stream),
            r,
            "run one eager call of this size",
            "a call needing more scratch",
        );
        Ok(())
    });
    // The capture itself holds nothing the calls enqueued (an empty capture may make a graph
    // with no node, or none).
    drop(refusals);
    // Still usable: an eager call right after.
    eager_same.fill(&stream, r, n, 200);
    eager_same
        .issue(&comm, &stream)
        .expect("an eager call after the refusals");
    assert_eq!(
        eager_same.check(&stream, r, n, 200, "after the refusals"),
        0,
        "rank {r}"
    );

    // Graph D: all-reduces above the limit, captured as two-shot kernels over chunks (every
    // chunk within the first scratch: no eager call first); an all-gather and reduce-scatters
    // above the limit and a gather, as point-to-point groups.
    let mut chunked = vec![
        Call::<f32>::new(
            &stream,
            n,
            Kind::AllReduce(RedOp::Sum),
            TWOSHOT_MAX / 4 + 12_345,
            true,
        ),
        Call::<f32>::new(
            &stream,
            n,
            Kind::AllReduce(RedOp::Max),
            (9 << 20) + 3,
            false,
        ),
        Call::<f32>::new(
            &stream,
            n,
            Kind::AllGather,
            TWOSHOT_MAX / 4 / n + 1000,
            false,
        ),
        Call::<f32>::new(
            &stream,
            n,
            Kind::ReduceScatter(RedOp::Sum),
            TWOSHOT_MAX / 4 / n + 1,
            false,
        ),
        Call::<f32>::new(
            &stream,
            n,
            Kind::ReduceScatter(RedOp::Max),
            TWOSHOT_MAX / 4 / n + 77,
            true,
        ),
    ];
    stream.synchronize().expect("synchronize");
    let graph_d = capture(&stream, RELAXED, || {
        for c in &mut chunked {
            c.issue(&comm, &stream)
                .map_err(|e| format!("{}: {e}", c.name()))?;
        }
        let mut io = [if r == 0 {
            Io::out_of_place(&send, &mut out)
        } else {
            Io::send_only(&send)
        }];
        comm.gather(&mut io, 64, 0, &[&stream])
            .map_err(|e| format!("gather: {e}"))
    })
    .expect("graph D: all-reduces above the limit in chunks, an all-gather and a gather as groups");
    let gather_want: Vec<f32> = (0..n)
        .flat_map(|q| (0..64).map(move |i| (q * 1000 + i) as f32))
        .collect();

    // 3. Twenty rounds.
    let mut graph_c: Option<CudaGraph> = None;
    let mut replays = 0;
    for k in 0..20 {
        for c in &mut a32 {
            c.fill(&stream, r, n, k);
        }
        for c in &mut a16 {
            c.fill(&stream, r, n, k);
        }
        b.fill(&stream, r, n, k + 1000);
        graph_a.launch().expect("replay A");
        if k % 2 == 0 {
            eager_same.fill(&stream, r, n, k + 500);
            eager_same
                .issue(&comm, &stream)
                .expect("eager, a captured size");
            bad += eager_same.check(&stream, r, n, k + 500, "eager between replays");
        }
        // After the growth (round 10) only: before it, nothing may need more than the first
        // scratch, so that the growth is the 20 MiB call's.
        if k > 10 && k % 3 == 0 {
            eager_ring.fill(&stream, r, n, k + 600);
            eager_ring.issue(&comm, &stream).expect("eager, the ring");
            eager_gather.fill(&stream, r, n, k + 700);
            eager_gather
                .issue(&comm, &stream)
                .expect("eager all-gather, the ring");
            bad += eager_ring.check(&stream, r, n, k + 600, "eager ring between replays");
            bad += eager_gather.check(&stream, r, n, k + 700, "eager all-gather between replays");
        }
        graph_b.launch().expect("replay B");
        for c in &mut chunked {
            c.fill(&stream, r, n, k + 1100);
        }
        if r == 0 {
            stream
                .memset_zeros(&mut out)
                .expect("clear the gather's output");
        }
        graph_d.launch().expect("replay D");
        for c in &chunked {
            bad += c.check(&stream, r, n, k + 1100, &format!("replay {k} of D"));
        }
        if r == 0 {
            let got = stream.clone_dtoh(&out).expect("download");
            let wrong = got.iter().zip(&gather_want).filter(|(g, w)| g != w).count();
            if wrong > 0 {
                eprintln!("rank {r}: replay {k} of D: the gather has {wrong} wrong elements");
            }
            bad += wrong;
        }
        if k == 10 {
            // An eager call that grows the scratch (collective, between replays); then the
            // size can be captured.
            grows.fill(&stream, r, n, k + 800);
            grows
                .issue(&comm, &stream)
                .expect("the eager call that grows the scratch");
            bad += grows.check(&stream, r, n, k + 800, "the growing call");
            graph_c = Some(
                capture(&stream, RELAXED, || {
                    grows.issue(&comm, &stream).map_err(|e| e.to_string())
                })
                .expect("graph C, after the growth"),
            );
        }
        if let Some(g) = &graph_c {
            grows.fill(&stream, r, n, k + 900);
            g.launch().expect("replay C");
        }
        for c in &a32 {
            bad += c.check(&stream, r, n, k, &format!("replay {k} of A"));
        }
        for c in &a16 {
            bad += c.check(&stream, r, n, k, &format!("replay {k} of A"));
        }
        bad += b.check(&stream, r, n, k + 1000, &format!("replay {k} of B"));
        if graph_c.is_some() {
            bad += grows.check(&stream, r, n, k + 900, &format!("replay {k} of C"));
        }
        replays += 1;
    }
    assert_eq!(bad, 0, "rank {r}: wrong elements in the rounds");
    println!("rank {r} of {n}: {replays} rounds of replays among eager calls, every element right");

    // 4. The communicator dropped; the graph still replays.
    stream.synchronize().expect("synchronize");
    drop(comm);
    for c in &mut a32 {
        c.fill(&stream, r, n, 77);
    }
    for c in &mut a16 {
        c.fill(&stream, r, n, 77);
    }
    graph_a.launch().expect("replay A after the drop");
    for c in &a32 {
        bad += c.check(&stream, r, n, 77, "replay after the drop");
    }
    for c in &a16 {
        bad += c.check(&stream, r, n, 77, "replay after the drop");
    }
    assert_eq!(
        bad, 0,
        "rank {r}: wrong elements after the communicator's drop"
    );
    drop((graph_a, graph_b, graph_c, graph_d));
    let t1 = Instant::now();
    while Communicator::held_by_graphs() > held_before {
        assert!(
            t1.elapsed() < Duration::from_secs(10),
            "rank {r}: the graphs' references were not released"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    println!(
        "rank {r} of {n}: replayed after the drop, resources released ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );
}

/// The job: every visible GPU (at most 8), or `RINGCCL_TEST_PROCESSES` processes.
#[test]
#[ignore = "needs 2+ CUDA GPUs (or RINGCCL_TEST_PROCESSES and MPS)"]
fn captured_calls_replay_across_processes() {
    let gpus = cudarc::driver::CudaContext::device_count().expect("the CUDA driver");
    let n = ringccl_tests::jobs::job_size((gpus as usize).min(8));
    assert!(
        n >= 2,
        "this test needs 2+ CUDA GPUs or RINGCCL_TEST_PROCESSES; {n} ranks"
    );
    run_job("rank_captures", n, Duration::from_secs(300), |_| vec![]);
    println!("{n} processes: every rank passed");
}

/// A job of one process (`init_rank(1, ..)`, as PyTorch makes for a world of one): every
/// collective is captured at any size (its ring is a copy, with no signal), replayed 5 times
/// with new inputs, then once more after the communicator's drop.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_job_of_one_process_captures_every_collective() {
    let id = UniqueId::new().expect("a unique id");
    let mut config = Config::from_env().expect("the RINGCCL_ variables");
    config.timeout = Some(Duration::from_secs(60));
    let comm = Communicator::init_rank_with_config(1, &id, 0, 0, config).expect("init_rank");
    let stream = comm.context(0).new_stream().expect("a stream");
    let mut calls = vec![
        Call::<f32>::new(&stream, 1, Kind::AllReduce(RedOp::Sum), 10 << 20, false),
        Call::<f32>::new(&stream, 1, Kind::AllReduce(RedOp::Max), 1000, true),
        Call::<f32>::new(&stream, 1, Kind::ReduceScatter(RedOp::Sum), 4096, false),
        Call::<f32>::new(&stream, 1, Kind::AllGather, 3 << 20, false),
    ];
    let graph = capture(&stream, GLOBAL, || {
        for c in &mut calls {
            c.issue(&comm, &stream)
                .map_err(|e| format!("{}: {e}", c.name()))?;
        }
        Ok(())
    })
    .expect("the graph");
    let mut bad = 0;
    for k in 0..5 {
        for c in &mut calls {
            c.fill(&stream, 0, 1, k);
        }
        graph.launch().expect("replay");
        for c in &calls {
            bad += c.check(&stream, 0, 1, k, &format!("replay {k}"));
        }
    }
    stream.synchronize().expect("synchronize");
    drop(comm);
    for c in &mut calls {
        c.fill(&stream, 0, 1, 9);
    }
    graph.launch().expect("replay after the drop");
    for c in &calls {
        bad += c.check(&stream, 0, 1, 9, "replay after the drop");
    }
    assert_eq!(bad, 0, "wrong elements");
    println!(
        "a job of one process: 6 replays of {} captured calls right",
        calls.len()
    );
}
