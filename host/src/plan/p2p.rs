//! Point-to-point transfers among processes, planned: one rank's part of a group of sends and
//! receives (like `ncclSend`/`ncclRecv` between `ncclGroupStart` and `ncclGroupEnd`) as a list
//! of copies, signals and waits.
//!
//! A rank reaches no peer's memory but the peer's scratch (mapped in its process), so a transfer
//! from rank `s` to rank `d` moves through `d`'s scratch in chunks of [`P2pPlan::slot`] bytes:
//! `s` copies chunk `k` of its send data into slot `k % S` of the region `d` keeps for `s` (`S`
//! slots per region: [`P2pPlan::slots`]), and signals *data `k`*; `d` waits for it, copies the
//! chunk out into its receive buffer and signals *consumed `k`*, after which `s` may fill that
//! slot again (chunk `k + S`). Before its first chunk, `s` waits for `d`'s *ready* signal: `d` has
//! reached the group (its earlier work on its scratch is done).
//!
//! A rank's sends run `A = min(S - 1, `[`MAX_AHEAD`]`)` chunks ahead of its receives, so that
//! while its stream waits for a peer's chunk `k` its own chunks `k + 1 … k + A` are already on
//! their way. Over the network ([`NET_SLOTS`]) this keeps the proxy's link busy instead of one
//! chunk per round trip, and the slots beyond `A + 1` let a sender run ahead of the receiver's
//! credits (a receiver consumes chunk `c` only in round `c + A`);
//! between GPUs of one machine ([`IPC_SLOTS`]) every step runs on one stream anyway, so fewer,
//! larger chunks win (measured on 2 × H200, see `docs/PERFORMANCE.md`).
//!
//! The sends from `s` to `d` in one group are one byte stream (in the order given), and so are
//! the receives on `d` from `s`: the `i`-th byte sent is the `i`-th byte received, and the totals
//! must be equal, as in NCCL.
//!
//! Over the network the pairs carry their slots from one group to the next instead
//! ([`plan_net`] and [`Carry`]): chunk `m` of a pair, counted over every group, fills slot
//! `m % S`, so a group's first chunks wait for nothing but the consumption of the chunks that
//! last filled their slots (an earlier group's *consumed* signals, waited for as
//! [`Action::WaitCarried`]), and there are no *ready* signals. A sender is then never held up by
//! a round trip at a group's start: successive groups and calls stream through the slots as one
//! transfer does. A pair's chunks there are also cut per direction from its byte total
//! ([`Chunks`]), which both sides know.
//!
//! A rank issues, in order: its ready signals (per-group plans only); then per round `j`, first its chunk-`j` sends to
//! every peer, then its chunk-`(j - A)` receives from every peer. Signals from `r` to `q` in
//! one group are numbered in that order (see [`super::signals`] for the counters): *ready* if
//! `r` receives from `q`, then per round `j`: *data `j`* (if `r` sends chunk `j` to `q`),
//! *consumed `j - A`* (if `r` received that chunk from `q`). Both sides compute the same
//! numbers from the same byte counts. No set of ranks can wait on each other in a cycle: a send
//! in round `j` waits only for *consumed `j - S`*, which the peer issued in round
//! `j - S + A ≤ j - 1`; a receive in round `j` waits for *data `j - A`*, which the peer issued
//! in round `j - A`, among its sends, which come before its receives.

pub use crate::transport::net::{Carry, NET_SLOTS};
use crate::{Arg, Error, Result};

/// Which side of a transfer an operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Bytes from this rank to the peer.
    Send,
    /// Bytes from the peer into this rank.
    Recv,
}

/// One operation of this rank's part of a group: `bytes` to or from `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pOp {
    /// Send or receive.
    pub dir: Dir,
    /// The rank on the other side (this rank itself: a local copy).
    pub peer: usize,
    /// Bytes.
    pub bytes: usize,
}

/// A place a copy reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// `offset` bytes into the buffer of operation `op` (an index into the plan's operations).
    Op {
        /// The operation.
        op: usize,
        /// Bytes from the buffer's start.
        offset: usize,
    },
    /// `offset` bytes into rank `rank`'s scratch.
    Scratch {
        /// The rank whose scratch.
        rank: usize,
        /// Bytes from the scratch's start.
        offset: usize,
    },
}

/// One thing this rank's stream does, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Signal `peer`: the `k`-th signal (1-based) from this rank to `peer` in this group.
    Signal {
        /// The receiving rank.
        peer: usize,
        /// The signal's number in this group for the pair.
        k: u64,
    },
    /// Wait until `peer` has sent its `k`-th signal of this group to this rank.
    Wait {
        /// The signalling rank.
        peer: usize,
        /// The signal's number in this group for the pair.
        k: u64,
        /// Whether the signal is a credit (*ready* or *consumed*: the peer's leave to write
        /// its scratch) rather than *data*. Only the network path tells them apart: there a
        /// credit can be seen before the peer's earlier chunks have arrived.
        credit: bool,
    },
    /// Wait until `peer` has sent its signal number `at`, counted over every group so far (not
    /// in this group): the credit of an earlier group that frees the slot this rank fills next
    /// ([`plan_net`] only). Waited for on the credit word.
    WaitCarried {
        /// The signalling rank.
        peer: usize,
        /// The signal's number over every group of the pair.
        at: u64,
    },
    /// Copy `bytes` from `from` to `to`.
    Copy {
        /// Source.
        from: Place,
        /// Destination.
        to: Place,
        /// Bytes.
        bytes: usize,
    },
}

/// One rank's part of a group of transfers among processes. See the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct P2pPlan {
    /// Bytes of one chunk (one slot of a scratch region).
    pub slot: usize,
    /// Slots per region (per source rank) of a scratch.
    pub slots: usize,
    /// What the rank's stream does, in order.
    pub actions: Vec<Action>,
    /// Signals this rank sends to each rank in the group.
    pub sent: Vec<u64>,
    /// Signals each rank sends to this rank in the group.
    pub received: Vec<u64>,
}

/// Slots per region of the mapped scratch of a peer on the same machine (IPC): two, so that the
/// chunks are large (each costs a copy, a signal and a wait on the stream).
pub const IPC_SLOTS: usize = 2;

/// Most chunks a rank's sends run ahead of its receives.
pub const MAX_AHEAD: usize = 3;

/// The per-pair chunk counts and chunk sizes of the signal numbering.
#[derive(Clone, Copy, Debug, Default)]
struct Pair {
    /// Chunks this rank sends to the peer.
    out: usize,
    /// Chunks this rank receives from the peer.
    inn: usize,
    /// Bytes of a chunk this rank sends to the peer.
    out_chunk: usize,
    /// Bytes of a chunk this rank receives from the peer.
    in_chunk: usize,
}

impl Pair {
    /// The number of the sender's signal for `data k` (`k < out`) in the sequence of a rank
    /// that sends `out` chunks and receives `inn` chunks (see the module docs): the ready
    /// signal (if `ready`), the data signals of rounds `0..=k`, and the consumed signals of the
    /// rounds before `k` (chunks `c` with `c + ahead < k`), for sends `ahead` chunks ahead.
    fn data(out: usize, inn: usize, k: usize, (ahead, ready): (usize, bool)) -> u64 {
        debug_assert!(k < out);
        (usize::from(ready && inn > 0) + k + 1 + k.saturating_sub(ahead).min(inn)) as u64
    }

    /// The number of `consumed c` (`c < inn`) in the same sequence: issued in round
    /// `c + ahead`, after that round's data signal.
    fn consumed(out: usize, inn: usize, c: usize, (ahead, ready): (usize, bool)) -> u64 {
        debug_assert!(c < inn);
        (usize::from(ready && inn > 0) + (c + ahead + 1).min(out) + c + 1) as u64
    }

    /// Signals in the sequence.
    fn total(out: usize, inn: usize, ready: bool) -> u64 {
        (usize::from(ready && inn > 0) + out + inn) as u64
    }
}

/// The chunk size for `scratch_bytes` of scratch per rank and `nranks` ranks: `slots` slots per
/// source rank, each a multiple of 256 bytes (`None` if that leaves less than 256 bytes).
///
/// ```
/// use ringccl::internals::plan::p2p::slot_bytes;
/// assert_eq!(slot_bytes(4 << 20, 2, 2), Some(1 << 20));
/// assert_eq!(slot_bytes(4 << 20, 2, 4), Some(512 << 10));
/// assert_eq!(slot_bytes(1024, 4, 2), None);
/// ```
pub fn slot_bytes(scratch_bytes: usize, nranks: usize, slots: usize) -> Option<usize> {
    let per = scratch_bytes / nranks.max(1).saturating_mul(slots.max(1)) / 256 * 256;
    (per >= 256).then_some(per)
}

/// Smallest chunk [`net_chunk`] picks: 256 KiB, one UCX TCP segment (`transport::net::proxy`).
pub const MIN_NET_CHUNK: usize = 256 << 10;

/// The chunk size of a collective's groups over the network: about a sixteenth of `unit_bytes`
/// (the call's count in bytes, the same on every rank, so every rank plans the same chunks),
/// at least [`MIN_NET_CHUNK`] and at most `max_slot` (the scratch's slot), a multiple of 256
/// bytes. Small calls then still have several chunks in flight (the slots' look-ahead)
/// instead of one chunk per group, and large ones use the whole slot.
///
/// ```
/// use ringccl::internals::plan::p2p::net_chunk;
/// assert_eq!(net_chunk(1 << 20, 8 << 20), 512 << 10);
/// assert_eq!(net_chunk(1 << 20, 1 << 30), 1 << 20);
/// assert_eq!(net_chunk(1 << 20, 1000), 256 << 10);
/// assert_eq!(net_chunk(4096, 1 << 20), 4096);
/// ```
pub fn net_chunk(max_slot: usize, unit_bytes: usize) -> usize {
    let part = unit_bytes.div_ceil(2 * NET_SLOTS).div_ceil(256).saturating_mul(256);
    part.max(MIN_NET_CHUNK).min(max_slot)
}

/// The pieces of byte range `[start, start + len)` of the stream made of the buffers of `ops`
/// (operation index, bytes), in order: (operation, offset in its buffer, bytes).
fn pieces(ops: &[(usize, usize)], start: usize, len: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let (end, mut base) = (start + len, 0);
    for &(op, bytes) in ops {
        let (lo, hi) = (start.max(base), end.min(base + bytes));
        if lo < hi {
            out.push((op, lo - base, hi - lo));
        }
        base += bytes;
        if base >= end {
            break;
        }
    }
    out
}

/// Plans rank `me`'s part (of `nranks`) of a group made of `ops` with chunks of `slot` bytes,
/// `slots` of them per region (at least 1), the group's slots starting afresh after a *ready*
/// signal from each receiver (the CUDA IPC path).
///
/// Errors if a peer is out of range, a byte count overflows, or the sends to this rank itself
/// do not add up to its receives from itself.
///
/// ```
/// use ringccl::internals::plan::p2p::{plan, Action, Dir, P2pOp};
/// // Rank 0 of 2 sends 3 KiB to rank 1 in chunks of 1 KiB.
/// let p = plan(0, 2, &[P2pOp { dir: Dir::Send, peer: 1, bytes: 3 << 10 }], 1 << 10, 2)?;
/// assert_eq!(p.sent, vec![0, 3]); // data 0, 1, 2
/// assert_eq!(p.received, vec![0, 4]); // ready, consumed 0, 1, 2
/// assert_eq!(p.actions[0], Action::Wait { peer: 1, k: 1, credit: true }); // rank 1's ready
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn plan(me: usize, nranks: usize, ops: &[P2pOp], slot: usize, slots: usize) -> Result<P2pPlan> {
    build(me, nranks, ops, (slot, slots, Chunks::Slot), None).map(|(p, _)| p)
}

/// How [`plan_net`] cuts a pair's bytes into chunks (each at most a slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chunks {
    /// Whole slots.
    Slot,
    /// Chunks of this many bytes (a collective's: [`net_chunk`] of the call's size, the same
    /// on every rank).
    Fixed(usize),
    /// Per direction of each pair, [`net_chunk`] of the slot and the direction's byte total,
    /// which its sender and receiver both know (`peer_ops`).
    ByPair,
}

/// Plans rank `me`'s part of a group over the network: as [`plan`], but with the pairs' slots
/// carried over from the earlier groups in `carry` (see the module docs) instead of *ready*
/// signals, and chunks cut as `chunks` says; `received[q]` is the number of signals `q` has
/// sent this rank in the earlier groups. Returns the plan and the carry after it, to be kept
/// once the plan is issued (every rank must plan every group it takes part in, in order).
///
/// ```
/// use ringccl::internals::plan::p2p::{plan_net, Action, Carry, Chunks, Dir, P2pOp};
/// let send = [P2pOp { dir: Dir::Send, peer: 1, bytes: 3 << 10 }];
/// // Slots of 1 KiB, two per region: the first group waits for nothing...
/// let (p, carry) = plan_net(0, 2, &send, (1 << 10, 2, Chunks::Slot), &Carry::new(2, 2), &[0, 0])?;
/// assert_eq!(p.received, vec![0, 3]); // consumed 0, 1, 2: no ready
/// assert!(matches!(p.actions[0], Action::Copy { .. }));
/// // ... the next one's first chunk fills slot 1 once rank 1 consumed chunk 1 (its signal 2).
/// let (q, _) = plan_net(0, 2, &send, (1 << 10, 2, Chunks::Slot), &carry, &[0, 3])?;
/// assert_eq!(q.actions[0], Action::WaitCarried { peer: 1, at: 2 });
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn plan_net(
    me: usize,
    nranks: usize,
    ops: &[P2pOp],
    (slot, slots, chunks): (usize, usize, Chunks),
    carry: &Carry,
    received: &[u64],
) -> Result<(P2pPlan, Carry)> {
    if carry.slots != slots || carry.peers.len() != nranks || received.len() != nranks {
        return Err(Error::Internal {
            reason: format!(
                "a carry of {} ranks and {} slots for a plan of {nranks} ranks and {slots} slots",
                carry.peers.len(),
                carry.slots
            ),
        });
    }
    let (p, c) = build(me, nranks, ops, (slot, slots, chunks), Some((carry, received)))?;
    Ok((p, c.unwrap_or_else(|| carry.clone())))
}

/// The planner of [`plan`] (`carried` = `None`: per-group slots and *ready* signals) and of
/// [`plan_net`] (`carried`: the carry and the signals received so far).
fn build(
    me: usize,
    nranks: usize,
    ops: &[P2pOp],
    (slot, slots, chunks): (usize, usize, Chunks),
    carried: Option<(&Carry, &[u64])>,
) -> Result<(P2pPlan, Option<Carry>)> {
    let bad = |reason: String| Error::Internal { reason };
    if me >= nranks || slot == 0 || slots == 0 {
        return Err(bad(format!("a point-to-point plan for rank {me} of {nranks}")));
    }
    let chunk_of = |bytes: usize| match chunks {
        Chunks::Slot => slot,
        Chunks::Fixed(c) => c.clamp(1, slot),
        Chunks::ByPair => net_chunk(slot, bytes),
    };
    let ready = carried.is_none();
    // Per peer: the operations of each direction, in order, and their byte totals.
    let mut outs: Vec<Vec<(usize, usize)>> = vec![Vec::new(); nranks];
    let mut ins: Vec<Vec<(usize, usize)>> = vec![Vec::new(); nranks];
    for (i, o) in ops.iter().enumerate() {
        if o.peer >= nranks {
            return Err(bad(format!("peer {} of {nranks} ranks", o.peer)));
        }
        if o.bytes == 0 {
            continue;
        }
        match o.dir {
            Dir::Send => outs[o.peer].push((i, o.bytes)),
            Dir::Recv => ins[o.peer].push((i, o.bytes)),
        }
    }
    let total = |v: &[(usize, usize)]| {
        v.iter()
            .try_fold(0usize, |a, &(_, b)| a.checked_add(b))
            .ok_or_else(|| bad("point-to-point byte counts overflow".into()))
    };
    let mut pairs = vec![Pair::default(); nranks];
    let mut totals = vec![(0usize, 0usize); nranks];
    let mut actions = Vec::new();
    for q in 0..nranks {
        let (o, i) = (total(&outs[q])?, total(&ins[q])?);
        totals[q] = (o, i);
        if q == me {
            if o != i {
                return Err(Error::invalid(
                    Some(me),
                    Arg::Count,
                    format!("rank {me} sends {o} bytes to itself but receives {i} from itself"),
                ));
            }
            // A local copy, piece by piece of the two streams.
            let mut at = 0;
            for (op, off, len) in pieces(&outs[q], 0, o) {
                let mut within = 0;
                for (rop, roff, rlen) in pieces(&ins[q], at, len) {
                    actions.push(Action::Copy {
                        from: Place::Op {
                            op,
                            offset: off + within,
                        },
                        to: Place::Op {
                            op: rop,
                            offset: roff,
                        },
                        bytes: rlen,
                    });
                    within += rlen;
                }
                at += len;
            }
            continue;
        }
        let (out_chunk, in_chunk) = (chunk_of(o), chunk_of(i));
        pairs[q] = Pair {
            out: o.div_ceil(out_chunk),
            inn: i.div_ceil(in_chunk),
            out_chunk,
            in_chunk,
        };
    }
    // Ready signals.
    if ready {
        for (q, p) in pairs.iter().enumerate() {
            if p.inn > 0 {
                actions.push(Action::Signal { peer: q, k: 1 });
            }
        }
    }
    // Round `j`: chunk `j` of every send, then chunk `j - ahead` of every receive.
    let ahead = (slots - 1).min(MAX_AHEAD);
    let seq = (ahead, ready);
    let rounds = pairs
        .iter()
        .map(|p| p.out.max(if p.inn > 0 { p.inn + ahead } else { 0 }))
        .max()
        .unwrap_or(0);
    // Chunks of each pair before this group (0 without a carry).
    let base = |q: usize| carried.map_or((0, 0), |(c, _)| (c.peers[q].out, c.peers[q].inn));
    let region = |src: usize, m: u64| (src * slots + (m % slots as u64) as usize) * slot;
    for j in 0..rounds {
        for (q, p) in pairs.iter().enumerate() {
            if j >= p.out {
                continue;
            }
            let m = base(q).0 + j as u64;
            // The peer's sequence: it sends `p.inn` chunks to this rank and receives `p.out`.
            if j >= slots {
                actions.push(Action::Wait {
                    peer: q,
                    k: Pair::consumed(p.inn, p.out, j - slots, seq),
                    credit: true,
                });
            } else if let Some((c, _)) = carried {
                // The chunk that last filled slot `m % slots`, from an earlier group.
                let freed = &c.peers[q].freed;
                if let Some(back) = (slots - j).checked_sub(1).filter(|&b| b < freed.len()) {
                    actions.push(Action::WaitCarried {
                        peer: q,
                        at: freed[freed.len() - 1 - back],
                    });
                }
            } else if j == 0 {
                actions.push(Action::Wait { peer: q, k: 1, credit: true });
            }
            let start = j * p.out_chunk;
            let len = p.out_chunk.min(totals[q].0 - start);
            let mut at = region(me, m);
            for (op, offset, bytes) in pieces(&outs[q], start, len) {
                actions.push(Action::Copy {
                    from: Place::Op { op, offset },
                    to: Place::Scratch { rank: q, offset: at },
                    bytes,
                });
                at += bytes;
            }
            actions.push(Action::Signal {
                peer: q,
                k: Pair::data(p.out, p.inn, j, seq),
            });
        }
        let Some(k) = j.checked_sub(ahead) else {
            continue;
        };
        for (q, p) in pairs.iter().enumerate() {
            if k >= p.inn {
                continue;
            }
            actions.push(Action::Wait {
                peer: q,
                k: Pair::data(p.inn, p.out, k, seq),
                credit: false,
            });
            let start = k * p.in_chunk;
            let len = p.in_chunk.min(totals[q].1 - start);
            let mut at = region(q, base(q).1 + k as u64);
            for (op, offset, bytes) in pieces(&ins[q], start, len) {
                actions.push(Action::Copy {
                    from: Place::Scratch { rank: me, offset: at },
                    to: Place::Op { op, offset },
                    bytes,
                });
                at += bytes;
            }
            actions.push(Action::Signal {
                peer: q,
                k: Pair::consumed(p.out, p.inn, k, seq),
            });
        }
    }
    let sent = pairs.iter().map(|p| Pair::total(p.out, p.inn, ready)).collect();
    let received = pairs.iter().map(|p| Pair::total(p.inn, p.out, ready)).collect();
    let next = carried.map(|(c, got)| {
        let mut next = c.clone();
        for (q, p) in pairs.iter().enumerate() {
            let pc = &mut next.peers[q];
            for j in 0..p.out {
                pc.freed.push_back(got[q] + Pair::consumed(p.inn, p.out, j, seq));
            }
            while pc.freed.len() > slots {
                pc.freed.pop_front();
            }
            pc.out += p.out as u64;
            pc.inn += p.inn as u64;
        }
        next
    });
    Ok((
        P2pPlan {
            slot,
            slots,
            actions,
            sent,
            received,
        },
        next,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transfer of the group: `bytes` from rank `from` to rank `to`.
    type Transfer = (usize, usize, usize);

    /// Every rank's operations for `group`, in the group's order.
    fn ops_of(group: &[Transfer], n: usize) -> Vec<Vec<P2pOp>> {
        let mut ops = vec![Vec::new(); n];
        for &(from, to, bytes) in group {
            ops[from].push(P2pOp { dir: Dir::Send, peer: to, bytes });
            ops[to].push(P2pOp { dir: Dir::Recv, peer: from, bytes });
        }
        ops
    }

    fn byte(rank: usize, op: usize, i: usize) -> u8 {
        (rank * 131 + op * 31 + i * 7 + 1) as u8
    }

    /// Runs every rank's plan with the ranks' steps interleaved by `seed` (0: round robin),
    /// byte by byte: checks that no rank waits forever, that every signal is the pair's next,
    /// that every receive buffer ends with the bytes sent to it, and the signal totals.
    fn simulate(group: &[Transfer], n: usize, (slot, slots): (usize, usize), seed: u64) {
        simulate_groups(&[group.to_vec()], n, (slot, slots, Chunks::Slot), false, seed);
    }

    /// One action of a rank's stream in [`simulate_groups`]: its group, and the signals the
    /// rank had sent to and received from each rank before that group.
    type Step = (usize, Action, Vec<u64>, Vec<u64>);

    /// [`simulate`] for `groups` one after the other on every rank, planned per group
    /// (`carried` false: [`plan`]) or with the slots carried from group to group ([`plan_net`]
    /// with `chunks`); the counters run over every group, as the executors' do.
    fn simulate_groups(
        groups: &[Vec<Transfer>],
        n: usize,
        (slot, slots, chunks): (usize, usize, Chunks),
        carried: bool,
        seed: u64,
    ) {
        let ops: Vec<Vec<Vec<P2pOp>>> = groups.iter().map(|g| ops_of(g, n)).collect();
        // Per rank: every group's actions with the pair counters before the group.
        let mut streams: Vec<Vec<Step>> = vec![Vec::new(); n];
        let mut totals = vec![(vec![0u64; n], vec![0u64; n]); n];
        for r in 0..n {
            let mut carry = Carry::new(n, slots);
            let (mut sent, mut received) = (vec![0u64; n], vec![0u64; n]);
            for (g, gops) in ops.iter().enumerate() {
                let p = if carried {
                    let (p, next) = plan_net(r, n, &gops[r], (slot, slots, chunks), &carry, &received).unwrap();
                    carry = next;
                    p
                } else {
                    plan(r, n, &gops[r], slot, slots).unwrap()
                };
                for a in &p.actions {
                    streams[r].push((g, *a, sent.clone(), received.clone()));
                }
                for q in 0..n {
                    sent[q] += p.sent[q];
                    received[q] += p.received[q];
                }
            }
            totals[r] = (sent, received);
        }
        let mut bufs: Vec<Vec<Vec<Vec<u8>>>> = ops
            .iter()
            .enumerate()
            .map(|(g, gops)| {
                (0..n)
                    .map(|r| {
                        gops[r]
                            .iter()
                            .enumerate()
                            .map(|(i, o)| match o.dir {
                                Dir::Send => (0..o.bytes).map(|b| byte(r, i + 7 * g, b)).collect(),
                                Dir::Recv => vec![0; o.bytes],
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let mut scratch = vec![vec![0u8; n * slots * slot]; n];
        let mut flags = vec![vec![0u64; n]; n]; // flags[receiver][sender], over every group
        let mut pc = vec![0usize; n];
        let mut rng = seed;
        loop {
            let ready: Vec<usize> = (0..n)
                .filter(|&r| match streams[r].get(pc[r]) {
                    None => false,
                    Some((_, Action::Wait { peer, k, .. }, _, got)) => flags[r][*peer] >= got[*peer] + *k,
                    Some((_, Action::WaitCarried { peer, at }, _, _)) => flags[r][*peer] >= *at,
                    Some(_) => true,
                })
                .collect();
            if ready.is_empty() {
                let stuck: Vec<_> = (0..n).filter(|&r| pc[r] < streams[r].len()).collect();
                assert!(stuck.is_empty(), "ranks {stuck:?} wait forever ({groups:?}, slot {slot})");
                break;
            }
            let r = if seed == 0 {
                ready[0]
            } else {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                ready[(rng % ready.len() as u64) as usize]
            };
            let (g, action, sent, _) = &streams[r][pc[r]];
            match *action {
                Action::Wait { .. } | Action::WaitCarried { .. } => {}
                Action::Signal { peer, k } => {
                    assert_eq!(flags[peer][r] + 1, sent[peer] + k, "rank {r} → {peer}: signals out of order");
                    flags[peer][r] = sent[peer] + k;
                }
                Action::Copy { from, to, bytes } => {
                    let data: Vec<u8> = match from {
                        Place::Op { op, offset } => bufs[*g][r][op][offset..offset + bytes].to_vec(),
                        Place::Scratch { rank, offset } => {
                            assert_eq!(rank, r, "rank {r} reads another rank's scratch");
                            scratch[rank][offset..offset + bytes].to_vec()
                        }
                    };
                    match to {
                        Place::Op { op, offset } => {
                            assert_eq!(ops[*g][r][op].dir, Dir::Recv, "rank {r} writes a send buffer");
                            bufs[*g][r][op][offset..offset + bytes].copy_from_slice(&data)
                        }
                        Place::Scratch { rank, offset } => {
                            scratch[rank][offset..offset + bytes].copy_from_slice(&data)
                        }
                    }
                }
            }
            pc[r] += 1;
        }
        // Every pair's stream of bytes arrived in order, in every group.
        for (g, gops) in ops.iter().enumerate() {
            for s in 0..n {
                for d in 0..n {
                    let sent: Vec<u8> = gops[s]
                        .iter()
                        .enumerate()
                        .filter(|(_, o)| o.dir == Dir::Send && o.peer == d)
                        .flat_map(|(i, o)| (0..o.bytes).map(move |b| byte(s, i + 7 * g, b)))
                        .collect();
                    let got: Vec<u8> = gops[d]
                        .iter()
                        .enumerate()
                        .filter(|(_, o)| o.dir == Dir::Recv && o.peer == s)
                        .flat_map(|(i, _)| bufs[g][d][i].iter().copied())
                        .collect();
                    assert_eq!(got, sent, "group {g}: {s} → {d} ({groups:?}, slot {slot}, seed {seed})");
                }
            }
        }
        for s in 0..n {
            for d in 0..n {
                assert_eq!(flags[d][s], totals[s].0[d], "signals {s} → {d}");
                assert_eq!(flags[d][s], totals[d].1[s], "signals {s} → {d} as {d} counts");
            }
        }
    }

    /// [`simulate`] with several interleavings, for one slot per region (no look-ahead), the
    /// IPC layout and the network layout.
    fn simulate_many(group: &[Transfer], n: usize, slot: usize) {
        for slots in [1, IPC_SLOTS, NET_SLOTS] {
            for seed in [0, 1, 7, 42, 1234, 0xdead_beef, 99, 5] {
                simulate(group, n, (slot, slots), seed);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 256,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Any group (random transfers among up to 6 ranks, self copies and several
        /// operations per pair included, in any order), any slot size and number of slots, random
        /// interleavings.
        #[test]
        fn random_groups_deliver_every_byte(
            n in 1usize..7,
            picks in proptest::collection::vec((0usize..6, 0usize..6, 0usize..200), 0..14),
            slot in 1usize..64,
            slots in 1usize..10,
            seed in proptest::prelude::any::<u64>(),
        ) {
            let group: Vec<Transfer> = picks.into_iter().map(|(a, b, bytes)| (a % n, b % n, bytes)).collect();
            simulate(&group, n, (slot, slots), seed);
        }
    }

    #[test]
    fn two_ranks_both_ways_every_size() {
        for a in [0, 1, 15, 16, 17, 40, 64, 100] {
            for b in [0, 1, 16, 33, 112] {
                simulate_many(&[(0, 1, a), (1, 0, b)], 2, 16);
            }
        }
    }

    #[test]
    fn all_to_all_of_four_with_self_copies() {
        let mut group = Vec::new();
        for s in 0..4 {
            for d in 0..4 {
                group.push((s, d, 8 * (s + 1) + 13 * d + 3));
            }
        }
        simulate_many(&group, 4, 16);
    }

    #[test]
    fn several_operations_per_pair_form_one_stream() {
        simulate_many(&[(0, 1, 5), (0, 1, 37), (1, 0, 3), (0, 1, 0), (0, 1, 17)], 2, 16);
        // Different splits on the two sides: rank 1 receives 59 bytes as 20 + 39.
        let ops0 = [
            P2pOp { dir: Dir::Send, peer: 1, bytes: 5 },
            P2pOp { dir: Dir::Send, peer: 1, bytes: 54 },
        ];
        let ops1 = [
            P2pOp { dir: Dir::Recv, peer: 0, bytes: 20 },
            P2pOp { dir: Dir::Recv, peer: 0, bytes: 39 },
        ];
        let (p0, p1) = (plan(0, 2, &ops0, 16, 2).unwrap(), plan(1, 2, &ops1, 16, 2).unwrap());
        assert_eq!(p0.sent[1], p1.received[0]);
        assert_eq!(p0.received[1], p1.sent[0]);
    }

    #[test]
    fn a_ring_shift_and_fan_in_of_five() {
        let ring: Vec<_> = (0..5).map(|r| (r, (r + 1) % 5, 70 + r)).collect();
        simulate_many(&ring, 5, 32);
        let fan_in: Vec<_> = (1..5).map(|r| (r, 0, 50 * r)).collect();
        simulate_many(&fan_in, 5, 32);
    }

    #[test]
    fn self_copies_must_add_up() {
        let ops = [
            P2pOp { dir: Dir::Send, peer: 0, bytes: 8 },
            P2pOp { dir: Dir::Recv, peer: 0, bytes: 4 },
        ];
        let e = plan(0, 2, &ops, 16, 2).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { rank: Some(0), .. }), "{e}");
        let e = plan(0, 2, &[P2pOp { dir: Dir::Send, peer: 2, bytes: 8 }], 16, 2).unwrap_err();
        assert!(e.to_string().contains("peer 2"), "{e}");
    }

    #[test]
    fn slots_of_scratch() {
        assert_eq!(slot_bytes(4 << 20, 8, 2), Some(256 << 10));
        assert_eq!(slot_bytes(4 << 20, 8, 4), Some(128 << 10));
        assert_eq!(slot_bytes(4 << 20, 1024, 2), Some(2048));
        assert_eq!(slot_bytes(1000, 1, 2), Some(256));
        assert_eq!(slot_bytes(1000, 1, 4), None);
        assert_eq!(slot_bytes(0, 0, 2), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 256,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Several random groups one after the other with the slots carried from group to
        /// group ([`plan_net`]): fixed, whole-slot and per-pair chunks, random interleavings of
        /// the ranks' streams (a rank may run groups ahead of its peers).
        #[test]
        fn carried_slots_deliver_every_byte_of_every_group(
            n in 1usize..6,
            groups in proptest::collection::vec(
                proptest::collection::vec((0usize..5, 0usize..5, 0usize..300), 0..8), 1..6),
            slot in 1usize..64,
            slots in 1usize..10,
            chunking in 0usize..3,
            seed in proptest::prelude::any::<u64>(),
        ) {
            let groups: Vec<Vec<Transfer>> = groups
                .into_iter()
                .map(|g| g.into_iter().map(|(a, b, bytes)| (a % n, b % n, bytes)).collect())
                .collect();
            let chunks = [Chunks::Slot, Chunks::Fixed(slot.div_ceil(3)), Chunks::ByPair][chunking];
            simulate_groups(&groups, n, (slot, slots, chunks), true, seed);
        }
    }

    #[test]
    fn carried_slots_across_calls_of_a_ring_and_a_broadcast() {
        let ring: Vec<Transfer> = (0..3).map(|r| (r, (r + 1) % 3, 100 + 7 * r)).collect();
        let bcast: Vec<Transfer> = (1..3).map(|d| (0, d, 90)).collect();
        let groups = vec![ring.clone(), bcast.clone(), ring, bcast.clone(), bcast];
        for (slots, chunks) in [(1, Chunks::Slot), (2, Chunks::Fixed(8)), (NET_SLOTS, Chunks::Fixed(16)), (NET_SLOTS, Chunks::ByPair)] {
            for seed in [0, 1, 7, 42, 1234, 0xdead_beef] {
                simulate_groups(&groups, 3, (32, slots, chunks), true, seed);
            }
        }
    }

    #[test]
    fn carried_plans_have_no_ready_and_wait_only_for_reused_slots() {
        let send = [P2pOp { dir: Dir::Send, peer: 1, bytes: 4 << 10 }];
        let recv = [P2pOp { dir: Dir::Recv, peer: 0, bytes: 4 << 10 }];
        let layout = (1 << 10, 8, Chunks::Slot);
        let (mut c0, mut c1) = (Carry::new(2, 8), Carry::new(2, 8));
        let (mut got0, mut got1) = (vec![0u64; 2], vec![0u64; 2]);
        let mut carried_waits = Vec::new();
        for _ in 0..3 {
            let (p0, n0) = plan_net(0, 2, &send, layout, &c0, &got0).unwrap();
            let (p1, n1) = plan_net(1, 2, &recv, layout, &c1, &got1).unwrap();
            // No ready: the receiver's first signal is its first consumed.
            assert_eq!(p1.sent, vec![4, 0]);
            assert!(p1.actions.iter().all(|a| !matches!(a, Action::WaitCarried { .. })));
            carried_waits.push(
                p0.actions
                    .iter()
                    .filter_map(|a| match a {
                        Action::WaitCarried { at, .. } => Some(*at),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            );
            // The sender's chunks go round the eight slots: 0-3, 4-7, 0-3.
            (c0, c1) = (n0, n1);
            got0[1] += p0.received[1];
            got1[0] += p1.received[0];
        }
        // Group 0 and 1 fill fresh slots; group 2 reuses group 0's, freed by its consumed 1-4.
        assert_eq!(carried_waits, vec![vec![], vec![], vec![1, 2, 3, 4]]);
        assert_eq!(c0.chunks_to(1), 12);
    }

    #[test]
    fn per_pair_chunks_follow_each_direction_bytes() {
        // 1 MiB one way, 4 KiB the other, slots of 1 MiB: 256 KiB chunks and one 4 KiB chunk.
        let ops = [
            P2pOp { dir: Dir::Send, peer: 1, bytes: 1 << 20 },
            P2pOp { dir: Dir::Recv, peer: 1, bytes: 4 << 10 },
        ];
        let (p, _) = plan_net(0, 2, &ops, (1 << 20, NET_SLOTS, Chunks::ByPair), &Carry::new(2, NET_SLOTS), &[0, 0]).unwrap();
        let sends: Vec<usize> = p
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Copy { to: Place::Scratch { .. }, bytes, .. } => Some(*bytes),
                _ => None,
            })
            .collect();
        assert_eq!(sends, vec![256 << 10; 4]);
        assert_eq!(p.sent[1], 4 + 1); // data 0-3, consumed of the one chunk received
        let e = plan_net(0, 2, &ops, (1 << 20, 4, Chunks::ByPair), &Carry::new(2, NET_SLOTS), &[0, 0]).unwrap_err();
        assert!(e.to_string().contains("carry"), "{e}");
    }
}
