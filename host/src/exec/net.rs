//! The executor of a rank's part of a group of point-to-point transfers whose peers are reached
//! over the network: the copies, signals and waits of a [`P2pPlan`] on the rank's stream,
//! against the rank's [`NetMem`] in pinned, device-mapped host memory, with its
//! [`Proxy`] carrying the signals and chunks (see [`crate::transport::net`]).
//!
//! A copy into a peer's scratch lands in this rank's outbox (the same slot, by destination); a
//! signal to a peer is `cuStreamWriteValue64` on this rank's posted word for it, a wait for a
//! peer the bounded wait kernel on this rank's flag word for it ([`Bound`]); copies out of this
//! rank's scratch read the inbox. Before the stream can post anything, the proxy is handed the group's
//! [`program`]. Every peer but this rank itself is a network peer here.

use cudarc::driver::{sys, CudaStream};
use gpu_kernels::op::RedOp;

use super::internal;
use crate::resources::order::CallOrder;
use crate::driver::ipc::MemOps;
use crate::driver::launch::{Prim, WaitArgs};
use crate::driver::Kernels;
use crate::dtype::DataType;
use crate::resources::Health;
use crate::plan::net::{At, NetGroup};
use crate::plan::p2p::{self, Action, Chunks, P2pOp, P2pPlan, Place};
use crate::transport::net::proxy::{Chunk, Outgoing};
use crate::transport::net::{outbox_offset, NetMem, NetRank};
use crate::{Error, Result};

/// Plans the `peer_ops` group `group_ops` ([`p2p::plan_net`], chunks per pair) and enqueues it
/// on `stream`; `bufs[i]` is the device address of the buffer of operation `i` (validated by
/// the caller to hold the operation's bytes). The group starts after
/// `end` (this rank's previous call) and records its own end there, so that the rank's groups
/// post their signals in order whatever streams they run on.
///
/// # Safety
/// Every `bufs[i]` is a device address this rank's GPU may read (a send) or write (a
/// receive) for `group_ops[i].bytes` bytes, alive until the group's work on `stream` has
/// ended; no other work touches a receive buffer meanwhile. `order` is this rank's order of
/// calls and `net` its network rank (the same communicator's).
pub unsafe fn execute(
    net: &mut NetRank,
    ops: &MemOps,
    bound: Bound<'_>,
    group_ops: &[P2pOp],
    bufs: &[u64],
    stream: &CudaStream,
    order: &mut CallOrder,
) -> Result<()> {
    begin(net, stream, order)?;
    group(net, ops, bound, (group_ops, Chunks::ByPair), bufs, stream, None)?;
    order.record(stream, net.rank)
}

/// What makes a wait for a peer's signal bounded: the rank's kernels (the bounded wait kernel,
/// `gpu_kernels::oneshot::WAIT_ENTRY`) and the communicator's control block and timeout. A wait
/// ends when the flag word reaches its value, when the communicator is aborted, or at the
/// timeout (then with a status the host reports as `Error::Timeout`); the proxy also raises
/// the flag words when it fails, which ends the waits at once.
#[derive(Clone, Copy)]
pub struct Bound<'a> {
    /// The rank's kernels.
    pub kernels: &'a Kernels,
    /// The communicator's control block and timeout.
    pub health: &'a Health,
}

/// How a receive combines with what the buffer holds: `dst = a ⊕ dst` with the kernels, instead
/// of a copy.
#[derive(Clone, Copy)]
pub(crate) struct Combine<'a> {
    /// The rank's kernels.
    pub kernels: &'a Kernels,
    /// Most blocks of the reduce kernel.
    pub cap: u32,
    /// The element type.
    pub dtype: DataType,
    /// The operator.
    pub op: RedOp,
    /// The divisor of this combination (avg's last).
    pub postdiv: u32,
}

impl Combine<'_> {
    /// Enqueues `dst = src ⊕ dst` over `bytes` on `stream`.
    ///
    /// # Safety
    /// `src` and `dst` are `bytes` of device-accessible memory, alive until the kernel has
    /// run, that nothing else writes meanwhile.
    pub(crate) unsafe fn launch(&self, stream: &CudaStream, src: u64, dst: u64, bytes: usize) -> Result<()> {
        let size = self.dtype.size();
        if !bytes.is_multiple_of(size) {
            return Err(internal(format!("a chunk of {bytes} bytes of {size}-byte elements")));
        }
        let prim = Prim::ReduceCopy {
            a: src,
            b: dst,
            dst0: dst,
            dst1: None,
            postdiv: self.postdiv,
        };
        // SAFETY: the caller's contract; the destination equals the second source exactly.
        unsafe { self.kernels.launch_prim(stream, self.dtype, self.op, prim, bytes / size, self.cap) }
    }
}

/// A group of a collective ([`NetGroup`]) as a `peer_ops` group: its operations, and their
/// buffers' addresses in the caller's `send` and `recv`.
pub(crate) fn group_args(g: &NetGroup, send: u64, recv: u64) -> (Vec<P2pOp>, Vec<u64>) {
    let ops = g
        .ops
        .iter()
        .map(|o| P2pOp { dir: o.dir, peer: o.peer, bytes: o.bytes })
        .collect();
    let bufs = g
        .ops
        .iter()
        .map(|o| match o.at {
            At::Send(off) => send + off as u64,
            At::Recv(off) => recv + off as u64,
        })
        .collect();
    (ops, bufs)
}

pub(crate) fn begin(net: &NetRank, stream: &CudaStream, order: &CallOrder) -> Result<()> {
    if net.broken {
        return Err(internal(
            "an earlier call failed half-issued; the ranks are out of step: destroy the \
             communicator"
                .into(),
        ));
    }
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| Error::cuda("cuCtxSetCurrent", Some(net.rank), e))?;
    order.wait(stream, net.rank)
}

/// One group: plans it with the pairs' carried slots ([`p2p::plan_net`], chunks cut as
/// `chunks` says), hands the proxy its program, enqueues it, counts its signals and keeps the
/// carry.
pub(crate) fn group(
    net: &mut NetRank,
    ops: &MemOps,
    bound: Bound<'_>,
    (group_ops, chunks): (&[P2pOp], Chunks),
    bufs: &[u64],
    stream: &CudaStream,
    combine: Option<Combine<'_>>,
) -> Result<()> {
    let n = net.sent.len();
    if net.rank >= n {
        return Err(internal(format!("rank {} of {n}", net.rank)));
    }
    let mem = net.proxy.mem().clone();
    let slot = p2p::slot_bytes(mem.scratch_bytes(), n, p2p::NET_SLOTS)
        .ok_or_else(|| internal(format!("a network scratch too small for {n} ranks")))?;
    let layout = (slot, p2p::NET_SLOTS, chunks);
    let (plan, carry) = p2p::plan_net(net.rank, n, group_ops, layout, &net.carry, &net.received)?;
    if plan.actions.is_empty() {
        return Ok(());
    }
    if plan.slot.saturating_mul(plan.slots).saturating_mul(n) > mem.scratch_bytes() {
        return Err(internal(format!(
            "slots of {} bytes for {n} ranks exceed the scratch of {} bytes",
            plan.slot,
            mem.scratch_bytes()
        )));
    }
    let me = net.rank;
    net.proxy.post(program(&plan, me, &net.sent, |q| q != me)?)?;
    let issued = issue(net, &mem, ops, bound, &plan, bufs, stream, combine);
    if issued.is_err() {
        // Signals already enqueued cannot be taken back: the peers' counters and ours no
        // longer agree.
        net.broken = true;
        return issued;
    }
    for q in 0..n {
        net.sent[q] += plan.sent[q];
        net.received[q] += plan.received[q];
    }
    net.carry = carry;
    Ok(())
}

/// Rank `net.rank`'s part of a collective over the network: its `groups`
/// ([`crate::plan::net::groups`]) one after the other, each planned like a `peer_ops` group,
/// with the receives of a reducing group combined into their buffer by a reduce kernel (avg
/// divides where the group says). `send` and `recv` are the caller's buffers (consistent
/// with the in-place layout when in place; 0 where the rank has none), validated by the
/// caller to hold what the groups address.
///
/// `unit_bytes` is the call's count in bytes (the same on every rank): the groups' chunk size
/// is derived from it ([`p2p::net_chunk`]), so every rank plans the same chunks.
///
/// Ordered after `end` and recorded there, like [`execute`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn collective(
    net: &mut NetRank,
    ops: &MemOps,
    bound: Bound<'_>,
    cap: u32,
    (dtype, op): (DataType, RedOp),
    (send, recv): (u64, u64),
    (groups, unit_bytes): (&[NetGroup], usize),
    stream: &CudaStream,
    order: &mut CallOrder,
) -> Result<()> {
    let r = net.rank;
    begin(net, stream, order)?;
    let chunks = chunks_of(net, unit_bytes)?;
    for g in groups {
        let (group_ops, bufs) = group_args(g, send, recv);
        let combine = g.reduce.then_some(Combine {
            kernels: bound.kernels,
            cap,
            dtype,
            op,
            postdiv: g.postdiv,
        });
        group(net, ops, bound, (&group_ops, chunks), &bufs, stream, combine)?;
    }
    order.record(stream, r)
}

/// The chunks of a collective's groups over the network: [`p2p::net_chunk`] of the slot and
/// the call's `unit_bytes` (the same on every rank, so every rank cuts the same chunks).
pub(crate) fn chunks_of(net: &NetRank, unit_bytes: usize) -> Result<Chunks> {
    let n = net.sent.len();
    let slot = p2p::slot_bytes(net.proxy.mem().scratch_bytes(), n, p2p::NET_SLOTS)
        .ok_or_else(|| internal(format!("a network scratch too small for {n} ranks")))?;
    Ok(Chunks::Fixed(p2p::net_chunk(slot, unit_bytes)))
}

#[allow(clippy::too_many_arguments)]
fn issue(
    net: &NetRank,
    mem: &NetMem,
    ops: &MemOps,
    bound: Bound<'_>,
    plan: &P2pPlan,
    bufs: &[u64],
    stream: &CudaStream,
    combine: Option<Combine<'_>>,
) -> Result<()> {
    let (r, n) = (net.rank, net.sent.len());
    let base = mem
        .device_base()
        .ok_or_else(|| internal("network memory not mapped into the device".into()))?;
    let [flags, posted, credits, scratch, outbox] = mem.offsets().map(|o| base + o as u64);
    let bytes_in = |at: usize, len: usize, limit: usize| at.checked_add(len).is_some_and(|e| e <= limit);
    let addr = |p: Place, len: usize| -> Result<u64> {
        match p {
            Place::Op { op, offset } => bufs.get(op).map(|b| b + offset as u64),
            Place::Scratch { rank, offset } if rank == r => {
                bytes_in(offset, len, mem.scratch_bytes()).then(|| scratch + offset as u64)
            }
            Place::Scratch { rank, offset } => outbox_offset(r, rank, plan.slot, plan.slots, offset)
                .filter(|&o| bytes_in(o, len, mem.scratch_bytes()))
                .map(|o| outbox + o as u64),
        }
        .ok_or_else(|| internal(format!("no address for {p:?}")))
    };
    for a in &plan.actions {
        match *a {
            Action::Signal { peer, k } if peer < n => {
                // SAFETY: this rank's posted word for `peer`, in the mapped memory, which the
                // proxy (holding it) keeps alive.
                unsafe { ops.write(stream, posted + 8 * peer as u64, net.sent[peer] + k, r) }?
            }
            Action::Wait { peer, k, credit } if peer < n => {
                // A credit is waited for on the credit word, which the proxy raises as soon as
                // the credit arrives, not after the peer's earlier chunks (`NetMem::credit`).
                let words = if credit { credits } else { flags };
                let args = WaitArgs {
                    flag: words + 8 * peer as u64,
                    value: net.received[peer] + k,
                    ctl: bound.health.ctl(),
                    timeout_ns: bound.health.timeout_ns(),
                    slot: 0,
                    peer: u32::try_from(peer).unwrap_or(u32::MAX),
                };
                // SAFETY: the flag word for `peer` in the mapped memory, which the proxy
                // (holding it) keeps alive, and the communicator's control block, alive until
                // its drop waits for this call's end.
                unsafe { bound.kernels.launch_wait(stream, &args) }?
            }
            Action::WaitCarried { peer, at } if peer < n => {
                let args = WaitArgs {
                    flag: credits + 8 * peer as u64,
                    value: at,
                    ctl: bound.health.ctl(),
                    timeout_ns: bound.health.timeout_ns(),
                    slot: 0,
                    peer: u32::try_from(peer).unwrap_or(u32::MAX),
                };
                // SAFETY: as for `Wait`: the credit word for `peer` in the mapped memory and
                // the communicator's control block, both alive until this call has run.
                unsafe { bound.kernels.launch_wait(stream, &args) }?
            }
            Action::Copy {
                from: from @ Place::Scratch { .. },
                to: to @ Place::Op { .. },
                bytes,
            } if combine.is_some() => {
                let (src, dst) = (addr(from, bytes)?, addr(to, bytes)?);
                if let Some(c) = combine {
                    // SAFETY: `src` is inside this rank's mapped inbox and `dst` inside the
                    // caller's validated buffer (checked above); the plan's signals keep the
                    // inbox slot from being rewritten before the kernel has read it.
                    unsafe { c.launch(stream, src, dst, bytes)? };
                }
            }
            Action::Copy { from, to, bytes } => {
                let (src, dst) = (addr(from, bytes)?, addr(to, bytes)?);
                // SAFETY: both ranges are inside the caller's validated buffers or this rank's
                // mapped scratch/outbox (checked above); the plan's signals keep a slot from
                // being written while it is still read. `cuMemcpyAsync` infers the direction
                // (device or pinned host) from the unified addresses.
                unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream.cu_stream()) }
                    .result()
                    .map_err(|e| Error::cuda("cuMemcpyAsync", Some(r), e))?;
            }
            _ => return Err(internal(format!("a plan action {a:?} for {n} ranks"))),
        }
    }
    Ok(())
}

/// The signals rank `me`'s stream posts to network peers while running `plan`, in order, for
/// the proxy: each `Signal` of the plan becomes an [`Outgoing`] with counter `base[peer] + k`,
/// carrying the chunk the plan copied into that peer's scratch since its previous signal to
/// it. `net(q)` says which peers are network peers (the others are left out).
///
/// ```
/// use ringccl::internals::plan::p2p::{plan, Dir, P2pOp};
/// use ringccl::internals::exec::net::program;
/// // Rank 0 sends 300 bytes to rank 1 in slots of 256, four per region: two chunks.
/// let p = plan(0, 2, &[P2pOp { dir: Dir::Send, peer: 1, bytes: 300 }], 256, 4)?;
/// let out = program(&p, 0, &[0, 10], |q| q == 1)?;
/// assert_eq!(out.len(), 2);
/// assert_eq!(out[1].k, 12);
/// // Chunk 1 sits in slot 1 of rank 0's region in rank 1's scratch, and of rank 1's in the outbox.
/// assert_eq!(out[1].data.map(|c| (c.from, c.to, c.bytes)), Some((5 * 256, 256, 44)));
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn program(
    plan: &P2pPlan,
    me: usize,
    base: &[u64],
    net: impl Fn(usize) -> bool,
) -> Result<Vec<Outgoing>> {
    let bad = |reason: String| Error::Internal { reason };
    let n = base.len();
    // Per peer: the scratch range [lo, hi) copied since the last signal.
    let mut pending: Vec<Option<(usize, usize)>> = vec![None; n];
    let mut out = Vec::new();
    for a in &plan.actions {
        match *a {
            Action::Copy {
                to: Place::Scratch { rank, offset },
                bytes,
                ..
            } if rank != me && rank < n && net(rank) => {
                let end = offset
                    .checked_add(bytes)
                    .ok_or_else(|| bad("a chunk's range overflows".into()))?;
                let (lo, hi) = pending[rank].unwrap_or((offset, end));
                pending[rank] = Some((lo.min(offset), hi.max(end)));
            }
            Action::Signal { peer, k } if peer < n && net(peer) => {
                let data = match pending[peer].take() {
                    None => None,
                    Some((lo, hi)) => Some(Chunk {
                        from: outbox_offset(me, peer, plan.slot, plan.slots, lo).ok_or_else(|| {
                            bad(format!("a chunk at {lo} of rank {peer}'s scratch is outside rank {me}'s slots"))
                        })?,
                        to: lo,
                        bytes: hi - lo,
                    }),
                };
                out.push(Outgoing {
                    peer,
                    k: base[peer] + k,
                    data,
                });
            }
            _ => {}
        }
    }
    Ok(out)
}
