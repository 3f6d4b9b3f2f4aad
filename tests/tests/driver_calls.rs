//! GPU test of the host path of a job of processes: the CUDA driver calls each kind of call
//! makes, counted by CUPTI (`ringccl_tests::cupti`: every driver call on the calling thread,
//! cudarc's included) over 16 calls after a warm-up, printed per call, and checked against what
//! the design promises: nothing allocated, created, opened or waited for on the host per call;
//! one kernel launch per eager collective or point-to-point group; no stream wait when the
//! previous call ran on the same stream, one when it did not; no copy at all for the LL
//! all-reduce, for a one-shot all-reduce on a registered buffer (read in place by the peers)
//! and the LL all-gather (switched on here), for a point-to-point group between distinct
//! ranks and for a 1 MiB one into a registered receive buffer (written by the sender
//! directly); a captured call replayed is one
//! graph launch; no heap allocation (a counting global allocator) in an eager collective on plain
//! buffers. Where a case allocates, the call sites of one call's allocations are printed (the
//! ringccl frames of their backtraces).
//!
//! `driver_calls_per_call_across_processes` starts `RINGCCL_TEST_PROCESSES` processes (default:
//! the visible GPUs, at least 2; more processes than GPUs need the MPS daemon), each running
//! `rank_counts_driver_calls`. CUPTI (`libcupti.so`) comes from the loader's path, the CUDA
//! toolkit's usual places or `RINGCCL_TEST_CUPTI`. Run on a GPU machine:
//! `RINGCCL_TEST_PROCESSES=2 cargo test -p ringccl-tests --test driver_calls --
//! --include-ignored --test-threads=1 --nocapture`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use cudarc::driver::sys;
use ringccl::{Communicator, Config, Io, PeerOp, RedOp};
use ringccl_tests::cupti::{Calls, DriverCalls};
use ringccl_tests::jobs::{job_size, run_job, this_rank, JobRank};
use ringccl_tests::plain::Plain;

/// The system allocator, counting the allocations of a thread that asks it to
/// ([`COUNTING_ALLOCS`]) and, while [`TRACING_ALLOCS`] is set, keeping each one's backtrace.
struct CountingAlloc;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING_ALLOCS: Cell<bool> = const { Cell::new(false) };
    static TRACING_ALLOCS: Cell<bool> = const { Cell::new(false) };
    /// Inside the capture of a backtrace (its own allocations are neither counted nor traced).
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
    static TRACES: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

fn count_alloc() {
    if IN_TRACE.try_with(Cell::get).unwrap_or(true) {
        return;
    }
    if COUNTING_ALLOCS.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Relaxed);
    }
    if TRACING_ALLOCS.try_with(Cell::get).unwrap_or(false) {
        IN_TRACE.with(|t| t.set(true));
        let trace = Backtrace::force_capture().to_string();
        TRACES.with(|t| t.borrow_mut().push(trace));
        IN_TRACE.with(|t| t.set(false));
    }
}

/// The call sites of the allocations made by `call`: for each, the first ringccl frames of its
/// backtrace (function names; the test binary keeps its symbol table).
fn allocation_sites(mut call: impl FnMut()) -> Vec<String> {
    TRACES.with(|t| t.borrow_mut().clear());
    TRACING_ALLOCS.with(|t| t.set(true));
    call();
    TRACING_ALLOCS.with(|t| t.set(false));
    let traces = TRACES.with(|t| std::mem::take(&mut *t.borrow_mut()));
    traces
        .iter()
        .map(|bt| {
            let frames: Vec<&str> = bt
                .lines()
                .map(str::trim)
                .filter(|l| l.contains("ringccl") && !l.starts_with("at "))
                .filter(|l| !l.contains("driver_calls::"))
                .take(4)
                .collect();
            if frames.is_empty() {
                "(no ringccl frame)".to_string()
            } else {
                frames.join(" <- ")
            }
        })
        .collect()
}

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_alloc();
        // SAFETY: forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_alloc();
        // SAFETY: forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_alloc();
        // SAFETY: forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Calls counted per case (after [`WARM`] uncounted ones).
const CALLS: u64 = 16;
const WARM: usize = 3;

/// Driver functions no call may reach once warm: allocation, creation, mapping, module
/// loading and host-side waiting.
const NEVER: [&str; 16] = [
    "cuMemAlloc",
    "cuMemFree",
    "cuMemCreate",
    "cuMemMap",
    "cuMemHost",
    "cuMemPool",
    "cuEventCreate",
    "cuEventDestroy",
    "cuEventSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuIpc",
    "cuModule",
    "cuLibrary",
];

/// What a case promises about its calls.
#[derive(Clone, Copy)]
struct Promise {
    /// Kernel launches per call (`cuLaunchKernel*`, `cuLaunchCooperativeKernel*`).
    launches: u64,
    /// Whether no copy (`cuMemcpy*`) may be made.
    no_copy: bool,
    /// Graph launches per call.
    graphs: u64,
    /// Stream waits (`cuStreamWaitEvent`) per call, where promised: none on plain buffers when
    /// the previous call ran on the same stream (stream order suffices), one when it did not.
    waits: Option<u64>,
    /// Heap allocations per call, where promised.
    allocs: Option<u64>,
}

const EAGER: Promise = Promise {
    launches: 1,
    no_copy: false,
    graphs: 0,
    waits: Some(0),
    allocs: Some(0),
};
const EAGER_NO_COPY: Promise = Promise {
    launches: 1,
    no_copy: true,
    graphs: 0,
    waits: Some(0),
    allocs: Some(0),
};
const REPLAY: Promise = Promise {
    launches: 0,
    no_copy: true,
    graphs: 1,
    waits: None,
    allocs: Some(0),
};

/// Checks `calls` and `allocs` (made by [`CALLS`] calls of `case`) against `p`; returns the
/// broken promises.
fn broken(case: &str, calls: &Calls, allocs: u64, p: Promise) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(a) = p.allocs {
        if allocs != a * CALLS {
            out.push(format!(
                "{case}: {allocs} heap allocations in {CALLS} calls, {} promised",
                a * CALLS
            ));
        }
    }
    for f in NEVER {
        if calls.matching(f) > 0 {
            out.push(format!(
                "{case}: {f}* x{} in {CALLS} calls",
                calls.matching(f)
            ));
        }
    }
    let launches = calls.matching("cuLaunchKernel") + calls.matching("cuLaunchCooperativeKernel");
    if launches != p.launches * CALLS {
        out.push(format!(
            "{case}: {launches} kernel launches in {CALLS} calls, {} promised",
            p.launches * CALLS
        ));
    }
    if p.no_copy && calls.matching("cuMemcpy") > 0 {
        out.push(format!(
            "{case}: {} copies in {CALLS} calls, none promised",
            calls.matching("cuMemcpy")
        ));
    }
    if let Some(w) = p.waits {
        if calls.matching("cuStreamWaitEvent") != w * CALLS {
            out.push(format!(
                "{case}: {} stream waits in {CALLS} calls, {} promised",
                calls.matching("cuStreamWaitEvent"),
                w * CALLS
            ));
        }
    }
    if calls.matching("cuGraphLaunch") != p.graphs * CALLS {
        out.push(format!(
            "{case}: {} graph launches in {CALLS} calls, {} promised",
            calls.matching("cuGraphLaunch"),
            p.graphs * CALLS
        ));
    }
    out
}

/// The counting of one rank: CUPTI and the promises broken so far.
struct Counter {
    cupti: DriverCalls,
    rank: usize,
    broken: Vec<String>,
}

impl Counter {
    /// Runs `call` [`WARM`] times uncounted, then [`CALLS`] times counted, synchronises `comm`,
    /// prints the calls per call and records the promises broken.
    fn case(&mut self, comm: &Communicator, name: &str, p: Promise, mut call: impl FnMut()) {
        for _ in 0..WARM {
            call();
        }
        comm.synchronize().expect("synchronize");
        let allocs_before = ALLOCS.load(Relaxed);
        let calls = self.cupti.count(|| {
            COUNTING_ALLOCS.with(|c| c.set(true));
            for _ in 0..CALLS {
                call();
            }
            COUNTING_ALLOCS.with(|c| c.set(false));
        });
        let allocs = ALLOCS.load(Relaxed) - allocs_before;
        comm.synchronize().expect("synchronize");
        if self.rank == 0 {
            println!(
                "{name}: {:.1} driver calls per call: {}; {:.1} heap allocations per call",
                calls.total() as f64 / CALLS as f64,
                calls.per(CALLS),
                allocs as f64 / CALLS as f64
            );
        }
        // One more call on every rank (the peers' calls must match), its allocations traced.
        let mut sites = allocation_sites(&mut call);
        comm.synchronize().expect("synchronize");
        if self.rank == 0 {
            sites.sort();
            sites.dedup();
            for site in sites {
                println!("  allocates: {site}");
            }
        }
        self.broken.extend(broken(name, &calls, allocs, p));
    }
}

fn input(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 3) % 13) as f32 - 4.0
}

#[test]
#[ignore = "needs a CUDA GPU and CUPTI; started by driver_calls_per_call_across_processes as each rank"]
fn rank_counts_driver_calls() {
    let Some(JobRank {
        id,
        rank,
        nranks: n,
    }) = this_rank()
    else {
        println!(
            "rank_counts_driver_calls runs as a rank of driver_calls_per_call_across_processes' job"
        );
        return;
    };
    let cupti = DriverCalls::load().expect("CUPTI (set RINGCCL_TEST_CUPTI to libcupti.so)");
    let mut config = Config::from_env().expect("the RINGCCL_ variables");
    config.timeout = Some(Duration::from_secs(60));
    config.zero_copy_reads = true;
    let ordinal = ringccl_tests::jobs::gpu_of(rank);
    let comm = ringccl_tests::jobs::join(&id, rank, n, config);
    comm.context(rank).bind_to_thread().expect("bind");
    let mut me = Counter {
        cupti,
        rank,
        broken: Vec::new(),
    };
    let stream = comm.stream(rank).clone();
    let s = [&stream];
    let (small, mid, large) = (1024usize, 16 << 10, 256 << 10);
    let send = Plain::<f32>::new(large, ordinal);
    send.upload(&(0..large).map(|i| input(rank, i)).collect::<Vec<_>>());
    let mut recv = Plain::<f32>::new(large * n, ordinal);
    let mut inplace = Plain::<f32>::new(large, ordinal);

    // Eager collectives on plain buffers (as the C ABI's callers pass them).
    me.case(
        &comm,
        "all_reduce 4 KiB out of place (LL)",
        EAGER_NO_COPY,
        || {
            comm.all_reduce(
                &mut [Io::out_of_place(&send, &mut recv)],
                small,
                RedOp::Sum,
                &s,
            )
            .expect("all_reduce");
        },
    );
    let got = recv.download();
    let wrong = (0..small)
        .filter(|&i| got[i] != (0..n).map(|q| input(q, i)).sum::<f32>())
        .count();
    assert_eq!(wrong, 0, "rank {rank}: the LL all-reduce's result");
    // Alternating between two streams: each call waits for the previous one's end.
    let other = comm.context(rank).new_stream().expect("a stream");
    let mut k = 0usize;
    let alternating = Promise {
        waits: Some(1),
        ..EAGER_NO_COPY
    };
    me.case(
        &comm,
        "all_reduce 4 KiB out of place (LL), alternating two streams",
        alternating,
        || {
            k += 1;
            let st = if k.is_multiple_of(2) { &stream } else { &other };
            comm.all_reduce(
                &mut [Io::out_of_place(&send, &mut recv)],
                small,
                RedOp::Sum,
                &[st],
            )
            .expect("all_reduce");
        },
    );
    let got = recv.download();
    let wrong = (0..small)
        .filter(|&i| got[i] != (0..n).map(|q| input(q, i)).sum::<f32>())
        .count();
    assert_eq!(
        wrong, 0,
        "rank {rank}: the alternating LL all-reduces' result"
    );
    me.case(
        &comm,
        "all_reduce 4 KiB in place (LL)",
        EAGER_NO_COPY,
        || {
            comm.all_reduce(&mut [Io::in_place(&mut inplace)], small, RedOp::Sum, &s)
                .expect("all_reduce");
        },
    );
    me.case(&comm, "all_reduce 64 KiB (one-shot, staged)", EAGER, || {
        comm.all_reduce(
            &mut [Io::out_of_place(&send, &mut recv)],
            mid,
            RedOp::Sum,
            &s,
        )
        .expect("all_reduce");
    });
    let reg = comm.register(&send).expect("register");
    assert!(
        reg.zero_copy(),
        "rank {rank}: a cuMemAlloc buffer, read in place"
    );
    me.case(
        &comm,
        "all_reduce 64 KiB (one-shot, registered: read in place)",
        EAGER_NO_COPY,
        || {
            comm.all_reduce(
                &mut [Io::out_of_place(&send, &mut recv)],
                mid,
                RedOp::Sum,
                &s,
            )
            .expect("all_reduce");
        },
    );
    drop(reg);
    me.case(&comm, "all_reduce 1 MiB (two-shot)", EAGER, || {
        comm.all_reduce(
            &mut [Io::out_of_place(&send, &mut recv)],
            large,
            RedOp::Sum,
            &s,
        )
        .expect("all_reduce");
    });
    me.case(
        &comm,
        "all_gather 4 KiB per rank (LL)",
        EAGER_NO_COPY,
        || {
            comm.all_gather(&mut [Io::out_of_place(&send, &mut recv)], small, &s)
                .expect("all_gather");
        },
    );
    me.case(&comm, "broadcast 4 KiB (LL)", EAGER_NO_COPY, || {
        comm.broadcast(&mut [Io::out_of_place(&send, &mut recv)], small, 0, &s)
            .expect("broadcast");
    });
    me.case(&comm, "reduce 4 KiB (LL)", EAGER_NO_COPY, || {
        comm.reduce(
            &mut [Io::out_of_place(&send, &mut recv)],
            small,
            RedOp::Sum,
            0,
            &s,
        )
        .expect("reduce");
    });
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    me.case(
        &comm,
        "send/recv 4 KiB (ring shift, LL)",
        EAGER_NO_COPY,
        || {
            let mut ops = [
                PeerOp::send(rank, next, &send, small),
                PeerOp::recv(rank, prev, &mut recv, small),
            ];
            comm.peer_ops(&mut ops, &s).expect("peer_ops");
        },
    );
    // A 1 MiB ring shift into registered receive buffers: posted on the point-to-point
    // kernel, the sender writes the receive buffer directly (no copy, one launch).
    let big = 256 << 10; // f32: 1 MiB, the default RINGCCL_P2P_KERNEL_MAX_BYTES
    let bsend = Plain::<f32>::new(big, ordinal);
    bsend.upload(&(0..big).map(|i| input(rank, i)).collect::<Vec<_>>());
    let mut brecv = Plain::<f32>::new(big, ordinal);
    let reg = comm.register(&brecv).expect("register");
    me.case(
        &comm,
        "send/recv 1 MiB into a registered buffer (ring shift, posted, zero-copy)",
        EAGER_NO_COPY,
        || {
            let mut ops = [
                PeerOp::send(rank, next, &bsend, big),
                PeerOp::recv(rank, prev, &mut brecv, big),
            ];
            comm.peer_ops(&mut ops, &s).expect("peer_ops");
        },
    );
    stream.synchronize().expect("synchronize");
    let got = brecv.download();
    let wrong = (0..big).filter(|&i| got[i] != input(prev, i)).count();
    assert_eq!(wrong, 0, "rank {rank}: the zero-copy ring shift's result");
    drop(reg);

    // A captured LL all-reduce, replayed.
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .expect("begin capture");
    let captured = comm.all_reduce(
        &mut [Io::out_of_place(&send, &mut recv)],
        small,
        RedOp::Sum,
        &s,
    );
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    captured.expect("captured all_reduce");
    let graph = graph.expect("end capture").expect("a graph");
    me.case(
        &comm,
        "all_reduce 4 KiB captured (LL), replayed",
        REPLAY,
        || {
            graph.launch().expect("replay");
        },
    );
    drop(graph);

    // cudarc's slices: its event tracking adds its own calls (shown, not promised away).
    let a = stream.clone_htod(&vec![1.0f32; small]).expect("upload");
    let mut b = stream.alloc_zeros::<f32>(small).expect("alloc");
    me.case(
        &comm,
        "all_reduce 4 KiB on cudarc slices (LL)",
        Promise {
            waits: None,
            allocs: None,
            ..EAGER_NO_COPY
        },
        || {
            comm.all_reduce(&mut [Io::out_of_place(&a, &mut b)], small, RedOp::Sum, &s)
                .expect("all_reduce");
        },
    );

    comm.synchronize().expect("synchronize");
    println!("rank {rank} of {n}: {} promises broken", me.broken.len());
    for b in &me.broken {
        println!("rank {rank}: {b}");
    }
    assert!(me.broken.is_empty(), "rank {rank}: {:?}", me.broken);
}

#[test]
#[ignore = "needs a CUDA GPU and CUPTI (2+ processes; more processes than GPUs under MPS)"]
fn driver_calls_per_call_across_processes() {
    let gpus = cudarc::driver::CudaContext::device_count().expect("the CUDA driver") as usize;
    let n = job_size(gpus.clamp(2, 8));
    assert!(n >= 2, "this test needs 2+ processes");
    run_job(
        "rank_counts_driver_calls",
        n,
        Duration::from_secs(240),
        |_| vec![],
    );
    println!("{n} processes: every rank kept its promises");
}
