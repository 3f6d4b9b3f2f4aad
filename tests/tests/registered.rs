//! GPU test of registered (zero-copy) buffers in a job of processes: one-shot all-reduces on
//! registered and unregistered buffers, in place and out of place, with every rank or only
//! some ranks reading registered inputs, and a buffer freed and re-allocated between calls;
//! point-to-point ring shifts (posted transfers, `gpu_kernels::p2p::kind::POSTED`) into
//! registered and unregistered receive buffers, on every rank or some, freed and re-allocated,
//! eager and captured into a CUDA graph; every result bit-exact against the host's (and the
//! bytes past a receive untouched), and the staging counted
//! (`ringccl::internals::driver::zc_counters`).
//!
//! `registered_buffers_across_processes` starts two jobs of `RINGCCL_TEST_PROCESSES` processes
//! (default: the visible GPUs, at least 2; more processes than GPUs need the MPS daemon), each
//! rank running `rank_with_registered_buffers`: one with the peers' reads in place switched
//! off (`RINGCCL_ZERO_COPY_READS=0`, the default: every call stages) and one with them on. Run on a GPU machine:
//! `cargo test -p ringccl-tests --test registered -- --include-ignored --test-threads=1
//! --nocapture`.

use std::time::Duration;

use ringccl::internals::driver::zc_counters::{snapshot, Counters};
use ringccl::{Communicator, Io, PeerOp, RedOp};
use ringccl_tests::jobs::{run_job, this_rank, JobRank};

type Plain = ringccl_tests::plain::Plain<i32>;

fn input(r: usize, i: usize, salt: usize) -> i32 {
    ((r * 7 + i * 3 + salt * 5) % 13) as i32 - 4
}

fn want(n: usize, i: usize, salt: usize) -> i32 {
    (0..n).map(|q| input(q, i, salt)).sum()
}

struct Rank {
    comm: Communicator,
    rank: usize,
    n: usize,
    ordinal: usize,
}

impl Rank {
    /// One all-reduce (sum) of `count` elements on `send` (in place if `recv` is `None`),
    /// checked; returns the wrong elements.
    fn call(&self, send: &mut Plain, recv: Option<&mut Plain>, count: usize, salt: usize) -> usize {
        let (r, n) = (self.rank, self.n);
        send.upload(
            &(0..send.len())
                .map(|i| input(r, i, salt))
                .collect::<Vec<_>>(),
        );
        let s = [self.comm.stream(r)];
        let out = match recv {
            None => {
                self.comm
                    .all_reduce(&mut [Io::in_place(send)], count, RedOp::Sum, &s)
                    .expect("all_reduce");
                self.comm.stream(r).synchronize().expect("synchronize");
                send.download()
            }
            Some(recv) => {
                self.comm
                    .all_reduce(&mut [Io::out_of_place(&*send, recv)], count, RedOp::Sum, &s)
                    .expect("all_reduce");
                self.comm.stream(r).synchronize().expect("synchronize");
                recv.download()
            }
        };
        let bad = (0..count).filter(|&i| out[i] != want(n, i, salt)).count();
        if bad > 0 {
            eprintln!(
                "rank {r}: {count} elements (salt {salt}): {bad} wrong, [0] = {}",
                out[0]
            );
        }
        bad
    }
}

const COUNTS: [usize; 3] = [1, 4097, 70_000];

/// Elements (i32) of the point-to-point ring shifts on the kernel: just above the LL size
/// (64 KiB), 256 KiB, 768 KiB with an odd tail, 1 MiB (the default
/// `RINGCCL_P2P_KERNEL_MAX_BYTES`) and 2 MiB (the default
/// `RINGCCL_P2P_KERNEL_MAX_BYTES_REGISTERED`: on the kernel, eager, while a buffer is
/// registered).
const P2P_COUNTS: [usize; 5] = [16_385, 65_536, 196_611, 262_144, 524_288];

/// Elements of a shift just above `RINGCCL_P2P_KERNEL_MAX_BYTES_REGISTERED` (2 MiB + 4 B):
/// through the copy engines even into a registered buffer.
const OVER_LIMIT_COUNT: usize = 524_289;

/// Elements of the captured ring shift: 2 MiB (under capture every size runs on the kernel).
const CAPTURED_COUNT: usize = 524_288;

/// What a receive buffer holds past the received elements (and before the call).
const UNTOUCHED: i32 = -99;

impl Rank {
    /// One ring shift of `count` elements (to the next rank, from the previous one) from
    /// `send` into `recv`, checked (the received elements, and `recv` past them untouched);
    /// returns the wrong elements.
    fn shift(&self, send: &Plain, recv: &mut Plain, count: usize, salt: usize) -> usize {
        let (r, n) = (self.rank, self.n);
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        send.upload(
            &(0..send.len())
                .map(|i| input(r, i, salt))
                .collect::<Vec<_>>(),
        );
        recv.upload(&vec![UNTOUCHED; recv.len()]);
        let mut ops = [
            PeerOp::send(r, next, send, count),
            PeerOp::recv(r, prev, recv, count),
        ];
        self.comm
            .peer_ops(&mut ops, &[self.comm.stream(r)])
            .expect("peer_ops");
        self.comm.stream(r).synchronize().expect("synchronize");
        self.check_shift(&recv.download(), count, salt)
    }

    /// The wrong elements of a ring shift's receive buffer `out` (see [`Rank::shift`]).
    fn check_shift(&self, out: &[i32], count: usize, salt: usize) -> usize {
        let (r, n) = (self.rank, self.n);
        let prev = (r + n - 1) % n;
        let bad = (0..out.len())
            .filter(|&i| {
                out[i]
                    != if i < count {
                        input(prev, i, salt)
                    } else {
                        UNTOUCHED
                    }
            })
            .count();
        if bad > 0 {
            eprintln!("rank {r}: ring shift of {count} elements (salt {salt}): {bad} wrong");
        }
        bad
    }
}

/// Every rank registers one buffer: its receive buffer where `recv_registered`, else its send
/// buffer (registration is collective; either way the communicator has one, so every
/// transfer above the LL size is posted). Returns the wrong elements and the counters.
fn p2p_round(me: &Rank, recv_registered: bool) -> (usize, Counters) {
    let len = P2P_COUNTS.iter().max().unwrap_or(&1) + 40;
    let send = Plain::new(len, me.ordinal);
    let mut recv = Plain::new(len, me.ordinal);
    let reg = if recv_registered {
        me.comm.register(&recv)
    } else {
        me.comm.register(&send)
    }
    .expect("register");
    let before = snapshot();
    let mut bad = 0;
    for (k, &c) in P2P_COUNTS.iter().enumerate() {
        bad += me.shift(&send, &mut recv, c, 30 + k);
    }
    let spent = snapshot().since(&before);
    me.comm.synchronize().expect("synchronize");
    reg.deregister().expect("deregister");
    (bad, spent)
}

/// A 2 MiB ring shift into a registered receive buffer captured into a graph, the buffer then
/// deregistered, the graph replayed three times with new inputs; returns the wrong elements.
fn captured_shift(me: &Rank) -> usize {
    use cudarc::driver::sys;
    let (r, n) = (me.rank, me.n);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let count = CAPTURED_COUNT;
    let send = Plain::new(count, me.ordinal);
    let mut recv = Plain::new(count, me.ordinal);
    let reg = me.comm.register(&recv).expect("register");
    let mut bad = me.shift(&send, &mut recv, count, 40);
    let stream = me.comm.stream(r).clone();
    let before = snapshot();
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .expect("begin capture");
    let captured = {
        let mut ops = [
            PeerOp::send(r, next, &send, count),
            PeerOp::recv(r, prev, &mut recv, count),
        ];
        me.comm.peer_ops(&mut ops, &[&stream])
    };
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    captured.expect("captured peer_ops");
    let graph = graph.expect("end capture").expect("a graph");
    let spent = snapshot().since(&before);
    assert_eq!(
        (spent.zero_copy_receives, spent.staged_receives),
        (1, 0),
        "rank {r}: the captured receive is zero-copy: {spent:?}"
    );
    reg.deregister().expect("deregister");
    for salt in 41..44 {
        send.upload(&(0..count).map(|i| input(r, i, salt)).collect::<Vec<_>>());
        recv.upload(&vec![UNTOUCHED; count]);
        // No barrier needed: a sender writes `recv` only after its owner's replay posted it.
        graph.launch().expect("replay");
        stream.synchronize().expect("synchronize");
        bad += me.check_shift(&recv.download(), count, salt);
    }
    // Each replay's receive ended after the sender's writes (its `DATA` signal).
    drop(graph);
    bad
}

/// Every rank registers its buffer; the ranks in `reads_registered` call on it, the others on
/// an unregistered one. Returns the wrong elements and the counters of the calls.
fn round(me: &Rank, reads_registered: bool) -> (usize, Counters) {
    let len = *COUNTS.iter().max().unwrap_or(&1);
    let mut reg_buf = Plain::new(len, me.ordinal);
    let mut plain = Plain::new(len, me.ordinal);
    let mut out = Plain::new(len, me.ordinal);
    let reg = me.comm.register(&reg_buf).expect("register");
    assert_eq!(
        reg.zero_copy(),
        me.comm.config().zero_copy_reads,
        "rank {}: a cuMemAlloc buffer is mapped by every peer (read in place where enabled)",
        me.rank
    );
    let before = snapshot();
    let mut bad = 0;
    for (k, &c) in COUNTS.iter().enumerate() {
        let input = if reads_registered {
            &mut reg_buf
        } else {
            &mut plain
        };
        bad += me.call(input, Some(&mut out), c, k);
        bad += me.call(input, None, c, k + 10);
    }
    let spent = snapshot().since(&before);
    me.comm.synchronize().expect("synchronize");
    reg.deregister().expect("deregister");
    (bad, spent)
}

/// An in-place all-reduce on a registered buffer captured into a graph, the buffer then
/// deregistered, the graph replayed three times with new inputs; returns the wrong elements.
fn captured_round(me: &Rank) -> usize {
    use cudarc::driver::sys;
    let (r, n) = (me.rank, me.n);
    let len = COUNTS[1];
    let mut g = Plain::new(len, me.ordinal);
    let reg = me.comm.register(&g).expect("register");
    // One eager call of the size first (as any captured size needs).
    let mut bad = me.call(&mut g, None, len, 20);
    let stream = me.comm.stream(r).clone();
    let before = snapshot();
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .expect("begin capture");
    let captured = me
        .comm
        .all_reduce(&mut [Io::in_place(&mut g)], len, RedOp::Sum, &[&stream]);
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    captured.expect("captured all_reduce");
    let graph = graph.expect("end capture").expect("a graph");
    let spent = snapshot().since(&before);
    assert_eq!(
        (spent.zero_copy_inputs, spent.staged_inputs),
        if me.comm.config().zero_copy_reads {
            (1, 0)
        } else {
            (0, 1)
        },
        "rank {r}: {spent:?}"
    );
    reg.deregister().expect("deregister");
    for salt in 21..24 {
        g.upload(&(0..len).map(|i| input(r, i, salt)).collect::<Vec<_>>());
        graph.launch().expect("replay");
        stream.synchronize().expect("synchronize");
        let out = g.download();
        let wrong = (0..len).filter(|&i| out[i] != want(n, i, salt)).count();
        if wrong > 0 {
            eprintln!("rank {r}: replay {salt}: {wrong} wrong");
        }
        bad += wrong;
    }
    drop(graph);
    bad
}

#[test]
#[ignore = "needs a CUDA GPU; started by registered_buffers_across_processes as each rank"]
fn rank_with_registered_buffers() {
    let Some(JobRank {
        id,
        rank,
        nranks: n,
    }) = this_rank()
    else {
        println!(
            "rank_with_registered_buffers runs as a rank of registered_buffers_across_processes' job"
        );
        return;
    };
    let mut config = ringccl::Config::from_env().expect("the RINGCCL_ variables");
    config.algorithm = Some(ringccl::Algorithm::OneShot);
    config.oneshot_max_bytes = config.oneshot_max_bytes.max(1 << 20);
    // The small calls would take the LL kernel, which reads every input in place anyway and
    // counts neither way: this test is about the one-shot kernel's published addresses.
    config.ll_max_bytes = 0;
    let ordinal = ringccl_tests::jobs::gpu_of(rank);
    let comm = ringccl_tests::jobs::join(&id, rank, n, config);
    comm.stream(rank).context().bind_to_thread().expect("bind");
    let me = Rank {
        comm,
        rank,
        n,
        ordinal,
    };
    let calls = 2 * COUNTS.len() as u64;
    let reads = me.comm.config().zero_copy_reads;
    println!(
        "rank {rank} of {n}: reads in place {}",
        if reads { "on" } else { "off" }
    );
    let mut bad = 0;

    // Every rank reads registered inputs: nothing staged anywhere, one buffer-id check a call.
    let (b, spent) = round(&me, true);
    bad += b;
    assert_eq!(
        (spent.staged_inputs, spent.zero_copy_inputs),
        if reads { (0, calls) } else { (calls, 0) },
        "rank {rank}: {spent:?}"
    );
    assert_eq!(spent.ipc_opens, 0, "no mapping per call");
    let queries = if reads { calls } else { 0 };
    assert_eq!(
        spent.pointer_queries, queries,
        "one buffer-id check per call where enabled"
    );

    // Only the even ranks read registered inputs: a mix across ranks.
    let (b, spent) = round(&me, rank.is_multiple_of(2));
    bad += b;
    let want = if rank.is_multiple_of(2) && reads {
        (0, calls)
    } else {
        (calls, 0)
    };
    assert_eq!(
        (spent.staged_inputs, spent.zero_copy_inputs),
        want,
        "rank {rank}: {spent:?}"
    );

    // Unregistered everywhere: staged as before, no driver query.
    let (b, spent) = round(&me, false);
    bad += b;
    assert_eq!(
        (spent.staged_inputs, spent.pointer_queries),
        (calls, 0),
        "rank {rank}: {spent:?}"
    );

    // Freed and re-allocated between calls: the stale registration must not be used.
    let len = COUNTS[1];
    let mut a = Plain::new(len, me.ordinal);
    let reg = me.comm.register(&a).expect("register");
    let mut out = Plain::new(len, me.ordinal);
    bad += me.call(&mut a, Some(&mut out), len, 1);
    let old = a.ptr();
    drop(a);
    let mut b2 = Plain::new(len, me.ordinal);
    println!(
        "rank {rank}: re-allocated at the freed address: {}",
        b2.ptr() == old
    );
    let before = snapshot();
    bad += me.call(&mut b2, Some(&mut out), len, 2);
    bad += me.call(&mut b2, None, len, 3);
    let spent = snapshot().since(&before);
    assert_eq!(
        (spent.staged_inputs, spent.zero_copy_inputs),
        (2, 0),
        "rank {rank}: {spent:?}"
    );
    me.comm.synchronize().expect("synchronize");
    drop(reg);

    // Captured into a CUDA graph, then deregistered: replays still read it in place (the
    // peers keep their mappings while the communicator's windows live).
    bad += captured_round(&me);

    // Point-to-point: every receive buffer registered, the sender writes it directly.
    let shifts = P2P_COUNTS.len() as u64;
    let (b, spent) = p2p_round(&me, true);
    bad += b;
    assert_eq!(
        (spent.zero_copy_receives, spent.staged_receives),
        (shifts, 0),
        "rank {rank}: every posted receive zero-copy: {spent:?}"
    );
    assert_eq!(spent.ipc_opens, 0, "no mapping per call");
    // Registered send buffers only: every transfer posted, every receive staged.
    let (b, spent) = p2p_round(&me, false);
    bad += b;
    assert_eq!(
        (spent.zero_copy_receives, spent.staged_receives),
        (0, shifts),
        "rank {rank}: {spent:?}"
    );
    // Only the even ranks' receive buffers registered: a mix across the pairs.
    let (b, spent) = p2p_round(&me, rank.is_multiple_of(2));
    bad += b;
    let want = if rank.is_multiple_of(2) {
        (shifts, 0)
    } else {
        (0, shifts)
    };
    assert_eq!(
        (spent.zero_copy_receives, spent.staged_receives),
        want,
        "rank {rank}: {spent:?}"
    );
    // Above the registered limit: the copy engines (staged), not the kernel, into a registered
    // buffer too; no kernel receive counted.
    {
        let len = OVER_LIMIT_COUNT + 40;
        let (send, mut recv) = (Plain::new(len, me.ordinal), Plain::new(len, me.ordinal));
        let reg = me.comm.register(&recv).expect("register");
        let before = snapshot();
        bad += me.shift(&send, &mut recv, OVER_LIMIT_COUNT, 45);
        let spent = snapshot().since(&before);
        assert_eq!(
            (spent.zero_copy_receives, spent.staged_receives),
            (0, 0),
            "rank {rank}: a shift above the registered limit is not on the kernel: {spent:?}"
        );
        me.comm.synchronize().expect("synchronize");
        reg.deregister().expect("deregister");
    }
    // No registration left: nothing posted.
    {
        let len = P2P_COUNTS.iter().max().unwrap_or(&1) + 40;
        let (send, mut recv) = (Plain::new(len, me.ordinal), Plain::new(len, me.ordinal));
        let before = snapshot();
        for (k, &c) in P2P_COUNTS.iter().enumerate() {
            bad += me.shift(&send, &mut recv, c, 50 + k);
        }
        let spent = snapshot().since(&before);
        assert_eq!(
            (spent.zero_copy_receives, spent.staged_receives),
            (0, 0),
            "rank {rank}: {spent:?}"
        );
    }
    // A registered receive buffer freed and re-allocated between calls: staged from then on.
    {
        let count = P2P_COUNTS[2];
        let send = Plain::new(count, me.ordinal);
        let mut a = Plain::new(count, me.ordinal);
        let reg = me.comm.register(&a).expect("register");
        bad += me.shift(&send, &mut a, count, 60);
        // The previous rank's writes into `a` ended before the receive did (synchronized).
        let old = a.ptr();
        drop(a);
        let mut b2 = Plain::new(count, me.ordinal);
        println!(
            "rank {rank}: receive buffer re-allocated at the freed address: {}",
            b2.ptr() == old
        );
        let before = snapshot();
        bad += me.shift(&send, &mut b2, count, 61);
        let spent = snapshot().since(&before);
        assert_eq!(
            (spent.zero_copy_receives, spent.staged_receives),
            (0, 1),
            "rank {rank}: a stale registration is never written: {spent:?}"
        );
        me.comm.synchronize().expect("synchronize");
        drop(reg);
    }
    bad += captured_shift(&me);

    println!("rank {rank} of {n}: {bad} wrong elements");
    assert_eq!(bad, 0, "rank {rank}: wrong elements");
}

#[test]
#[ignore = "needs a CUDA GPU (2+ processes; more processes than GPUs under MPS)"]
fn registered_buffers_across_processes() {
    let gpus = cudarc::driver::CudaContext::device_count().expect("the CUDA driver") as usize;
    let n = ringccl_tests::jobs::job_size(gpus.clamp(2, 8));
    assert!(n >= 2, "this test needs 2+ processes");
    for reads in ["0", "1"] {
        run_job(
            "rank_with_registered_buffers",
            n,
            Duration::from_secs(240),
            |_| vec![("RINGCCL_ZERO_COPY_READS".to_string(), reads.to_string())],
        );
        println!("{n} processes, RINGCCL_ZERO_COPY_READS={reads}: every rank passed");
    }
}
