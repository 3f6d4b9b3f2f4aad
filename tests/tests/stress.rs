//! GPU stress test: 10,000 random collectives from 8 host threads on ONE communicator at once,
//! each checked exactly against a CPU reference, with guard regions around every buffer.
//!
//! Run on a machine with 2+ GPUs: `cargo test --release -p ringccl-tests --test stress --
//! --include-ignored --nocapture`. `RINGCCL_STRESS_CALLS` changes the number of calls (default
//! 10,000), `RINGCCL_STRESS_SEED` the seed.
//!
//! Each call: a random collective (all-reduce, reduce-scatter, all-gather, broadcast, reduce,
//! all-to-all, gather, scatter), element type (f32, f64, bf16, i32, i64, u8), operator, count
//! (0, 1, small primes, random up to 65,536 per block), layout (in place where the collective
//! has a simple one: all-reduce, broadcast and reduce at the root) and root, on the thread's own
//! streams (one per rank). Inputs are small integers (products from {1, 2}), so every order of
//! reduction gives the same exact result in every type: the reference is exact and the check is
//! bit for bit. Every buffer has [`GUARD`] poisoned elements on both sides; after the call every
//! byte of every buffer is compared: guards untouched, inputs of out-of-place calls unchanged,
//! outputs equal to the reference.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringccl::{Communicator, DeviceElement, Io, RedOp};

/// Poisoned elements before and after every buffer.
const GUARD: usize = 37;
/// Host threads calling at once.
const THREADS: usize = 8;

trait Elem: DeviceElement + cudarc::driver::ValidAsZeroBits {
    const POISON: Self;
    const FLOAT: bool;
    fn from_f64(x: f64) -> Self;
    fn bits(self) -> u64;
}

impl Elem for f32 {
    const POISON: Self = f32::from_bits(0x7fc0_a5a5);
    const FLOAT: bool = true;
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}
impl Elem for f64 {
    const POISON: Self = f64::from_bits(0x7ff8_a5a5_a5a5_a5a5);
    const FLOAT: bool = true;
    fn from_f64(x: f64) -> Self {
        x
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
}
impl Elem for bf16 {
    const POISON: Self = bf16::from_bits(0x7fa5);
    const FLOAT: bool = true;
    fn from_f64(x: f64) -> Self {
        bf16::from_f64(x)
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}
impl Elem for i32 {
    const POISON: Self = 0xa5a5_a5a5u32 as i32;
    const FLOAT: bool = false;
    fn from_f64(x: f64) -> Self {
        x as i32
    }
    fn bits(self) -> u64 {
        u64::from(self as u32)
    }
}
impl Elem for i64 {
    const POISON: Self = 0xa5a5_a5a5_a5a5_a5a5u64 as i64;
    const FLOAT: bool = false;
    fn from_f64(x: f64) -> Self {
        x as i64
    }
    fn bits(self) -> u64 {
        self as u64
    }
}
impl Elem for u8 {
    const POISON: Self = 0xa5;
    const FLOAT: bool = false;
    fn from_f64(x: f64) -> Self {
        x as u8
    }
    fn bits(self) -> u64 {
        u64::from(self)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Coll {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
    AllToAll,
    Gather,
    Scatter,
}

const COLLS: [Coll; 8] = [
    Coll::AllReduce,
    Coll::ReduceScatter,
    Coll::AllGather,
    Coll::Broadcast,
    Coll::Reduce,
    Coll::AllToAll,
    Coll::Gather,
    Coll::Scatter,
];

/// One random call.
#[derive(Clone, Copy, Debug)]
struct Case {
    coll: Coll,
    op: RedOp,
    count: usize,
    root: usize,
    in_place: bool,
    seed: u64,
}

impl Case {
    fn random(rng: &mut StdRng, n: usize) -> Self {
        let coll = COLLS[rng.random_range(0..COLLS.len())];
        let op = RedOp::ALL[rng.random_range(0..RedOp::ALL.len())];
        const FIXED: [usize; 10] = [0, 1, 2, 3, 7, 13, 31, 127, 1021, 4093];
        let count = match rng.random_range(0..4) {
            0 | 1 => FIXED[rng.random_range(0..FIXED.len())],
            2 => rng.random_range(1..4096),
            _ => rng.random_range(1..65_536),
        };
        let in_place = matches!(coll, Coll::AllReduce | Coll::Broadcast | Coll::Reduce)
            && rng.random_bool(0.5);
        Case {
            coll,
            op,
            count,
            root: rng.random_range(0..n),
            in_place,
            seed: rng.random(),
        }
    }

    /// Elements of rank `r`'s send and receive buffers (`None`: not passed).
    fn lens(&self, r: usize, n: usize) -> (Option<usize>, Option<usize>) {
        let c = self.count;
        let root = r == self.root;
        let only = |yes: bool, len: usize| yes.then_some(len);
        match self.coll {
            Coll::AllReduce => (Some(c), Some(c)),
            Coll::ReduceScatter => (Some(n * c), Some(c)),
            Coll::AllGather => (Some(c), Some(n * c)),
            Coll::Broadcast => (only(root, c), Some(c)),
            Coll::Reduce => (Some(c), only(root, c)),
            Coll::AllToAll => (Some(n * c), Some(n * c)),
            Coll::Gather => (Some(c), only(root, n * c)),
            Coll::Scatter => (only(root, n * c), Some(c)),
        }
    }
}

/// Rank `r`'s input element `i`: small integers (for `Prod`: 1 or 2, so products stay exact).
fn input(case: &Case, r: usize, i: usize) -> i64 {
    let h = (case.seed ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_add((i as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9));
    let h = (h ^ (h >> 31)).wrapping_mul(0x94d0_49bb_1331_11eb);
    let h = h ^ (h >> 29);
    if case.op == RedOp::Prod {
        1 + (h % 2) as i64
    } else {
        (h % 9) as i64 // 0..=8: unsigned types stay exact too
    }
}

/// The reduction of the ranks' element values, exact, as the type computes it.
fn reduce_ref(op: RedOp, vals: &[i64], float: bool) -> f64 {
    let n = vals.len() as i64;
    match op {
        RedOp::Sum => vals.iter().sum::<i64>() as f64,
        RedOp::Prod => vals.iter().product::<i64>() as f64,
        RedOp::Min => *vals.iter().min().unwrap_or(&0) as f64,
        RedOp::Max => *vals.iter().max().unwrap_or(&0) as f64,
        RedOp::Avg => {
            let s = vals.iter().sum::<i64>();
            if float {
                s as f64 / n as f64
            } else {
                (s / n) as f64
            }
        }
    }
}

/// The expected receive buffer of every rank (`None`: not passed).
fn expected<T: Elem>(case: &Case, n: usize) -> Vec<Option<Vec<T>>> {
    let c = case.count;
    let x = |r: usize, i: usize| input(case, r, i);
    let red = |idx: &dyn Fn(usize) -> i64| -> T {
        let vals: Vec<i64> = (0..n).map(idx).collect();
        T::from_f64(reduce_ref(case.op, &vals, T::FLOAT))
    };
    let val = |v: i64| T::from_f64(v as f64);
    (0..n)
        .map(|r| {
            let root = r == case.root;
            match case.coll {
                Coll::AllReduce => Some((0..c).map(|i| red(&|q| x(q, i))).collect()),
                Coll::ReduceScatter => Some((0..c).map(|i| red(&|q| x(q, r * c + i))).collect()),
                Coll::AllGather => Some(
                    (0..n * c)
                        .map(|j| val(x(j / c.max(1), j % c.max(1))))
                        .collect(),
                ),
                Coll::Broadcast => Some((0..c).map(|i| val(x(case.root, i))).collect()),
                Coll::Reduce => root.then(|| (0..c).map(|i| red(&|q| x(q, i))).collect()),
                Coll::AllToAll => Some(
                    (0..n * c)
                        .map(|j| val(x(j / c.max(1), r * c + j % c.max(1))))
                        .collect(),
                ),
                Coll::Gather => root.then(|| {
                    (0..n * c)
                        .map(|j| val(x(j / c.max(1), j % c.max(1))))
                        .collect()
                }),
                Coll::Scatter => Some((0..c).map(|i| val(x(case.root, r * c + i))).collect()),
            }
        })
        .collect()
}

/// Poisoned guards around `body`.
fn guarded<T: Elem>(body: &[T]) -> Vec<T> {
    let mut v = vec![T::POISON; body.len() + 2 * GUARD];
    v[GUARD..GUARD + body.len()].copy_from_slice(body);
    v
}

/// Runs one case with element type `T` on the thread's `streams`; `Err` describes a mismatch.
fn run_case<T: Elem>(
    comm: &Communicator,
    streams: &[Arc<CudaStream>],
    case: &Case,
) -> Result<(), String> {
    let n = comm.nranks();
    let up = |r: usize, host: &[T]| -> CudaSlice<T> {
        streams[r]
            .clone_htod(host)
            .unwrap_or_else(|e| panic!("upload: {e:?}"))
    };
    // Per rank: the guarded host image of each buffer passed (`None`: not passed). In place,
    // the input lives in the receive-side buffer (the root's, for rooted calls).
    let mut send_host: Vec<Option<Vec<T>>> = Vec::new();
    let mut recv_host: Vec<Option<Vec<T>>> = Vec::new();
    for r in 0..n {
        let (sl, rl) = case.lens(r, n);
        let send = |len: usize| -> Vec<T> {
            (0..len)
                .map(|i| T::from_f64(input(case, r, i) as f64))
                .collect()
        };
        if case.in_place {
            let body = match (sl, rl) {
                (Some(l), _) => send(l),
                (None, Some(l)) => vec![T::POISON; l],
                (None, None) => return Err(format!("no buffers for a rank in {case:?}")),
            };
            send_host.push(None);
            recv_host.push(Some(guarded(&body)));
        } else {
            send_host.push(sl.map(|l| guarded(&send(l))));
            recv_host.push(rl.map(|l| guarded(&vec![T::POISON; l])));
        }
    }
    let sends: Vec<Option<CudaSlice<T>>> = (0..n)
        .map(|r| send_host[r].as_ref().map(|h| up(r, h)))
        .collect();
    let mut recvs: Vec<Option<CudaSlice<T>>> = (0..n)
        .map(|r| recv_host[r].as_ref().map(|h| up(r, h)))
        .collect();
    {
        let send_views: Vec<_> = sends
            .iter()
            .map(|s| s.as_ref().map(|s| s.slice(GUARD..s.len() - GUARD)))
            .collect();
        let mut recv_views: Vec<_> = recvs
            .iter_mut()
            .map(|b| {
                b.as_mut().map(|b| {
                    let end = b.len() - GUARD;
                    b.slice_mut(GUARD..end)
                })
            })
            .collect();
        // In place: all-reduce on every rank; broadcast and reduce at the root (a broadcast's
        // other ranks receive, a reduce's other ranks only send, from the same buffer).
        let rooted_in_place = case.in_place && matches!(case.coll, Coll::Broadcast | Coll::Reduce);
        let mut io: Vec<Io<T>> = Vec::with_capacity(n);
        for (r, (s, rv)) in send_views.iter().zip(recv_views.iter_mut()).enumerate() {
            let root = r == case.root;
            let item = if rooted_in_place {
                match (case.coll, root, rv) {
                    (_, true, Some(rv)) => Io::in_place(rv),
                    (Coll::Broadcast, false, Some(rv)) => Io::recv_only(rv),
                    (Coll::Reduce, false, Some(rv)) => Io::send_only(&*rv),
                    _ => return Err(format!("bad in-place layout for {case:?}")),
                }
            } else if case.in_place {
                match rv {
                    Some(rv) => Io::in_place(rv),
                    None => return Err(format!("no in-place buffer in {case:?}")),
                }
            } else {
                match (s, rv) {
                    (Some(s), Some(rv)) => Io::out_of_place(s, rv),
                    (Some(s), None) => Io::send_only(s),
                    (None, Some(rv)) => Io::recv_only(rv),
                    (None, None) => return Err(format!("no buffers for a rank in {case:?}")),
                }
            };
            io.push(item);
        }
        let c = case.count;
        let r = match case.coll {
            Coll::AllReduce => comm.all_reduce(&mut io, c, case.op, streams),
            Coll::ReduceScatter => comm.reduce_scatter(&mut io, c, case.op, streams),
            Coll::AllGather => comm.all_gather(&mut io, c, streams),
            Coll::Broadcast => comm.broadcast(&mut io, c, case.root, streams),
            Coll::Reduce => comm.reduce(&mut io, c, case.op, case.root, streams),
            Coll::AllToAll => comm.all_to_all(&mut io, c, streams),
            Coll::Gather => comm.gather(&mut io, c, case.root, streams),
            Coll::Scatter => comm.scatter(&mut io, c, case.root, streams),
        };
        r.map_err(|e| format!("{case:?}: the call failed: {e}"))?;
    }
    let want = expected::<T>(case, n);
    for r in 0..n {
        let s = &streams[r];
        if let (Some(buf), Some(host)) = (&sends[r], &send_host[r]) {
            let got = s.clone_dtoh(buf).map_err(|e| format!("download: {e:?}"))?;
            if got.iter().zip(host).any(|(a, b)| a.bits() != b.bits()) {
                return Err(format!(
                    "{case:?}: rank {r}'s send buffer or its guards changed"
                ));
            }
        }
        if let (Some(buf), Some(host)) = (&recvs[r], &recv_host[r]) {
            let got = s.clone_dtoh(buf).map_err(|e| format!("download: {e:?}"))?;
            let body_len = got.len() - 2 * GUARD;
            let guards_ok = got[..GUARD]
                .iter()
                .chain(&got[GUARD + body_len..])
                .all(|x| x.bits() == T::POISON.bits());
            if !guards_ok {
                return Err(format!("{case:?}: rank {r}'s receive guards were written"));
            }
            let body = &got[GUARD..GUARD + body_len];
            let expect: Vec<T> = match &want[r] {
                Some(w) => w.clone(),
                // Not an output on this rank (a non-root in-place reduce): unchanged.
                None => host[GUARD..GUARD + body_len].to_vec(),
            };
            if let Some(i) = (0..body_len).find(|&i| body[i].bits() != expect[i].bits()) {
                return Err(format!(
                    "{case:?} {}: rank {r} element {i} of {body_len} is {:?}, expected {:?}",
                    std::any::type_name::<T>(),
                    body[i],
                    expect[i]
                ));
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn ten_thousand_random_collectives_from_eight_threads() {
    let calls: u64 = std::env::var("RINGCCL_STRESS_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let seed: u64 = std::env::var("RINGCCL_STRESS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed);
    let comm = Communicator::all().expect("a communicator over every GPU");
    let n = comm.nranks();
    assert!(n >= 2, "needs 2+ GPUs; {n} visible");
    let next = AtomicU64::new(0);
    let counts: Vec<AtomicU64> = (0..6).map(|_| AtomicU64::new(0)).collect();
    let t0 = Instant::now();
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (comm, next, counts) = (&comm, &next, &counts);
                s.spawn(move || {
                    let streams: Vec<Arc<CudaStream>> = (0..n)
                        .map(|r| comm.context(r).new_stream().expect("a stream"))
                        .collect();
                    let mut failures = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= calls {
                            break;
                        }
                        let mut rng =
                            StdRng::seed_from_u64(seed ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d));
                        let case = Case::random(&mut rng, n);
                        let ty = rng.random_range(0..6);
                        counts[ty].fetch_add(1, Ordering::Relaxed);
                        let r = match ty {
                            0 => run_case::<f32>(comm, &streams, &case),
                            1 => run_case::<f64>(comm, &streams, &case),
                            2 => run_case::<bf16>(comm, &streams, &case),
                            3 => run_case::<i32>(comm, &streams, &case),
                            4 => run_case::<i64>(comm, &streams, &case),
                            _ => run_case::<u8>(comm, &streams, &case),
                        };
                        if let Err(e) = r {
                            failures.push(format!("thread {t}, call {i}: {e}"));
                            if failures.len() > 5 {
                                break;
                            }
                        }
                    }
                    failures
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a stress thread"))
            .collect()
    });
    comm.synchronize().expect("synchronize");
    let by_type: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    println!(
        "stress: {calls} random collectives from {THREADS} threads on {n} GPUs in {:.1} s \
         (f32/f64/bf16/i32/i64/u8: {by_type:?}); {} wrong",
        t0.elapsed().as_secs_f64(),
        failures.len()
    );
    for f in failures.iter().take(10) {
        println!("  {f}");
    }
    assert!(failures.is_empty(), "{} calls were wrong", failures.len());
    assert!(comm.async_error().is_none());
}
