//! GPU tests of the data-parallel gradient reducer (`ringccl::ddp::Reducer`), one process
//! driving every visible GPU (2 or more).
//!
//! Run on a machine with 2+ GPUs: `cargo test -p ringccl-tests --test ddp -- --include-ignored`.
//! The gradients are small integers, so every sum is exact and the average is one correctly
//! rounded division: results are compared with the CPU's exactly (sum) or to 1 ulp (average).
//! One process per GPU is exercised by the `train_mlp` example's `--check` under `ringccl-run`.

use std::sync::Arc;

use cudarc::driver::{CudaStream, CudaViewMut};
use ringccl::ddp::{BucketCaps, Launch, Reducer, ReducerError, ReducerOptions, Reduction};
use ringccl::Communicator;

/// Parameter sizes: odd sizes, a 1-element one, one over the caps below.
const LENS: [usize; 8] = [1000, 3, 70_000, 1, 250_000, 4096, 17, 65];

/// Small caps, so that the parameters fall into several buckets.
const CAPS: BucketCaps = BucketCaps {
    first_bytes: 4 << 10,
    bytes: 64 << 10,
};

/// Gradient element `i` of parameter `p` on rank `r` in pass `pass`: an integer in [-8, 8].
fn grad(r: usize, p: usize, i: usize, pass: usize) -> f32 {
    ((r * 7 + p * 3 + i * 5 + pass * 11) % 17) as f32 - 8.0
}

/// A permutation of `0..n` from a seed (the order gradients are marked in).
fn order(n: usize, seed: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut s = seed as u64 * 0x9e37_79b9_7f4a_7c15 + 1;
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
    v
}

fn comm() -> Communicator {
    let comm = Communicator::all().expect("a communicator over every GPU (needs the CUDA driver)");
    assert!(comm.nranks() >= 2, "needs 2+ GPUs, found {}", comm.nranks());
    comm
}

fn write(stream: &Arc<CudaStream>, view: &mut CudaViewMut<'_, f32>, values: &[f32]) {
    stream.memcpy_htod(values, view).expect("upload a gradient");
}

/// One backward pass: every rank writes and marks its gradients in its own order.
fn pass(reducer: &mut Reducer<'_, f32>, compute: &[Arc<CudaStream>], ranks: &[usize], k: usize) {
    for (local, &rank) in ranks.iter().enumerate() {
        for p in order(LENS.len(), rank * 100 + k) {
            let values: Vec<f32> = (0..LENS[p]).map(|i| grad(rank, p, i, k)).collect();
            let mut view = reducer.grad_mut(local, p).expect("a gradient view");
            write(&compute[local], &mut view, &values);
            reducer.mark_ready(local, p).expect("mark a gradient ready");
        }
    }
    reducer.wait().expect("wait for the buckets");
}

fn check(
    reducer: &Reducer<'_, f32>,
    compute: &[Arc<CudaStream>],
    n: usize,
    k: usize,
    reduction: Reduction,
) {
    for (local, stream) in compute.iter().enumerate() {
        stream.synchronize().expect("synchronise");
        let flat = stream
            .clone_dtoh(reducer.grads(local).expect("the flat buffer"))
            .expect("download");
        let mut covered = vec![false; flat.len()];
        for (p, &len) in LENS.iter().enumerate() {
            let range = reducer.range(p).expect("a range");
            assert_eq!(range.len(), len);
            for i in 0..len {
                let sum: f32 = (0..n).map(|r| grad(r, p, i, k)).sum();
                let want = match reduction {
                    Reduction::Avg => sum / n as f32,
                    _ => sum,
                };
                let got = flat[range.start + i];
                let ok = match reduction {
                    Reduction::Avg => (got - want).abs() <= want.abs() * f32::EPSILON,
                    _ => got.to_bits() == want.to_bits(),
                };
                assert!(
                    ok,
                    "local rank {local}, param {p}, element {i}, pass {k}: {got} != {want}"
                );
                covered[range.start + i] = true;
            }
        }
        // The alignment padding between gradients stays zero.
        for (i, v) in flat.iter().enumerate() {
            assert!(covered[i] || *v == 0.0, "padding element {i} is {v}");
        }
    }
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn reducer_averages_and_sums_in_any_order() {
    let comm = comm();
    let n = comm.nranks();
    let ranks = comm.local_ranks().to_vec();
    for &rank in &ranks {
        // SAFETY: the streams below are synchronised before every host access and at the end.
        unsafe { comm.context(rank).disable_event_tracking() };
    }
    let compute: Vec<Arc<CudaStream>> = ranks
        .iter()
        .map(|&r| comm.context(r).new_stream().expect("a stream"))
        .collect();
    for reduction in [Reduction::Avg, Reduction::Sum] {
        for launch in [Launch::Overlap, Launch::AfterBackward] {
            let options = ReducerOptions {
                caps: CAPS,
                reduction,
                launch,
            };
            let mut reducer =
                Reducer::<f32>::new(&comm, &LENS, &compute, options).expect("a reducer");
            assert!(
                reducer.plan().buckets().len() >= 4,
                "{:?}",
                reducer.plan().buckets()
            );
            for k in 0..3 {
                pass(&mut reducer, &compute, &ranks, k);
                check(&reducer, &compute, n, k, reduction);
            }
            println!(
                "{reduction:?} {launch:?}: {} buckets, 3 passes, every element as on the CPU",
                reducer.plan().buckets().len()
            );
        }
    }
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn reducer_reports_misuse_and_recovers() {
    let comm = comm();
    let n = comm.nranks();
    let ranks = comm.local_ranks().to_vec();
    // With cudarc's event tracking on (the default): correct, only without overlap.
    let compute: Vec<Arc<CudaStream>> = ranks.iter().map(|&r| comm.stream(r).clone()).collect();
    let options = ReducerOptions {
        caps: CAPS,
        ..Default::default()
    };
    let mut reducer = Reducer::<f32>::new(&comm, &LENS, &compute, options).expect("a reducer");
    assert!(matches!(
        Reducer::<f32>::new(&comm, &LENS, &compute[..1], options),
        Err(ReducerError::Streams { .. })
    ));
    reducer.mark_ready(0, 2).expect("first mark");
    assert_eq!(
        reducer.mark_ready(0, 2),
        Err(ReducerError::AlreadyReady {
            rank: ranks[0],
            param: 2
        })
    );
    assert!(matches!(
        reducer.mark_ready(0, LENS.len()),
        Err(ReducerError::UnknownParam { .. })
    ));
    assert!(matches!(
        reducer.mark_ready(ranks.len(), 0),
        Err(ReducerError::UnknownRank { .. })
    ));
    // Only parameter 2 of rank 0 was marked: wait reports the rest, starts nothing.
    match reducer.wait() {
        Err(ReducerError::Unused { rank, params }) => {
            assert_eq!(rank, ranks[0]);
            assert_eq!(params.len(), LENS.len() - 1);
        }
        other => panic!("expected Unused, got {other:?}"),
    }
    // The next pass works.
    pass(&mut reducer, &compute, &ranks, 5);
    check(&reducer, &compute, n, 5, Reduction::Avg);
}
