//! GPU test of point-to-point groups among processes on the one-kernel path (device-side
//! counters): every size from 0 bytes to several slots per channel, all-to-all with self-sends
//! (both directions at once between every pair), ring shifts, many iterations on several
//! streams with buffers freed and re-allocated between groups, byte streams over several
//! buffers (to peers and to itself) and collectives interleaved, and captured groups replayed 100 times among eager groups and
//! another graph; every received byte checked.
//!
//! `p2p_groups_across_processes` (2+ GPUs, or `RINGCCL_TEST_PROCESSES=N` with N processes on
//! fewer GPUs under MPS, rank r on GPU `r % gpus`) starts one process per rank, each running
//! `rank_p2p` (this binary again, with the job's id, rank and size in its environment).
//!
//! The job runs twice: with the default `RINGCCL_P2P_KERNEL_MAX_BYTES` (eager transfers above
//! 1 MiB through the copy engines, the others on the kernel, in the same groups) and with
//! every transfer on the kernel.
//!
//! Run on a GPU machine: `RINGCCL_TEST_PROCESSES=2 cargo test -p ringccl-tests --test
//! p2p_kernel -- --include-ignored --test-threads=1 --nocapture` (also with 4; under MPS when
//! there are fewer GPUs than processes).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaGraph, CudaSlice, CudaStream};
use ringccl::{Communicator, Config, Io, PeerOp, RedOp};
use ringccl_tests::jobs::{run_job, this_rank, JobRank};

/// A slot of the kernel's pipeline (`gpu_kernels::p2p::SLOT_BYTES`).
const SLOT: usize = 32 << 10;

/// Byte `i` of what `src` sends `dst` in round `seed` (a hash, so that a chunk in the wrong
/// place is seen).
fn byte(seed: u64, src: usize, dst: usize, i: usize) -> u8 {
    let x = (i as u64) ^ (seed << 40) ^ ((src as u64) << 52) ^ ((dst as u64) << 58);
    (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

fn pattern(seed: u64, src: usize, dst: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| byte(seed, src, dst, i)).collect()
}

/// One rank's buffers of an all-to-all group of `bytes` per pair (self included).
struct Group {
    bytes: usize,
    sends: Vec<CudaSlice<u8>>,
    recvs: Vec<CudaSlice<u8>>,
}

impl Group {
    fn new(stream: &Arc<CudaStream>, n: usize, bytes: usize) -> Self {
        let alloc = || stream.alloc_zeros::<u8>(bytes.max(1)).expect("alloc");
        Group {
            bytes,
            sends: (0..n).map(|_| alloc()).collect(),
            recvs: (0..n).map(|_| alloc()).collect(),
        }
    }

    fn fill(&mut self, stream: &Arc<CudaStream>, r: usize, seed: u64) {
        for (q, s) in self.sends.iter_mut().enumerate() {
            let mut v = pattern(seed, r, q, self.bytes);
            v.resize(self.bytes.max(1), 0);
            stream.memcpy_htod(&v, s).expect("upload");
        }
        for d in &mut self.recvs {
            stream.memset_zeros(d).expect("clear");
        }
    }

    /// Every peer `q` (in `peers`) gets `sends[q]`, and `recvs[q]` receives from it.
    fn issue(
        &mut self,
        comm: &Communicator,
        stream: &Arc<CudaStream>,
        r: usize,
        peers: &[(usize, usize)],
    ) -> ringccl::Result<()> {
        let bytes = self.bytes;
        let mut ops = Vec::new();
        let mut recvs: Vec<Option<&mut CudaSlice<u8>>> = self.recvs.iter_mut().map(Some).collect();
        for &(to, from) in peers {
            ops.push(PeerOp::send(r, to, &self.sends[to], bytes));
            let b = recvs[from].take().expect("one receive per peer");
            ops.push(PeerOp::recv(r, from, b, bytes));
        }
        comm.peer_ops(&mut ops, &[stream])
    }

    /// Wrong bytes received from the peers in `froms`.
    fn check(
        &self,
        stream: &Arc<CudaStream>,
        r: usize,
        froms: &[usize],
        seed: u64,
        what: &str,
    ) -> usize {
        let mut bad = 0;
        for &q in froms {
            let got = stream.clone_dtoh(&self.recvs[q]).expect("download");
            let want = pattern(seed, q, r, self.bytes);
            let wrong = (0..self.bytes).filter(|&i| got[i] != want[i]).count();
            if wrong > 0 {
                let first = (0..self.bytes).find(|&i| got[i] != want[i]).unwrap_or(0);
                eprintln!(
                    "rank {r}: {what}: {wrong} of {} bytes from rank {q} wrong (first at {first}: {} not {})",
                    self.bytes, got[first], want[first]
                );
            }
            bad += wrong;
        }
        bad
    }
}

fn capture(stream: &Arc<CudaStream>, body: impl FnOnce() -> Result<(), String>) -> CudaGraph {
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
        .expect("begin capture");
    let result = body();
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    result.expect("the captured calls");
    graph.expect("end capture").expect("a graph")
}

/// One rank of a job: see the module's description.
#[test]
#[ignore = "needs a CUDA GPU; started by p2p_groups_across_processes as each rank"]
fn rank_p2p() {
    let Some(JobRank {
        id,
        rank: r,
        nranks: n,
    }) = this_rank()
    else {
        println!("rank_p2p runs as a rank of p2p_groups_across_processes' job");
        return;
    };
    let mut config = Config::from_env().expect("the RINGCCL_ variables");
    config.timeout = Some(Duration::from_secs(60));
    let comm = ringccl_tests::jobs::join(&id, r, n, config);
    let ctx = comm.context(r).clone();
    let streams = [
        ctx.new_stream().expect("a stream"),
        ctx.new_stream().expect("a stream"),
    ];
    let s0 = &streams[0];
    let t0 = Instant::now();
    let all: Vec<(usize, usize)> = (0..n).map(|q| (q, q)).collect();
    let froms: Vec<usize> = (0..n).collect();
    let mut bad = 0;

    // 1. Every size, all-to-all with the self-send, three rounds each, the buffers new per
    // size and the streams alternating.
    let sizes = [
        0,
        1,
        7,
        8,
        100,
        4096,
        8193,
        SLOT - 1,
        SLOT,
        SLOT + 1,
        65_536,
        65_537,
        100_000,
        (1 << 20) + 3,
        2 << 20,
        (5 << 20) + 1,
    ];
    for (k, &bytes) in sizes.iter().enumerate() {
        let mut g = Group::new(s0, n, bytes);
        for round in 0..3u64 {
            let s = &streams[(k + round as usize) % 2];
            let seed = k as u64 * 10 + round;
            g.fill(s, r, seed);
            g.issue(&comm, s, r, &all).expect("all-to-all");
            bad += g.check(s, r, &froms, seed, &format!("{bytes} bytes, round {round}"));
        }
    }
    assert_eq!(bad, 0, "rank {r}: wrong bytes in the sizes");
    println!(
        "rank {r} of {n}: every size right ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );

    // 1b. LL transfers (at most 64 KiB: packets with the flag inside) on views at odd offsets
    // (the kernel's 4-byte and byte paths) and one stream over several buffers of odd sizes on
    // both sides, each round checked.
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    for (k, &(bytes, off_send, off_recv)) in [
        (5, 1, 3),
        (13, 4, 0),
        (4097, 3, 4),
        (8193, 0, 1),
        (65_535, 4, 4),
        (65_536, 2, 0),
    ]
    .iter()
    .enumerate()
    {
        let seed = 500 + k as u64;
        let mut data = vec![0u8; off_send];
        data.extend(pattern(seed, r, next, bytes));
        let src = s0.clone_htod(&data).expect("upload");
        let mut dst = s0.alloc_zeros::<u8>(off_recv + bytes).expect("alloc");
        {
            let view = src.slice(off_send..off_send + bytes);
            let mut into = dst.slice_mut(off_recv..off_recv + bytes);
            let mut ops = [
                PeerOp::send(r, next, &view, bytes),
                PeerOp::recv(r, prev, &mut into, bytes),
            ];
            comm.peer_ops(&mut ops, &[s0]).expect("LL views");
        }
        let got = s0.clone_dtoh(&dst).expect("download");
        bad += usize::from(got[off_recv..] != pattern(seed, prev, r, bytes)[..]);
        bad += usize::from(got[..off_recv].iter().any(|&b| b != 0));
    }
    {
        let parts = [1001usize, 7, 2000];
        let total: usize = parts.iter().sum();
        let whole = pattern(600, r, next, total);
        let mut at = 0;
        let srcs: Vec<CudaSlice<u8>> = parts
            .iter()
            .map(|&len| {
                at += len;
                s0.clone_htod(&whole[at - len..at]).expect("upload")
            })
            .collect();
        let mut a = s0.alloc_zeros::<u8>(1500).expect("alloc");
        let mut b = s0.alloc_zeros::<u8>(total - 1500).expect("alloc");
        let mut ops: Vec<PeerOp<'_, u8>> = srcs
            .iter()
            .zip(parts)
            .map(|(x, len)| PeerOp::send(r, next, x, len))
            .collect();
        ops.push(PeerOp::recv(r, prev, &mut a, 1500));
        ops.push(PeerOp::recv(r, prev, &mut b, total - 1500));
        comm.peer_ops(&mut ops, &[s0])
            .expect("LL over several buffers");
        drop(ops);
        let mut got = s0.clone_dtoh(&a).expect("download");
        got.extend(s0.clone_dtoh(&b).expect("download"));
        bad += usize::from(got != pattern(600, prev, r, total));
    }
    assert_eq!(bad, 0, "rank {r}: wrong bytes in the LL transfers");
    println!("rank {r} of {n}: LL views and streams right");

    // 2. Many small groups: ring shifts (to the next rank, from the previous one) on alternating
    // streams, buffers freed and re-allocated every group, with groups whose streams span
    // several buffers and an all-reduce in between.
    for it in 0..200u64 {
        let s = &streams[it as usize % 2];
        let bytes = [8, 1000, 33_000, 70_001][it as usize % 4];
        let mut g = Group::new(s, n, bytes);
        g.fill(s, r, 1000 + it);
        g.issue(&comm, s, r, &[(next, prev)]).expect("ring shift");
        bad += g.check(s, r, &[prev], 1000 + it, &format!("ring shift {it}"));
        drop(g);
        if it % 25 == 7 {
            // One byte stream in two sends (across a chunk boundary), received into one
            // buffer; to itself, one send received into two buffers.
            let (half, own) = (SLOT + 5000, 3001);
            let a = s.clone_htod(&pattern(it, r, next, half)).expect("upload");
            let b = s
                .clone_htod(&pattern(it + 1, r, next, half))
                .expect("upload");
            let mine = s.clone_htod(&pattern(it, r, r, 2 * own)).expect("upload");
            let mut got = s.alloc_zeros::<u8>(2 * half).expect("alloc");
            let mut own_a = s.alloc_zeros::<u8>(own).expect("alloc");
            let mut own_b = s.alloc_zeros::<u8>(own).expect("alloc");
            let mut ops = [
                PeerOp::send(r, next, &a, half),
                PeerOp::recv(r, r, &mut own_a, own),
                PeerOp::send(r, next, &b, half),
                PeerOp::send(r, r, &mine, 2 * own),
                PeerOp::recv(r, prev, &mut got, 2 * half),
                PeerOp::recv(r, r, &mut own_b, own),
            ];
            comm.peer_ops(&mut ops, &[s])
                .expect("streams over several buffers");
            let got = s.clone_dtoh(&got).expect("download");
            let mut want = pattern(it, prev, r, half);
            want.extend(pattern(it + 1, prev, r, half));
            bad += usize::from(got != want);
            let mut own_got = s.clone_dtoh(&own_a).expect("download");
            own_got.extend(s.clone_dtoh(&own_b).expect("download"));
            bad += usize::from(own_got != pattern(it, r, r, 2 * own));
            // A collective between the groups.
            let mut x = s.clone_htod(&vec![r as f32 + 1.0; 4097]).expect("upload");
            comm.all_reduce(&mut [Io::in_place(&mut x)], 4097, RedOp::Sum, &[s])
                .expect("all-reduce");
            let want = (n * (n + 1) / 2) as f32;
            bad += s
                .clone_dtoh(&x)
                .expect("download")
                .iter()
                .filter(|&&v| v != want)
                .count();
        }
    }
    assert_eq!(bad, 0, "rank {r}: wrong bytes in the ring shifts");
    println!(
        "rank {r} of {n}: 200 ring shifts right ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );

    // 3. Captured: graph A, an all-to-all of 40 000 bytes (self included); graph B, a ring
    // shift of 1 MiB + 5. Each run once eagerly first. 100 rounds: new inputs, A replayed,
    // an eager group of other buffers, B replayed; everything checked.
    let mut a = Group::new(s0, n, 40_000);
    let mut b = Group::new(s0, n, (1 << 20) + 5);
    a.fill(s0, r, 1);
    a.issue(&comm, s0, r, &all).expect("eager A");
    bad += a.check(s0, r, &froms, 1, "eager A");
    b.fill(s0, r, 2);
    b.issue(&comm, s0, r, &[(next, prev)]).expect("eager B");
    bad += b.check(s0, r, &[prev], 2, "eager B");
    s0.synchronize().expect("synchronize");
    let held = Communicator::held_by_graphs();
    let graph_a = capture(s0, || {
        a.issue(&comm, s0, r, &all).map_err(|e| e.to_string())
    });
    let graph_b = capture(s0, || {
        b.issue(&comm, s0, r, &[(next, prev)])
            .map_err(|e| e.to_string())
    });
    assert!(
        Communicator::held_by_graphs() >= held + 2,
        "the graphs hold the communicator's resources"
    );
    let mut eager = Group::new(s0, n, 3 * SLOT + 17);
    for k in 0..100u64 {
        a.fill(s0, r, 10_000 + k);
        b.fill(s0, r, 20_000 + k);
        graph_a.launch().expect("replay A");
        eager.fill(s0, r, 30_000 + k);
        eager
            .issue(&comm, s0, r, &all)
            .expect("eager between replays");
        graph_b.launch().expect("replay B");
        bad += a.check(s0, r, &froms, 10_000 + k, &format!("replay {k} of A"));
        bad += b.check(s0, r, &[prev], 20_000 + k, &format!("replay {k} of B"));
        bad += eager.check(s0, r, &froms, 30_000 + k, &format!("eager group {k}"));
    }
    assert_eq!(bad, 0, "rank {r}: wrong bytes in the replays");
    println!("rank {r} of {n}: 100 replays of two graphs among eager groups right");

    // 4. The communicator dropped: the graph still replays (its resources held by it).
    s0.synchronize().expect("synchronize");
    drop(comm);
    a.fill(s0, r, 99);
    graph_a.launch().expect("replay A after the drop");
    bad += a.check(s0, r, &froms, 99, "replay after the drop");
    assert_eq!(bad, 0, "rank {r}: wrong bytes after the drop");
    drop((graph_a, graph_b));
    println!(
        "rank {r} of {n}: done ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );
}

/// The job: every visible GPU (at most 8), or `RINGCCL_TEST_PROCESSES` processes.
#[test]
#[ignore = "needs 2+ CUDA GPUs (or RINGCCL_TEST_PROCESSES and MPS)"]
fn p2p_groups_across_processes() {
    let gpus = cudarc::driver::CudaContext::device_count().expect("the CUDA driver");
    let n = ringccl_tests::jobs::job_size((gpus as usize).min(8));
    assert!(
        n >= 2,
        "this test needs 2+ CUDA GPUs or RINGCCL_TEST_PROCESSES; {n} ranks"
    );
    // The default (transfers above 1 MiB through the copy engines when eager, beside the
    // kernel's), then every transfer on the kernel.
    for limit in ["1M", "1G"] {
        run_job("rank_p2p", n, Duration::from_secs(300), |_| {
            vec![(
                "RINGCCL_P2P_KERNEL_MAX_BYTES".to_string(),
                limit.to_string(),
            )]
        });
        println!("{n} processes, RINGCCL_P2P_KERNEL_MAX_BYTES={limit}: every rank passed");
    }
}
