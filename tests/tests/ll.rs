//! GPU test of the LL push all-reduce among processes (`gpu_kernels::ll`, the plan
//! `ProcessLl`), and of the LL all-gather and reduce-scatter (`ProcessLlGather`,
//! `ProcessLlReduceScatter`) and of the broadcast and reduce on the LL all-reduce kernel
//! (`ProcessLlBroadcast`, `ProcessLlReduce`; each interleaved with all-reduces): every size up to the LL limit, every type the host API has and every
//! operator, in place and out of place, streams alternating, many calls in a row (the epoch's
//! parity wraps thousands of times), each result compared bit for bit with the CPU's fold of
//! the ranks' inputs in rank order (`gpu_kernels::op::RedOp`, the arithmetic the kernels use).
//!
//! `ll_all_reduce_across_processes` starts the job (every visible GPU, at most 8, or
//! `RINGCCL_TEST_PROCESSES` processes under MPS); each rank runs `rank_runs_ll`.
//!
//! Run on a GPU machine: `cargo test -p ringccl-tests --test ll -- --include-ignored
//! --test-threads=1 --nocapture`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream, ValidAsZeroBits};
use gpu_kernels::element::Element;
use gpu_kernels::ll::LL_MAX_BYTES;
use gpu_kernels::op::RedOp as KOp;
use ringccl::internals::api::collective::Collective;
use ringccl::internals::plan::call::{
    ll_fits, ll_gather_fits, ll_reduce_scatter_fits, ll_rooted_fits,
};
use ringccl::{Communicator, Config, DeviceElement, Io, RedOp};
use ringccl_tests::jobs::{run_job, this_rank, JobRank};

/// A host element type with the kernels' element type of the same bits.
trait Elem: DeviceElement + ValidAsZeroBits + Copy + Default + Unpin + std::fmt::Debug {
    type K: Element;
    fn to_k(self) -> Self::K;
    fn from_k(k: Self::K) -> Self;
    /// A value from a hash: small magnitudes, so that sums and products stay finite mostly
    /// (the comparison is bit for bit either way).
    fn make(h: u64) -> Self;
}

macro_rules! native {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            type K = $t;
            fn to_k(self) -> $t { self }
            fn from_k(k: $t) -> $t { k }
            fn make(h: u64) -> $t { <$t>::from_raw(h % 7 + 1) }
        }
    )*};
}
native!(i8, u8, i32, u32, i64, u64);

impl Elem for f32 {
    type K = f32;
    fn to_k(self) -> f32 {
        self
    }
    fn from_k(k: f32) -> f32 {
        k
    }
    fn make(h: u64) -> f32 {
        (h % 1000) as f32 / 37.0 - 13.0
    }
}

impl Elem for f64 {
    type K = f64;
    fn to_k(self) -> f64 {
        self
    }
    fn from_k(k: f64) -> f64 {
        k
    }
    fn make(h: u64) -> f64 {
        (h % 1000) as f64 / 37.0 - 13.0
    }
}

impl Elem for half::f16 {
    type K = gpu_kernels::element::F16;
    fn to_k(self) -> Self::K {
        gpu_kernels::element::F16(self.to_bits())
    }
    fn from_k(k: Self::K) -> Self {
        half::f16::from_bits(k.0)
    }
    fn make(h: u64) -> Self {
        half::f16::from_f32((h % 100) as f32 / 7.0 - 7.0)
    }
}

impl Elem for half::bf16 {
    type K = gpu_kernels::element::Bf16;
    fn to_k(self) -> Self::K {
        gpu_kernels::element::Bf16(self.to_bits())
    }
    fn from_k(k: Self::K) -> Self {
        half::bf16::from_bits(k.0)
    }
    fn make(h: u64) -> Self {
        half::bf16::from_f32((h % 100) as f32 / 7.0 - 7.0)
    }
}

fn hash(r: usize, k: usize, i: usize) -> u64 {
    let mut x = (r as u64) << 48 ^ (k as u64) << 24 ^ i as u64;
    x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 29)
}

fn kop(op: RedOp) -> KOp {
    match op {
        RedOp::Sum => KOp::Sum,
        RedOp::Prod => KOp::Prod,
        RedOp::Min => KOp::Min,
        RedOp::Max => KOp::Max,
        RedOp::Avg => KOp::Avg,
    }
}

/// Rank `r`'s input of call `k`.
fn input<T: Elem>(r: usize, k: usize, count: usize) -> Vec<T> {
    (0..count).map(|i| T::make(hash(r, k, i))).collect()
}

/// The expected output of call `k`: the ranks' inputs folded in rank order, finished with the
/// rank count, as the kernels do.
fn expected<T: Elem>(n: usize, k: usize, count: usize, op: RedOp) -> Vec<T> {
    let op = kop(op);
    (0..count)
        .map(|i| {
            let mut acc = T::make(hash(0, k, i)).to_k();
            for q in 1..n {
                acc = op.combine(acc, T::make(hash(q, k, i)).to_k());
            }
            T::from_k(op.finish(acc, n as u32))
        })
        .collect()
}

/// Runs call `k` (`count` elements, `op`, in place or not) on `stream`; returns how many
/// elements differ from [`expected`].
#[allow(clippy::too_many_arguments)]
fn one_call<T: Elem>(
    comm: &Communicator,
    stream: &Arc<CudaStream>,
    (r, n): (usize, usize),
    k: usize,
    count: usize,
    op: RedOp,
    in_place: bool,
) -> usize {
    let mine = input::<T>(r, k, count);
    let send: CudaSlice<T> = stream.clone_htod(&mine).expect("upload");
    let mut recv: CudaSlice<T> = if in_place {
        send.clone()
    } else {
        stream.alloc_zeros(count).expect("alloc")
    };
    {
        let mut io = [if in_place {
            Io::in_place(&mut recv)
        } else {
            Io::out_of_place(&send, &mut recv)
        }];
        comm.all_reduce(&mut io, count, op, &[stream])
            .unwrap_or_else(|e| panic!("rank {r}: all_reduce of {count} ({op:?}): {e}"));
    }
    let got = stream.clone_dtoh(&recv).expect("download");
    mismatches(&got, &expected::<T>(n, k, count, op))
}

/// The elements of `got` that are not the same result as `want`'s (bit for bit, NaNs alike).
fn mismatches<T: Elem>(got: &[T], want: &[T]) -> usize {
    got.iter()
        .zip(want)
        .filter(|(g, w)| !g.to_k().same_result(w.to_k()))
        .count()
}

/// Every size class up to the LL limit for `T`, every operator, in and out of place, on
/// streams taken in turn; returns (calls, wrong elements).
fn sweep<T: Elem>(
    comm: &Communicator,
    streams: &[Arc<CudaStream>],
    (r, n): (usize, usize),
    k: &mut usize,
) -> (usize, usize) {
    let size = std::mem::size_of::<T>();
    let max = LL_MAX_BYTES / size;
    let mut counts: Vec<usize> = (1..=17).collect();
    counts.extend([
        31,
        32,
        33,
        255,
        256,
        257,
        1000,
        1023,
        1025,
        max / 2 + 3,
        max - 1,
        max,
    ]);
    counts.retain(|&c| c <= max);
    let (mut calls, mut wrong) = (0, 0);
    for &count in &counts {
        assert!(
            ll_fits(
                Collective::AllReduce { count },
                count * size,
                n,
                &Config::default()
            ),
            "{count} elements of {size} bytes run on the LL kernel"
        );
        for op in [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg] {
            for in_place in [false, true] {
                let stream = &streams[*k % streams.len()];
                let bad = one_call::<T>(comm, stream, (r, n), *k, count, op, in_place);
                if bad > 0 {
                    eprintln!(
                        "rank {r}: {} × {count} {op:?} in_place={in_place}: {bad} wrong",
                        std::any::type_name::<T>()
                    );
                }
                wrong += bad;
                calls += 1;
                *k += 1;
            }
        }
    }
    (calls, wrong)
}

/// The LL all-gather (`ProcessLlGather`, the default for small all-gathers): bytes per rank from 1 to
/// the LL limit (odd sizes take the kernel's byte-by-byte path), in place and out of place,
/// each followed by a small LL all-reduce on another stream (the two share the epochs);
/// returns (calls, wrong bytes).
fn gather_sweep(
    comm: &Communicator,
    streams: &[Arc<CudaStream>],
    (r, n): (usize, usize),
    k: &mut usize,
) -> (usize, usize) {
    let mut sizes: Vec<usize> = (1..=17).collect();
    sizes.extend([
        63,
        64,
        65,
        1000,
        4096,
        4099,
        LL_MAX_BYTES - 8,
        LL_MAX_BYTES - 1,
        LL_MAX_BYTES,
    ]);
    let (mut calls, mut wrong) = (0, 0);
    for &bytes in &sizes {
        let c = Collective::AllGather { sendcount: bytes };
        assert!(
            ll_gather_fits(c, bytes, n, comm.config()),
            "{bytes} bytes run on the LL all-gather"
        );
        for in_place in [false, true] {
            let stream = &streams[*k % streams.len()];
            let block = |q: usize| input::<u8>(q, *k, bytes);
            let mut out: CudaSlice<u8> = stream.alloc_zeros(n * bytes).expect("alloc");
            if in_place {
                let mut full = vec![0u8; n * bytes];
                full[r * bytes..(r + 1) * bytes].copy_from_slice(&block(r));
                stream.memcpy_htod(&full, &mut out).expect("upload");
                comm.all_gather(&mut [Io::in_place(&mut out)], bytes, &[stream])
                    .unwrap_or_else(|e| panic!("rank {r}: all_gather of {bytes}: {e}"));
            } else {
                let send: CudaSlice<u8> = stream.clone_htod(&block(r)).expect("upload");
                comm.all_gather(&mut [Io::out_of_place(&send, &mut out)], bytes, &[stream])
                    .unwrap_or_else(|e| panic!("rank {r}: all_gather of {bytes}: {e}"));
            }
            let got = stream.clone_dtoh(&out).expect("download");
            let want: Vec<u8> = (0..n).flat_map(block).collect();
            let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            if bad > 0 {
                eprintln!(
                    "rank {r}: LL all-gather of {bytes} bytes in_place={in_place}: {bad} wrong"
                );
            }
            wrong += bad;
            calls += 1;
            *k += 1;
            let other = &streams[*k % streams.len()];
            wrong += one_call::<f32>(comm, other, (r, n), *k, 1 + bytes % 500, RedOp::Sum, false);
            calls += 1;
            *k += 1;
        }
    }
    (calls, wrong)
}

/// One LL reduce-scatter (`ProcessLlReduceScatter`) of `count` elements per rank, call `k`:
/// rank `q`'s input is `input(q, k, n * count)`, so rank `r`'s output is block `r` of
/// [`expected`] over `n * count`; returns the wrong elements.
#[allow(clippy::too_many_arguments)]
fn one_reduce_scatter<T: Elem>(
    comm: &Communicator,
    stream: &Arc<CudaStream>,
    (r, n): (usize, usize),
    k: usize,
    count: usize,
    op: RedOp,
    in_place: bool,
) -> usize {
    let mine = input::<T>(r, k, n * count);
    let mut send: CudaSlice<T> = stream.clone_htod(&mine).expect("upload");
    let mut recv: CudaSlice<T> = stream.alloc_zeros(count).expect("alloc");
    let call = if in_place {
        comm.reduce_scatter(&mut [Io::in_place(&mut send)], count, op, &[stream])
    } else {
        comm.reduce_scatter(
            &mut [Io::out_of_place(&send, &mut recv)],
            count,
            op,
            &[stream],
        )
    };
    call.unwrap_or_else(|e| panic!("rank {r}: reduce_scatter of {count} ({op:?}): {e}"));
    let got = if in_place {
        stream.clone_dtoh(&send).expect("download")[r * count..(r + 1) * count].to_vec()
    } else {
        stream.clone_dtoh(&recv).expect("download")
    };
    mismatches(
        &got,
        &expected::<T>(n, k, n * count, op)[r * count..(r + 1) * count],
    )
}

/// The LL reduce-scatter: element counts per rank up to the LL limit for `T`, every operator,
/// in place and out of place, each followed by a small LL all-reduce on another stream (the
/// two share the epochs); returns (calls, wrong elements).
fn reduce_scatter_sweep<T: Elem>(
    comm: &Communicator,
    streams: &[Arc<CudaStream>],
    (r, n): (usize, usize),
    k: &mut usize,
) -> (usize, usize) {
    let size = std::mem::size_of::<T>();
    let max = LL_MAX_BYTES / size;
    let mut counts: Vec<usize> = (1..=9).collect();
    counts.extend([31, 33, 257, 1023, max / 2 + 3, max]);
    counts.retain(|&c| c <= max);
    let (mut calls, mut wrong) = (0, 0);
    for &count in &counts {
        let c = Collective::ReduceScatter { recvcount: count };
        assert!(
            ll_reduce_scatter_fits(c, count * size, n, comm.config()),
            "{count} elements of {size} bytes per rank run on the LL reduce-scatter"
        );
        for op in [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg] {
            for in_place in [false, true] {
                let stream = &streams[*k % streams.len()];
                let bad = one_reduce_scatter::<T>(comm, stream, (r, n), *k, count, op, in_place);
                if bad > 0 {
                    eprintln!(
                        "rank {r}: LL reduce-scatter {} × {count} {op:?} in_place={in_place}: {bad} wrong",
                        std::any::type_name::<T>()
                    );
                }
                wrong += bad;
                calls += 1;
                *k += 1;
                let other = &streams[*k % streams.len()];
                wrong +=
                    one_call::<f32>(comm, other, (r, n), *k, 1 + count % 300, RedOp::Sum, false);
                calls += 1;
                *k += 1;
            }
        }
    }
    (calls, wrong)
}

/// One LL broadcast of `bytes` from `root`, call `k`, on `stream`: the root's input is
/// `input(root, k, bytes)`, every f32-sized word of it made a NaN or a negative zero now and
/// then (a broadcast moves bytes: a sum of floats would change both); the other ranks' outputs
/// start as other bytes. In place on every rank or out of place on every rank (the root's
/// output then its receive buffer). Returns the wrong bytes.
fn one_broadcast(
    comm: &Communicator,
    stream: &Arc<CudaStream>,
    (r, root): (usize, usize),
    k: usize,
    bytes: usize,
    in_place: bool,
) -> usize {
    let mut want = input::<u8>(root, k, bytes);
    for (w, word) in want.chunks_mut(4).enumerate() {
        let special: &[u8] = match (k + w) % 7 {
            0 => &[0x00, 0x00, 0xc0, 0x7f], // NaN
            3 => &[0x00, 0x00, 0x00, 0x80], // -0.0
            _ => continue,
        };
        let len = word.len();
        word.copy_from_slice(&special[..len]);
    }
    let before: Vec<u8> = (0..bytes).map(|i| (i as u8) ^ 0x5a).collect();
    let mut out: CudaSlice<u8> = stream
        .clone_htod(if r == root { &want } else { &before })
        .expect("upload");
    let call = if in_place {
        comm.broadcast(&mut [Io::in_place(&mut out)], bytes, root, &[stream])
    } else if r == root {
        let send: CudaSlice<u8> = stream.clone_htod(&want).expect("upload");
        let mut recv: CudaSlice<u8> = stream.clone_htod(&before).expect("upload");
        let called = comm.broadcast(
            &mut [Io::out_of_place(&send, &mut recv)],
            bytes,
            root,
            &[stream],
        );
        out = recv;
        called
    } else {
        comm.broadcast(&mut [Io::recv_only(&mut out)], bytes, root, &[stream])
    };
    call.unwrap_or_else(|e| panic!("rank {r}: broadcast of {bytes} from {root}: {e}"));
    let got = stream.clone_dtoh(&out).expect("download");
    got.iter().zip(&want).filter(|(g, w)| g != w).count()
}

/// One LL reduce of `count` elements to `root`, call `k`: the root's output is [`expected`];
/// a non-root's receive buffer (given out of place) is left as it was. Returns the wrong
/// elements.
#[allow(clippy::too_many_arguments)]
fn one_reduce<T: Elem>(
    comm: &Communicator,
    stream: &Arc<CudaStream>,
    (r, n, root): (usize, usize, usize),
    k: usize,
    count: usize,
    op: RedOp,
    in_place: bool,
) -> usize {
    let mine = input::<T>(r, k, count);
    let mut send: CudaSlice<T> = stream.clone_htod(&mine).expect("upload");
    let before = vec![T::make(99); count];
    let mut recv: CudaSlice<T> = stream.clone_htod(&before).expect("upload");
    let call = if in_place {
        comm.reduce(&mut [Io::in_place(&mut send)], count, op, root, &[stream])
    } else {
        comm.reduce(
            &mut [Io::out_of_place(&send, &mut recv)],
            count,
            op,
            root,
            &[stream],
        )
    };
    call.unwrap_or_else(|e| panic!("rank {r}: reduce of {count} ({op:?}) to {root}: {e}"));
    match (r == root, in_place) {
        (true, true) => mismatches(
            &stream.clone_dtoh(&send).expect("download"),
            &expected::<T>(n, k, count, op),
        ),
        (true, false) => mismatches(
            &stream.clone_dtoh(&recv).expect("download"),
            &expected::<T>(n, k, count, op),
        ),
        // A non-root's buffers are its own: the input unchanged, the receive buffer untouched.
        (false, true) => mismatches(&stream.clone_dtoh(&send).expect("download"), &mine),
        (false, false) => mismatches(&stream.clone_dtoh(&recv).expect("download"), &before),
    }
}

/// The broadcast and reduce on the LL kernel: sizes up to the LL limit, every root, in place
/// and out of place, each followed by a small LL all-reduce on another stream (they share the
/// epochs); returns (calls, wrong elements).
fn rooted_sweep(
    comm: &Communicator,
    streams: &[Arc<CudaStream>],
    (r, n): (usize, usize),
    k: &mut usize,
) -> (usize, usize) {
    let (mut calls, mut wrong) = (0, 0);
    let after = |k: &mut usize, calls: &mut usize, wrong: &mut usize| {
        *k += 1;
        let other = &streams[*k % streams.len()];
        *wrong += one_call::<f32>(comm, other, (r, n), *k, 1 + *k % 300, RedOp::Sum, false);
        *calls += 1;
        *k += 1;
    };
    for bytes in [
        1,
        2,
        3,
        7,
        8,
        9,
        15,
        16,
        17,
        63,
        64,
        65,
        1000,
        4096,
        4099,
        LL_MAX_BYTES - 1,
        LL_MAX_BYTES,
    ] {
        let c = Collective::Broadcast {
            count: bytes,
            root: 0,
        };
        assert!(
            ll_rooted_fits(c, bytes, n, comm.config()),
            "{bytes} bytes run on the LL broadcast"
        );
        for root in 0..n {
            for in_place in [false, true] {
                let stream = &streams[*k % streams.len()];
                let bad = one_broadcast(comm, stream, (r, root), *k, bytes, in_place);
                if bad > 0 {
                    eprintln!("rank {r}: LL broadcast of {bytes} bytes from {root} in_place={in_place}: {bad} wrong");
                }
                wrong += bad;
                calls += 1;
                after(k, &mut calls, &mut wrong);
            }
        }
    }
    let max = LL_MAX_BYTES / 4;
    for count in [1, 2, 3, 17, 257, 1023, max / 2 + 3, max] {
        let c = Collective::Reduce { count, root: 0 };
        assert!(
            ll_rooted_fits(c, count * 4, n, comm.config()),
            "{count} f32 run on the LL reduce"
        );
        for (j, op) in [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg]
            .into_iter()
            .enumerate()
        {
            let root = (count + j) % n;
            for in_place in [false, true] {
                let stream = &streams[*k % streams.len()];
                let bad = one_reduce::<f32>(comm, stream, (r, n, root), *k, count, op, in_place)
                    + one_reduce::<i32>(comm, stream, (r, n, root), *k + 1, count, op, in_place);
                if bad > 0 {
                    eprintln!("rank {r}: LL reduce of {count} {op:?} to {root} in_place={in_place}: {bad} wrong");
                }
                wrong += bad;
                calls += 2;
                *k += 1;
                after(k, &mut calls, &mut wrong);
            }
        }
    }
    (calls, wrong)
}

#[test]
#[ignore = "needs a CUDA GPU; started by ll_all_reduce_across_processes as each rank"]
fn rank_runs_ll() {
    let Some(JobRank {
        id,
        rank: r,
        nranks: n,
    }) = this_rank()
    else {
        println!("rank_runs_ll runs as a rank of ll_all_reduce_across_processes' job");
        return;
    };
    let mut config = Config::from_env().expect("the RINGCCL_ variables");
    config.timeout = Some(Duration::from_secs(60));
    let comm = ringccl_tests::jobs::join(&id, r, n, config);
    let ctx = comm.context(r).clone();
    let streams: Vec<Arc<CudaStream>> = (0..3)
        .map(|_| ctx.new_stream().expect("a stream"))
        .collect();
    let t0 = Instant::now();
    let mut k = 0;
    let (mut calls, mut wrong) = (0, 0);
    for (c, w) in [
        sweep::<f32>(&comm, &streams, (r, n), &mut k),
        sweep::<f64>(&comm, &streams, (r, n), &mut k),
        sweep::<half::f16>(&comm, &streams, (r, n), &mut k),
        sweep::<half::bf16>(&comm, &streams, (r, n), &mut k),
        sweep::<i8>(&comm, &streams, (r, n), &mut k),
        sweep::<u8>(&comm, &streams, (r, n), &mut k),
        sweep::<i32>(&comm, &streams, (r, n), &mut k),
        sweep::<u32>(&comm, &streams, (r, n), &mut k),
        sweep::<i64>(&comm, &streams, (r, n), &mut k),
        sweep::<u64>(&comm, &streams, (r, n), &mut k),
    ] {
        calls += c;
        wrong += w;
    }
    let (c, w) = gather_sweep(&comm, &streams, (r, n), &mut k);
    println!("rank {r} of {n}: {c} LL all-gathers and all-reduces interleaved, {w} wrong");
    calls += c;
    wrong += w;
    let (mut c, mut w) = (0, 0);
    for (c1, w1) in [
        reduce_scatter_sweep::<f32>(&comm, &streams, (r, n), &mut k),
        reduce_scatter_sweep::<half::bf16>(&comm, &streams, (r, n), &mut k),
        reduce_scatter_sweep::<i32>(&comm, &streams, (r, n), &mut k),
        reduce_scatter_sweep::<u8>(&comm, &streams, (r, n), &mut k),
        reduce_scatter_sweep::<f64>(&comm, &streams, (r, n), &mut k),
    ] {
        c += c1;
        w += w1;
    }
    println!("rank {r} of {n}: {c} LL reduce-scatters and all-reduces interleaved, {w} wrong");
    calls += c;
    wrong += w;
    let (c, w) = rooted_sweep(&comm, &streams, (r, n), &mut k);
    println!("rank {r} of {n}: {c} LL broadcasts, reduces and all-reduces interleaved, {w} wrong");
    calls += c;
    wrong += w;
    // Many calls in a row on one stream, then alternating (every third call on another),
    // each checked: the epoch's parity flips every call.
    for j in 0..3000 {
        let stream = if j < 1500 {
            &streams[0]
        } else {
            &streams[(j / 3) % streams.len()]
        };
        let count = 1 + j % 97;
        wrong += one_call::<f32>(&comm, stream, (r, n), k, count, RedOp::Sum, j % 2 == 0);
        calls += 1;
        k += 1;
    }
    // Without a check between them: 2000 calls queued back to back, then the last checked.
    let count = 513;
    let mine = input::<f32>(r, k, count);
    let send: CudaSlice<f32> = streams[1].clone_htod(&mine).expect("upload");
    let mut recv: CudaSlice<f32> = streams[1].alloc_zeros(count).expect("alloc");
    for _ in 0..2000 {
        let mut io = [Io::out_of_place(&send, &mut recv)];
        comm.all_reduce(&mut io, count, RedOp::Max, &[&streams[1]])
            .expect("all_reduce");
    }
    let got = streams[1].clone_dtoh(&recv).expect("download");
    let want = expected::<f32>(n, k, count, RedOp::Max);
    wrong += got
        .iter()
        .zip(&want)
        .filter(|(g, w)| g.to_bits() != w.to_bits())
        .count();
    calls += 2000;
    println!(
        "rank {r} of {n}: {calls} LL all-reduces, {wrong} wrong elements, {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(wrong, 0, "rank {r}: wrong elements");
}

/// The job: every visible GPU (at most 8), or `RINGCCL_TEST_PROCESSES` processes.
#[test]
#[ignore = "needs 2+ CUDA GPUs (or RINGCCL_TEST_PROCESSES and MPS)"]
fn ll_all_reduce_across_processes() {
    let gpus = cudarc::driver::CudaContext::device_count().expect("the CUDA driver");
    let n = ringccl_tests::jobs::job_size((gpus as usize).min(8));
    assert!(
        n >= 2,
        "this test needs 2+ CUDA GPUs or RINGCCL_TEST_PROCESSES; {n} ranks"
    );
    run_job("rank_runs_ll", n, Duration::from_secs(600), |_| Vec::new());
    println!("{n} processes: every rank passed");
}
