//! Collectives and point-to-point calls: from NCCL's per-rank calls to ringccl's calls over
//! the ranks a process holds.
//!
//! NCCL takes one rank per call; ringccl takes every rank held by the process in one call. So
//! each call is queued on its rank ([`crate::queue::Queues`]), and as soon as every rank of the process has
//! a call at the head of its queue, those calls are checked to be the same collective and
//! issued as one ringccl call. With one rank per process (`ncclCommInitRank`) that is at once;
//! with `ncclCommInitAll` it is when the last rank's call arrives (inside a group, at
//! `ncclGroupEnd`). Sends and receives are queued too and issued together, as one ringccl
//! group, at `ncclGroupEnd` (or at once outside a group).
//!
//! Buffers and streams come from C as raw pointers ([`Raw`], and borrowed `CUstream`s): the
//! caller's contract (nccl.h) is that they are device memory of the communicator's device, of
//! the sizes the call implies, and that the caller orders other work on them through the
//! stream.
//!
//! Dependencies point one way: `queue` (plain data) ← `comm` (handles, worlds) ← `group`
//! (the thread's group state) ← `coll` (issuing) ← the C entry points.

use std::marker::PhantomData;
use std::sync::Arc;

use ringccl::cudarc::driver::{sys, CudaStream};
use ringccl::half::{bf16, f16};
use ringccl::{
    DataType, DeviceElement, DeviceSlice, DeviceSliceMut, Io, Op, PeerOp, RawBuf, Scalar,
};

use crate::comm::{Member, World};
use crate::error::{Fail, Result};
use crate::group;
use crate::ops::{self, PreMul};
pub use crate::queue::{CollCall, Kind, P2pCall};

/// Queues a collective call of `m`'s rank; issues every complete set unless inside a group.
pub fn submit(m: &Member, call: CollCall) -> Result<()> {
    let tag = group::touched(&m.world);
    m.world.lock().push_coll(m.index, call, tag);
    if group::depth() == 0 {
        flush(&m.world)
    } else {
        Ok(())
    }
}

/// Queues a send or receive of `m`'s rank; issues the queued ones unless inside a group.
pub fn submit_p2p(m: &Member, call: P2pCall) -> Result<()> {
    let tag = group::touched(&m.world);
    m.world.lock().push_p2p(call, tag);
    if group::depth() == 0 {
        flush(&m.world)
    } else {
        Ok(())
    }
}

/// `ncclGroupEnd`: at the outermost level, waits for the group's initialisations, then either
/// issues the calls it queued or, if a call inside the group failed, drops them and returns
/// that first failure (as NCCL does: the whole group fails, nothing of it runs).
pub fn group_end() -> Result<()> {
    let Some(done) = group::end()? else {
        return Ok(());
    };
    let mut first = match done.error {
        Some(f) => Err(Fail::new(
            f.code,
            format!(
                "a call inside the group failed, so nothing of the group was issued: {}",
                f.message
            ),
        )),
        None => Ok(()),
    };
    for h in &done.inits {
        let r = h.wait_init();
        if first.is_ok() {
            first = r;
        }
    }
    if first.is_err() {
        for w in &done.worlds {
            let dropped = w.lock().discard(done.tag);
            crate::debug::info(|| {
                format!("ncclGroupEnd: the group failed; {dropped} calls dropped")
            });
        }
        return first;
    }
    for w in &done.worlds {
        let r = flush(w);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// `ncclGroupSimulateEnd` with a `ncclSimInfo_t`: ends the group as NCCL does (inner level:
/// nothing; outermost: the thread leaves the group, the group's initialisations are waited for,
/// and, as in a simulation, none of its calls is issued: they are dropped). ringccl has no cost
/// model to fill in `estimatedTime`, so the outermost end then fails with `ncclInvalidUsage`
/// (or with the group's own first error, or `ncclInvalidArgument` for a `simInfo` not made with
/// `NCCL_SIM_INFO_INITIALIZER`); the thread is out of the group either way.
pub fn group_simulate_end(sim_info_valid: bool) -> Result<()> {
    let Some(done) = group::end()? else {
        return Ok(());
    };
    let mut first = match done.error {
        Some(f) => Err(f),
        None if !sim_info_valid => Err(Fail::arg(
            "simInfo was not initialised with NCCL_SIM_INFO_INITIALIZER (magic 0x74685283)",
        )),
        None => Err(Fail::usage(
            "ringccl has no cost model to estimate the group's time; the group ended and none \
             of its calls was issued (as in a simulation): end it with ncclGroupEnd to run them",
        )),
    };
    for h in &done.inits {
        if let Err(f) = h.wait_init() {
            first = Err(f);
        }
    }
    for w in &done.worlds {
        w.lock().discard(done.tag);
    }
    first
}

/// Issues every complete set of collectives of `world`, in order, then the queued sends and
/// receives: across processes at once, in one process once both sides of every transfer are
/// queued (ranks driven by several threads). The first failure is returned (the failing set is
/// dropped; later sets still run).
pub fn flush(world: &World) -> Result<()> {
    let _keep = crate::cuda::KeepContext::new();
    let mut first: Result<()> = Ok(());
    // The lock is held while issuing, so that sets from several threads go out in order.
    let mut q = world.lock();
    while let Some(set) = q.next_set() {
        let r = issue(world, &set);
        if first.is_ok() {
            first = r;
        }
    }
    let ready = world.comm.local_ranks().len() < world.comm.nranks() || q.p2p_balanced();
    if q.has_p2p() && ready {
        let calls = q.take_p2p();
        let r = issue_p2p(world, &calls);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// Device memory from C: an address, a length in elements, a device.
struct Raw<T> {
    buf: RawBuf,
    _t: PhantomData<fn() -> T>,
}

impl<T> Raw<T> {
    fn new(ptr: u64, len: usize, ordinal: usize) -> Raw<T> {
        Raw {
            buf: RawBuf::new(ptr, len, ordinal),
            _t: PhantomData,
        }
    }
}

// SAFETY: nccl.h's contract: the caller passes device memory of the communicator's device,
// at least as long as the call implies (the lengths here are exactly those), valid until the
// work on the call's stream is done, and orders any other access to it through that stream.
// No tracking: ordering is the caller's, as with NCCL.
unsafe impl<T> DeviceSlice<T> for Raw<T> {
    fn raw(&self) -> RawBuf {
        self.buf
    }
}

// SAFETY: as above; the receive buffers of NCCL's calls are writable device memory.
unsafe impl<T> DeviceSliceMut<T> for Raw<T> {}

/// How one rank's buffers are passed.
enum Mode {
    InPlace,
    OutOfPlace,
    SendOnly,
    RecvOnly,
}

/// One rank's buffers.
struct Slot<T> {
    send: Raw<T>,
    recv: Raw<T>,
    mode: Mode,
}

/// Rank `rank`'s buffers for `c`, with NCCL's lengths and in-place rules.
fn slot<T>(c: &CollCall, rank: usize, n: usize, ordinal: usize) -> Slot<T> {
    let k = c.count;
    let nk = n.saturating_mul(k);
    let size = c.dtype.size() as u64;
    let at = |base: u64, elems: usize| base.wrapping_add((elems as u64).wrapping_mul(size));
    let raw = |p: u64, len: usize| Raw::new(p, len, ordinal);
    let is_root = rank == c.root;
    let (send_len, recv_len, mode) = match c.kind {
        Kind::AllReduce => (k, k, in_place(c.send == c.recv)),
        Kind::Broadcast | Kind::Reduce if c.send == c.recv && is_root => (k, k, Mode::InPlace),
        Kind::Broadcast if is_root => (k, k, Mode::OutOfPlace),
        Kind::Broadcast => (k, k, Mode::RecvOnly),
        Kind::Reduce if is_root => (k, k, Mode::OutOfPlace),
        Kind::Reduce => (k, k, Mode::SendOnly),
        Kind::AllGather => {
            // In place: sendbuff is recvbuff + rank * sendcount; the call names recvbuff.
            if c.send == at(c.recv, rank * k) {
                return Slot {
                    send: raw(c.recv, nk),
                    recv: raw(c.recv, nk),
                    mode: Mode::InPlace,
                };
            }
            (k, nk, Mode::OutOfPlace)
        }
        Kind::ReduceScatter => {
            // In place: recvbuff is sendbuff + rank * recvcount; the call names sendbuff.
            if c.recv == at(c.send, rank * k) {
                return Slot {
                    send: raw(c.send, nk),
                    recv: raw(c.send, nk),
                    mode: Mode::InPlace,
                };
            }
            (nk, k, Mode::OutOfPlace)
        }
        Kind::AllToAll => (nk, nk, Mode::OutOfPlace),
        Kind::Gather if is_root => {
            if c.send == at(c.recv, c.root * k) {
                return Slot {
                    send: raw(c.recv, nk),
                    recv: raw(c.recv, nk),
                    mode: Mode::InPlace,
                };
            }
            (k, nk, Mode::OutOfPlace)
        }
        Kind::Gather => (k, 0, Mode::SendOnly),
        Kind::Scatter if is_root => {
            if c.recv == at(c.send, c.root * k) {
                return Slot {
                    send: raw(c.send, nk),
                    recv: raw(c.send, nk),
                    mode: Mode::InPlace,
                };
            }
            (nk, k, Mode::OutOfPlace)
        }
        Kind::Scatter => (0, k, Mode::RecvOnly),
    };
    let recv = if matches!(mode, Mode::InPlace) {
        c.send
    } else {
        c.recv
    };
    Slot {
        send: raw(c.send, send_len),
        recv: raw(recv, recv_len),
        mode,
    }
}

fn in_place(yes: bool) -> Mode {
    if yes {
        Mode::InPlace
    } else {
        Mode::OutOfPlace
    }
}

/// Wraps the callers' streams (borrowed: never destroyed here).
fn streams(world: &World, raw: impl Iterator<Item = (usize, usize)>) -> Vec<Arc<CudaStream>> {
    raw.map(|(rank, s)| {
        // SAFETY: nccl.h's contract: the stream belongs to the communicator's device (its
        // primary context, the runtime's) and lives until the call's work is done; the
        // wrapper does not destroy it, and ordering with the caller's other work is the
        // caller's, as with NCCL.
        unsafe {
            world
                .comm
                .context(rank)
                .wrap_borrowed_stream(s as sys::CUstream)
        }
    })
    .collect()
}

/// Issues one complete set (one call per local rank).
fn issue(world: &World, set: &[CollCall]) -> Result<()> {
    let first = set[0];
    if let Some(i) = set.iter().position(|c| !c.same_as(&first)) {
        let ranks = world.comm.local_ranks();
        return Err(Fail::usage(format!(
            "the ranks of this process called different collectives: rank {} {}, rank {} {}",
            ranks[0],
            first.describe(),
            ranks[i],
            set[i].describe()
        )));
    }
    crate::debug::info(|| first.describe());
    if first.count == 0 {
        return Ok(());
    }
    match first.dtype {
        DataType::F32 => issue_typed::<f32>(world, set),
        DataType::F64 => issue_typed::<f64>(world, set),
        DataType::F16 => issue_typed::<f16>(world, set),
        DataType::BF16 => issue_typed::<bf16>(world, set),
        DataType::I8 => issue_typed::<i8>(world, set),
        DataType::U8 => issue_typed::<u8>(world, set),
        DataType::I32 => issue_typed::<i32>(world, set),
        DataType::U32 => issue_typed::<u32>(world, set),
        DataType::I64 => issue_typed::<i64>(world, set),
        DataType::U64 => issue_typed::<u64>(world, set),
        DataType::F8E4M3 => issue_typed::<ringccl::F8E4M3>(world, set),
        DataType::F8E5M2 => issue_typed::<ringccl::F8E5M2>(world, set),
    }
}

fn issue_typed<T: DeviceElement>(world: &World, set: &[CollCall]) -> Result<()> {
    let comm = &world.comm;
    let n = comm.nranks();
    let ranks = comm.local_ranks();
    let c = set[0];
    let mut slots: Vec<Slot<T>> = ranks
        .iter()
        .zip(set)
        .map(|(&r, call)| slot(call, r, n, comm.ordinal(r)))
        .collect();
    let streams = streams(
        world,
        ranks.iter().copied().zip(set.iter().map(|c| c.stream)),
    );
    let mut io: Vec<Io<'_, T>> = slots
        .iter_mut()
        .map(|Slot { send, recv, mode }| match mode {
            Mode::InPlace => Io::in_place(recv),
            Mode::OutOfPlace => Io::out_of_place(&*send, recv),
            Mode::SendOnly => Io::send_only(&*send),
            Mode::RecvOnly => Io::recv_only(recv),
        })
        .collect();
    let op = operator::<T>(set)?;
    let r = match c.kind {
        Kind::AllReduce => comm.all_reduce(&mut io, c.count, op, &streams),
        Kind::Broadcast => comm.broadcast(&mut io, c.count, c.root, &streams),
        Kind::Reduce => comm.reduce(&mut io, c.count, op, c.root, &streams),
        Kind::AllGather => comm.all_gather(&mut io, c.count, &streams),
        Kind::ReduceScatter => comm.reduce_scatter(&mut io, c.count, op, &streams),
        Kind::AllToAll => comm.all_to_all(&mut io, c.count, &streams),
        Kind::Gather => comm.gather(&mut io, c.count, c.root, &streams),
        Kind::Scatter => comm.scatter(&mut io, c.count, c.root, &streams),
    };
    r.map_err(Fail::from)
}

/// The host call's operator for a set of calls: the built-in, or (every rank's call carrying
/// a PreMulSum, `CollCall::same_as` checked that) a PreMulSum with each rank's scalar as its
/// operator was created: the host value's bits, or the device address, read when the
/// collective runs.
fn operator<T: DeviceElement>(set: &[CollCall]) -> Result<Op> {
    let premuls: Vec<PreMul> = set.iter().filter_map(|c| c.premul).collect();
    if premuls.is_empty() {
        return Ok(set[0].op.into());
    }
    if premuls.len() != set.len() || premuls.iter().any(|p| p.dtype != T::DTYPE) {
        return Err(Fail::new(
            crate::types::NCCL_INTERNAL_ERROR,
            "the ranks' PreMulSum operators do not all match the call's datatype; nothing was run",
        ));
    }
    let scalars: Vec<Scalar<T>> = premuls
        .iter()
        .map(|p| match p.scalar {
            ops::Scalar::Host { bits } => Scalar::Host(from_bits::<T>(bits)),
            ops::Scalar::Device { ptr } => Scalar::Device(ptr),
        })
        .collect();
    // SAFETY: a device scalar is the address `ncclRedOpCreatePreMulSum` was given with
    // `ncclScalarDevice`: by nccl.h's contract one element of the datatype in the rank's
    // device memory, valid for as long as the operator is used (read when the call runs).
    Ok(unsafe { Op::pre_mul_sum_scalars(&scalars) })
}

/// The element whose bits (little-endian, zero-extended) are `bits`.
fn from_bits<T: DeviceElement>(bits: u64) -> T {
    let b = bits.to_le_bytes();
    debug_assert!(std::mem::size_of::<T>() <= b.len());
    // SAFETY: every `DeviceElement` is a plain number of at most 8 bytes (floats, integers,
    // half types, fp8 newtypes) for which any bit pattern is a valid value; `b` holds 8.
    unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<T>()) }
}

/// Issues queued sends and receives as one ringccl group ([`Communicator::peer_ops`]), in
/// bytes: as in NCCL, what one rank sends to another must add up, in bytes, to what that rank
/// receives from it in its group. Within one process the group must hold both sides of every
/// transfer (ringccl matches them); across processes each rank's own calls are enough.
///
/// [`Communicator::peer_ops`]: ringccl::Communicator::peer_ops
fn issue_p2p(world: &World, calls: &[P2pCall]) -> Result<()> {
    let comm = &world.comm;
    let ranks = comm.local_ranks();
    // One stream per local rank: the stream of its calls in this group (they must agree).
    let mut stream_of: Vec<Option<usize>> = vec![None; ranks.len()];
    for call in calls {
        let Some(i) = ranks.iter().position(|&r| r == call.rank) else {
            return Err(Fail::new(
                crate::types::NCCL_INTERNAL_ERROR,
                format!("rank {} is not held by this process", call.rank),
            ));
        };
        match stream_of[i] {
            None => stream_of[i] = Some(call.stream),
            Some(x) if x != call.stream => {
                return Err(Fail::usage(format!(
                    "rank {}'s sends and receives of one group use different streams; ringccl \
                     needs one stream per rank for them",
                    call.rank
                )))
            }
            Some(_) => {}
        }
    }
    let streams: Vec<Arc<CudaStream>> = ranks
        .iter()
        .zip(&stream_of)
        .map(|(&r, s)| match s {
            Some(s) => streams(world, std::iter::once((r, *s))).remove(0),
            None => comm.stream(r).clone(),
        })
        .collect();
    let bytes = |c: &P2pCall| c.count.saturating_mul(c.dtype.size());
    let mut bufs: Vec<Raw<u8>> = calls
        .iter()
        .map(|c| Raw::new(c.buf, bytes(c), comm.ordinal(c.rank)))
        .collect();
    let mut ops: Vec<PeerOp<'_, u8>> = bufs
        .iter_mut()
        .zip(calls)
        .map(|(b, c)| {
            if c.send {
                PeerOp::send(c.rank, c.peer, &*b, bytes(c))
            } else {
                PeerOp::recv(c.rank, c.peer, b, bytes(c))
            }
        })
        .collect();
    comm.peer_ops(&mut ops, &streams).map_err(Fail::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringccl::RedOp;

    fn call(kind: Kind, send: u64, recv: u64, count: usize) -> CollCall {
        CollCall {
            kind,
            count,
            dtype: DataType::F32,
            op: RedOp::Sum,
            premul: None,
            root: 1,
            send,
            recv,
            stream: 0,
        }
    }

    fn shape<T>(s: &Slot<T>) -> (u64, usize, u64, usize, &'static str) {
        let m = match s.mode {
            Mode::InPlace => "in",
            Mode::OutOfPlace => "out",
            Mode::SendOnly => "send",
            Mode::RecvOnly => "recv",
        };
        (
            s.send.buf.ptr,
            s.send.buf.len,
            s.recv.buf.ptr,
            s.recv.buf.len,
            m,
        )
    }

    #[test]
    fn nccl_in_place_rules() {
        // all_gather, rank 2 of 4, sendcount 10: in place when sendbuff = recvbuff + 2*10*4.
        let s = slot::<f32>(&call(Kind::AllGather, 0x1000 + 80, 0x1000, 10), 2, 4, 0);
        assert_eq!(shape(&s), (0x1000, 40, 0x1000, 40, "in"));
        let s = slot::<f32>(&call(Kind::AllGather, 0x9000, 0x1000, 10), 2, 4, 0);
        assert_eq!(shape(&s), (0x9000, 10, 0x1000, 40, "out"));
        // reduce_scatter: in place when recvbuff = sendbuff + rank*recvcount.
        let s = slot::<f32>(&call(Kind::ReduceScatter, 0x1000, 0x1000 + 40, 10), 1, 4, 0);
        assert_eq!(shape(&s), (0x1000, 40, 0x1000, 40, "in"));
        // gather/scatter: in place at the root's block.
        let s = slot::<f32>(&call(Kind::Gather, 0x1000 + 40, 0x1000, 10), 1, 4, 0);
        assert_eq!(shape(&s), (0x1000, 40, 0x1000, 40, "in"));
        let s = slot::<f32>(&call(Kind::Scatter, 0x1000, 0x1000 + 40, 10), 1, 4, 0);
        assert_eq!(shape(&s), (0x1000, 40, 0x1000, 40, "in"));
        // non-roots
        let s = slot::<f32>(&call(Kind::Gather, 0x1000, 0, 10), 0, 4, 0);
        assert_eq!(shape(&s).4, "send");
        let s = slot::<f32>(&call(Kind::Scatter, 0, 0x2000, 10), 0, 4, 0);
        assert_eq!(shape(&s).4, "recv");
        let s = slot::<f32>(&call(Kind::Broadcast, 0, 0x2000, 10), 0, 4, 0);
        assert_eq!(shape(&s).4, "recv");
        let s = slot::<f32>(&call(Kind::Reduce, 0x2000, 0, 10), 0, 4, 0);
        assert_eq!(shape(&s).4, "send");
        let s = slot::<f32>(&call(Kind::AllReduce, 0x2000, 0x2000, 10), 0, 4, 0);
        assert_eq!(shape(&s), (0x2000, 10, 0x2000, 10, "in"));
    }

    fn premul(scalar: ops::Scalar) -> Option<PreMul> {
        Some(PreMul {
            scalar,
            dtype: DataType::F32,
            nccl_type: 7,
        })
    }

    #[test]
    fn a_premul_set_becomes_one_operator_with_each_ranks_scalar() {
        let mut a = call(Kind::AllReduce, 0x100, 0x200, 4);
        let mut b = a;
        assert_eq!(
            operator::<f32>(&[a, b]).unwrap(),
            ringccl::RedOp::Sum.into()
        );
        a.premul = premul(ops::Scalar::Host {
            bits: u64::from(0.5f32.to_bits()),
        });
        b.premul = premul(ops::Scalar::Device { ptr: 0x7000 });
        // Different scalars are the same collective (each rank has its own, as in NCCL)...
        assert!(a.same_as(&b));
        // SAFETY: the operator is compared, never run.
        let want =
            unsafe { Op::pre_mul_sum_scalars(&[Scalar::Host(0.5f32), Scalar::Device(0x7000)]) };
        assert_eq!(operator::<f32>(&[a, b]).unwrap(), want);
        // ...but a PreMulSum and a plain sum are not.
        let plain = call(Kind::AllReduce, 0x100, 0x200, 4);
        assert!(!a.same_as(&plain));
        assert!(operator::<f32>(&[a, plain]).is_err());
        // The scalar's type must be the call's.
        assert!(operator::<f64>(&[a, b]).is_err());
        assert!(a.describe().contains("premulsum"), "{}", a.describe());
    }

    #[test]
    fn host_scalar_bits_become_the_element() {
        assert_eq!(from_bits::<f32>(u64::from(1.5f32.to_bits())), 1.5);
        assert_eq!(from_bits::<f64>((-2.0f64).to_bits()), -2.0);
        assert_eq!(from_bits::<i8>(0xff), -1);
        assert_eq!(from_bits::<bf16>(0x3f80), bf16::ONE);
        assert_eq!(from_bits::<ringccl::F8E5M2>(0x3c).to_f32(), 1.0);
    }
}
