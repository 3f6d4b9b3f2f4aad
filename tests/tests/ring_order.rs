//! GPU test of the communicator's ring order ([`Communicator::ring`]): the ring chosen from the
//! topology, the `RINGCCL_RING` override, and the collectives over a non-identity ring.
//!
//! Run on a machine with 2+ GPUs: `cargo test -p ringccl-tests --test ring_order --
//! --include-ignored --nocapture`. One test only: it sets `RINGCCL_RING` for this process, so
//! nothing else may run beside it (this file is its own test binary).

use std::sync::Arc;

use cudarc::driver::CudaStream;
use ringccl::internals::topology::{best_ring, ring_quality};
use ringccl::{Communicator, Error, Io, RedOp};

const RING_ENV: &str = "RINGCCL_RING";

/// Rank `r`'s input element `i`: small integers, so float sums are exact in any order.
fn input(r: usize, i: usize) -> f32 {
    ((r * 7 + i) % 13) as f32
}

fn inputs(r: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| input(r, i)).collect()
}

/// All-reduce, all-gather, reduce-scatter and broadcast over the communicator's ring, large
/// enough for the ring algorithm (not the one-shot all-reduce), checked element by element.
fn check_collectives(comm: &Communicator) {
    let n = comm.nranks();
    let streams: Vec<&Arc<CudaStream>> = (0..n).map(|r| comm.stream(r)).collect();
    let down = |r: usize, buf: &cudarc::driver::CudaSlice<f32>| -> Vec<f32> {
        comm.stream(r).synchronize().expect("synchronize");
        comm.stream(r).clone_dtoh(buf).expect("download")
    };
    let ring = comm.ring().to_vec();

    // All-reduce, out of place.
    let count = (1 << 20) + 3;
    let send: Vec<_> = (0..n)
        .map(|r| {
            comm.stream(r)
                .clone_htod(&inputs(r, count))
                .expect("upload")
        })
        .collect();
    let mut recv: Vec<_> = (0..n)
        .map(|r| comm.stream(r).alloc_zeros::<f32>(count).expect("alloc"))
        .collect();
    {
        let mut io: Vec<Io<f32>> = send
            .iter()
            .zip(recv.iter_mut())
            .map(|(s, d)| Io::out_of_place(s, d))
            .collect();
        comm.all_reduce(&mut io, count, RedOp::Sum, &streams)
            .expect("all_reduce");
    }
    for (r, buf) in recv.iter().enumerate() {
        let out = down(r, buf);
        for (i, &x) in out.iter().enumerate() {
            let want: f32 = (0..n).map(|q| input(q, i)).sum();
            assert_eq!(x, want, "all_reduce ring {ring:?}: rank {r} element {i}");
        }
    }

    // All-gather, out of place.
    let sendcount = (1 << 18) + 5;
    let send: Vec<_> = (0..n)
        .map(|r| {
            comm.stream(r)
                .clone_htod(&inputs(r, sendcount))
                .expect("upload")
        })
        .collect();
    let mut recv: Vec<_> = (0..n)
        .map(|r| {
            comm.stream(r)
                .alloc_zeros::<f32>(n * sendcount)
                .expect("alloc")
        })
        .collect();
    {
        let mut io: Vec<Io<f32>> = send
            .iter()
            .zip(recv.iter_mut())
            .map(|(s, d)| Io::out_of_place(s, d))
            .collect();
        comm.all_gather(&mut io, sendcount, &streams)
            .expect("all_gather");
    }
    for (r, buf) in recv.iter().enumerate() {
        let out = down(r, buf);
        for (k, &x) in out.iter().enumerate() {
            let (q, i) = (k / sendcount, k % sendcount);
            assert_eq!(
                x,
                input(q, i),
                "all_gather ring {ring:?}: rank {r} element {k}"
            );
        }
    }

    // Reduce-scatter, out of place.
    let recvcount = (1 << 18) + 1;
    let send: Vec<_> = (0..n)
        .map(|r| {
            comm.stream(r)
                .clone_htod(&inputs(r, n * recvcount))
                .expect("upload")
        })
        .collect();
    let mut recv: Vec<_> = (0..n)
        .map(|r| comm.stream(r).alloc_zeros::<f32>(recvcount).expect("alloc"))
        .collect();
    {
        let mut io: Vec<Io<f32>> = send
            .iter()
            .zip(recv.iter_mut())
            .map(|(s, d)| Io::out_of_place(s, d))
            .collect();
        comm.reduce_scatter(&mut io, recvcount, RedOp::Sum, &streams)
            .expect("reduce_scatter");
    }
    for (r, buf) in recv.iter().enumerate() {
        let out = down(r, buf);
        for (i, &x) in out.iter().enumerate() {
            let want: f32 = (0..n).map(|q| input(q, r * recvcount + i)).sum();
            assert_eq!(
                x, want,
                "reduce_scatter ring {ring:?}: rank {r} element {i}"
            );
        }
    }

    // Broadcast from the last rank, in place.
    let root = n - 1;
    let mut bufs: Vec<_> = (0..n)
        .map(|r| {
            comm.stream(r)
                .clone_htod(&inputs(r, count))
                .expect("upload")
        })
        .collect();
    {
        let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
        comm.broadcast(&mut io, count, root, &streams)
            .expect("broadcast");
    }
    for (r, buf) in bufs.iter().enumerate() {
        let out = down(r, buf);
        for (i, &x) in out.iter().enumerate() {
            assert_eq!(
                x,
                input(root, i),
                "broadcast ring {ring:?}: rank {r} element {i}"
            );
        }
    }
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn ring_from_topology_and_from_the_environment() {
    std::env::remove_var(RING_ENV);
    let comm = Communicator::all().expect("a communicator over every GPU");
    let n = comm.nranks();
    assert!(n >= 2, "this test needs 2+ CUDA GPUs; {n} visible");

    // The chosen ring: a normalised permutation, and the best for the scores of the pairs
    // that use peer access.
    let ordinals: Vec<usize> = (0..n).map(|r| comm.ordinal(r)).collect();
    let driver_scores =
        ringccl::internals::driver::p2p_link_scores(&ordinals).expect("p2p link scores");
    let scores: Vec<Vec<u32>> = (0..n)
        .map(|a| {
            (0..n)
                .map(|b| {
                    if a != b && comm.peer_access(a, b) {
                        driver_scores[a][b]
                    } else {
                        0
                    }
                })
                .collect()
        })
        .collect();
    let ring = comm.ring().to_vec();
    println!(
        "{n} GPUs; driver link scores {driver_scores:?}; ring {ring:?} ({:?})",
        ring_quality(&scores, &ring)
    );
    let mut sorted = ring.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "not a permutation");
    assert_eq!(ring, best_ring(&scores));
    check_collectives(&comm);
    drop(comm);

    // The override, reversed (not the identity, not normalised).
    let reversed: Vec<usize> = (0..n).rev().collect();
    let value = reversed
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(",");
    std::env::set_var(RING_ENV, &value);
    let comm = Communicator::all().expect("a communicator with RINGCCL_RING");
    assert_eq!(comm.ring(), reversed.as_slice());
    check_collectives(&comm);
    drop(comm);

    // A bad override is an error that names the variable.
    std::env::set_var(RING_ENV, "0,0");
    let result = Communicator::all();
    std::env::remove_var(RING_ENV);
    match result {
        Err(e @ Error::Config { .. }) => {
            assert!(e.to_string().contains(RING_ENV), "{e}");
        }
        other => panic!("RINGCCL_RING=0,0 should be rejected, got {other:?}"),
    }
}
