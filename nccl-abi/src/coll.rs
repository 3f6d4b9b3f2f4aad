//! Collectives and point-to-point calls: from NCCL's per-rank calls to ringccl's calls over
//! the ranks a process holds.
//!
//! NCCL takes one rank per call; ringccl takes every rank held by the process in one call. So
//! each call is queued on its rank ([`Queues`]), and as soon as every rank of the process has
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

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;

use ringccl::cudarc::driver::{sys, CudaStream};
use ringccl::half::{bf16, f16};
use ringccl::{DataType, DeviceElement, DeviceSlice, DeviceSliceMut, Io, PeerOp, RawBuf, RedOp};

use crate::comm::{Member, World};
use crate::error::{Fail, Result};

/// The collectives of nccl.h.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `ncclAllReduce`.
    AllReduce,
    /// `ncclBroadcast` (and `ncclBcast`).
    Broadcast,
    /// `ncclReduce`.
    Reduce,
    /// `ncclAllGather`.
    AllGather,
    /// `ncclReduceScatter`.
    ReduceScatter,
    /// `ncclAlltoAll`.
    AllToAll,
    /// `ncclGather`.
    Gather,
    /// `ncclScatter`.
    Scatter,
}

impl Kind {
    /// The NCCL function's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "ncclAllReduce",
            Kind::Broadcast => "ncclBroadcast",
            Kind::Reduce => "ncclReduce",
            Kind::AllGather => "ncclAllGather",
            Kind::ReduceScatter => "ncclReduceScatter",
            Kind::AllToAll => "ncclAlltoAll",
            Kind::Gather => "ncclGather",
            Kind::Scatter => "ncclScatter",
        }
    }

    /// Whether the call has a root.
    pub fn rooted(self) -> bool {
        matches!(
            self,
            Kind::Broadcast | Kind::Reduce | Kind::Gather | Kind::Scatter
        )
    }
}

/// One rank's collective call, as plain data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollCall {
    /// Which collective.
    pub kind: Kind,
    /// The count argument (NCCL's meaning for the collective).
    pub count: usize,
    /// The element type.
    pub dtype: DataType,
    /// The operator (`Sum` where there is none).
    pub op: RedOp,
    /// The root (0 where there is none).
    pub root: usize,
    /// `sendbuff`.
    pub send: u64,
    /// `recvbuff`.
    pub recv: u64,
    /// The `cudaStream_t`/`CUstream`, as an address.
    pub stream: usize,
}

impl CollCall {
    /// Whether two ranks' calls are the same collective.
    fn same_as(&self, o: &CollCall) -> bool {
        (self.kind, self.count, self.dtype, self.op, self.root)
            == (o.kind, o.count, o.dtype, o.op, o.root)
    }

    fn describe(&self) -> String {
        if self.kind.rooted() {
            format!(
                "{} count {} {} {} root {}",
                self.kind.name(),
                self.count,
                self.dtype.name(),
                self.op.name(),
                self.root
            )
        } else {
            format!(
                "{} count {} {} {}",
                self.kind.name(),
                self.count,
                self.dtype.name(),
                self.op.name()
            )
        }
    }
}

/// One rank's `ncclSend` or `ncclRecv`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pCall {
    /// `true`: a send to `peer`; `false`: a receive from `peer`.
    pub send: bool,
    /// The calling rank.
    pub rank: usize,
    /// The other rank.
    pub peer: usize,
    /// Elements.
    pub count: usize,
    /// The element type.
    pub dtype: DataType,
    /// The buffer.
    pub buf: u64,
    /// The stream, as an address.
    pub stream: usize,
}

/// A queued call.
#[derive(Clone, Copy, Debug)]
enum Queued {
    Coll(CollCall),
}

/// The calls of a world's local ranks waiting for the other ranks' (one queue per local rank),
/// and the sends and receives waiting for their other side.
pub struct Queues {
    per_rank: Vec<VecDeque<Queued>>,
    p2p: Vec<P2pCall>,
}

impl Queues {
    /// Empty queues for `n` local ranks.
    pub fn new(n: usize) -> Queues {
        Queues {
            per_rank: vec![VecDeque::new(); n],
            p2p: Vec::new(),
        }
    }

    /// Whether nothing waits.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.p2p.is_empty() && self.per_rank.iter().all(VecDeque::is_empty)
    }

    /// Whether every (sender, receiver) pair's queued sends add up, in bytes, to the receiver's
    /// queued receives from that sender.
    fn p2p_balanced(&self) -> bool {
        let mut sums: std::collections::HashMap<(usize, usize), i128> = Default::default();
        for c in &self.p2p {
            let bytes = (c.count as i128) * (c.dtype.size() as i128);
            let (key, v) = if c.send {
                ((c.rank, c.peer), bytes)
            } else {
                ((c.peer, c.rank), -bytes)
            };
            *sums.entry(key).or_default() += v;
        }
        sums.values().all(|&v| v == 0)
    }

    /// Takes the next set of calls, one per local rank, if every rank has one.
    fn next_set(&mut self) -> Option<Vec<CollCall>> {
        if self.per_rank.iter().any(VecDeque::is_empty) {
            return None;
        }
        let mut set = Vec::with_capacity(self.per_rank.len());
        for q in &mut self.per_rank {
            let Some(Queued::Coll(c)) = q.pop_front() else {
                return None;
            };
            set.push(c);
        }
        Some(set)
    }
}

/// Queues a collective call of `m`'s rank; issues every complete set unless inside a group.
pub fn submit(m: &Member, call: CollCall) -> Result<()> {
    m.world.lock().per_rank[m.index].push_back(Queued::Coll(call));
    crate::group::touched(&m.world);
    if crate::group::depth() == 0 {
        flush(&m.world)
    } else {
        Ok(())
    }
}

/// Queues a send or receive of `m`'s rank; issues the queued ones unless inside a group.
pub fn submit_p2p(m: &Member, call: P2pCall) -> Result<()> {
    m.world.lock().p2p.push(call);
    crate::group::touched(&m.world);
    if crate::group::depth() == 0 {
        flush(&m.world)
    } else {
        Ok(())
    }
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
    if !q.p2p.is_empty() && ready {
        let calls = std::mem::take(&mut q.p2p);
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
    let r = match c.kind {
        Kind::AllReduce => comm.all_reduce(&mut io, c.count, c.op, &streams),
        Kind::Broadcast => comm.broadcast(&mut io, c.count, c.root, &streams),
        Kind::Reduce => comm.reduce(&mut io, c.count, c.op, c.root, &streams),
        Kind::AllGather => comm.all_gather(&mut io, c.count, &streams),
        Kind::ReduceScatter => comm.reduce_scatter(&mut io, c.count, c.op, &streams),
        Kind::AllToAll => comm.all_to_all(&mut io, c.count, &streams),
        Kind::Gather => comm.gather(&mut io, c.count, c.root, &streams),
        Kind::Scatter => comm.scatter(&mut io, c.count, c.root, &streams),
    };
    r.map_err(Fail::from)
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

    fn call(kind: Kind, send: u64, recv: u64, count: usize) -> CollCall {
        CollCall {
            kind,
            count,
            dtype: DataType::F32,
            op: RedOp::Sum,
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

    #[test]
    fn transfers_balance_in_bytes() {
        let p2p = |send, rank, peer, count, dtype| P2pCall {
            send,
            rank,
            peer,
            count,
            dtype,
            buf: 0x1000,
            stream: 0,
        };
        let mut q = Queues::new(2);
        q.p2p.push(p2p(true, 0, 1, 4, DataType::F32));
        assert!(!q.p2p_balanced());
        q.p2p.push(p2p(false, 1, 0, 16, DataType::U8));
        assert!(q.p2p_balanced());
        q.p2p.push(p2p(false, 0, 1, 1, DataType::F64));
        assert!(!q.p2p_balanced());
    }

    #[test]
    fn sets_form_when_every_rank_has_a_call() {
        let mut q = Queues::new(2);
        q.per_rank[0].push_back(Queued::Coll(call(Kind::AllReduce, 1, 1, 4)));
        assert!(q.next_set().is_none());
        q.per_rank[1].push_back(Queued::Coll(call(Kind::AllReduce, 2, 2, 4)));
        assert_eq!(q.next_set().map(|s| s.len()), Some(2));
        assert!(q.is_empty());
    }
}
