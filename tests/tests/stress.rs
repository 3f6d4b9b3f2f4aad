//! GPU stress test: 10,000 random collectives from 8 host threads on ONE communicator at once,
//! each checked exactly against a CPU reference and run through NCCL on the same data, some
//! also captured into a CUDA graph and replayed, with guard regions around every buffer.
//!
//! Run on a machine with 2+ GPUs: `cargo test --release -p ringccl-tests --test stress --
//! --include-ignored --nocapture`. `RINGCCL_STRESS_CALLS` changes the number of calls (default
//! 10,000), `RINGCCL_STRESS_SEED` the seed; `RINGCCL_STRESS_NCCL=0` leaves NCCL out (for runs
//! under compute-sanitizer; the summary line then says so). Without NCCL (`libnccl.so`) and
//! without that variable the test fails.
//!
//! Each call: a random collective (all-reduce, reduce-scatter, all-gather, broadcast, reduce,
//! all-to-all, gather, scatter), element type (all ten: f32, f64, f16, bf16, i8, u8, i32, u32,
//! i64, u64), operator (sum, prod, min, max, avg), count (0, 1, small primes, random up to
//! 65,536 per block), layout (in place where the collective has a simple one: all-reduce,
//! broadcast and reduce at the root) and root, on the thread's own streams (one per rank).
//! Inputs are small integers (products from {1, 2}), so every order of reduction gives the same
//! exact result in every type: the reference is exact and the check is bit for bit. Every buffer
//! has [`GUARD`] poisoned elements on both sides; after the call every byte of every buffer is
//! compared ([`check`]): guards untouched, inputs of out-of-place calls unchanged, outputs equal
//! to the reference.
//!
//! * **NCCL**: every case also runs through NCCL (one communicator per GPU, calls serialised by
//!   a mutex, on fresh copies of the same guarded buffers, with NCCL's in-place forms where
//!   ringccl's call is in place; all-to-all, gather and scatter as grouped `ncclSend`/`ncclRecv`)
//!   and passes the same checks: ringccl's and NCCL's results both equal the exact reference,
//!   so they equal each other bit for bit. (NCCL's float avg multiplies by 1/n first, exact only
//!   for n a power of two: for other n those cases skip NCCL, and are counted.)
//! * **CUDA graphs**: about one case in [`GRAPH_ONE_IN`] is captured: it runs eagerly and is
//!   checked, then the same ringccl call is captured on the thread's streams (every rank's stream
//!   in one capture), and the graph is replayed twice, each time after re-uploading every buffer,
//!   and checked again. A replay is ordered with nothing else on the communicator's streams, so
//!   (as the library requires of graph launches) a graph case runs alone: eager cases hold a
//!   read lock for their whole call and check, a graph case the write lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::{Comm, NcclType, ReduceOp};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringccl::{Communicator, DeviceElement, Io, RedOp};

/// Poisoned elements before and after every buffer.
const GUARD: usize = 37;
/// Host threads calling at once.
const THREADS: usize = 8;
/// About one case in this many is also captured into a CUDA graph and replayed.
const GRAPH_ONE_IN: u32 = 40;
/// Replays of each captured graph.
const REPLAYS: usize = 2;

trait Elem: DeviceElement + cudarc::driver::ValidAsZeroBits + NcclType {
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
impl Elem for f16 {
    const POISON: Self = f16::from_bits(0x7e5a);
    const FLOAT: bool = true;
    fn from_f64(x: f64) -> Self {
        f16::from_f64(x)
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}
impl Elem for i8 {
    const POISON: Self = 0xa5u8 as i8;
    const FLOAT: bool = false;
    fn from_f64(x: f64) -> Self {
        // Through i64, so that a product that overflows wraps as on the GPU.
        x as i64 as i8
    }
    fn bits(self) -> u64 {
        u64::from(self as u8)
    }
}
impl Elem for u32 {
    const POISON: Self = 0xa5a5_a5a5;
    const FLOAT: bool = false;
    fn from_f64(x: f64) -> Self {
        // Through i64, so that a product that overflows wraps as on the GPU.
        x as i64 as u32
    }
    fn bits(self) -> u64 {
        u64::from(self)
    }
}
impl Elem for u64 {
    const POISON: Self = 0xa5a5_a5a5_a5a5_a5a5;
    const FLOAT: bool = false;
    fn from_f64(x: f64) -> Self {
        // Through i64, so that a product that overflows wraps as on the GPU.
        x as i64 as u64
    }
    fn bits(self) -> u64 {
        self
    }
}
impl Elem for i32 {
    const POISON: Self = 0xa5a5_a5a5u32 as i32;
    const FLOAT: bool = false;
    fn from_f64(x: f64) -> Self {
        // Through i64, so that a product that overflows wraps as on the GPU.
        x as i64 as i32
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
        // Through i64, so that a product that overflows wraps as on the GPU.
        x as i64 as u8
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
    /// Also captured into a CUDA graph and replayed.
    graph: bool,
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
            graph: rng.random_range(0..GRAPH_ONE_IN) == 0,
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

/// Per rank: the guarded host image of each buffer passed (`None`: not passed). In place, the
/// input lives in the receive-side buffer (the root's, for rooted calls).
struct Images<T> {
    send: Vec<Option<Vec<T>>>,
    recv: Vec<Option<Vec<T>>>,
}

fn images<T: Elem>(case: &Case, n: usize) -> Result<Images<T>, String> {
    let mut send_host = Vec::new();
    let mut recv_host = Vec::new();
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
    Ok(Images {
        send: send_host,
        recv: recv_host,
    })
}

/// The device buffers of one run (guards included), on the thread's streams.
struct Bufs<T> {
    send: Vec<Option<CudaSlice<T>>>,
    recv: Vec<Option<CudaSlice<T>>>,
}

fn upload<T: Elem>(streams: &[Arc<CudaStream>], im: &Images<T>) -> Result<Bufs<T>, String> {
    let up = |list: &[Option<Vec<T>>]| -> Result<Vec<Option<CudaSlice<T>>>, String> {
        list.iter()
            .enumerate()
            .map(|(r, h)| {
                h.as_ref()
                    .map(|h| {
                        streams[r]
                            .clone_htod(h)
                            .map_err(|e| format!("upload: {e:?}"))
                    })
                    .transpose()
            })
            .collect()
    };
    Ok(Bufs {
        send: up(&im.send)?,
        recv: up(&im.recv)?,
    })
}

/// Writes every buffer's host image again (before a graph replay).
fn reupload<T: Elem>(
    streams: &[Arc<CudaStream>],
    im: &Images<T>,
    bufs: &mut Bufs<T>,
) -> Result<(), String> {
    for (list, host) in [(&mut bufs.send, &im.send), (&mut bufs.recv, &im.recv)] {
        for (r, (b, h)) in list.iter_mut().zip(host).enumerate() {
            if let (Some(b), Some(h)) = (b, h) {
                streams[r]
                    .memcpy_htod(h, b)
                    .map_err(|e| format!("upload: {e:?}"))?;
            }
        }
    }
    Ok(())
}

/// The ringccl call of `case` on `bufs` (inside the guards).
fn call_ringccl<T: Elem>(
    comm: &Communicator,
    streams: &[Arc<CudaStream>],
    case: &Case,
    bufs: &mut Bufs<T>,
) -> Result<(), String> {
    let send_views: Vec<_> = bufs
        .send
        .iter()
        .map(|s| s.as_ref().map(|s| s.slice(GUARD..s.len() - GUARD)))
        .collect();
    let mut recv_views: Vec<_> = bufs
        .recv
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
    let mut io: Vec<Io<T>> = Vec::with_capacity(send_views.len());
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
    r.map_err(|e| format!("{case:?}: the call failed: {e}"))
}

/// One NCCL communicator per GPU. NCCL's communicators may be used from any thread as long as
/// calls are not concurrent: they are only used under the test's mutex.
struct Nccl(Vec<Comm>);

// SAFETY: `Comm` holds a raw `ncclComm_t` (and an `Arc` of its stream). NCCL allows a
// communicator to be used from another thread than the one that created it; the test only
// touches these through a `Mutex`, so calls on them are never concurrent.
unsafe impl Send for Nccl {}

fn nccl_op(op: RedOp) -> ReduceOp {
    match op {
        RedOp::Sum => ReduceOp::Sum,
        RedOp::Prod => ReduceOp::Prod,
        RedOp::Min => ReduceOp::Min,
        RedOp::Max => ReduceOp::Max,
        RedOp::Avg => ReduceOp::Avg,
    }
}

/// The same call as [`call_ringccl`] through NCCL (one group over every rank, from this
/// thread), on `bufs`, with NCCL's in-place forms where the case is in place; returns once
/// NCCL's streams are done.
fn call_nccl<T: Elem>(nccl: &Nccl, case: &Case, bufs: &mut Bufs<T>) -> Result<(), String> {
    let err = |what: &str, e: cudarc::nccl::result::NcclError| format!("nccl {what}: {:?}", e.0);
    let (c, root, op) = (case.count, case.root as i32, nccl_op(case.op));
    let n = nccl.0.len();
    cudarc::nccl::group_start().map_err(|e| err("group_start", e))?;
    let mut result = Ok(());
    for (r, comm) in nccl.0.iter().enumerate() {
        let send = bufs.send[r]
            .as_ref()
            .map(|s| s.slice(GUARD..s.len() - GUARD));
        let mut recv = bufs.recv[r].as_mut().map(|b| {
            let end = b.len() - GUARD;
            b.slice_mut(GUARD..end)
        });
        let missing = || format!("nccl: a buffer missing on rank {r} in {case:?}");
        let one = (|| -> Result<(), String> {
            match (case.coll, case.in_place) {
                (Coll::AllReduce, true) => {
                    let b = recv.as_mut().ok_or_else(missing)?;
                    comm.all_reduce_in_place(b, &op)
                        .map_err(|e| err("all_reduce", e))?;
                }
                (Coll::AllReduce, false) => {
                    let (s, b) = (
                        send.as_ref().ok_or_else(missing)?,
                        recv.as_mut().ok_or_else(missing)?,
                    );
                    comm.all_reduce(s, b, &op)
                        .map_err(|e| err("all_reduce", e))?;
                }
                (Coll::ReduceScatter, _) => {
                    let (s, b) = (
                        send.as_ref().ok_or_else(missing)?,
                        recv.as_mut().ok_or_else(missing)?,
                    );
                    comm.reduce_scatter(s, b, &op)
                        .map_err(|e| err("reduce_scatter", e))?;
                }
                (Coll::AllGather, _) => {
                    let (s, b) = (
                        send.as_ref().ok_or_else(missing)?,
                        recv.as_mut().ok_or_else(missing)?,
                    );
                    comm.all_gather(s, b).map_err(|e| err("all_gather", e))?;
                }
                (Coll::Broadcast, true) => {
                    let b = recv.as_mut().ok_or_else(missing)?;
                    comm.broadcast_in_place(b, root)
                        .map_err(|e| err("broadcast", e))?;
                }
                (Coll::Broadcast, false) => {
                    let b = recv.as_mut().ok_or_else(missing)?;
                    comm.broadcast(send.as_ref(), b, root)
                        .map_err(|e| err("broadcast", e))?;
                }
                (Coll::Reduce, true) => {
                    let b = recv.as_mut().ok_or_else(missing)?;
                    comm.reduce_in_place(b, &op, root)
                        .map_err(|e| err("reduce", e))?;
                }
                (Coll::Reduce, false) => {
                    let s = send.as_ref().ok_or_else(missing)?;
                    comm.reduce(s, recv.as_mut(), &op, root)
                        .map_err(|e| err("reduce", e))?;
                }
                (Coll::AllToAll, _) => {
                    let (s, b) = (
                        send.as_ref().ok_or_else(missing)?,
                        recv.as_mut().ok_or_else(missing)?,
                    );
                    for q in 0..n {
                        comm.send(&s.slice(q * c..(q + 1) * c), q as i32)
                            .map_err(|e| err("send", e))?;
                        comm.recv(&mut b.slice_mut(q * c..(q + 1) * c), q as i32)
                            .map_err(|e| err("recv", e))?;
                    }
                }
                (Coll::Gather, _) => {
                    let s = send.as_ref().ok_or_else(missing)?;
                    comm.send(s, root).map_err(|e| err("send", e))?;
                    if r == case.root {
                        let b = recv.as_mut().ok_or_else(missing)?;
                        for q in 0..n {
                            comm.recv(&mut b.slice_mut(q * c..(q + 1) * c), q as i32)
                                .map_err(|e| err("recv", e))?;
                        }
                    }
                }
                (Coll::Scatter, _) => {
                    if r == case.root {
                        let s = send.as_ref().ok_or_else(missing)?;
                        for q in 0..n {
                            comm.send(&s.slice(q * c..(q + 1) * c), q as i32)
                                .map_err(|e| err("send", e))?;
                        }
                    }
                    let b = recv.as_mut().ok_or_else(missing)?;
                    comm.recv(b, root).map_err(|e| err("recv", e))?;
                }
            }
            Ok(())
        })();
        if let Err(e) = one {
            result = Err(e);
            break;
        }
    }
    let end = cudarc::nccl::group_end().map_err(|e| err("group_end", e));
    result?;
    end?;
    // Inside a group NCCL enqueues its kernels at group end, after cudarc recorded the buffers'
    // events: wait for NCCL's streams so that the checks read finished results.
    for comm in &nccl.0 {
        comm.stream()
            .synchronize()
            .map_err(|e| format!("nccl stream: {e:?}"))?;
    }
    Ok(())
}

/// Compares every byte of every buffer with what `case` must leave there (`what` names the
/// run: eager, a replay, NCCL); `Err` describes the first difference.
fn check<T: Elem>(
    streams: &[Arc<CudaStream>],
    case: &Case,
    im: &Images<T>,
    bufs: &Bufs<T>,
    want: &[Option<Vec<T>>],
    what: &str,
) -> Result<(), String> {
    for r in 0..streams.len() {
        let s = &streams[r];
        if let (Some(buf), Some(host)) = (&bufs.send[r], &im.send[r]) {
            let got = s.clone_dtoh(buf).map_err(|e| format!("download: {e:?}"))?;
            if got.iter().zip(host).any(|(a, b)| a.bits() != b.bits()) {
                return Err(format!(
                    "{what} {case:?}: rank {r}'s send buffer or its guards changed"
                ));
            }
        }
        if let (Some(buf), Some(host)) = (&bufs.recv[r], &im.recv[r]) {
            let got = s.clone_dtoh(buf).map_err(|e| format!("download: {e:?}"))?;
            let body_len = got.len() - 2 * GUARD;
            let guards_ok = got[..GUARD]
                .iter()
                .chain(&got[GUARD + body_len..])
                .all(|x| x.bits() == T::POISON.bits());
            if !guards_ok {
                return Err(format!(
                    "{what} {case:?}: rank {r}'s receive guards were written"
                ));
            }
            let body = &got[GUARD..GUARD + body_len];
            let expect: Vec<T> = match &want[r] {
                Some(w) => w.clone(),
                // Not an output on this rank (a non-root in-place reduce): unchanged.
                None => host[GUARD..GUARD + body_len].to_vec(),
            };
            if let Some(i) = (0..body_len).find(|&i| body[i].bits() != expect[i].bits()) {
                return Err(format!(
                    "{what} {case:?} {}: rank {r} element {i} of {body_len} is {:?}, expected {:?}",
                    std::any::type_name::<T>(),
                    body[i],
                    expect[i]
                ));
            }
        }
    }
    Ok(())
}

/// What one case did, for the summary.
#[derive(Default)]
struct Ran {
    graph_replays: u64,
    nccl: u64,
    nccl_skipped: u64,
}

/// Runs one case with element type `T` on the thread's `streams` (see the module docs);
/// `Err` describes the first mismatch.
fn run_case<T: Elem>(
    comm: &Communicator,
    streams: &[Arc<CudaStream>],
    nccl: Option<&Mutex<Nccl>>,
    case: &Case,
) -> Result<Ran, String> {
    let n = comm.nranks();
    let mut ran = Ran::default();
    let im = images::<T>(case, n)?;
    let want = expected::<T>(case, n);
    let mut bufs = upload(streams, &im)?;
    call_ringccl(comm, streams, case, &mut bufs)?;
    check(streams, case, &im, &bufs, &want, "eager")?;
    if case.graph {
        let ctxs: Vec<Arc<CudaContext>> = (0..n).map(|r| comm.context(r).clone()).collect();
        let graph = ringccl_tests::capture_one_graph(&ctxs, streams, || {
            call_ringccl(comm, streams, case, &mut bufs)
        })
        .map_err(|e| format!("graph {case:?}: {e}"))?;
        for replay in 0..REPLAYS {
            reupload(streams, &im, &mut bufs)?;
            for s in streams {
                s.synchronize().map_err(|e| format!("sync: {e:?}"))?;
            }
            graph.launch().map_err(|e| format!("graph launch: {e:?}"))?;
            streams[0]
                .synchronize()
                .map_err(|e| format!("replay {replay}: {e:?}"))?;
            check(
                streams,
                case,
                &im,
                &bufs,
                &want,
                &format!("graph replay {replay}"),
            )?;
            ran.graph_replays += 1;
        }
    }
    if let Some(nccl) = nccl {
        // NCCL's float avg pre-multiplies by 1/n: exact only for n a power of two.
        if case.op == RedOp::Avg && T::FLOAT && !n.is_power_of_two() {
            ran.nccl_skipped += 1;
        } else {
            let mut nbufs = upload(streams, &im)?;
            {
                let guard = nccl
                    .lock()
                    .map_err(|_| "the NCCL mutex is poisoned".to_string())?;
                call_nccl(&guard, case, &mut nbufs)?;
            }
            check(streams, case, &im, &nbufs, &want, "nccl:")?;
            ran.nccl += 1;
        }
    }
    Ok(ran)
}

/// The NCCL side of the test: `None` when `RINGCCL_STRESS_NCCL=0`; fails the test when NCCL
/// cannot be loaded otherwise.
fn nccl_comms(comm: &Communicator) -> Option<Mutex<Nccl>> {
    if std::env::var("RINGCCL_STRESS_NCCL").is_ok_and(|v| v == "0") {
        return None;
    }
    // SAFETY: only checks whether libnccl can be loaded.
    let present = unsafe { cudarc::nccl::sys::is_culib_present() };
    assert!(
        present,
        "libnccl.so could not be loaded: the stress test compares with NCCL (install libnccl2, \
         or put libnccl.so on LD_LIBRARY_PATH; RINGCCL_STRESS_NCCL=0 leaves NCCL out)"
    );
    let streams: Vec<Arc<CudaStream>> = (0..comm.nranks())
        .map(|r| comm.context(r).new_stream().expect("a stream for NCCL"))
        .collect();
    let comms =
        Comm::from_devices(streams).unwrap_or_else(|e| panic!("ncclCommInitAll failed: {:?}", e.0));
    Some(Mutex::new(Nccl(comms)))
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
    let nccl = nccl_comms(&comm);
    // Eager cases read-lock, graph cases write-lock: a replay runs alone (see the module docs).
    let order = RwLock::new(());
    let next = AtomicU64::new(0);
    let counts: Vec<AtomicU64> = (0..10).map(|_| AtomicU64::new(0)).collect();
    let [graphs, replays, nccl_checked, nccl_skipped] = [(); 4].map(|_| AtomicU64::new(0));
    let t0 = Instant::now();
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (comm, next, counts, order, nccl) =
                    (&comm, &next, &counts, &order, nccl.as_ref());
                let (graphs, replays, nccl_checked, nccl_skipped) =
                    (&graphs, &replays, &nccl_checked, &nccl_skipped);
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
                        let ty = rng.random_range(0..10);
                        counts[ty].fetch_add(1, Ordering::Relaxed);
                        let (_read, _write);
                        if case.graph {
                            _write = order.write().unwrap_or_else(|e| e.into_inner());
                        } else {
                            _read = order.read().unwrap_or_else(|e| e.into_inner());
                        }
                        let (st, c) = (&streams, &case);
                        let r = match ty {
                            0 => run_case::<f32>(comm, st, nccl, c),
                            1 => run_case::<f64>(comm, st, nccl, c),
                            2 => run_case::<f16>(comm, st, nccl, c),
                            3 => run_case::<bf16>(comm, st, nccl, c),
                            4 => run_case::<i8>(comm, st, nccl, c),
                            5 => run_case::<u8>(comm, st, nccl, c),
                            6 => run_case::<i32>(comm, st, nccl, c),
                            7 => run_case::<u32>(comm, st, nccl, c),
                            8 => run_case::<i64>(comm, st, nccl, c),
                            _ => run_case::<u64>(comm, st, nccl, c),
                        };
                        match r {
                            Ok(ran) => {
                                graphs.fetch_add(u64::from(case.graph), Ordering::Relaxed);
                                replays.fetch_add(ran.graph_replays, Ordering::Relaxed);
                                nccl_checked.fetch_add(ran.nccl, Ordering::Relaxed);
                                nccl_skipped.fetch_add(ran.nccl_skipped, Ordering::Relaxed);
                            }
                            Err(e) => {
                                failures.push(format!("thread {t}, call {i}: {e}"));
                                if failures.len() > 5 {
                                    break;
                                }
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
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let nccl_note = if nccl.is_some() {
        format!(
            "NCCL ran {} of them on the same data, identical ({} float avg cases skipped: n is \
             not a power of two)",
            load(&nccl_checked),
            load(&nccl_skipped)
        )
    } else {
        "NCCL left out (RINGCCL_STRESS_NCCL=0)".to_string()
    };
    println!(
        "stress: {calls} random collectives from {THREADS} threads on {n} GPUs in {:.1} s \
         (f32/f64/f16/bf16/i8/u8/i32/u32/i64/u64: {by_type:?}); {} captured into CUDA graphs \
         and replayed {} times; {nccl_note}; {} wrong",
        t0.elapsed().as_secs_f64(),
        load(&graphs),
        load(&replays),
        failures.len()
    );
    for f in failures.iter().take(10) {
        println!("  {f}");
    }
    assert!(failures.is_empty(), "{} calls were wrong", failures.len());
    assert!(comm.async_error().is_none());
    if nccl.is_some() {
        assert_eq!(
            load(&nccl_checked) + load(&nccl_skipped),
            calls,
            "every case ran through NCCL or was counted as skipped"
        );
    }
}
