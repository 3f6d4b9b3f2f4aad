//! Point-to-point groups among processes of one machine as ONE kernel per rank
//! (`gpu_kernels::p2p`): the plan is the kernel's one parameter, [`P2pArgs`], built from the
//! group's operations and the ranks' point-to-point buffers. Every counter lives in those
//! buffers and is advanced by the kernel, so the plan holds no value that changes from one call
//! to the next for the same buffers: a CUDA graph that captured the launch replays correctly.
//!
//! A group runs on the kernel when the communicator has at most
//! [`MAX_RANKS`](gpu_kernels::p2p::MAX_RANKS) ranks, all reached over CUDA IPC, and it has at
//! most one send and one receive per peer (and at most one of each to itself, of equal bytes);
//! other groups take the scratch path ([`super::p2p`]), which cannot be captured.

use gpu_kernels::p2p::{
    channel_offset, channels, kind, word, P2pArgs, P2pOpDesc, CONSUMED, DATA, MAX_OPS, MAX_RANKS,
};

use super::p2p::{Dir, P2pOp};
use crate::{Arg, Error, Result};

/// Bytes a local copy's block moves at least (the copy's blocks: its bytes over this, at most
/// the channel cap).
pub const COPY_BYTES_PER_BLOCK: usize = 64 << 10;

/// Where the kernel's memory is: the control block and the ranks' buffers.
#[derive(Clone, Copy, Debug)]
pub struct KernelEnv<'a> {
    /// This rank.
    pub rank: usize,
    /// Every rank's point-to-point buffer in this process (0: not reachable).
    pub bufs: &'a [u64],
    /// Most channels per transfer ([`gpu_kernels::p2p::channel_cap`]), the same on every rank.
    pub cap: usize,
    /// The control block.
    pub ctl: u64,
    /// The waits' timeout in nanoseconds.
    pub timeout_ns: u64,
    /// The waits' status slot.
    pub slot: u32,
}

/// The kernel's parameter for this rank's group `ops` (buffer `addrs[i]` for `ops[i]`), or
/// `None` if the group cannot run on the kernel (see the module docs). Operations of 0 bytes
/// are left out. Errors if a peer is out of range or the bytes this rank sends to itself differ
/// from those it receives from itself.
///
/// ```
/// use ringccl::internals::plan::p2p::{Dir, P2pOp};
/// use ringccl::internals::plan::p2p_kernel::{plan, KernelEnv};
/// let env = KernelEnv { rank: 0, bufs: &[1 << 40, 2 << 40], cap: 16, ctl: 0x100, timeout_ns: 0, slot: 0 };
/// let ops = [
///     P2pOp { dir: Dir::Send, peer: 1, bytes: 100 },
///     P2pOp { dir: Dir::Recv, peer: 1, bytes: 100 },
/// ];
/// let args = plan(&ops, &[0x1000, 0x2000], &env)?.expect("runs on the kernel");
/// assert_eq!((args.nops, args.blocks()), (2, 2));
/// // Two sends to one peer in one group take the scratch path.
/// assert!(plan(&[ops[0], ops[0]], &[0x1000, 0x3000], &env)?.is_none());
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn plan(ops: &[P2pOp], addrs: &[u64], env: &KernelEnv<'_>) -> Result<Option<P2pArgs>> {
    let (me, n) = (env.rank, env.bufs.len());
    if ops.len() != addrs.len() {
        return Err(Error::Internal {
            reason: format!("{} buffers for {} point-to-point operations", addrs.len(), ops.len()),
        });
    }
    if me >= n {
        return Err(Error::Internal {
            reason: format!("rank {me} of {n} point-to-point buffers"),
        });
    }
    // Per peer and direction: the one operation (index), if any.
    let mut send = [None; MAX_RANKS];
    let mut recv = [None; MAX_RANKS];
    let (mut self_sent, mut self_recvd) = (0usize, 0usize);
    let mut fits = n <= MAX_RANKS && env.bufs.iter().all(|&b| b != 0);
    for (i, o) in ops.iter().enumerate() {
        if o.peer >= n {
            return Err(Error::invalid(Some(me), Arg::Peer, format!("peer {} of {n} ranks", o.peer)));
        }
        if o.bytes == 0 {
            continue;
        }
        let (table, total) = match o.dir {
            Dir::Send => (&mut send, &mut self_sent),
            Dir::Recv => (&mut recv, &mut self_recvd),
        };
        if o.peer == me {
            *total = total.saturating_add(o.bytes);
        }
        match table.get_mut(o.peer) {
            Some(slot @ None) => *slot = Some(i),
            // A second operation of the pair (one byte stream over several buffers), or more
            // ranks than the kernel serves.
            _ => fits = false,
        }
    }
    if self_sent != self_recvd {
        return Err(Error::invalid(
            Some(me),
            Arg::Count,
            format!("rank {me} sends {self_sent} bytes to itself but receives {self_recvd} from itself"),
        ));
    }
    if !fits {
        return Ok(None);
    }
    let mut args = P2pArgs {
        header: env.bufs[me],
        ctl: env.ctl,
        timeout_ns: env.timeout_ns,
        slot: env.slot,
        ..P2pArgs::default()
    };
    let (mut nops, mut block) = (0usize, 0u32);
    let mut push = |d: P2pOpDesc| -> Result<()> {
        let row = args.ops.get_mut(nops).ok_or_else(|| Error::Internal {
            reason: format!("more than {MAX_OPS} point-to-point operations"),
        })?;
        *row = P2pOpDesc { first_block: block, ..d };
        block = block.saturating_add(d.channels);
        nops += 1;
        Ok(())
    };
    let as_u32 = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    let off = |base: u64, bytes: usize| base + bytes as u64;
    for q in 0..n {
        if q == me {
            if let (Some(s), Some(r)) = (send[q], recv[q]) {
                let bytes = ops[s].bytes;
                let blocks = bytes.div_ceil(COPY_BYTES_PER_BLOCK).clamp(1, env.cap.max(1));
                push(P2pOpDesc {
                    kind: kind::COPY,
                    peer: as_u32(me),
                    channels: as_u32(blocks),
                    first_block: 0,
                    bytes: bytes as u64,
                    user: addrs[s],
                    slots: addrs[r],
                    remote: 0,
                })?;
            }
            continue;
        }
        if let Some(s) = send[q] {
            let bytes = ops[s].bytes;
            push(P2pOpDesc {
                kind: kind::SEND,
                peer: as_u32(q),
                channels: as_u32(channels(bytes, env.cap)),
                first_block: 0,
                bytes: bytes as u64,
                user: addrs[s],
                slots: off(env.bufs[q], channel_offset(me, 0)),
                remote: off(env.bufs[q], 8 * word(DATA, me, 0)),
            })?;
        }
        if let Some(r) = recv[q] {
            let bytes = ops[r].bytes;
            push(P2pOpDesc {
                kind: kind::RECV,
                peer: as_u32(q),
                channels: as_u32(channels(bytes, env.cap)),
                first_block: 0,
                bytes: bytes as u64,
                user: addrs[r],
                slots: off(env.bufs[me], channel_offset(q, 0)),
                remote: off(env.bufs[q], 8 * word(CONSUMED, me, 0)),
            })?;
        }
    }
    args.nops = as_u32(nops);
    Ok(Some(args))
}

#[cfg(test)]
mod tests;
