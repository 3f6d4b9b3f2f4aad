//! The executor of a rank whose peers are partly on its machine and partly on others: each
//! group of a collective ([`NetGroup`], from [`crate::plan::net`]) or of `peer_ops` is split
//! ([`crate::plan::net::split`]) into its transfers with ranks of this machine, run over CUDA
//! IPC by [`super::p2p`], then its transfers with ranks on other machines, run over the network
//! by [`super::net`], both on the rank's stream. The hierarchical all-reduce
//! ([`crate::plan::net::hierarchical_all_reduce`]) has no group with both kinds of peer.
//!
//! Every rank splits every group the same way, so each pair meets in the same part of the same
//! group and no part waits for a later one: the two transports keep their own signal counters
//! (the IPC flag words, the network's posted and flag words), as a pair only ever uses one.

use cudarc::driver::CudaStream;

use super::net::{self as netx, Bound, Combine};
use super::p2p as ipcx;
use super::process::ProcessCall;
use super::internal;
use crate::dtype::DataType;
use crate::plan::net::{split, NetGroup};
use crate::plan::p2p::{self, Chunks, P2pOp};
use crate::transport::net::NetRank;
use crate::{RedOp, Result};

/// The chunks of the two transports for a call of `unit_bytes` (the same on every rank): the
/// IPC slot of the mapped scratch, and the network's chunks ([`netx::chunks_of`]; per pair for
/// `peer_ops`, `unit_bytes` = `None`).
fn slots(call: &ProcessCall<'_>, net: &NetRank, unit_bytes: Option<usize>) -> Result<(usize, Chunks)> {
    let n = call.state.sent.len();
    let ipc = p2p::slot_bytes(call.state.windows.scratch_bytes(), n, p2p::IPC_SLOTS)
        .ok_or_else(|| internal(format!("a scratch too small for {n} ranks")))?;
    let far = match unit_bytes {
        Some(u) => netx::chunks_of(net, u)?,
        None => Chunks::ByPair,
    };
    Ok((ipc, far))
}

/// One part of a group, all of whose peers are on this machine (`far` false: over CUDA IPC) or
/// all on others (`far`: over the network). `ops[i]`'s buffer is at `bufs[i]`.
#[allow(clippy::too_many_arguments)]
fn run_part(
    net: &mut NetRank,
    call: &mut ProcessCall<'_>,
    bound: Bound<'_>,
    far: bool,
    (ops, bufs): (&[P2pOp], &[u64]),
    (ipc_slot, net_chunks): (usize, Chunks),
    stream: &CudaStream,
    combine: Option<Combine<'_>>,
) -> Result<()> {
    if ops.iter().all(|o| o.bytes == 0) {
        return Ok(());
    }
    let (r, n) = (call.state.rank, call.state.sent.len());
    if far {
        let memops = call.memops;
        netx::group(net, memops, bound, (ops, net_chunks), bufs, stream, combine)
    } else {
        let plan = p2p::plan(r, n, ops, ipc_slot, p2p::IPC_SLOTS)?;
        ipcx::group(call, &plan, bufs, stream, combine)
    }
}

/// Rank `call.state.rank`'s part of a collective whose `groups` reach ranks of this machine and
/// ranks on others: each group's part inside the machine over CUDA IPC, then its part across
/// machines over the network ([`crate::plan::net::split`]), the receives of a reducing group
/// combined by the reduce kernel. `send` and `recv` are the caller's buffers, validated to hold
/// what the groups address; `unit_bytes` (the call's count in bytes, the same on every rank)
/// sizes the network's chunks. Ordered after this rank's previous call and recorded as its end.
#[allow(clippy::too_many_arguments)]
pub(crate) fn collective(
    net: &mut NetRank,
    call: &mut ProcessCall<'_>,
    bound: Bound<'_>,
    cap: u32,
    (dtype, op): (DataType, RedOp),
    (send, recv): (u64, u64),
    (groups, unit_bytes): (&[NetGroup], usize),
    stream: &CudaStream,
) -> Result<()> {
    call.health.check()?;
    netx::begin(net, stream, &call.state.order)?;
    let slots = slots(call, net, Some(unit_bytes))?;
    for g in groups {
        let combine = g.reduce.then_some(Combine {
            kernels: bound.kernels,
            cap,
            dtype,
            op,
            postdiv: g.postdiv,
        });
        let parts = split(g, |q| call.state.windows.is_remote(q));
        for (far, part) in [false, true].into_iter().zip(&parts) {
            let (ops, bufs) = netx::group_args(part, send, recv);
            run_part(net, call, bound, far, (&ops, &bufs), slots, stream, combine)?;
        }
    }
    let r = call.state.rank;
    call.state.order.record(stream, r)
}

/// A `peer_ops` group whose peers are partly on this machine and partly on others: its
/// transfers with ranks of this machine over CUDA IPC, then the others over the network.
/// `bufs[i]` is the address of operation `i`'s buffer (validated by the caller).
pub(crate) fn peer_ops(
    net: &mut NetRank,
    call: &mut ProcessCall<'_>,
    bound: Bound<'_>,
    ops: &[P2pOp],
    bufs: &[u64],
    stream: &CudaStream,
) -> Result<()> {
    call.health.check()?;
    if ops.iter().all(|o| o.bytes == 0) {
        return Ok(());
    }
    netx::begin(net, stream, &call.state.order)?;
    let slots = slots(call, net, None)?;
    for far in [false, true] {
        let (part, part_bufs): (Vec<P2pOp>, Vec<u64>) = ops
            .iter()
            .zip(bufs)
            .filter(|(o, _)| call.state.windows.is_remote(o.peer) == far)
            .map(|(o, b)| (*o, *b))
            .unzip();
        run_part(net, call, bound, far, (&part, &part_bufs), slots, stream, None)?;
    }
    let r = call.state.rank;
    call.state.order.record(stream, r)
}
