//! Point-to-point groups among processes of one machine as ONE kernel per rank
//! (`gpu_kernels::p2p`): the plan is the kernel's one parameter, [`P2pArgs`], built from the
//! group's operations and the ranks' point-to-point buffers. Every counter lives in those
//! buffers and is advanced by the kernel, so the plan holds no value that changes from one call
//! to the next for the same buffers: a CUDA graph that captured the launch replays correctly.
//!
//! Every group of a communicator of at most [`MAX_RANKS`](gpu_kernels::p2p::MAX_RANKS) ranks,
//! all reached over CUDA IPC, runs on the kernel (the choice must be the same on every rank,
//! so it depends on nothing but the communicator); larger communicators keep the scratch path
//! ([`super::p2p`]), which cannot be captured. On the kernel's communicators, an eager
//! transfer above [`Config::p2p_kernel_max_bytes`](crate::Config::p2p_kernel_max_bytes) (the
//! bytes of one peer and direction in the group) takes the scratch path too, before the
//! kernel: [`split_large`].

use gpu_kernels::p2p::{
    channel_offset, channels, is_ll, kind, word, P2pArgs, P2pOpDesc, P2pPiece, CONSUMED, DATA,
    MAX_PIECES, MAX_RANKS,
};

use super::p2p::{Dir, P2pOp};
use crate::per_rank::PerOp;
use crate::{Arg, Error, Result};

/// Bytes a local copy's block moves at least (the copy's blocks: its bytes over this, at most
/// the channel cap).
pub const COPY_BYTES_PER_BLOCK: usize = 64 << 10;

/// Where the kernel's memory is: the control block and the ranks' buffers.
///
/// ```
/// use ringccl::internals::plan::p2p_kernel::KernelEnv;
/// let cap = gpu_kernels::p2p::channel_cap(66, 2); // 132 SMs shared by 2 processes
/// let env = KernelEnv { rank: 1, bufs: &[1 << 40, 2 << 40], cap, ctl: 0x100, timeout_ns: 0, slot: 0, posted: false, direct: &[] };
/// assert_eq!(env.cap, 16);
/// ```
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
    /// Whether this group's transfers of more than
    /// [`LL_MAX_BYTES`](gpu_kernels::p2p::LL_MAX_BYTES) are posted
    /// ([`kind::POSTED`](gpu_kernels::p2p::kind::POSTED): the receiver tells the sender where
    /// to write): the same on every rank (the communicator has registered buffers).
    pub posted: bool,
    /// Per operation of the group, for a posted receive: its buffer as mapped in the sending
    /// peer's process (registered), 0 or absent where the peer cannot reach it (the bytes go
    /// through the slots). Used where the receives from that peer are one buffer.
    pub direct: &'a [u64],
}

/// A group on the kernel: its parameter, and the local copies (source, destination, bytes)
/// enqueued before it where a rank's sends to itself and receives from itself are not one
/// buffer each (those are in the kernel).
///
/// ```
/// use ringccl::internals::plan::p2p::{Dir, P2pOp};
/// use ringccl::internals::plan::p2p_kernel::{plan, KernelEnv};
/// let env = KernelEnv { rank: 0, bufs: &[1 << 40, 2 << 40], cap: 16, ctl: 0x100, timeout_ns: 0, slot: 0, posted: false, direct: &[] };
/// // To itself: 8 bytes from 0x1000 received into two buffers of 4.
/// let ops = [
///     P2pOp { dir: Dir::Send, peer: 0, bytes: 8 },
///     P2pOp { dir: Dir::Recv, peer: 0, bytes: 4 },
///     P2pOp { dir: Dir::Recv, peer: 0, bytes: 4 },
/// ];
/// let p = plan(&ops, &[0x1000, 0x2000, 0x3000], &env)?.expect("on the kernel");
/// assert_eq!(&p.copies[..], &[(0x1000, 0x2000, 4), (0x1004, 0x3000, 4)]);
/// assert_eq!(p.args.blocks(), 0); // nothing else to do
/// # Ok::<(), ringccl::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelPlan {
    /// The kernel's parameter.
    pub args: P2pArgs,
    /// Copies enqueued before the kernel.
    pub copies: PerOp<(u64, u64, usize)>,
}

/// The kernel plan of this rank's group `ops` (buffer `addrs[i]` for `ops[i]`), or `None` if
/// the communicator's groups cannot run on the kernel (more than
/// [`MAX_RANKS`](gpu_kernels::p2p::MAX_RANKS) ranks, or a rank not reached over CUDA IPC): a
/// decision every rank makes alike, whatever its own operations. Operations of 0 bytes are left
/// out; the operations of one direction with one peer are one byte stream, in order. Errors if
/// a peer is out of range, the bytes this rank sends to itself differ from those it receives
/// from itself, or the sends and receives with peers use more than
/// [`MAX_PIECES`](gpu_kernels::p2p::MAX_PIECES) buffers.
///
/// ```
/// use ringccl::internals::plan::p2p::{Dir, P2pOp};
/// use ringccl::internals::plan::p2p_kernel::{plan, KernelEnv};
/// let env = KernelEnv { rank: 0, bufs: &[1 << 40, 2 << 40], cap: 16, ctl: 0x100, timeout_ns: 0, slot: 0, posted: false, direct: &[] };
/// let ops = [
///     P2pOp { dir: Dir::Send, peer: 1, bytes: 100 },
///     P2pOp { dir: Dir::Recv, peer: 1, bytes: 100 },
/// ];
/// let p = plan(&ops, &[0x1000, 0x2000], &env)?.expect("runs on the kernel");
/// assert_eq!((p.args.nops, p.args.blocks()), (2, 2));
/// // Two sends to one peer: one stream over two buffers.
/// let p = plan(&[ops[0], ops[0]], &[0x1000, 0x3000], &env)?.expect("runs on the kernel");
/// assert_eq!((p.args.nops, p.args.ops[0].npieces, p.args.ops[0].bytes), (1, 2, 200));
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn plan(ops: &[P2pOp], addrs: &[u64], env: &KernelEnv<'_>) -> Result<Option<KernelPlan>> {
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
    for o in ops {
        if o.peer >= n {
            return Err(Error::invalid(Some(me), Arg::Peer, format!("peer {} of {n} ranks", o.peer)));
        }
    }
    // The buffers of one peer and direction, in order (operations of 0 bytes left out).
    let stream = |peer: usize, dir: Dir| {
        ops.iter()
            .zip(addrs)
            .filter(move |(o, _)| o.peer == peer && o.dir == dir && o.bytes > 0)
            .map(|(o, &addr)| (addr, o.bytes))
    };
    let overflow = || Error::invalid(Some(me), Arg::Count, "point-to-point byte counts overflow");
    let total = |peer: usize, dir: Dir| {
        stream(peer, dir)
            .try_fold(0usize, |t, (_, b)| t.checked_add(b))
            .ok_or_else(overflow)
    };
    let (self_sent, self_recvd) = (total(me, Dir::Send)?, total(me, Dir::Recv)?);
    if self_sent != self_recvd {
        return Err(Error::invalid(
            Some(me),
            Arg::Count,
            format!("rank {me} sends {self_sent} bytes to itself but receives {self_recvd} from itself"),
        ));
    }
    if n > MAX_RANKS || env.bufs.contains(&0) {
        return Ok(None);
    }
    let npieces = ops.iter().filter(|o| o.peer != me && o.bytes > 0).count();
    if npieces > MAX_PIECES {
        return Err(Error::invalid(
            Some(me),
            Arg::Count,
            format!(
                "this rank's point-to-point group sends from and receives into {npieces} buffers \
                 of its peers' transfers; one group takes at most {MAX_PIECES}: split it into \
                 several groups"
            ),
        ));
    }
    let mut args = P2pArgs {
        header: env.bufs[me],
        ctl: env.ctl,
        timeout_ns: env.timeout_ns,
        slot: env.slot,
        ..P2pArgs::default()
    };
    let mut copies = PerOp::new();
    let (mut nops, mut block, mut piece) = (0usize, 0u32, 0usize);
    let as_u32 = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    let off = |base: u64, bytes: usize| base + bytes as u64;
    let mut push = |args: &mut P2pArgs, d: P2pOpDesc, buffers: &mut dyn Iterator<Item = (u64, usize)>| -> Result<()> {
        let row = args.ops.get_mut(nops).ok_or_else(|| Error::Internal {
            reason: "more point-to-point operations than the kernel takes".into(),
        })?;
        let first = piece;
        for (user, bytes) in buffers {
            let p = args.pieces.get_mut(piece).ok_or_else(|| Error::Internal {
                reason: "more point-to-point buffers than the kernel takes".into(),
            })?;
            *p = P2pPiece { user, bytes: bytes as u64 };
            piece += 1;
        }
        *row = P2pOpDesc {
            first_block: block,
            first_piece: as_u32(first),
            npieces: as_u32(piece - first),
            ..d
        };
        block = block.saturating_add(d.channels);
        nops += 1;
        Ok(())
    };
    for q in 0..n {
        if q == me {
            let (mut s, mut r) = (stream(me, Dir::Send), stream(me, Dir::Recv));
            match (s.next(), r.next(), s.clone().next().is_none() && r.clone().next().is_none()) {
                (None, None, _) => {}
                (Some((src, bytes)), Some((dst, _)), true) => {
                    let blocks = bytes.div_ceil(COPY_BYTES_PER_BLOCK).clamp(1, env.cap.max(1));
                    let d = P2pOpDesc {
                        kind: kind::COPY,
                        peer: as_u32(me),
                        channels: as_u32(blocks),
                        bytes: bytes as u64,
                        user: src,
                        slots: dst,
                        ..P2pOpDesc::default()
                    };
                    push(&mut args, d, &mut core::iter::empty())?;
                }
                _ => copies = segments(stream(me, Dir::Send), stream(me, Dir::Recv)),
            }
            continue;
        }
        for (dir, k) in [(Dir::Send, kind::SEND), (Dir::Recv, kind::RECV)] {
            let bytes = total(q, dir)?;
            if bytes == 0 {
                continue;
            }
            let (slots, remote) = if k == kind::SEND {
                (off(env.bufs[q], channel_offset(me, 0)), off(env.bufs[q], 8 * word(DATA, me, 0)))
            } else {
                (off(env.bufs[me], channel_offset(q, 0)), off(env.bufs[q], 8 * word(CONSUMED, me, 0)))
            };
            let posted = env.posted && !is_ll(bytes);
            // A posted receive into one buffer the sender has mapped goes there directly.
            let user = if posted && k == kind::RECV {
                let mut mine = ops
                    .iter()
                    .enumerate()
                    .filter(|(_, o)| o.peer == q && o.dir == Dir::Recv && o.bytes > 0)
                    .map(|(i, _)| i);
                match (mine.next(), mine.next()) {
                    (Some(i), None) => env.direct.get(i).copied().unwrap_or(0),
                    _ => 0,
                }
            } else {
                0
            };
            let d = P2pOpDesc {
                kind: if posted { k | kind::POSTED } else { k },
                peer: as_u32(q),
                channels: as_u32(channels(bytes, env.cap)),
                bytes: bytes as u64,
                user,
                slots,
                remote,
                ..P2pOpDesc::default()
            };
            push(&mut args, d, &mut stream(q, dir))?;
        }
    }
    args.nops = as_u32(nops);
    Ok(Some(KernelPlan { args, copies }))
}

/// This rank's operations (and their buffers) of collective `c` run as one point-to-point
/// group: how a gather, scatter, all-to-all or all-gather among processes is captured into a
/// CUDA graph where the two-shot kernel cannot take it (the point-to-point kernel's counters
/// live on the device). `send` and `recv` are this rank's validated buffers (0 where it has
/// none), elements of `size` bytes. A copy of a rank's own block is left out where it is
/// already in place; an in-place all-to-all (a block received over one being sent) is refused.
///
/// ```
/// use ringccl::internals::api::collective::Collective;
/// use ringccl::internals::plan::p2p::{Dir, P2pOp};
/// use ringccl::internals::plan::p2p_kernel::collective_ops;
/// // Rank 1 of 3 gathering 4 f32 (16 bytes) per rank at the root, rank 1.
/// let (ops, bufs) = collective_ops(Collective::Gather { sendcount: 4, root: 1 }, 1, 3, 4, (0x100, 0x1000))?;
/// assert_eq!(ops[0], P2pOp { dir: Dir::Recv, peer: 0, bytes: 16 });
/// assert_eq!(bufs, vec![0x1000, 0x100, 0x1010, 0x1020]); // from 0, its own copy, from 2
/// // In place at the root: its block is already there.
/// let (ops, _) = collective_ops(Collective::Gather { sendcount: 4, root: 1 }, 1, 3, 4, (0x1010, 0x1000))?;
/// assert_eq!(ops.len(), 2);
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn collective_ops(
    c: crate::plan::collective::Collective,
    rank: usize,
    n: usize,
    size: usize,
    (send, recv): (u64, u64),
) -> Result<(Vec<P2pOp>, Vec<u64>)> {
    use crate::plan::collective::Collective as C;
    let mut ops = Vec::new();
    let mut bufs = Vec::new();
    let mut op = |dir: Dir, peer: usize, bytes: usize, buf: u64| {
        ops.push(P2pOp { dir, peer, bytes });
        bufs.push(buf);
    };
    let at = |base: u64, block: usize, bytes: usize| base + (block * bytes) as u64;
    // A copy of this rank's own `bytes` from `from` to `to`, unless they are one place.
    let own = |op: &mut dyn FnMut(Dir, usize, usize, u64), from: u64, to: u64, bytes: usize| {
        if from != to {
            op(Dir::Send, rank, bytes, from);
            op(Dir::Recv, rank, bytes, to);
        }
    };
    match c {
        C::Gather { sendcount, root } => {
            let b = sendcount.saturating_mul(size);
            if rank != root {
                op(Dir::Send, root, b, send);
            } else {
                for q in 0..n {
                    if q == rank {
                        own(&mut op, send, at(recv, q, b), b);
                    } else {
                        op(Dir::Recv, q, b, at(recv, q, b));
                    }
                }
            }
        }
        C::Scatter { recvcount, root } => {
            let b = recvcount.saturating_mul(size);
            if rank != root {
                op(Dir::Recv, root, b, recv);
            } else {
                for q in 0..n {
                    if q == rank {
                        own(&mut op, at(send, q, b), recv, b);
                    } else {
                        op(Dir::Send, q, b, at(send, q, b));
                    }
                }
            }
        }
        C::AllToAll { count_per_peer } => {
            let b = count_per_peer.saturating_mul(size);
            if send == recv {
                return Err(Error::invalid(
                    Some(rank),
                    Arg::Recv,
                    "an in-place all-to-all of this size cannot be captured into a CUDA graph in a \
                     job of processes (each block would be received over one being sent): use \
                     separate buffers, or call it eagerly",
                ));
            }
            for q in 0..n {
                if q == rank {
                    own(&mut op, at(send, q, b), at(recv, q, b), b);
                } else {
                    op(Dir::Send, q, b, at(send, q, b));
                    op(Dir::Recv, q, b, at(recv, q, b));
                }
            }
        }
        C::AllGather { sendcount } => {
            let b = sendcount.saturating_mul(size);
            for q in 0..n {
                if q == rank {
                    own(&mut op, send, at(recv, q, b), b);
                } else {
                    op(Dir::Send, q, b, send);
                    op(Dir::Recv, q, b, at(recv, q, b));
                }
            }
        }
        other => {
            return Err(Error::Internal {
                reason: format!("a {} as a point-to-point group", other.name()),
            })
        }
    }
    Ok((ops, bufs))
}

/// A reduce-scatter of `bytes` per block as a point-to-point group and a local reduction:
/// this rank's operations (block `q` of `send` to each peer `q`, each peer's block `rank` into
/// slot `q < rank ? q : q - 1` of `temp`, `(n - 1) * bytes` long) with their buffers, and the
/// reduction's sources in rank order (its own block of `send`, the slots).
///
/// ```
/// use ringccl::internals::plan::p2p::{Dir, P2pOp};
/// use ringccl::internals::plan::p2p_kernel::reduce_scatter_parts;
/// let (ops, bufs, srcs) = reduce_scatter_parts(1, 3, 16, 0x1000, 0x9000);
/// assert_eq!(ops[0], P2pOp { dir: Dir::Send, peer: 0, bytes: 16 });
/// assert_eq!(bufs, vec![0x1000, 0x9000, 0x1020, 0x9010]);
/// assert_eq!(srcs, vec![0x9000, 0x1010, 0x9010]);
/// ```
pub fn reduce_scatter_parts(
    rank: usize,
    n: usize,
    bytes: usize,
    send: u64,
    temp: u64,
) -> (Vec<P2pOp>, Vec<u64>, Vec<u64>) {
    let (mut ops, mut bufs, mut srcs) = (Vec::new(), Vec::new(), Vec::new());
    let at = |base: u64, block: usize| base + (block * bytes) as u64;
    for q in 0..n {
        if q == rank {
            srcs.push(at(send, q));
            continue;
        }
        let slot = at(temp, if q < rank { q } else { q - 1 });
        ops.push(P2pOp { dir: Dir::Send, peer: q, bytes });
        bufs.push(at(send, q));
        ops.push(P2pOp { dir: Dir::Recv, peer: q, bytes });
        bufs.push(slot);
        srcs.push(slot);
    }
    (ops, bufs, srcs)
}

/// A group cut in two by size ([`split_large`]): the operations that run on the kernel and
/// those that go through the copy engines and the scratch ([`super::p2p`]), each with its
/// buffers, in the group's order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SizeSplit {
    /// The operations on the kernel.
    pub kernel: PerOp<P2pOp>,
    /// Their buffers.
    pub kernel_bufs: PerOp<u64>,
    /// The operations through the copy engines.
    pub copies: PerOp<P2pOp>,
    /// Their buffers.
    pub copies_bufs: PerOp<u64>,
}

/// Cuts this rank's (`me`) group `ops` (buffer `addrs[i]` for `ops[i]`) by size: every
/// operation of a peer and direction whose bytes in the group add up to more than
/// `kernel_max` goes through the copy engines, the rest (and every copy to itself) runs on the
/// kernel. The peer on the other side adds up the same bytes (a group's sends and receives
/// between two ranks match), so both sides put a transfer on the same path.
///
/// ```
/// use ringccl::internals::plan::p2p::{Dir, P2pOp};
/// use ringccl::internals::plan::p2p_kernel::split_large;
/// let op = |dir, peer, bytes| P2pOp { dir, peer, bytes };
/// // Rank 0: 3 MiB to rank 1 in two buffers, 4 KiB from rank 1, 8 MiB to itself.
/// let ops = [
///     op(Dir::Send, 1, 1 << 20),
///     op(Dir::Recv, 1, 4096),
///     op(Dir::Send, 1, 2 << 20),
///     op(Dir::Send, 0, 8 << 20),
///     op(Dir::Recv, 0, 8 << 20),
/// ];
/// let s = split_large(&ops, &[10, 20, 30, 40, 50], 0, 1 << 20);
/// assert_eq!(&s.copies[..], &[ops[0], ops[2]]);
/// assert_eq!(&s.copies_bufs[..], &[10, 30]);
/// assert_eq!(&s.kernel_bufs[..], &[20, 40, 50]);
/// ```
pub fn split_large(ops: &[P2pOp], addrs: &[u64], me: usize, kernel_max: usize) -> SizeSplit {
    let total = |dir: Dir, peer: usize| -> usize {
        ops.iter()
            .filter(|o| o.dir == dir && o.peer == peer)
            .fold(0usize, |t, o| t.saturating_add(o.bytes))
    };
    let mut out = SizeSplit::default();
    for (o, &addr) in ops.iter().zip(addrs) {
        if o.peer != me && total(o.dir, o.peer) > kernel_max {
            out.copies.push(*o);
            out.copies_bufs.push(addr);
        } else {
            out.kernel.push(*o);
            out.kernel_bufs.push(addr);
        }
    }
    out
}

/// The copies (source, destination, bytes) that move the byte stream of buffers `from` into
/// that of buffers `to` (equal totals).
fn segments(
    mut from: impl Iterator<Item = (u64, usize)>,
    mut to: impl Iterator<Item = (u64, usize)>,
) -> PerOp<(u64, u64, usize)> {
    let mut out = PerOp::new();
    let (mut a, mut b) = (from.next(), to.next());
    let (mut i, mut j) = (0usize, 0usize); // bytes of `a` and `b` already moved
    while let (Some((src, sl)), Some((dst, dl))) = (a, b) {
        let len = (sl - i).min(dl - j);
        out.push((src + i as u64, dst + j as u64, len));
        i += len;
        j += len;
        if i == sl {
            (a, i) = (from.next(), 0);
        }
        if j == dl {
            (b, j) = (to.next(), 0);
        }
    }
    out
}

#[cfg(test)]
mod tests;
