//! Collectives between processes whose peers are reached over the network
//! (`RINGCCL_NET=ucx`, or a peer on another machine): one rank's part of a collective as a
//! sequence of groups of point-to-point transfers ([`NetGroup`]), each run like a `peer_ops`
//! group ([`super::p2p`]), with the receives of a reducing group combined into their buffer
//! (`dst = received ⊕ dst`) instead of copied.
//!
//! | collective | groups |
//! | --- | --- |
//! | all-reduce | the input copied to the output (out of place), then the ring: n − 1 reducing groups of reduce-scatter, n − 1 of all-gather ([`ring_groups`]) |
//! | reduce-scatter | the rank's own block copied to the output (out of place), then n − 1 reducing groups: at step s, block `me + s` to rank `me + s`, the block of rank `me − s` combined into the output |
//! | reduce | non-roots: one group sending the input to the root; the root: its input copied (out of place), then one reducing group per peer |
//! | all-gather, broadcast, all-to-all, gather, scatter | one group: every transfer at once (a rank's part for itself is a local copy) |
//!
//! Avg divides by n in the last reduction of each element. Every rank computes the same pair
//! traffic for each group index, so the groups of two ranks match as `peer_ops` groups do.
//!
//! ```
//! use ringccl::internals::plan::net::{groups, At};
//! use ringccl::CollectiveKind;
//! // All-gather of 4 elements of 4 bytes on rank 1 of 3, out of place: one group.
//! let g = groups((CollectiveKind::AllGather, 4, 0), (1, 3), 4, false);
//! assert_eq!(g.len(), 1);
//! assert!(!g[0].reduce);
//! // It receives rank 2's block at byte 32 of the output.
//! assert!(g[0].ops.iter().any(|o| o.peer == 2 && o.at == At::Recv(32)));
//! ```

use crate::kind::CollectiveKind as Kind;
use crate::plan::p2p::Dir;

/// Where a transfer's bytes are: a byte offset into the caller's input or output buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// Bytes from the start of the input (send) buffer.
    Send(usize),
    /// Bytes from the start of the output (receive) buffer.
    Recv(usize),
}

/// One transfer of a group: `bytes` to or from `peer` (this rank itself: a local copy), read
/// from or written to `at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetOp {
    /// Send or receive.
    pub dir: Dir,
    /// The rank on the other side.
    pub peer: usize,
    /// Bytes.
    pub bytes: usize,
    /// The buffer and offset.
    pub at: At,
}

/// One group of transfers, run like a `peer_ops` group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetGroup {
    /// The transfers.
    pub ops: Vec<NetOp>,
    /// Receives from peers are combined into their buffer with the call's operator.
    pub reduce: bool,
    /// The divisor applied by that combination (n in the last reduction of avg, else 1).
    pub postdiv: u32,
}

impl NetGroup {
    fn copies(ops: Vec<NetOp>) -> Self {
        NetGroup {
            ops,
            reduce: false,
            postdiv: 1,
        }
    }
}

fn send(peer: usize, bytes: usize, at: At) -> NetOp {
    NetOp {
        dir: Dir::Send,
        peer,
        bytes,
        at,
    }
}

fn recv(peer: usize, bytes: usize, at: At) -> NetOp {
    NetOp {
        dir: Dir::Recv,
        peer,
        bytes,
        at,
    }
}

/// A local copy of `bytes` from `from` to `to`.
fn local(me: usize, bytes: usize, from: At, to: At) -> [NetOp; 2] {
    [send(me, bytes, from), recv(me, bytes, to)]
}

/// One step of a ring all-reduce ([`ring_groups`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingGroup {
    /// Combine the received elements with the output's (reduce-scatter) or copy them
    /// (all-gather).
    pub reduce: bool,
    /// The final reduction of the received chunk.
    pub last: bool,
    /// (first element, elements) sent.
    pub send: (usize, usize),
    /// (first element, elements) received.
    pub recv: (usize, usize),
}

/// The groups of rank `r` of `n` in a ring all-reduce of `count` elements, in order: n − 1 of
/// reduce-scatter, then n − 1 of all-gather. Chunk `c` is elements `c·count/n .. (c+1)·count/n`;
/// at reduce-scatter step `s` rank `r` sends chunk `r − s` and receives chunk `r − s − 1`; at
/// all-gather step `s` it sends chunk `r + 1 − s` and receives chunk `r − s` (mod n).
///
/// ```
/// use ringccl::internals::plan::net::ring_groups;
/// let g = ring_groups(0, 2, 10);
/// assert_eq!(g.len(), 2);
/// assert_eq!((g[0].send, g[0].recv, g[0].reduce, g[0].last), ((0, 5), (5, 5), true, true));
/// assert_eq!((g[1].send, g[1].recv, g[1].reduce), ((5, 5), (0, 5), false));
/// ```
pub fn ring_groups(r: usize, n: usize, count: usize) -> Vec<RingGroup> {
    let chunk = |c: usize| (c * count / n, (c + 1) * count / n - c * count / n);
    let mut out = Vec::new();
    if n < 2 || r >= n {
        return out;
    }
    for phase in 0..2 {
        for s in 0..n - 1 {
            let (send_c, recv_c) = if phase == 0 {
                ((r + n - s) % n, (r + 2 * n - s - 1) % n)
            } else {
                ((r + 1 + n - s) % n, (r + n - s) % n)
            };
            out.push(RingGroup {
                reduce: phase == 0,
                last: phase == 0 && s + 2 == n,
                send: chunk(send_c),
                recv: chunk(recv_c),
            });
        }
    }
    out
}

/// Rank `me`'s groups among `n` ranks for the collective `kind` with `count` elements (the
/// count of the collective's API: per rank for all-gather, reduce-scatter, all-to-all, gather
/// and scatter) and `root` (rooted collectives), elements of `size` bytes; `in_place` as
/// validation found it (then the input and output addresses the executor gets are consistent
/// with NCCL's in-place layout, and a copy of a block onto itself is left out). A rank with
/// nothing to do gets no group; `me >= n`, `root >= n` and point-to-point groups get none.
pub fn groups(
    (kind, count, root): (Kind, usize, usize),
    (me, n): (usize, usize),
    size: usize,
    in_place: bool,
) -> Vec<NetGroup> {
    if me >= n || root >= n {
        return Vec::new();
    }
    let k = count;
    let b = |elems: usize| elems.saturating_mul(size);
    let mut out = Vec::new();
    let copy_first = |out: &mut Vec<NetGroup>, bytes: usize, from: At, to: At| {
        if !in_place && bytes > 0 {
            out.push(NetGroup::copies(local(me, bytes, from, to).to_vec()));
        }
    };
    let postdiv_last = |last: bool| if last { n as u32 } else { 1 };
    match kind {
        Kind::AllReduce => {
            copy_first(&mut out, b(count), At::Send(0), At::Recv(0));
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            for g in ring_groups(me, n, count) {
                let ((so, sl), (ro, rl)) = (g.send, g.recv);
                out.push(NetGroup {
                    ops: vec![
                        send(next, b(sl), At::Recv(b(so))),
                        recv(prev, b(rl), At::Recv(b(ro))),
                    ],
                    reduce: g.reduce,
                    postdiv: if g.reduce { postdiv_last(g.last) } else { 1 },
                });
            }
        }
        Kind::ReduceScatter => {
            copy_first(&mut out, b(k), At::Send(b(me * k)), At::Recv(0));
            for s in 1..n {
                let (to, from) = ((me + s) % n, (me + n - s) % n);
                out.push(NetGroup {
                    ops: vec![send(to, b(k), At::Send(b(to * k))), recv(from, b(k), At::Recv(0))],
                    reduce: true,
                    postdiv: postdiv_last(s + 1 == n),
                });
            }
        }
        Kind::Reduce => {
            if me == root {
                copy_first(&mut out, b(count), At::Send(0), At::Recv(0));
                let peers: Vec<usize> = (1..n).map(|s| (root + s) % n).collect();
                for (i, &q) in peers.iter().enumerate() {
                    out.push(NetGroup {
                        ops: vec![recv(q, b(count), At::Recv(0))],
                        reduce: true,
                        postdiv: postdiv_last(i + 1 == peers.len()),
                    });
                }
            } else {
                // One group on this side; the root meets it in the group of its own that
                // receives from this rank (each pair talks in one group on each side).
                out.push(NetGroup::copies(vec![send(root, b(count), At::Send(0))]));
            }
        }
        Kind::AllGather => {
            let mut ops = Vec::new();
            for q in 0..n {
                if q == me {
                    if !in_place {
                        ops.extend(local(me, b(k), At::Send(0), At::Recv(b(me * k))));
                    }
                } else {
                    ops.push(send(q, b(k), At::Send(0)));
                    ops.push(recv(q, b(k), At::Recv(b(q * k))));
                }
            }
            out.push(NetGroup::copies(ops));
        }
        Kind::Broadcast => {
            let mut ops = Vec::new();
            if me == root {
                if !in_place {
                    ops.extend(local(me, b(count), At::Send(0), At::Recv(0)));
                }
                ops.extend((0..n).filter(|&q| q != root).map(|q| send(q, b(count), At::Send(0))));
            } else {
                ops.push(recv(root, b(count), At::Recv(0)));
            }
            out.push(NetGroup::copies(ops));
        }
        Kind::AllToAll => {
            let mut ops = Vec::new();
            for q in 0..n {
                ops.push(send(q, b(k), At::Send(b(q * k))));
                ops.push(recv(q, b(k), At::Recv(b(q * k))));
            }
            out.push(NetGroup::copies(ops));
        }
        Kind::Gather => {
            let mut ops = Vec::new();
            if me == root {
                for q in 0..n {
                    if q != me {
                        ops.push(recv(q, b(k), At::Recv(b(q * k))));
                    } else if !in_place {
                        ops.extend(local(me, b(k), At::Send(0), At::Recv(b(me * k))));
                    }
                }
            } else {
                ops.push(send(root, b(k), At::Send(0)));
            }
            out.push(NetGroup::copies(ops));
        }
        Kind::Scatter => {
            let mut ops = Vec::new();
            if me == root {
                for q in 0..n {
                    if q != me {
                        ops.push(send(q, b(k), At::Send(b(q * k))));
                    } else if !in_place {
                        ops.extend(local(me, b(k), At::Send(b(me * k)), At::Recv(0)));
                    }
                }
            } else {
                ops.push(recv(root, b(k), At::Recv(0)));
            }
            out.push(NetGroup::copies(ops));
        }
        Kind::SendRecv => {}
    }
    out.retain(|g| g.ops.iter().any(|o| o.bytes > 0));
    out
}

#[cfg(test)]
mod tests;
