//! GPU tests of `ringccl::nccl`, cudarc's NCCL API over ringccl: every call of `Comm`, checked
//! element by element against values computed on the host.
//!
//! * `nccl_job_of_processes` starts two processes of this binary (`nccl_rank_of_a_job`, with
//!   the id's bytes, the rank and the rank count in their environment; rank `r` on GPU
//!   `r % gpus`, so one GPU under MPS serves both); started alone, `nccl_rank_of_a_job` is a
//!   job of one rank on GPU 0.
//! * `from_devices_in_one_thread` drives every GPU from one thread (2+ GPUs): calls queued until
//!   every rank made them, a group of sends and receives, a buffer dropped while its call is
//!   queued, and a mismatch that fails loudly.
//!
//! Run: `cargo test -p ringccl-tests --test nccl_api -- --include-ignored --test-threads=1
//! --nocapture`.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream};
use ringccl::nccl::result::ncclResult_t;
use ringccl::nccl::{group_end, group_start, Comm, Id, ReduceOp};

const ENV_ID: &str = "RINGCCL_TEST_NCCL_ID";
const ENV_RANK: &str = "RINGCCL_TEST_NCCL_RANK";
const ENV_NRANKS: &str = "RINGCCL_TEST_NCCL_NRANKS";

/// Rank `r`'s input element `i`: small integers, exact in f32.
fn input(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 3) % 13) as f32 - 4.0
}

fn inputs(r: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| input(r, i)).collect()
}

fn sum_at(n: usize, i: usize) -> f32 {
    (0..n).map(|q| input(q, i)).sum()
}

fn max_at(n: usize, i: usize) -> f32 {
    (0..n).map(|q| input(q, i)).fold(f32::MIN, f32::max)
}

fn hex(id: &Id) -> String {
    id.internal()
        .iter()
        .map(|&c| format!("{:02x}", c as u8))
        .collect()
}

fn unhex(s: &str) -> Id {
    let mut b = [0 as std::ffi::c_char; 128];
    for (i, d) in b.iter_mut().enumerate() {
        *d = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex") as std::ffi::c_char;
    }
    Id::uninit(b)
}

fn check(what: &str, got: &[f32], want: impl Fn(usize) -> f32) {
    for (i, &g) in got.iter().enumerate() {
        assert_eq!(g, want(i), "{what}: element {i}");
    }
}

/// Every call of one rank's `Comm` (of `n` ranks), checked.
fn every_call(comm: &Comm, stream: &Arc<CudaStream>) {
    let (r, n) = (comm.rank(), comm.world_size());
    assert_eq!(comm.ordinal(), stream.context().ordinal());
    assert!(Arc::ptr_eq(&comm.stream(), stream));
    let c = 4099;
    let send = stream.clone_htod(&inputs(r, c)).unwrap();

    let mut out = stream.alloc_zeros::<f32>(c).unwrap();
    comm.all_reduce(&send, &mut out, &ReduceOp::Sum).unwrap();
    check("all_reduce", &stream.clone_dtoh(&out).unwrap(), |i| {
        sum_at(n, i)
    });

    let mut buf = stream.clone_htod(&inputs(r, c)).unwrap();
    comm.all_reduce_in_place(&mut buf, &ReduceOp::Max).unwrap();
    check(
        "all_reduce_in_place",
        &stream.clone_dtoh(&buf).unwrap(),
        |i| max_at(n, i),
    );

    // Views work as well as slices.
    let mut all = stream.alloc_zeros::<f32>(n * c).unwrap();
    comm.all_gather(&send.slice(..), &mut all.slice_mut(..))
        .unwrap();
    check("all_gather", &stream.clone_dtoh(&all).unwrap(), |i| {
        input(i / c, i % c)
    });

    let big = stream.clone_htod(&inputs(r, n * c)).unwrap();
    let mut mine = stream.alloc_zeros::<f32>(c).unwrap();
    comm.reduce_scatter(&big, &mut mine, &ReduceOp::Sum)
        .unwrap();
    check("reduce_scatter", &stream.clone_dtoh(&mine).unwrap(), |i| {
        sum_at(n, r * c + i)
    });

    let root = (n - 1) as i32;
    let mut got = stream.alloc_zeros::<f32>(c).unwrap();
    let src = (r == n - 1).then_some(&send);
    comm.broadcast(src, &mut got, root).unwrap();
    check("broadcast", &stream.clone_dtoh(&got).unwrap(), |i| {
        input(n - 1, i)
    });

    let mut b = stream.clone_htod(&inputs(r, c)).unwrap();
    comm.broadcast_in_place(&mut b, 0).unwrap();
    check("broadcast_in_place", &stream.clone_dtoh(&b).unwrap(), |i| {
        input(0, i)
    });

    let mut red = stream.alloc_zeros::<f32>(c).unwrap();
    comm.reduce(&send, (r == 0).then_some(&mut red), &ReduceOp::Sum, 0)
        .unwrap();
    if r == 0 {
        check("reduce", &stream.clone_dtoh(&red).unwrap(), |i| {
            sum_at(n, i)
        });
    }
    let mut red2 = stream.clone_htod(&inputs(r, c)).unwrap();
    comm.reduce_in_place(&mut red2, &ReduceOp::Max, root)
        .unwrap();
    if r == n - 1 {
        check("reduce_in_place", &stream.clone_dtoh(&red2).unwrap(), |i| {
            max_at(n, i)
        });
    }

    // A ring shift in a group. The send buffer lives until the group has ended: the driver
    // refuses a copy from memory whose stream-ordered free was already requested (see
    // `ringccl::nccl`'s module docs), as NCCL requires the buffers of a group to outlive it.
    let (next, prev) = (((r + 1) % n) as i32, ((r + n - 1) % n) as i32);
    let mut from_prev = stream.alloc_zeros::<f32>(c).unwrap();
    {
        let s = stream.clone_htod(&inputs(r, c)).unwrap();
        group_start().unwrap();
        comm.send(&s, next).unwrap();
        comm.recv(&mut from_prev, prev).unwrap();
        group_end().unwrap();
        drop(s);
    }
    check(
        "send/recv in a group",
        &stream.clone_dtoh(&from_prev).unwrap(),
        |i| input((r + n - 1) % n, i),
    );

    // The same through cudarc's `Group`, the other way round.
    let mut from_next = stream.alloc_zeros::<f32>(c).unwrap();
    {
        let (sv, rv) = (send.slice(..), from_next.slice_mut(..));
        let mut g = comm.group();
        g.send(sv, prev).unwrap();
        g.recv(rv, next).unwrap();
        g.end().unwrap();
    }
    check(
        "Group send/recv",
        &stream.clone_dtoh(&from_next).unwrap(),
        |i| input((r + 1) % n, i),
    );

    // Bad arguments fail with NCCL's code before anything runs.
    let mut x = stream.alloc_zeros::<f32>(4).unwrap();
    let none: Option<&cudarc::driver::CudaSlice<f32>> = None;
    assert_eq!(
        comm.broadcast(none, &mut x, r as i32).unwrap_err().0,
        ncclResult_t::ncclInvalidArgument
    );
    assert_eq!(
        comm.send(&send, n as i32).unwrap_err().0,
        ncclResult_t::ncclInvalidArgument
    );
    assert_eq!(
        comm.recv(&mut x, -1).unwrap_err().0,
        ncclResult_t::ncclInvalidArgument
    );
    println!("rank {r} of {n}: every call of ringccl::nccl::Comm checked");
}

/// One rank of a job started by `nccl_job_of_processes` (alone: a job of one rank).
#[test]
#[ignore = "needs a CUDA GPU"]
fn nccl_rank_of_a_job() {
    let gpus = CudaContext::device_count().expect("the CUDA driver") as usize;
    let (id, rank, n) = match std::env::var(ENV_ID) {
        Ok(id) => (
            unhex(&id),
            std::env::var(ENV_RANK).unwrap().parse().unwrap(),
            std::env::var(ENV_NRANKS).unwrap().parse().unwrap(),
        ),
        Err(_) => (Id::new().unwrap(), 0, 1),
    };
    let stream = CudaContext::new(rank % gpus.max(1))
        .unwrap()
        .default_stream();
    let comm = Comm::from_rank(stream.clone(), rank, n, id).unwrap();
    assert_eq!((comm.rank(), comm.world_size()), (rank, n));
    every_call(&comm, &stream);
}

/// Two processes (one GPU each, or both on GPU 0 under MPS), each `nccl_rank_of_a_job`.
#[test]
#[ignore = "needs a CUDA GPU (2 GPUs, or 1 under MPS)"]
fn nccl_job_of_processes() {
    let n = 2;
    let id = Id::new().unwrap();
    let id = hex(&id);
    ringccl_tests::jobs::run_ranks("nccl_rank_of_a_job", n, Duration::from_secs(240), |r| {
        vec![
            (ENV_ID.to_string(), id.clone()),
            (ENV_RANK.to_string(), r.to_string()),
            (ENV_NRANKS.to_string(), n.to_string()),
        ]
    });
}

/// `Comm::from_devices` over every GPU, driven from one thread.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn from_devices_in_one_thread() {
    let gpus = CudaContext::device_count().expect("the CUDA driver") as usize;
    assert!(gpus >= 2, "this test needs 2+ CUDA GPUs; {gpus} visible");
    let streams: Vec<Arc<CudaStream>> = (0..gpus)
        .map(|i| CudaContext::new(i).unwrap().default_stream())
        .collect();
    let comms = Comm::from_devices(streams.clone()).unwrap();
    let n = comms.len();
    let c = 100_003;
    // A loop of calls outside a group: each issued with the last rank's; the buffers of the
    // first ranks are dropped before that (their gates hold them).
    let mut outs: Vec<_> = streams
        .iter()
        .map(|s| s.alloc_zeros::<f32>(c).unwrap())
        .collect();
    for (r, comm) in comms.iter().enumerate() {
        let send = streams[r].clone_htod(&inputs(r, c)).unwrap();
        comm.all_reduce(&send, &mut outs[r], &ReduceOp::Sum)
            .unwrap();
    }
    for (r, o) in outs.iter().enumerate() {
        check(
            "from_devices all_reduce",
            &streams[r].clone_dtoh(o).unwrap(),
            |i| sum_at(n, i),
        );
    }
    // A ring shift in a group.
    let sends: Vec<_> = (0..n)
        .map(|r| streams[r].clone_htod(&inputs(r, c)).unwrap())
        .collect();
    let mut recvs: Vec<_> = streams
        .iter()
        .map(|s| s.alloc_zeros::<f32>(c).unwrap())
        .collect();
    group_start().unwrap();
    for (r, comm) in comms.iter().enumerate() {
        comm.send(&sends[r], ((r + 1) % n) as i32).unwrap();
        comm.recv(&mut recvs[r], ((r + n - 1) % n) as i32).unwrap();
    }
    group_end().unwrap();
    for (r, o) in recvs.iter().enumerate() {
        check(
            "from_devices ring",
            &streams[r].clone_dtoh(o).unwrap(),
            |i| input((r + n - 1) % n, i),
        );
    }
    // Ranks that disagree (rank 1 with another count): the call that completes the set
    // fails, and so does every later one.
    let mut bufs: Vec<_> = (0..n)
        .map(|r| {
            streams[r]
                .alloc_zeros::<f32>(if r == 1 { 16 } else { 8 })
                .unwrap()
        })
        .collect();
    let results: Vec<_> = comms
        .iter()
        .zip(bufs.iter_mut())
        .map(|(comm, b)| comm.all_reduce_in_place(b, &ReduceOp::Sum))
        .collect();
    assert!(results[..n - 1].iter().all(Result::is_ok));
    let e = results[n - 1].clone().unwrap_err();
    assert_eq!(e.0, ncclResult_t::ncclInvalidUsage, "{e}");
    let e = comms[0]
        .all_reduce_in_place(&mut bufs[0], &ReduceOp::Sum)
        .unwrap_err();
    assert!(e.to_string().contains("earlier call"), "{e}");
    println!("from_devices over {n} GPUs: checked");
}
