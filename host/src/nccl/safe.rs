//! `cudarc::nccl::safe` over ringccl: [`Id`], [`Comm`], [`ReduceOp`], [`NcclType`], [`Group`].
//!
//! Here the types, the queue that the `Comm`s of one communicator share, the constructors and
//! `Comm::call`, which issues or queues a call; `calls.rs` the calls (`send`, `recv`, the
//! collectives), `grouped.rs` the groups.

use std::collections::VecDeque;
use std::ffi::c_char;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use half::{bf16, f16};

use super::gate::{Side, Slots};
use super::group;
use super::ops::{self, Bufs, Op, OpKind};
use super::result::{NcclError, NcclStatus};
use crate::{Arg, Communicator, DataType, DeviceElement, RawBuf, RedOp, UniqueId};

pub use super::result::{group_end, group_start};
pub use grouped::Group;

mod calls;
mod grouped;

/// The id every rank of a job is created with (`ncclUniqueId`): made once by [`Id::new`] (in
/// one process, which then serves the rendezvous), its bytes ([`Id::internal`]) sent to the
/// others by any means, and rebuilt there with [`Id::uninit`].
///
/// ```no_run
/// use ringccl::nccl::Id;
/// let id = Id::new().unwrap();
/// let bytes = *id.internal(); // to the other ranks
/// let again = Id::uninit(bytes);
/// assert_eq!(again.internal(), id.internal());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Id {
    internal: [c_char; 128],
}

impl Id {
    /// A new id, like `ncclGetUniqueId`: the rendezvous service starts in this process.
    pub fn new() -> Result<Self, NcclError> {
        let id = UniqueId::new()?;
        let mut internal = [0 as c_char; 128];
        for (d, s) in internal.iter_mut().zip(id.as_bytes()) {
            *d = *s as c_char;
        }
        Ok(Id { internal })
    }

    /// The id of these bytes (those of [`Id::internal`] from the process that made it). Bytes
    /// that are no id are an error of [`Comm::from_rank`].
    pub fn uninit(internal: [c_char; 128]) -> Self {
        Id { internal }
    }

    /// The id's bytes.
    pub fn internal(&self) -> &[c_char; 128] {
        &self.internal
    }

    fn unique_id(&self) -> Result<UniqueId, NcclError> {
        let bytes: Vec<u8> = self.internal.iter().map(|&c| c as u8).collect();
        Ok(UniqueId::from_bytes(&bytes)?)
    }
}

impl From<UniqueId> for Id {
    /// The [`Id`] of a ringccl [`UniqueId`].
    fn from(id: UniqueId) -> Self {
        let mut internal = [0 as c_char; 128];
        for (d, s) in internal.iter_mut().zip(id.as_bytes()) {
            *d = *s as c_char;
        }
        Id { internal }
    }
}

/// A reduction (`ncclRedOp_t`'s built-in ones).
///
/// ```
/// use ringccl::nccl::ReduceOp;
/// assert_eq!(ringccl::RedOp::from(&ReduceOp::Avg), ringccl::RedOp::Avg);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `ncclSum`
    Sum,
    /// `ncclProd`
    Prod,
    /// `ncclMax`
    Max,
    /// `ncclMin`
    Min,
    /// `ncclAvg`
    Avg,
}

impl From<&ReduceOp> for RedOp {
    fn from(op: &ReduceOp) -> Self {
        match op {
            ReduceOp::Sum => RedOp::Sum,
            ReduceOp::Prod => RedOp::Prod,
            ReduceOp::Max => RedOp::Max,
            ReduceOp::Min => RedOp::Min,
            ReduceOp::Avg => RedOp::Avg,
        }
    }
}

/// The element types the calls take (cudarc's `NcclType`): `f32`, `f64`, `f16`, `bf16`, `i8`,
/// `u8`, `i32`, `u32`, `i64`, `u64`. (cudarc also lists `char` as NCCL's 1-byte `uint8`; a
/// Rust `char` is 4 bytes, so ringccl leaves it out rather than move a quarter of the data.)
///
/// ```
/// use ringccl::nccl::NcclType;
/// assert_eq!(<half::bf16 as NcclType>::as_nccl_type(), ringccl::DataType::BF16);
/// ```
pub trait NcclType: DeviceElement {
    /// The element type's tag.
    fn as_nccl_type() -> DataType {
        Self::DTYPE
    }
}

impl NcclType for f32 {}
impl NcclType for f64 {}
impl NcclType for f16 {}
impl NcclType for bf16 {}
impl NcclType for i8 {}
impl NcclType for u8 {}
impl NcclType for i32 {}
impl NcclType for u32 {}
impl NcclType for i64 {}
impl NcclType for u64 {}

/// One rank's queued call.
struct Pending {
    /// Index of the rank among the communicator's own.
    index: usize,
    op: Op,
    slot: usize,
    generation: u32,
    /// The caller's stream at the call.
    data: CudaEvent,
}

#[derive(Default)]
struct State {
    /// A communicator of several ranks: per own rank, its queued calls in call order.
    queues: Vec<VecDeque<Pending>>,
    /// A communicator of one rank: its sends and receives queued until the group's end.
    p2p: Vec<Pending>,
    slots: Vec<Slots>,
    /// Once a queued call failed: every later call fails with this.
    broken: Option<NcclError>,
}

/// What the [`Comm`]s of one ringccl communicator share.
pub(super) struct Shared {
    /// Per own rank: the caller's stream.
    streams: Vec<Arc<CudaStream>>,
    sides: Vec<Mutex<Option<Arc<Side>>>>,
    state: Mutex<State>,
    /// Held while queued calls are taken and issued, so that they are issued in call order
    /// when several threads complete calls at once.
    issuing: Mutex<()>,
    /// Last: dropped after the side streams have finished.
    comm: Communicator,
}

/// The buffers of one call, as the caller gave them.
enum Buffers<'b, T> {
    InPlace(&'b mut (dyn DevicePtrMut<T> + 'b)),
    Out(
        &'b (dyn DevicePtr<T> + 'b),
        &'b mut (dyn DevicePtrMut<T> + 'b),
    ),
    SendOnly(&'b (dyn DevicePtr<T> + 'b)),
    RecvOnly(&'b mut (dyn DevicePtrMut<T> + 'b)),
}

/// Length and device of a buffer (the address comes with its tracking).
fn shape<T>(b: &(impl cudarc::driver::DeviceSlice<T> + ?Sized)) -> (usize, usize) {
    (b.len(), b.stream().context().ordinal())
}

fn raw(ptr: u64, (len, ordinal): (usize, usize)) -> RawBuf {
    RawBuf::new(ptr, len, ordinal)
}

impl<T> Buffers<'_, T> {
    /// The cudarc handles that own the buffers.
    fn contexts(&self) -> Vec<Arc<CudaContext>> {
        let ctx = |s: &Arc<CudaStream>| s.context().clone();
        match self {
            Buffers::InPlace(b) | Buffers::RecvOnly(b) => vec![ctx(b.stream())],
            Buffers::SendOnly(s) => vec![ctx(s.stream())],
            Buffers::Out(s, r) => vec![ctx(s.stream()), ctx(r.stream())],
        }
    }

    /// The buffers' addresses, ordered on `stream` by cudarc's tracking: `stream` waits for
    /// their earlier tracked uses; the guards record this use when dropped.
    fn take<'s>(&'s mut self, stream: &'s CudaStream) -> (Bufs, Vec<SyncOnDrop<'s>>) {
        match self {
            Buffers::InPlace(b) => {
                let sh = shape(&**b);
                let (p, g) = b.device_ptr_mut(stream);
                (Bufs::InPlace(raw(p, sh)), vec![g])
            }
            Buffers::Out(s, r) => {
                let (ss, rs) = (shape(&**s), shape(&**r));
                let (sp, sg) = s.device_ptr(stream);
                let (rp, rg) = r.device_ptr_mut(stream);
                (Bufs::OutOfPlace(raw(sp, ss), raw(rp, rs)), vec![sg, rg])
            }
            Buffers::SendOnly(s) => {
                let sh = shape(&**s);
                let (p, g) = s.device_ptr(stream);
                (Bufs::SendOnly(raw(p, sh)), vec![g])
            }
            Buffers::RecvOnly(r) => {
                let sh = shape(&**r);
                let (p, g) = r.device_ptr_mut(stream);
                (Bufs::RecvOnly(raw(p, sh)), vec![g])
            }
        }
    }
}

/// Keeps the cudarc handle `ctx` in its multi-stream mode while it is in use, with a stream
/// of its own that runs nothing: cudarc orders a slice's free after the slice's events only in
/// that mode, and a queued call relies on it (see [`super::gate`]).
fn keep_tracking(ctx: &Arc<CudaContext>) -> Result<(), NcclError> {
    static STREAMS: Mutex<Vec<(usize, Arc<CudaStream>)>> = Mutex::new(Vec::new());
    let key = Arc::as_ptr(ctx) as usize;
    let mut streams = lock(&STREAMS);
    if streams.iter().any(|(k, _)| *k == key) {
        return Ok(());
    }
    // Handles nothing else refers to any more have no slice left to order.
    streams.retain(|(_, s)| Arc::strong_count(s.context()) > 1);
    streams.push((key, ctx.new_stream()?));
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn new(comm: Communicator, streams: Vec<Arc<CudaStream>>) -> Arc<Shared> {
        let n = streams.len();
        Arc::new(Shared {
            comm,
            sides: (0..n).map(|_| Mutex::new(None)).collect(),
            streams,
            state: Mutex::new(State {
                queues: (0..n).map(|_| VecDeque::new()).collect(),
                slots: (0..n).map(|_| Slots::default()).collect(),
                ..State::default()
            }),
            issuing: Mutex::new(()),
        })
    }

    /// Whether every call can be issued by itself (one rank held here).
    fn single(&self) -> bool {
        self.streams.len() == 1
    }

    fn side(&self, index: usize) -> Result<Arc<Side>, NcclError> {
        let mut s = lock(&self.sides[index]);
        if let Some(side) = &*s {
            return Ok(side.clone());
        }
        let rank = self.comm.local_ranks()[index];
        let side = Arc::new(Side::new(self.comm.context(rank), rank)?);
        *s = Some(side.clone());
        Ok(side)
    }

    /// Issues queued calls together (all collective parts of one call, or sends and
    /// receives), opens their gates, and orders each caller's stream after them.
    fn run(&self, parts: Vec<Pending>, p2p: bool) -> Result<(), NcclError> {
        let n = self.streams.len();
        let mut result: Result<(), NcclError> = Ok(());
        let mut sides = Vec::with_capacity(n);
        for i in 0..n {
            match self.side(i) {
                Ok(s) => sides.push(Some(s)),
                Err(e) => {
                    sides.push(None);
                    result = result.and(Err(e));
                }
            }
        }
        if result.is_ok() {
            result = (|| {
                for p in &parts {
                    if let Some(s) = &sides[p.index] {
                        s.t.wait(&p.data)?;
                    }
                }
                let streams: Vec<Arc<CudaStream>> =
                    sides.iter().flatten().map(|s| s.t.clone()).collect();
                let calls: Vec<&Op> = parts.iter().map(|p| &p.op).collect();
                if p2p {
                    // One group per element type, in a fixed order (the same on every rank).
                    for dt in DataType::ALL {
                        let of: Vec<&Op> =
                            calls.iter().copied().filter(|o| o.dtype == dt).collect();
                        ops::issue_p2p(&self.comm, &of, &streams)?;
                    }
                } else {
                    ops::issue_collective(&self.comm, &calls, &streams)?;
                }
                Ok(())
            })();
        }
        // The gates open whatever happened: after the work when it was enqueued.
        let mut state = lock(&self.state);
        let mut touched = vec![false; n];
        for p in &parts {
            touched[p.index] = true;
            if let Some(s) = &sides[p.index] {
                if let Err(e) = s.open(p.slot, p.generation) {
                    result = result.and(Err(e.into()));
                }
            }
            state.slots[p.index].give_back(p.slot);
        }
        drop(state);
        for (i, s) in sides.iter().enumerate() {
            if let (true, Some(s)) = (touched[i], s) {
                let done =
                    s.t.record_event(None)
                        .and_then(|e| self.streams[i].wait(&e));
                if let Err(e) = done {
                    result = result.and(Err(e.into()));
                }
            }
        }
        // Other ranks' parts returned `Ok` when they were queued: the communicator fails
        // for good. (One rank's group returns its error from `group_end`, which is all.)
        if let (Err(e), false) = (&result, self.single()) {
            lock(&self.state).broken.get_or_insert_with(|| e.clone());
        }
        result
    }

    /// Issues what is complete, in each rank's call order (a communicator of several
    /// ranks): a collective once it heads every rank's queue; the sends and receives that head
    /// the ranks' queues, once they pair up (see [`ready_p2p`]).
    fn issue_ready(&self) -> Result<(), NcclError> {
        let _issuing = lock(&self.issuing);
        loop {
            let batch = {
                let mut st = lock(&self.state);
                let all_collective = st
                    .queues
                    .iter()
                    .all(|q| q.front().is_some_and(|p| !p.op.kind.is_p2p()));
                if all_collective {
                    let heads: Vec<Pending> = st
                        .queues
                        .iter_mut()
                        .filter_map(VecDeque::pop_front)
                        .collect();
                    let calls: Vec<&Op> = heads.iter().map(|p| &p.op).collect();
                    if let Err(e) = ops::same_collective(&calls) {
                        drop(st);
                        self.open_all(heads);
                        return Err(self.fail(e));
                    }
                    Some((heads, false))
                } else {
                    let heads: Vec<Vec<Op>> = st
                        .queues
                        .iter()
                        .map(|q| {
                            q.iter()
                                .map(|p| p.op)
                                .take_while(|o| o.kind.is_p2p())
                                .collect()
                        })
                        .collect();
                    match ready_p2p(&heads) {
                        Err(e) => {
                            drop(st);
                            return Err(self.fail(e));
                        }
                        Ok(k) if k.iter().all(|&k| k == 0) => None,
                        Ok(k) => {
                            let mut parts = Vec::new();
                            for (q, k) in st.queues.iter_mut().zip(k) {
                                parts.extend(q.drain(..k));
                            }
                            Some((parts, true))
                        }
                    }
                }
            };
            match batch {
                Some((parts, p2p)) => self.run(parts, p2p)?,
                None => return Ok(()),
            }
        }
    }

    /// Issues this rank's queued sends and receives as one group (a communicator of one
    /// rank of a job of processes, at the end of a group).
    pub(super) fn flush_group(&self) -> Result<(), NcclError> {
        let parts = std::mem::take(&mut lock(&self.state).p2p);
        if parts.is_empty() {
            return Ok(());
        }
        self.run(parts, true)
    }

    /// Opens the gates of calls that will not run.
    fn open_all(&self, parts: Vec<Pending>) {
        let mut st = lock(&self.state);
        for p in parts {
            if let Ok(side) = self.side(p.index) {
                if let Err(e) = side.open(p.slot, p.generation) {
                    log::error!(target: "ringccl", "ringccl::nccl: {e}");
                }
            }
            st.slots[p.index].give_back(p.slot);
        }
    }

    /// Marks the communicator failed (every later call fails), drops every queued call
    /// (opening its gate), and returns `e`.
    fn fail(&self, e: NcclError) -> NcclError {
        let queued: Vec<Pending> = {
            let mut st = lock(&self.state);
            st.broken.get_or_insert_with(|| e.clone());
            let mut q: Vec<Pending> = std::mem::take(&mut st.p2p);
            for c in &mut st.queues {
                q.extend(c.drain(..));
            }
            q
        };
        self.open_all(queued);
        e
    }

    fn check(&self) -> Result<(), NcclError> {
        match &lock(&self.state).broken {
            None => Ok(()),
            Some(e) => Err(NcclError::usage(format!(
                "an earlier call of this communicator failed, after other ranks' parts of it \
                 had returned; no call runs on it any more. The failure: {e}"
            ))),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let queued: Vec<Pending> = {
            let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
            let mut q: Vec<Pending> = std::mem::take(&mut st.p2p);
            for c in &mut st.queues {
                q.extend(c.drain(..));
            }
            q
        };
        if !queued.is_empty() {
            let calls: Vec<String> = queued
                .iter()
                .map(|p| format!("rank {} {:?}", p.op.rank, p.op.kind))
                .collect();
            log::error!(
                target: "ringccl",
                "ringccl::nccl: a communicator was dropped with {} queued call(s) that never \
                 ran (their other ranks never made them): {}",
                calls.len(),
                calls.join(", ")
            );
            self.open_all(queued);
        }
    }
}

/// How many of the sends and receives heading each rank's queue (`heads[r]`, in call order)
/// can be issued now, together: the longest prefixes whose every call pairs with one in the
/// other ranks' prefixes (the `k`-th send from `a` to `b` with the `k`-th receive on `b` from
/// `a`). Issuing only prefixes keeps each rank's calls in call order.
fn ready_p2p(heads: &[Vec<Op>]) -> Result<Vec<usize>, NcclError> {
    let mut k: Vec<usize> = heads.iter().map(Vec::len).collect();
    loop {
        let ids: Vec<(usize, usize)> = k
            .iter()
            .enumerate()
            .flat_map(|(r, &n)| (0..n).map(move |i| (r, i)))
            .collect();
        let flat: Vec<Op> = ids.iter().map(|&(r, i)| heads[r][i]).collect();
        let mut matched = vec![false; flat.len()];
        for (a, b) in ops::match_p2p(&flat)? {
            matched[a] = true;
            matched[b] = true;
        }
        let mut next = vec![0; k.len()];
        let mut at = 0;
        for (r, &n) in k.iter().enumerate() {
            next[r] = matched[at..at + n].iter().take_while(|&&m| m).count();
            at += n;
        }
        if next == k {
            return Ok(k);
        }
        k = next;
    }
}

/// One rank of a communicator, as `cudarc::nccl::safe::Comm`: its calls run on its stream.
///
/// * [`Comm::from_rank`]: one rank of a job of processes (or threads), like
///   `ncclCommInitRank`; its calls are issued at once (its sends and receives inside a group
///   at [`group_end`], as one group).
/// * [`Comm::from_devices`]: one `Comm` per GPU of this process over one ringccl
///   communicator, like `ncclCommInitAll`. ringccl issues a call of such a communicator for
///   every rank at once, so each rank's call is queued until every rank has made it (a send
///   until its receive is made), then issued; calls must come in the same order on every
///   rank, as with NCCL, and a rank whose collective differs from the others' fails the call
///   and the communicator for good (`ncclInvalidUsage`).
///
/// A queued call's buffers stay valid and ordered: every later cudarc-tracked use of them (a
/// copy, a kernel, the free of a dropped `CudaSlice`) waits until the call has run; the
/// caller's stream is ordered after the call once it is issued (module docs of
/// [`crate::nccl`]).
///
/// ```no_run
/// use std::sync::Arc;
/// use ringccl::cudarc::driver::CudaContext;
/// use ringccl::nccl::{Comm, ReduceOp};
///
/// let streams: Vec<_> = (0..CudaContext::device_count()? as usize)
///     .map(|i| CudaContext::new(i).map(|c| c.default_stream()))
///     .collect::<Result<_, _>>()?;
/// let comms = Comm::from_devices(streams.clone()).unwrap();
/// let mut bufs: Vec<_> = streams
///     .iter()
///     .map(|s| s.clone_htod(&[1.0f32; 8]))
///     .collect::<Result<_, _>>()?;
/// for (comm, buf) in comms.iter().zip(bufs.iter_mut()) {
///     comm.all_reduce_in_place(buf, &ReduceOp::Sum).unwrap(); // issued with the last rank's
/// }
/// let out = streams[0].clone_dtoh(&bufs[0])?;
/// assert!(out.iter().all(|&x| x == comms.len() as f32));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Comm {
    shared: Arc<Shared>,
    index: usize,
    rank: usize,
    world_size: usize,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("ordinal", &self.ordinal())
            .finish()
    }
}

fn to_rank(v: i32, world: usize, arg: Arg, what: &str) -> Result<usize, NcclError> {
    usize::try_from(v)
        .ok()
        .filter(|&r| r < world)
        .ok_or_else(|| {
            NcclError::invalid(None, arg, format!("{what} {v} is not a rank of {world}"))
        })
}

impl Comm {
    /// One `Comm` per stream, over one communicator of this process (rank `i` on
    /// `streams[i]`'s device), like `ncclCommInitAll`; configured from the environment
    /// (`RINGCCL_*`). See [`Comm`] for how its calls are issued.
    pub fn from_devices(streams: Vec<Arc<CudaStream>>) -> Result<Vec<Self>, NcclError> {
        let ordinals: Vec<usize> = streams.iter().map(|s| s.context().ordinal()).collect();
        let comm = Communicator::new(&ordinals)?;
        let n = streams.len();
        let shared = Shared::new(comm, streams);
        Ok((0..n)
            .map(|rank| Comm {
                shared: shared.clone(),
                index: rank,
                rank,
                world_size: n,
            })
            .collect())
    }

    /// Rank `rank` of `world_size`, on `stream`'s device, like `ncclCommInitRank`: every rank
    /// calls it with the same [`Id`]; it returns once every rank has joined.
    ///
    /// ```no_run
    /// use ringccl::cudarc::driver::CudaContext;
    /// use ringccl::nccl::{Comm, Id, ReduceOp};
    /// let id = Id::new().unwrap(); // a job of one rank
    /// let stream = CudaContext::new(0)?.default_stream();
    /// let comm = Comm::from_rank(stream.clone(), 0, 1, id).unwrap();
    /// let mut buf = stream.clone_htod(&[2.0f32; 4])?;
    /// comm.all_reduce_in_place(&mut buf, &ReduceOp::Max).unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_rank(
        stream: Arc<CudaStream>,
        rank: usize,
        world_size: usize,
        id: Id,
    ) -> Result<Self, NcclError> {
        let uid = id.unique_id()?;
        let comm = Communicator::init_rank(world_size, &uid, rank, stream.context().ordinal())?;
        Ok(Comm {
            shared: Shared::new(comm, vec![stream]),
            index: 0,
            rank,
            world_size,
        })
    }

    /// The stream this rank's calls run on.
    pub fn stream(&self) -> Arc<CudaStream> {
        self.shared.streams[self.index].clone()
    }

    /// The stream's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.shared.streams[self.index].context()
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.context().ordinal()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The ringccl communicator underneath (shared by the `Comm`s of [`Comm::from_devices`]).
    pub fn communicator(&self) -> &Communicator {
        &self.shared.comm
    }

    fn call<T: NcclType>(
        &self,
        kind: OpKind,
        mut bufs: Buffers<'_, T>,
    ) -> Result<NcclStatus, NcclError> {
        let sh = &self.shared;
        sh.check()?;
        let in_group = group::depth() > 0;
        if sh.single() && in_group && !kind.is_p2p() && !lock(&sh.state).p2p.is_empty() {
            // A collective of a group after some of its sends and receives: those are issued
            // first (in call order), so that no gate is closed while the collective is issued
            // (growing the scratch of a communicator of processes synchronises the device).
            sh.flush_group()?;
        }
        if sh.single() && !(in_group && kind.is_p2p()) {
            // Issued now, on the caller's stream; the guards record the buffers' use after.
            let stream = sh.streams[self.index].clone();
            let (b, guards) = bufs.take(&stream);
            let op = Op {
                rank: self.rank,
                kind,
                dtype: T::DTYPE,
                bufs: b,
            };
            let r = if kind.is_p2p() {
                ops::issue_p2p(&sh.comm, &[&op], std::slice::from_ref(&stream))
            } else {
                ops::issue_collective(&sh.comm, &[&op], std::slice::from_ref(&stream))
            };
            drop(guards);
            r?;
            return Ok(NcclStatus::Success);
        }
        // Queued behind a gate (see `gate`).
        for ctx in bufs.contexts() {
            keep_tracking(&ctx)?;
        }
        let side = sh.side(self.index)?;
        let (slot, generation) = lock(&sh.state).slots[self.index].take().ok_or_else(|| {
            NcclError::usage(format!(
                "rank {} has {} calls queued, the most there can be: its other ranks have not \
                 made them (every rank must make the same calls)",
                self.rank,
                super::gate::GATE_WORDS
            ))
        })?;
        let queued = (|| -> Result<(Bufs, CudaEvent), NcclError> {
            let data = sh.streams[self.index].record_event(None)?;
            // The side stream waits for the buffers' earlier tracked uses ...
            let (_, guards) = bufs.take(&side.t);
            if guards.iter().any(|g| matches!(g, SyncOnDrop::Record(None))) {
                return Err(NcclError::usage(
                    "a call that is queued (a send or receive in a group, any call of \
                     Comm::from_devices before every rank made it) needs cudarc's event \
                     tracking of its buffers, to hold them until it has run; these were \
                     allocated with event tracking disabled"
                        .into(),
                ));
            }
            drop(guards);
            side.wait(slot, generation)?;
            // ... and their later ones wait for the gate.
            let (b, guards) = bufs.take(&side.g);
            drop(guards);
            Ok((b, data))
        })();
        let (b, data) = match queued {
            Ok(x) => x,
            Err(e) => {
                // Nothing waits at the gate unless `wait` was enqueued; opening it is harmless.
                let _ = side.open(slot, generation);
                lock(&sh.state).slots[self.index].give_back(slot);
                return Err(e);
            }
        };
        let op = Op {
            rank: self.rank,
            kind,
            dtype: T::DTYPE,
            bufs: b,
        };
        let pending = Pending {
            index: self.index,
            op,
            slot,
            generation,
            data,
        };
        {
            let mut st = lock(&sh.state);
            if sh.single() {
                st.p2p.push(pending);
            } else {
                st.queues[self.index].push_back(pending);
            }
        }
        if sh.single() {
            group::touch(sh);
        } else {
            sh.issue_ready()?;
        }
        Ok(NcclStatus::Success)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p2p(rank: usize, send: bool, peer: usize, count: usize) -> Op {
        let kind = if send {
            OpKind::Send { peer, count }
        } else {
            OpKind::Recv { peer, count }
        };
        let b = RawBuf::new(0x1000, count, rank);
        Op {
            rank,
            kind,
            dtype: DataType::F32,
            bufs: Bufs::SendOnly(b),
        }
    }

    #[test]
    fn a_ring_in_one_thread_is_ready_once_every_rank_made_its_part() {
        // Rank 0 and 1 of 3 have made their sends and receives; rank 2 not yet.
        let mut heads = vec![
            vec![p2p(0, true, 1, 4), p2p(0, false, 2, 4)],
            vec![p2p(1, true, 2, 4), p2p(1, false, 0, 4)],
            vec![],
        ];
        // Rank 0's send pairs with rank 1's receive, but it is behind rank 1's send to 2.
        assert_eq!(ready_p2p(&heads).unwrap(), vec![0, 0, 0]);
        heads[2] = vec![p2p(2, true, 0, 4), p2p(2, false, 1, 4)];
        assert_eq!(ready_p2p(&heads).unwrap(), vec![2, 2, 2]);
    }

    #[test]
    fn only_paired_prefixes_are_ready() {
        let heads = vec![
            vec![p2p(0, true, 1, 8), p2p(0, true, 1, 8)],
            vec![p2p(1, false, 0, 8)],
        ];
        // The second send waits for its receive; the first goes.
        assert_eq!(ready_p2p(&heads).unwrap(), vec![1, 1]);
        let bad = vec![vec![p2p(0, true, 1, 8)], vec![p2p(1, false, 0, 9)]];
        assert!(ready_p2p(&bad).is_err());
        assert_eq!(ready_p2p(&[vec![], vec![]]).unwrap(), vec![0, 0]);
    }

    #[test]
    fn reduce_ops_map_one_to_one() {
        let all = [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Avg,
        ];
        let mapped: Vec<RedOp> = all.iter().map(RedOp::from).collect();
        assert_eq!(
            mapped,
            vec![RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg]
        );
    }

    #[test]
    fn element_types_map_to_their_tags() {
        assert_eq!(f32::as_nccl_type(), DataType::F32);
        assert_eq!(f64::as_nccl_type(), DataType::F64);
        assert_eq!(f16::as_nccl_type(), DataType::F16);
        assert_eq!(bf16::as_nccl_type(), DataType::BF16);
        assert_eq!(i8::as_nccl_type(), DataType::I8);
        assert_eq!(u8::as_nccl_type(), DataType::U8);
        assert_eq!(i32::as_nccl_type(), DataType::I32);
        assert_eq!(u32::as_nccl_type(), DataType::U32);
        assert_eq!(i64::as_nccl_type(), DataType::I64);
        assert_eq!(u64::as_nccl_type(), DataType::U64);
    }

    #[test]
    fn an_id_survives_its_bytes_and_bad_bytes_are_rejected() {
        let uid = UniqueId::with_address("127.0.0.1:29500".parse().unwrap(), 42);
        let id = Id::from(uid);
        let again = Id::uninit(*id.internal());
        assert_eq!(again.unique_id().unwrap().key(), 42);
        assert_eq!(again.unique_id().unwrap().address(), uid.address());
        let e = Id::uninit([0; 128]).unique_id().unwrap_err();
        assert_eq!(e.0, super::super::result::ncclResult_t::ncclRemoteError);
    }

    #[test]
    fn roots_and_peers_must_be_ranks() {
        assert_eq!(to_rank(1, 2, Arg::Root, "root").unwrap(), 1);
        for bad in [-1, 2, i32::MIN] {
            let e = to_rank(bad, 2, Arg::Peer, "peer").unwrap_err();
            assert_eq!(e.0, super::super::result::ncclResult_t::ncclInvalidArgument);
            assert!(e.to_string().contains(&format!("peer {bad}")), "{e}");
        }
    }
}

#[cfg(test)]
mod traits {
    use super::*;

    fn send_sync<T: Send + Sync>() {}

    /// A `Comm` may move to another thread (cudarc's, a raw NCCL handle, may not: code written
    /// for it compiles here too), and an `Id` is plain bytes.
    #[test]
    fn comms_and_ids_cross_threads() {
        send_sync::<Comm>();
        send_sync::<Id>();
        send_sync::<NcclError>();
    }
}
