//! GPU tests of ringccl's containment: bounded device waits, abort, asynchronous errors, faults
//! on one GPU, failed launches, streams and buffers of the wrong context, and a dead process.
//!
//! Run on a machine with 2+ GPUs, each test in its own process (some kill a GPU's context in
//! the process on purpose; the tests that need a fresh process start one themselves):
//! `cargo test -p ringccl-tests --test reliability -- --include-ignored --test-threads=1
//! --nocapture`. Every test bounds its own time.
//!
//! | test | what it shows |
//! | --- | --- |
//! | [`a_late_peer_times_out_and_the_gpus_stay_usable`] | rank 1 blocked 5 s, 1 s timeout: `Error::Timeout` naming rank 1 in < 2 s, no trap; both GPUs then run a correct all-reduce |
//! | [`launch_blocking_small_all_reduces_complete`] | under `CUDA_LAUNCH_BLOCKING=1` small all-reduces complete and are right |
//! | [`an_injected_launch_failure_releases_the_launched_ranks`] | rank 1's launch fails after rank 0's: rank 0 ends in < 100 ms, the communicator reports it, GPU 0 stays usable |
//! | [`a_fault_on_one_gpu_is_reported_in_time`] | an illegal-address kernel on GPU 1 of a communicator of one process: the call fails with it in < 10 s, the communicator stays failed, its drop returns (the fault takes down GPU 0's context of the process too: measured) |
//! | [`a_fault_in_one_process_leaves_the_other_usable`] | one process per GPU; rank 1's GPU faults: both ranks' calls fail in < 10 s, and GPU 0 then runs a new communicator in rank 0's process |
//! | [`foreign_streams_and_buffers_are_rejected`] | a stream and a buffer of a non-primary context, a pool buffer without peer access: `InvalidArgument` before anything is enqueued |
//! | [`process_ranks_time_out_and_abort`] | ranks of a job (threads): a rank alone in a call gets `Error::Timeout` (ring, bounded wait kernel); with no timeout, `abort` ends its one-shot wait at once |
//! | [`a_killed_process_makes_its_peer_fail_in_time`] | two processes streaming 1 GiB all-reduces; `kill -9` of one: the other gets an error within its timeout |
//! | [`a_graph_replays_after_its_communicator_is_dropped`] | one-shot and ring all-reduces captured in one graph; the communicator dropped; 3 replays right; its resources released when the graph is destroyed |
//! | [`separate_captures_are_rejected`] | each rank's stream in a capture of its own: `InvalidArgument` naming rank 1, nothing captured |
//! | [`untracked_buffers_are_kept_until_the_call_is_done`] | 50 × (256 MiB buffers of context handles without streams, all-reduce, drop, reallocate and zero elsewhere): the new buffers stay zero |

use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use ringccl::{Algorithm, Communicator, Config, DeviceSlice, Error, Io, RawBuf, RedOp, UniqueId};

/// Two small kernels of the test's own, in PTX: `ringccl_test_spin(ns)` keeps one thread busy
/// for `ns` nanoseconds (a stream blocked by other work); `ringccl_test_fault(addr)` stores to
/// `addr` (an illegal address: the context faults).
const TEST_PTX: &str = r#"
.version 7.0
.target sm_80
.address_size 64

.visible .entry ringccl_test_spin(
    .param .u64 ns
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [ns];
    mov.u64 %rd2, %globaltimer;
SPIN:
    mov.u64 %rd3, %globaltimer;
    sub.s64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra SPIN;
    ret;
}

.visible .entry ringccl_test_fault(
    .param .u64 addr
)
{
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [addr];
    mov.u64 %rd2, 1;
    st.global.u64 [%rd1], %rd2;
    ret;
}
"#;

fn test_kernel(ctx: &Arc<CudaContext>, name: &str) -> CudaFunction {
    let module = ctx
        .load_module(cudarc::nvrtc::Ptx::from_src(TEST_PTX))
        .expect("load the test PTX");
    module.load_function(name).expect("a test kernel")
}

/// Enqueues `ringccl_test_spin` for `d` on `stream`. Returns the kernel: keep it until the
/// spin is over (dropping the last handle of its module unloads it, which waits for the kernel
/// to end).
#[must_use = "dropping the kernel unloads its module, which waits for the spin to end"]
fn spin(stream: &Arc<CudaStream>, d: Duration) -> CudaFunction {
    let f = test_kernel(stream.context(), "ringccl_test_spin");
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel takes one u64 and touches no memory.
    unsafe { stream.launch_builder(&f).arg(&ns).launch(cfg) }.expect("launch the spin kernel");
    f
}

fn need_two_gpus() {
    let n = CudaContext::device_count().expect("the CUDA driver");
    assert!(n >= 2, "these tests need 2+ CUDA GPUs; {n} visible");
}

fn config(timeout: Option<Duration>, algorithm: Option<Algorithm>) -> Config {
    let mut c = Config::from_env().expect("the environment's configuration");
    c.timeout = timeout;
    c.algorithm = algorithm;
    c
}

/// An all-reduce (sum, f32, in place) of `count` elements of rank + 1 on every rank of `comm`,
/// synchronised and checked: every element equals n (n + 1) / 2.
fn checked_all_reduce(comm: &Communicator, count: usize) {
    let n = comm.nranks();
    let mut bufs: Vec<_> = (0..n)
        .map(|r| {
            comm.stream(r)
                .clone_htod(&vec![(r + 1) as f32; count])
                .expect("upload")
        })
        .collect();
    let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
    comm.all_reduce(&mut io, count, RedOp::Sum, comm.streams())
        .expect("all_reduce");
    drop(io);
    comm.synchronize().expect("synchronize");
    let want = (n * (n + 1) / 2) as f32;
    for (r, b) in bufs.iter().enumerate() {
        let out = comm.stream(r).clone_dtoh(b).expect("download");
        let bad = out.iter().filter(|&&x| x != want).count();
        assert_eq!(bad, 0, "rank {r}: {bad} of {count} elements are not {want}");
    }
}

/// Launches a kernel that stores to an illegal address on `stream` (of `ctx`): the context
/// faults. Only for a process that exists for it.
fn fault(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>) {
    let f = test_kernel(ctx, "ringccl_test_fault");
    let bad: u64 = 16;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: deliberately faults the context (the caller's process exists for it).
    unsafe { stream.launch_builder(&f).arg(&bad).launch(cfg) }.expect("launch");
}

/// Allocates, fills, copies and reads back on `ordinal` with a fresh handle of its primary
/// context: the context is alive.
fn gpu_usable(ordinal: usize) {
    let ctx = CudaContext::new(ordinal).expect("the device's context");
    let s = ctx.new_stream().expect("a stream");
    let a = s.clone_htod(&vec![7u32; 1 << 20]).expect("upload");
    let mut b = s.alloc_zeros::<u32>(1 << 20).expect("alloc");
    s.memcpy_dtod(&a, &mut b).expect("copy");
    let back = s.clone_dtoh(&b).expect("download");
    assert!(
        back.iter().all(|&x| x == 7),
        "GPU {ordinal} copied wrong data"
    );
}

/// Runs test `name` of this binary in a child process with `env`, waiting at most `limit`;
/// panics if it fails or runs out of time.
fn in_child(name: &str, env: &[(&str, &str)], limit: Duration) {
    let exe = std::env::current_exe().expect("this test binary");
    let mut cmd = Command::new(exe);
    cmd.args([
        name,
        "--exact",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn the child test");
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            assert!(
                status.success(),
                "{name} failed in its own process: {status}"
            );
            return;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

const CHILD: &str = "RINGCCL_TEST_CHILD";

/// Whether this process is the child a test started (the inner tests do nothing otherwise).
fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

use ringccl_tests::jobs::{ENV_ID, ENV_RANK};

/// Starts test `name` of this binary as rank `rank` of a job of processes joined by `id`
/// (read back with `ENV_ID`, `ENV_RANK`), with a 5 s timeout and the extra `env`.
fn spawn_rank(
    name: &str,
    id: &UniqueId,
    rank: usize,
    env: &[(&str, &std::ffi::OsStr)],
) -> std::process::Child {
    let exe = std::env::current_exe().expect("this test binary");
    let mut cmd = Command::new(exe);
    cmd.args([
        name,
        "--exact",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, "1")
    .env(ENV_ID, id.to_string())
    .env(ENV_RANK, rank.to_string())
    .env("RINGCCL_TIMEOUT", "5")
    .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn a rank")
}

// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn a_late_peer_times_out_and_the_gpus_stay_usable() {
    need_two_gpus();
    let comm = Communicator::with_config(
        &[0, 1],
        config(Some(Duration::from_secs(1)), Some(Algorithm::OneShot)),
    )
    .expect("communicator");
    let count = 1024; // 4 KiB of f32: one-shot
                      // A first call (the driver loads kernels on first use, which can wait for a busy context).
    checked_all_reduce(&comm, count);
    let mut bufs: Vec<_> = (0..2)
        .map(|r| {
            comm.stream(r)
                .clone_htod(&vec![1.0f32; count])
                .expect("upload")
        })
        .collect();
    comm.synchronize().expect("uploads");
    let spinning = spin(comm.stream(1), Duration::from_secs(5));
    let t0 = Instant::now();
    let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
    comm.all_reduce(&mut io, count, RedOp::Sum, comm.streams())
        .expect("the call is enqueued");
    drop(io);
    println!("late peer: the call returned after {:?}", t0.elapsed());
    let e = comm
        .synchronize_timeout(Duration::from_secs(4))
        .expect_err("rank 1 is 5 s late: the call must time out");
    let took = t0.elapsed();
    println!("late peer: {e} (after {took:?})");
    match &e {
        Error::Timeout {
            rank: Some(0),
            peer: Some(1),
            ..
        } => {}
        other => panic!("expected rank 0's device wait for rank 1 to time out, got {other:?}"),
    }
    assert!(took < Duration::from_secs(2), "the timeout took {took:?}");
    assert!(comm.async_error().is_some(), "the failure is not reported");
    let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
    assert!(
        matches!(
            comm.all_reduce(&mut io, count, RedOp::Sum, comm.streams()),
            Err(Error::Aborted { .. })
        ),
        "a failed communicator accepted a call"
    );
    drop(io);
    // Dropping waits for rank 1's spin (5 s) and its released kernel: bounded.
    let t1 = Instant::now();
    drop(comm);
    println!("drop after the timeout: {:?}", t1.elapsed());
    drop(spinning);
    assert!(t1.elapsed() < Duration::from_secs(12));
    drop(bufs);
    gpu_usable(0);
    gpu_usable(1);
    let fresh = Communicator::with_config(&[0, 1], config(None, None)).expect("a new communicator");
    checked_all_reduce(&fresh, count);
    checked_all_reduce(&fresh, 16 << 20);
    println!("both GPUs allocate, copy and all-reduce correctly afterwards");
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn launch_blocking_small_all_reduces_complete() {
    need_two_gpus();
    in_child(
        "launch_blocking_inner",
        &[(CHILD, "1"), ("CUDA_LAUNCH_BLOCKING", "1")],
        Duration::from_secs(120),
    );
}

/// The body of [`launch_blocking_small_all_reduces_complete`] (in a process started with
/// `CUDA_LAUNCH_BLOCKING=1`).
#[test]
#[ignore = "started by launch_blocking_small_all_reduces_complete"]
fn launch_blocking_inner() {
    if !is_child() {
        return;
    }
    assert_eq!(std::env::var("CUDA_LAUNCH_BLOCKING").as_deref(), Ok("1"));
    let comm = Communicator::with_config(&[0, 1], config(Some(Duration::from_secs(20)), None))
        .expect("communicator");
    let t0 = Instant::now();
    for count in [1, 1024, 4097, 65536] {
        for _ in 0..25 {
            checked_all_reduce(&comm, count);
        }
    }
    println!(
        "CUDA_LAUNCH_BLOCKING=1: 100 small all-reduces correct in {:?}",
        t0.elapsed()
    );
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn an_injected_launch_failure_releases_the_launched_ranks() {
    need_two_gpus();
    // No timeout: only the host's release can end rank 0's wait.
    let comm = Communicator::with_config(&[0, 1], config(None, Some(Algorithm::OneShot)))
        .expect("communicator");
    checked_all_reduce(&comm, 1024);
    let mut bufs: Vec<_> = (0..2)
        .map(|r| {
            comm.stream(r)
                .clone_htod(&vec![1.0f32; 1024])
                .expect("upload")
        })
        .collect();
    comm.inject_launch_failure(1);
    let t0 = Instant::now();
    let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
    let e = comm
        .all_reduce(&mut io, 1024, RedOp::Sum, comm.streams())
        .expect_err("rank 1's launch was made to fail");
    drop(io);
    println!("injected: {e}");
    match &e {
        Error::PartlyEnqueued { enqueued, cause } => {
            assert_eq!(enqueued, &[0], "{e}");
            assert_eq!(cause.rank(), Some(1), "{e}");
        }
        other => panic!("expected PartlyEnqueued, got {other:?}"),
    }
    comm.stream(0).synchronize().expect("rank 0's stream");
    let took = t0.elapsed();
    println!("rank 0's kernel ended {took:?} after the failed call");
    assert!(took < Duration::from_millis(100), "rank 0 took {took:?}");
    assert!(comm.async_error().is_some());
    assert!(matches!(
        comm.synchronize(),
        Err(Error::PartlyEnqueued { .. })
    ));
    drop(comm);
    drop(bufs);
    gpu_usable(0);
    let fresh = Communicator::with_config(&[0, 1], config(None, None)).expect("a new communicator");
    checked_all_reduce(&fresh, 1024);
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn a_fault_on_one_gpu_is_reported_in_time() {
    need_two_gpus();
    in_child("fault_inner", &[(CHILD, "1")], Duration::from_secs(60));
}

/// The body of [`a_fault_on_one_gpu_is_reported_in_time`] (its own process: the fault ends
/// CUDA in it).
///
/// Measured on 2 × H200 (driver 580): after an illegal address in a kernel on GPU 1, every
/// call in GPU 0's context of the same process fails with the same error too (a query of its
/// streams, a new stream from a thread with no current context): the driver takes down every
/// context of the process that has peer access to the faulted one, so no query tells which GPU
/// faulted. What one process can guarantee is that the error arrives in time, the communicator
/// is failed for good, and its drop returns; containment to one GPU is what one process per GPU
/// gives ([`a_fault_in_one_process_leaves_the_other_usable`]).
#[test]
#[ignore = "started by a_fault_on_one_gpu_is_reported_in_time"]
fn fault_inner() {
    if !is_child() {
        return;
    }
    // The default timeout (600 s): only the context checks can end the waits in time.
    let comm = Communicator::with_config(&[0, 1], config(None, None)).expect("communicator");
    checked_all_reduce(&comm, 1024);
    let mut bufs: Vec<_> = (0..2)
        .map(|r| {
            comm.stream(r)
                .clone_htod(&vec![1.0f32; 1024])
                .expect("upload")
        })
        .collect();
    let t0 = Instant::now();
    fault(comm.context(1), comm.stream(1));
    std::thread::sleep(Duration::from_millis(200));
    let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
    let called = comm.all_reduce(&mut io, 1024, RedOp::Sum, comm.streams());
    drop(io);
    let e = match called {
        Err(e) => e,
        Ok(()) => comm
            .synchronize()
            .expect_err("GPU 1 faulted: the call must fail"),
    };
    let took = t0.elapsed();
    println!("fault on GPU 1: {e} (after {took:?})");
    assert!(
        matches!(&e, Error::Cuda { code, .. } if code.contains("ILLEGAL_ADDRESS")),
        "not the fault's CUDA error: {e:?}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let again = comm.async_error();
    println!("async_error afterwards: {again:?}");
    assert!(
        again.is_some(),
        "the communicator does not report the failure"
    );
    let t1 = Instant::now();
    drop(comm);
    println!("dropped in {:?}", t1.elapsed());
    assert!(
        t1.elapsed() < Duration::from_secs(15),
        "drop took {:?}",
        t1.elapsed()
    );
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn a_fault_in_one_process_leaves_the_other_usable() {
    need_two_gpus();
    let id = UniqueId::new().expect("a unique id");
    let mut children: Vec<_> = (0..2)
        .map(|r| spawn_rank("faulting_rank", &id, r, &[]))
        .collect();
    let t0 = Instant::now();
    let mut status = [None, None];
    while status.iter().any(Option::is_none) {
        for (r, c) in children.iter_mut().enumerate() {
            if status[r].is_none() {
                status[r] = c.try_wait().expect("wait");
            }
        }
        if t0.elapsed() > Duration::from_secs(60) {
            for c in &mut children {
                let _ = c.kill();
            }
            panic!("the ranks did not finish within 60 s: {status:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("ranks finished: {status:?} in {:?}", t0.elapsed());
    assert!(
        status.iter().all(|s| s.is_some_and(|s| s.success())),
        "{status:?}"
    );
}

/// A rank of [`a_fault_in_one_process_leaves_the_other_usable`]. Rank 1 faults its GPU, then
/// calls (its call fails). Rank 0 calls: its call must fail within its 5 s timeout, and GPU 0
/// must still allocate, copy and run a new communicator of its own afterwards.
#[test]
#[ignore = "started by a_fault_in_one_process_leaves_the_other_usable"]
fn faulting_rank() {
    if !is_child() {
        return;
    }
    let var = |k| std::env::var(k).expect("set by the parent test");
    let id: UniqueId = var(ENV_ID).parse().expect("the id");
    let rank: usize = var(ENV_RANK).parse().expect("the rank");
    let comm = Communicator::init_rank(2, &id, rank, rank).expect("init_rank");
    let stream = comm.stream(rank).clone();
    let count = 1024usize;
    let mut buf = stream
        .clone_htod(&vec![(rank + 1) as f32; count])
        .expect("upload");
    comm.all_reduce(&mut [Io::in_place(&mut buf)], count, RedOp::Sum, &[&stream])
        .and_then(|()| comm.synchronize())
        .expect("a first all-reduce");
    if rank == 1 {
        fault(comm.context(1), &stream);
        std::thread::sleep(Duration::from_millis(200));
    }
    let t0 = Instant::now();
    let r = comm
        .all_reduce(&mut [Io::in_place(&mut buf)], count, RedOp::Sum, &[&stream])
        .and_then(|()| comm.synchronize());
    let took = t0.elapsed();
    println!("rank {rank}: the call after the fault: {r:?} after {took:?}");
    let e = r.expect_err("the call after the fault must fail on both ranks");
    assert!(took < Duration::from_secs(10), "rank {rank}: took {took:?}");
    let t1 = Instant::now();
    drop(comm);
    println!("rank {rank}: dropped in {:?} ({e})", t1.elapsed());
    if rank == 0 {
        // On a thread with no context current; then a communicator of one rank.
        std::thread::spawn(|| gpu_usable(0))
            .join()
            .expect("GPU 0 is usable");
        let solo = Communicator::with_config(&[0], config(Some(Duration::from_secs(5)), None))
            .expect("a new communicator on GPU 0");
        checked_all_reduce(&solo, 4096);
        println!("rank 0: GPU 0 allocates, copies and runs a new communicator");
    }
}

/// A buffer given by address: the test's own memory of other contexts and pools.
struct Foreign(RawBuf);

// SAFETY: the tests keep the memory alive (and do not free it) until the calls are rejected;
// the calls are expected to reject it before touching it.
unsafe impl DeviceSlice<f32> for Foreign {
    fn raw(&self) -> RawBuf {
        self.0
    }
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn foreign_streams_and_buffers_are_rejected() {
    need_two_gpus();
    let comm = Communicator::with_config(&[0, 1], config(None, None)).expect("communicator");
    let count = 1024;
    let bytes = count * 4;
    let ins: Vec<_> = (0..2)
        .map(|r| {
            comm.stream(r)
                .clone_htod(&vec![1.0f32; count])
                .expect("upload")
        })
        .collect();
    let mut outs: Vec<_> = (0..2)
        .map(|r| comm.stream(r).alloc_zeros::<f32>(count).expect("alloc"))
        .collect();

    // A second (non-primary) context on device 0, with a stream and a buffer of its own.
    let mut dev: sys::CUdevice = 0;
    let mut other: sys::CUcontext = std::ptr::null_mut();
    let mut other_stream: sys::CUstream = std::ptr::null_mut();
    let mut other_buf: sys::CUdeviceptr = 0;
    // SAFETY: plain driver calls with valid out-pointers; the context is popped right after.
    unsafe {
        sys::cuDeviceGet(&mut dev, 0).result().expect("cuDeviceGet");
        sys::cuCtxCreate_v4(&mut other, std::ptr::null_mut(), 0, dev)
            .result()
            .expect("cuCtxCreate");
        sys::cuStreamCreate(&mut other_stream, 1)
            .result()
            .expect("cuStreamCreate");
        sys::cuMemAlloc_v2(&mut other_buf, bytes)
            .result()
            .expect("cuMemAlloc");
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        sys::cuCtxPopCurrent_v2(&mut popped)
            .result()
            .expect("cuCtxPopCurrent");
    }

    // 1. A stream of the other context, wrapped as if it were of the primary one.
    // SAFETY: deliberately violates `wrap_borrowed_stream`'s contract (the stream is of
    // another context): the call must reject it before using it.
    let wrong = unsafe { comm.context(0).wrap_borrowed_stream(other_stream) };
    let streams = [wrong.clone(), comm.stream(1).clone()];
    let mut io: Vec<Io<f32>> = ins
        .iter()
        .zip(outs.iter_mut())
        .map(|(i, o)| Io::out_of_place(i, o))
        .collect();
    let e = comm
        .all_reduce(&mut io, count, RedOp::Sum, &streams)
        .expect_err("a stream of another context");
    drop(io);
    println!("foreign stream: {e}");
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                rank: Some(0),
                arg: ringccl::Arg::Stream,
                ..
            }
        ),
        "{e:?}"
    );

    // 2. A buffer of the other context.
    let foreign = Foreign(RawBuf::new(other_buf, count, 0));
    let (o0, o1) = outs.split_at_mut(1);
    let mut io = vec![
        Io::out_of_place(&foreign, &mut o0[0]),
        Io::out_of_place(&ins[1], &mut o1[0]),
    ];
    let e = comm
        .all_reduce(&mut io, count, RedOp::Sum, comm.streams())
        .expect_err("a buffer of another context");
    drop(io);
    println!("foreign buffer: {e}");
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                rank: Some(0),
                arg: ringccl::Arg::Send,
                ..
            }
        ),
        "{e:?}"
    );

    // 3. A buffer of a memory pool of device 0 that device 1 has no access to.
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut pool_buf: sys::CUdeviceptr = 0;
    // SAFETY: the properties are zeroed but for the required fields; valid out-pointers; the
    // allocation is made on the communicator's own stream of rank 0 and synchronised.
    unsafe {
        let mut props: sys::CUmemPoolProps = std::mem::zeroed();
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        };
        comm.context(0).bind_to_thread().expect("bind");
        sys::cuMemPoolCreate(&mut pool, &props)
            .result()
            .expect("cuMemPoolCreate");
        sys::cuMemAllocFromPoolAsync(&mut pool_buf, bytes, pool, comm.stream(0).cu_stream())
            .result()
            .expect("cuMemAllocFromPoolAsync");
    }
    comm.stream(0).synchronize().expect("sync");
    let pooled = Foreign(RawBuf::new(pool_buf, count, 0));
    let (o0, o1) = outs.split_at_mut(1);
    let mut io = vec![
        Io::out_of_place(&pooled, &mut o0[0]),
        Io::out_of_place(&ins[1], &mut o1[0]),
    ];
    let e = comm
        .all_reduce(&mut io, count, RedOp::Sum, comm.streams())
        .expect_err("a pool buffer without peer access");
    drop(io);
    println!("pool without peer access: {e}");
    assert!(
        matches!(&e, Error::InvalidArgument { rank: Some(0), arg: ringccl::Arg::Send, reason } if reason.contains("pool")),
        "{e:?}"
    );

    // Nothing was enqueued: the communicator still works and the outputs are untouched.
    assert!(comm.async_error().is_none());
    for (r, o) in outs.iter().enumerate() {
        let v = comm.stream(r).clone_dtoh(o).expect("download");
        assert!(v.iter().all(|&x| x == 0.0), "rank {r}'s output was written");
    }
    checked_all_reduce(&comm, count);
    // SAFETY: frees what was made above, nothing uses it any more.
    unsafe {
        comm.context(0).bind_to_thread().expect("bind");
        sys::cuMemFreeAsync(pool_buf, comm.stream(0).cu_stream())
            .result()
            .expect("free");
        comm.stream(0).synchronize().expect("sync");
        sys::cuMemPoolDestroy(pool).result().expect("pool destroy");
        drop(wrong);
        sys::cuCtxPushCurrent_v2(other).result().expect("push");
        sys::cuMemFree_v2(other_buf).result().expect("free");
        sys::cuStreamDestroy_v2(other_stream)
            .result()
            .expect("stream destroy");
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        sys::cuCtxPopCurrent_v2(&mut popped).result().expect("pop");
        sys::cuCtxDestroy_v2(other).result().expect("destroy");
    }
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn process_ranks_time_out_and_abort() {
    need_two_gpus();
    // A 1 s timeout: rank 0 alone in a ring all-reduce (bounded wait kernels) times out.
    let id = UniqueId::new().expect("a unique id");
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        for rank in 0..2 {
            let (id, barrier) = (&id, &barrier);
            s.spawn(move || {
                let cfg = config(Some(Duration::from_secs(1)), None);
                let comm =
                    Communicator::init_rank_with_config(2, id, rank, rank, cfg).expect("init_rank");
                let count = 1 << 20; // 4 MiB: the ring
                let stream = comm.stream(rank).clone();
                let mut buf = stream.clone_htod(&vec![1.0f32; count]).expect("upload");
                comm.all_reduce(&mut [Io::in_place(&mut buf)], count, RedOp::Sum, &[&stream])
                    .expect("all_reduce");
                comm.synchronize().expect("both ranks");
                let v = stream.clone_dtoh(&buf).expect("download");
                assert!(v.iter().all(|&x| x == 2.0), "rank {rank}: wrong sum");
                barrier.wait();
                if rank == 0 {
                    let t0 = Instant::now();
                    comm.all_reduce(&mut [Io::in_place(&mut buf)], count, RedOp::Sum, &[&stream])
                        .expect("enqueued");
                    let e = comm
                        .synchronize_timeout(Duration::from_secs(5))
                        .expect_err("rank 1 never comes");
                    println!(
                        "rank 0 alone (ring, 1 s timeout): {e} after {:?}",
                        t0.elapsed()
                    );
                    assert!(matches!(e, Error::Timeout { peer: Some(1), .. }), "{e:?}");
                    assert!(t0.elapsed() < Duration::from_secs(3));
                    // Drained before rank 1 frees the memory rank 0's kernels may still read.
                    drop(comm);
                    barrier.wait();
                } else {
                    barrier.wait();
                    drop(comm);
                }
            });
        }
    });
    // No timeout: rank 0 alone in a one-shot all-reduce waits until `abort`.
    let id = UniqueId::new().expect("a unique id");
    std::thread::scope(|s| {
        for rank in 0..2 {
            let (id, barrier) = (&id, &barrier);
            s.spawn(move || {
                let comm =
                    Communicator::init_rank_with_config(2, id, rank, rank, config(None, None))
                        .expect("init_rank");
                let count = 1024;
                let stream = comm.stream(rank).clone();
                let mut buf = stream.clone_htod(&vec![1.0f32; count]).expect("upload");
                comm.all_reduce(&mut [Io::in_place(&mut buf)], count, RedOp::Sum, &[&stream])
                    .expect("all_reduce");
                comm.synchronize().expect("both ranks");
                barrier.wait();
                if rank == 0 {
                    comm.all_reduce(&mut [Io::in_place(&mut buf)], count, RedOp::Sum, &[&stream])
                        .expect("enqueued");
                    std::thread::sleep(Duration::from_millis(300));
                    assert!(comm.async_error().is_none(), "nothing failed yet");
                    let t0 = Instant::now();
                    comm.abort().expect("abort drains at once");
                    let took = t0.elapsed();
                    println!("abort of a one-shot wait with no timeout: {took:?}");
                    assert!(took < Duration::from_millis(500), "abort took {took:?}");
                    assert!(matches!(comm.synchronize(), Err(Error::Aborted { .. })));
                    let t1 = Instant::now();
                    drop(comm);
                    assert!(t1.elapsed() < Duration::from_secs(2), "drop after abort");
                    barrier.wait();
                } else {
                    // Alive until rank 0's kernel (which writes its arrival into this rank's
                    // flags) has ended.
                    barrier.wait();
                    drop(comm);
                }
            });
        }
    });
}

const ENV_DIR: &str = "RINGCCL_TEST_KILL_DIR";

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn a_killed_process_makes_its_peer_fail_in_time() {
    need_two_gpus();
    let id = UniqueId::new().expect("a unique id");
    let dir = std::env::temp_dir().join(format!("ringccl-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let mut children: Vec<_> = (0..2)
        .map(|r| spawn_rank("killed_rank", &id, r, &[(ENV_DIR, dir.as_os_str())]))
        .collect();
    let ready = dir.join("rank1.ready");
    let t0 = Instant::now();
    while !ready.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "rank 1 never started"
        );
        if let Some(s) = children[0].try_wait().expect("wait") {
            panic!("rank 0 exited early: {s}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    children[1].kill().expect("kill -9 rank 1");
    let _ = children[1].wait();
    let killed = Instant::now();
    println!("rank 1 killed (SIGKILL) mid-stream");
    let status = loop {
        if let Some(s) = children[0].try_wait().expect("wait for rank 0") {
            break s;
        }
        if killed.elapsed() > Duration::from_secs(60) {
            let _ = children[0].kill();
            panic!("rank 0 did not return an error within 60 s of its peer's death");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    println!(
        "rank 0 exited {:?} after rank 1's death: {status}",
        killed.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "rank 0 did not report an error: {status}");
    assert!(killed.elapsed() < Duration::from_secs(30));
}

/// A rank of [`a_killed_process_makes_its_peer_fail_in_time`]: 1 GiB all-reduces until a call
/// fails (success: the error came) or 120 s pass (failure).
#[test]
#[ignore = "started by a_killed_process_makes_its_peer_fail_in_time"]
fn killed_rank() {
    if !is_child() {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let id: UniqueId = var(ENV_ID).parse().expect("the id");
    let rank: usize = var(ENV_RANK).parse().expect("the rank");
    let dir = std::path::PathBuf::from(var(ENV_DIR));
    let comm = Communicator::init_rank(2, &id, rank, rank).expect("init_rank");
    let count = 1usize << 28; // 1 GiB of f32
    let stream = comm.stream(rank).clone();
    let mut buf = stream.alloc_zeros::<f32>(count).expect("1 GiB");
    let t0 = Instant::now();
    let mut calls = 0u64;
    let outcome = loop {
        let r = comm
            .all_reduce(&mut [Io::in_place(&mut buf)], count, RedOp::Sum, &[&stream])
            .and_then(|()| comm.synchronize());
        calls += 1;
        if let Err(e) = r {
            break e;
        }
        if calls == 3 {
            std::fs::write(dir.join(format!("rank{rank}.ready")), b"").expect("ready file");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "rank {rank}: no error in 120 s"
        );
    };
    println!("rank {rank}: call {calls} failed after its peer died: {outcome}");
    let t1 = Instant::now();
    drop(comm);
    println!("rank {rank}: dropped in {:?}", t1.elapsed());
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn a_graph_replays_after_its_communicator_is_dropped() {
    need_two_gpus();
    let comm = Communicator::with_config(&[0, 1], config(Some(Duration::from_secs(30)), None))
        .expect("communicator");
    let ctxs: Vec<_> = (0..2).map(|r| comm.context(r).clone()).collect();
    let streams: Vec<_> = ctxs
        .iter()
        .map(|c| c.new_stream().expect("stream"))
        .collect();
    // A small call (the one-shot kernel) and a 16 MiB one (the ring), in place, sum of r + 1.
    let counts = [1024usize, 4 << 20];
    let mut bufs: Vec<Vec<_>> = counts
        .iter()
        .map(|&n| {
            (0..2)
                .map(|r| streams[r].alloc_zeros::<f32>(n).expect("alloc"))
                .collect()
        })
        .collect();
    let fill = |bufs: &mut Vec<Vec<cudarc::driver::CudaSlice<f32>>>| {
        for (k, &n) in counts.iter().enumerate() {
            for r in 0..2 {
                streams[r]
                    .memcpy_htod(&vec![(r + 1) as f32; n], &mut bufs[k][r])
                    .expect("upload");
            }
        }
        for s in &streams {
            s.synchronize().expect("sync");
        }
    };
    let call = |bufs: &mut Vec<Vec<cudarc::driver::CudaSlice<f32>>>| {
        for (k, &n) in counts.iter().enumerate() {
            let mut io: Vec<Io<f32>> = bufs[k].iter_mut().map(Io::in_place).collect();
            comm.all_reduce(&mut io, n, RedOp::Sum, &streams)
                .expect("all_reduce");
        }
    };
    // Once eagerly (the scratch a capture needs), then captured.
    fill(&mut bufs);
    call(&mut bufs);
    for s in &streams {
        s.synchronize().expect("sync");
    }
    let before = Communicator::held_by_graphs();
    let graph = ringccl_tests::capture_one_graph(&ctxs, &streams, || {
        call(&mut bufs);
        Ok(())
    })
    .expect("a graph of the calls");
    let held = Communicator::held_by_graphs() - before;
    assert_eq!(
        held,
        counts.len(),
        "each captured call holds the communicator's resources"
    );
    drop(comm);
    println!("communicator dropped; {held} captured calls hold its resources");
    for replay in 0..3 {
        fill(&mut bufs);
        graph.launch().expect("graph launch");
        streams[0].synchronize().expect("the replay ends");
        for (k, &n) in counts.iter().enumerate() {
            for r in 0..2 {
                let out = streams[r].clone_dtoh(&bufs[k][r]).expect("download");
                let bad = out.iter().filter(|&&x| x != 3.0).count();
                assert_eq!(bad, 0, "replay {replay}, count {n}, rank {r}: {bad} wrong");
            }
        }
    }
    println!("3 replays after the drop, every element right");
    drop(graph);
    let t0 = Instant::now();
    while Communicator::held_by_graphs() > before {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the graph's references were not released"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("released {:?} after the graph was destroyed", t0.elapsed());
    gpu_usable(0);
    gpu_usable(1);
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn separate_captures_are_rejected() {
    need_two_gpus();
    let comm = Communicator::with_config(&[0, 1], config(Some(Duration::from_secs(30)), None))
        .expect("communicator");
    let streams: Vec<_> = (0..2)
        .map(|r| comm.context(r).new_stream().expect("stream"))
        .collect();
    let mut bufs: Vec<_> = streams
        .iter()
        .map(|s| s.alloc_zeros::<f32>(1024).expect("alloc"))
        .collect();
    // Run once eagerly, so that only the capture rule can refuse the captured call.
    let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
    comm.all_reduce(&mut io, 1024, RedOp::Sum, &streams)
        .expect("eager all_reduce");
    drop(io);
    comm.synchronize().expect("synchronize");
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    for s in &streams {
        s.begin_capture(mode).expect("begin capture");
    }
    let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
    let e = comm
        .all_reduce(&mut io, 1024, RedOp::Sum, &streams)
        .expect_err("two captures must be refused");
    drop(io);
    println!("separate captures: {e}");
    assert!(
        matches!(e, Error::InvalidArgument { rank: Some(1), .. }),
        "not an InvalidArgument naming rank 1: {e:?}"
    );
    for s in &streams {
        s.end_capture(sys::CUgraphInstantiate_flags(0))
            .expect("the captures end cleanly");
    }
    // Refused before anything of the call was captured: no graph holds the communicator.
    assert_eq!(Communicator::held_by_graphs(), 0);
    checked_all_reduce(&comm, 1024);
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn untracked_buffers_are_kept_until_the_call_is_done() {
    need_two_gpus();
    // Buffers of context handles that never created a stream (cudarc orders their uses and
    // frees only in a handle's multi-stream mode), freed right after the call, the memory
    // reallocated on another handle and zeroed: the call's writes must not land in it.
    let iters: usize = std::env::var("RINGCCL_TEST_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let count = 64usize << 20; // 256 MiB of f32
    let comm = Communicator::with_config(&[0, 1], config(Some(Duration::from_secs(30)), None))
        .expect("communicator");
    let host: Vec<Vec<f32>> = (0..2).map(|r| vec![(r + 1) as f32; count]).collect();
    let mut dirty = 0usize;
    for it in 0..iters {
        let handles: Vec<_> = (0..2)
            .map(|r| CudaContext::new(r).expect("handle"))
            .collect();
        let mut bufs: Vec<_> = handles
            .iter()
            .zip(&host)
            .map(|(h, v)| h.default_stream().clone_htod(v).expect("upload"))
            .collect();
        let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
        comm.all_reduce(&mut io, count, RedOp::Sum, comm.streams())
            .expect("all_reduce");
        drop(io);
        drop(bufs);
        let fresh: Vec<_> = (0..2)
            .map(|r| {
                let h = CudaContext::new(r).expect("handle");
                let s = h.default_stream();
                let mut b = s.alloc_zeros::<f32>(count).expect("realloc");
                s.memset_zeros(&mut b).expect("memset");
                (s, b)
            })
            .collect();
        comm.synchronize().expect("synchronize");
        for (r, (s, b)) in fresh.iter().enumerate() {
            let out = s.clone_dtoh(b).expect("download");
            let bad = out.iter().filter(|&&x| x != 0.0).count();
            if bad > 0 {
                println!("iteration {it}, rank {r}: {bad} elements of the new buffer overwritten");
            }
            dirty += bad;
        }
    }
    println!("{iters} iterations of 256 MiB: {dirty} elements of the new buffers overwritten");
    assert_eq!(dirty, 0);
}
