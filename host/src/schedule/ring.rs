//! The ring schedules of every collective: pure functions from the ring order, the counts,
//! the layout and the chunk to a finished [`Schedule`].

use super::{BufId, Layout, Region, Schedule, Step};

/// One point-to-point transfer of a [`send_recv`] group: `count` elements from rank `from` to
/// rank `to`.
///
/// ```
/// use ringccl::internals::schedule::P2p;
/// let p = P2p { from: 0, to: 1, count: 16 };
/// assert_eq!(p.count, 16);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct P2p {
    /// Sending rank.
    pub from: usize,
    /// Receiving rank.
    pub to: usize,
    /// Elements.
    pub count: usize,
}

/// Whether `ring` is a permutation of `0..ring.len()` (and not empty).
///
/// ```
/// use ringccl::internals::schedule::is_ring;
/// assert!(is_ring(&[2, 0, 1]));
/// assert!(!is_ring(&[0, 0, 1]) && !is_ring(&[0, 3]) && !is_ring(&[]));
/// ```
pub fn is_ring(ring: &[usize]) -> bool {
    let n = ring.len();
    let mut seen = vec![false; n];
    n > 0
        && ring
            .iter()
            .all(|&r| r < n && !std::mem::replace(&mut seen[r], true))
}

/// `count` split into `n` contiguous, nearly equal segments `(offset, len)` (the first
/// `count % n` are one longer).
pub(super) fn segments(count: usize, n: usize) -> Vec<(usize, usize)> {
    let (base, rem) = (count / n, count % n);
    let mut off = 0;
    (0..n)
        .map(|s| {
            let len = base + usize::from(s < rem);
            let seg = (off, len);
            off += len;
            seg
        })
        .collect()
}

/// Chunk `c` of a segment of `len` elements: `(offset within the segment, len)`, if it exists.
fn chunk_of(len: usize, chunk: usize, c: usize) -> Option<(usize, usize)> {
    let off = c.checked_mul(chunk)?;
    (off < len).then(|| (off, chunk.min(len - off)))
}

/// Chunks in a segment of `len` elements.
fn nchunks(len: usize, chunk: usize) -> usize {
    len.div_ceil(chunk)
}

/// Whether `a * b` fits (all offsets a generator computes stay below it).
fn fits(a: usize, b: usize) -> bool {
    a.checked_mul(b).is_some_and(|x| x.checked_mul(2).is_some())
}

/// The opening check of every builder: `ring` a permutation and the call's arguments `ok`
/// (its layout accepted, its offsets within range); then the chunk, at least 1 element.
/// `None`: the builder returns the empty schedule (callers validate first).
fn opening(ring: &[usize], ok: bool, chunk: usize) -> Option<usize> {
    (is_ring(ring) && ok).then_some(chunk.max(1))
}

fn reg(rank: usize, buf: BufId, offset: usize, len: usize) -> Region {
    Region::new(rank, buf, offset, len)
}

use BufId::{Recv, Scratch, Send};

/// Ring all-reduce of `count` elements (send = recv = `count` on every rank).
///
/// `count` is split into `n` segments. For each segment (and chunk), a ring reduce-scatter of
/// `n − 1` reduce-copy steps (`recv[seg] = send[seg] ⊕ predecessor's partial`, the last with
/// `finish`) leaves the result on one rank, then `n − 1` copy steps pass it around the ring.
/// With 2 ranks each rank reduces its half once and writes it to both receive buffers.
/// Layouts: [`Layout::OutOfPlace`] and `SendInRecv { stride: 0 }`; any other layout, or a
/// `ring` that is not a permutation, gives an empty schedule (callers validate first).
///
/// ```
/// use ringccl::internals::schedule::{all_reduce, Layout};
/// let s = all_reduce(&[0, 1], 10, Layout::SendInRecv { stride: 0 }, 3);
/// // 2 ranks × 2 chunks of each 5-element half, each step writes both ranks' recv.
/// assert_eq!(s.steps.len(), 4);
/// assert!(s.steps.iter().all(|st| st.dsts.len() == 2 && st.finish));
/// ```
pub fn all_reduce(ring: &[usize], count: usize, layout: Layout, chunk: usize) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = matches!(
        layout,
        Layout::OutOfPlace | Layout::SendInRecv { stride: 0 }
    );
    let Some(chunk) = opening(ring, ok && fits(count, 1), chunk) else {
        return s;
    };
    let segs = segments(count, n);
    let maxc = segs
        .iter()
        .map(|&(_, l)| nchunks(l, chunk))
        .max()
        .unwrap_or(0);
    for c in 0..maxc {
        if n == 1 {
            if let Some((o, l)) = chunk_of(count, chunk, c) {
                s.push(Step::copy(0, reg(0, Send, o, l), reg(0, Recv, o, l)));
            }
        } else if n == 2 {
            for (p, &(so, sl)) in segs.iter().enumerate() {
                if let Some((o, l)) = chunk_of(sl, chunk, c) {
                    let (me, peer) = (ring[p], ring[1 - p]);
                    let o = so + o;
                    s.push(Step::reduce(
                        me,
                        vec![reg(me, Send, o, l), reg(peer, Send, o, l)],
                        vec![reg(me, Recv, o, l), reg(peer, Recv, o, l)],
                        true,
                    ));
                }
            }
        } else {
            for k in 1..=2 * n - 2 {
                for (si, &(so, sl)) in segs.iter().enumerate() {
                    let Some((o, l)) = chunk_of(sl, chunk, c) else {
                        continue;
                    };
                    let o = so + o;
                    if k < n {
                        // Reduce-scatter: the chain of segment `si` starts after position si.
                        let pos = (si + 1 + k) % n;
                        let (me, pred) = (ring[pos], ring[(pos + n - 1) % n]);
                        let partial = reg(pred, if k == 1 { Send } else { Recv }, o, l);
                        s.push(Step::reduce(
                            me,
                            vec![reg(me, Send, o, l), partial],
                            vec![reg(me, Recv, o, l)],
                            k == n - 1,
                        ));
                    } else {
                        // All-gather from position si, which holds the result.
                        let pos = (si + k - (n - 1)) % n;
                        let (me, pred) = (ring[pos], ring[(pos + n - 1) % n]);
                        s.push(Step::copy(me, reg(pred, Recv, o, l), reg(me, Recv, o, l)));
                    }
                }
            }
        }
    }
    s.finish(layout)
}

/// Ring reduce-scatter: rank `q` receives block `q` (`recvcount` elements at
/// `q * recvcount` of every send buffer) reduced over all ranks.
///
/// Each block travels the ring once: `n − 1` reduce-copy steps, partial results in scratch (two
/// slots of `recvcount`, reused every other step), the last step writing the owner's recv with
/// `finish`. Layouts: [`Layout::OutOfPlace`] and `RecvInSend { stride: recvcount }`.
///
/// ```
/// use ringccl::internals::schedule::{reduce_scatter, Layout};
/// let s = reduce_scatter(&[0, 1, 2, 3], 8, Layout::OutOfPlace, 8);
/// assert_eq!(s.steps.len(), 4 * 3);
/// assert_eq!(s.scratch_len, 2 * 8);
/// ```
pub fn reduce_scatter(ring: &[usize], recvcount: usize, layout: Layout, chunk: usize) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = match layout {
        Layout::OutOfPlace => true,
        Layout::RecvInSend { stride } => stride == recvcount,
        Layout::SendInRecv { .. } => false,
    };
    let Some(chunk) = opening(ring, ok && fits(recvcount, n), chunk) else {
        return s;
    };
    let slots = n.saturating_sub(2).min(2);
    s.scratch_len = slots * recvcount;
    let slot = |k: usize| ((k - 1) % 2) * recvcount;
    for c in 0..nchunks(recvcount, chunk) {
        let Some((o, l)) = chunk_of(recvcount, chunk, c) else {
            continue;
        };
        if n == 1 {
            s.push(Step::copy(0, reg(0, Send, o, l), reg(0, Recv, o, l)));
            continue;
        }
        for k in 1..n {
            for si in 0..n {
                let q = ring[si];
                let bo = q * recvcount + o;
                let pos = (si + 1 + k) % n;
                let (me, pred) = (ring[pos], ring[(pos + n - 1) % n]);
                let partial = if k == 1 {
                    reg(pred, Send, bo, l)
                } else {
                    reg(pred, Scratch, slot(k - 1) + o, l)
                };
                let dst = if k == n - 1 {
                    reg(me, Recv, o, l)
                } else {
                    reg(me, Scratch, slot(k) + o, l)
                };
                s.push(Step::reduce(
                    me,
                    vec![reg(me, Send, bo, l), partial],
                    vec![dst],
                    k == n - 1,
                ));
            }
        }
    }
    s.finish(layout)
}

/// Ring all-gather: block `q` of every recv buffer (`sendcount` elements at `q * sendcount`)
/// receives rank `q`'s send buffer.
///
/// Each block travels the ring: the next rank copies it from the owner's send buffer, the
/// others from their predecessor's recv. Layouts: [`Layout::OutOfPlace`] (the owner also copies
/// its own block) and `SendInRecv { stride: sendcount }`.
///
/// ```
/// use ringccl::internals::schedule::{all_gather, Layout};
/// let s = all_gather(&[0, 1, 2], 5, Layout::SendInRecv { stride: 5 }, 64);
/// assert_eq!(s.steps.len(), 3 * 2);
/// ```
pub fn all_gather(ring: &[usize], sendcount: usize, layout: Layout, chunk: usize) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = match layout {
        Layout::OutOfPlace => true,
        Layout::SendInRecv { stride } => stride == sendcount,
        Layout::RecvInSend { .. } => false,
    };
    let Some(chunk) = opening(ring, ok && fits(sendcount, n), chunk) else {
        return s;
    };
    for c in 0..nchunks(sendcount, chunk) {
        let Some((o, l)) = chunk_of(sendcount, chunk, c) else {
            continue;
        };
        for k in 0..n {
            for si in 0..n {
                let q = ring[si];
                let bo = q * sendcount + o;
                let pos = (si + k) % n;
                let (me, pred) = (ring[pos], ring[(pos + n - 1) % n]);
                let src = if k <= 1 {
                    reg(q, Send, o, l)
                } else {
                    reg(pred, Recv, bo, l)
                };
                s.push(Step::copy(me, src, reg(me, Recv, bo, l)));
            }
        }
    }
    s.finish(layout)
}

/// Position of `root` in `ring`.
fn position(ring: &[usize], root: usize) -> Option<usize> {
    ring.iter().position(|&r| r == root)
}

/// Ring broadcast of `count` elements from `root`'s send buffer to every recv buffer.
///
/// The rank after the root copies from the root's send buffer, each following rank from its
/// predecessor's recv, chunk by chunk; the root copies send → recv when out of place. Layouts:
/// [`Layout::OutOfPlace`] and `SendInRecv { stride: 0 }` (the root's buffers alias).
///
/// ```
/// use ringccl::internals::schedule::{broadcast, Layout};
/// let s = broadcast(&[0, 1, 2, 3], 100, 2, Layout::SendInRecv { stride: 0 }, 50);
/// assert_eq!(s.steps.len(), 2 * 3);
/// assert!(s.steps.iter().all(|st| st.exec != 2));
/// ```
pub fn broadcast(
    ring: &[usize],
    count: usize,
    root: usize,
    layout: Layout,
    chunk: usize,
) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = matches!(
        layout,
        Layout::OutOfPlace | Layout::SendInRecv { stride: 0 }
    );
    let Some(pr) = position(ring, root) else {
        return s;
    };
    let Some(chunk) = opening(ring, ok && fits(count, 1), chunk) else {
        return s;
    };
    for c in 0..nchunks(count, chunk) {
        let Some((o, l)) = chunk_of(count, chunk, c) else {
            continue;
        };
        for k in 0..n {
            let pos = (pr + k) % n;
            let (me, pred) = (ring[pos], ring[(pos + n - 1) % n]);
            let src = if k <= 1 {
                reg(root, Send, o, l)
            } else {
                reg(pred, Recv, o, l)
            };
            s.push(Step::copy(me, src, reg(me, Recv, o, l)));
        }
    }
    s.finish_for(layout, Some(root))
}

/// Ring reduce of `count` elements to `root`'s recv buffer.
///
/// The chain starts after the root and ends at it: each rank folds its send buffer into its
/// predecessor's partial (kept in scratch, `count` elements per rank for 3+ ranks); the root
/// writes the result with `finish`. Layouts: [`Layout::OutOfPlace`] and
/// `SendInRecv { stride: 0 }` (the root's buffers alias).
///
/// ```
/// use ringccl::internals::schedule::{reduce, Layout};
/// let s = reduce(&[0, 1, 2], 10, 0, Layout::OutOfPlace, 10);
/// assert_eq!(s.steps.len(), 2);
/// assert!(s.steps[1].finish && s.steps[1].exec == 0);
/// ```
pub fn reduce(ring: &[usize], count: usize, root: usize, layout: Layout, chunk: usize) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = matches!(
        layout,
        Layout::OutOfPlace | Layout::SendInRecv { stride: 0 }
    );
    let Some(pr) = position(ring, root) else {
        return s;
    };
    let Some(chunk) = opening(ring, ok && fits(count, 1), chunk) else {
        return s;
    };
    if n >= 3 {
        s.scratch_len = count;
    }
    for c in 0..nchunks(count, chunk) {
        let Some((o, l)) = chunk_of(count, chunk, c) else {
            continue;
        };
        if n == 1 {
            s.push(Step::copy(
                root,
                reg(root, Send, o, l),
                reg(root, Recv, o, l),
            ));
            continue;
        }
        for k in 1..n {
            let pos = (pr + 1 + k) % n;
            let (me, pred) = (ring[pos], ring[(pos + n - 1) % n]);
            let partial = reg(pred, if k == 1 { Send } else { Scratch }, o, l);
            let last = k == n - 1;
            let dst = reg(me, if last { Recv } else { Scratch }, o, l);
            s.push(Step::reduce(
                me,
                vec![reg(me, Send, o, l), partial],
                vec![dst],
                last,
            ));
        }
    }
    s.finish_for(layout, Some(root))
}

/// All-to-all: block `q` of rank `r`'s recv (`count` elements at `q * count`) receives block
/// `r` of rank `q`'s send. Each rank pulls its blocks from every peer, peers in a rotated order
/// so no rank is read by everyone at once.
///
/// `ring` gives the rank count (its order does not matter). Any layout is accepted: other than
/// [`Layout::OutOfPlace`], every rank first stages its send blocks in scratch
/// (`n * count` elements) and peers read them there; with `SendInRecv { stride: 0 }` a rank's
/// own block stays where it is.
///
/// ```
/// use ringccl::internals::schedule::{all_to_all, Layout};
/// let s = all_to_all(&[0, 1, 2], 4, Layout::OutOfPlace, 64);
/// assert_eq!(s.steps.len(), 9);
/// ```
pub fn all_to_all(ring: &[usize], count: usize, layout: Layout, chunk: usize) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let Some(chunk) = opening(ring, fits(count, n), chunk) else {
        return s;
    };
    let staged = layout != Layout::OutOfPlace;
    let skip_self = layout == Layout::SendInRecv { stride: 0 };
    let first = usize::from(skip_self);
    if staged {
        s.scratch_len = n * count;
        for c in 0..nchunks(count, chunk) {
            let Some((o, l)) = chunk_of(count, chunk, c) else {
                continue;
            };
            for r in 0..n {
                for d in first..n {
                    let q = (r + d) % n;
                    let bo = q * count + o;
                    s.push(Step::copy(r, reg(r, Send, bo, l), reg(r, Scratch, bo, l)));
                }
            }
        }
    }
    for c in 0..nchunks(count, chunk) {
        let Some((o, l)) = chunk_of(count, chunk, c) else {
            continue;
        };
        for d in first..n {
            for r in 0..n {
                let q = (r + d) % n;
                let src = reg(q, if staged { Scratch } else { Send }, r * count + o, l);
                s.push(Step::copy(r, src, reg(r, Recv, q * count + o, l)));
            }
        }
    }
    s.finish(layout)
}

/// Gather: block `q` of `root`'s recv (`sendcount` elements at `q * sendcount`) receives rank
/// `q`'s send buffer; the root pulls every block.
///
/// Layouts: [`Layout::OutOfPlace`] and `SendInRecv { stride: sendcount }` (the root's send is
/// its own block of its recv).
///
/// ```
/// use ringccl::internals::schedule::{gather, Layout};
/// let s = gather(&[0, 1, 2, 3], 6, 1, Layout::SendInRecv { stride: 6 }, 64);
/// assert_eq!(s.steps.len(), 3);
/// assert!(s.steps.iter().all(|st| st.exec == 1));
/// ```
pub fn gather(
    ring: &[usize],
    sendcount: usize,
    root: usize,
    layout: Layout,
    chunk: usize,
) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = match layout {
        Layout::OutOfPlace => true,
        Layout::SendInRecv { stride } => stride == sendcount,
        Layout::RecvInSend { .. } => false,
    };
    let Some(pr) = position(ring, root) else {
        return s;
    };
    let Some(chunk) = opening(ring, ok && fits(sendcount, n), chunk) else {
        return s;
    };
    for c in 0..nchunks(sendcount, chunk) {
        let Some((o, l)) = chunk_of(sendcount, chunk, c) else {
            continue;
        };
        for d in 0..n {
            let q = ring[(pr + d) % n];
            s.push(Step::copy(
                root,
                reg(q, Send, o, l),
                reg(root, Recv, q * sendcount + o, l),
            ));
        }
    }
    s.finish_for(layout, Some(root))
}

/// Scatter: rank `q`'s recv receives block `q` of `root`'s send (`recvcount` elements at
/// `q * recvcount`); every rank pulls its block.
///
/// Layouts: [`Layout::OutOfPlace`] and `RecvInSend { stride: recvcount }` (the root's recv is
/// its own block of its send).
///
/// ```
/// use ringccl::internals::schedule::{scatter, Layout};
/// let s = scatter(&[0, 1, 2], 6, 0, Layout::OutOfPlace, 4);
/// assert_eq!(s.steps.len(), 2 * 3);
/// ```
pub fn scatter(
    ring: &[usize],
    recvcount: usize,
    root: usize,
    layout: Layout,
    chunk: usize,
) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = match layout {
        Layout::OutOfPlace => true,
        Layout::RecvInSend { stride } => stride == recvcount,
        Layout::SendInRecv { .. } => false,
    };
    let Some(pr) = position(ring, root) else {
        return s;
    };
    let Some(chunk) = opening(ring, ok && fits(recvcount, n), chunk) else {
        return s;
    };
    for c in 0..nchunks(recvcount, chunk) {
        let Some((o, l)) = chunk_of(recvcount, chunk, c) else {
            continue;
        };
        for d in 0..n {
            let q = ring[(pr + d) % n];
            s.push(Step::copy(
                q,
                reg(root, Send, q * recvcount + o, l),
                reg(q, Recv, o, l),
            ));
        }
    }
    s.finish_for(layout, Some(root))
}

/// A group of point-to-point transfers. Each rank's messages lie back to back in its buffers,
/// in list order: the `k`-th pair sent by rank `r` reads `r`'s send buffer after the counts of
/// `r`'s earlier sends, and the `k`-th pair received by rank `t` lands in `t`'s recv after the
/// counts of its earlier receives. The receiver copies from the sender's buffer.
///
/// `ring` gives the rank count. Pairs naming a rank out of range give an empty schedule. Any
/// layout is accepted: other than [`Layout::OutOfPlace`], senders first stage their messages in
/// scratch (`scratch_len` = the most any rank sends) and receivers read them there.
///
/// ```
/// use ringccl::internals::schedule::{send_recv, Layout, P2p};
/// let ring = [0, 1, 2];
/// let pairs: Vec<P2p> = (0..3).map(|r| P2p { from: r, to: (r + 1) % 3, count: 5 }).collect();
/// let s = send_recv(&ring, &pairs, Layout::OutOfPlace, 64);
/// assert_eq!(s.steps.len(), 3);
/// assert!(s.steps.iter().all(|st| st.deps.is_empty()));
/// ```
pub fn send_recv(ring: &[usize], pairs: &[P2p], layout: Layout, chunk: usize) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let Some(chunk) = opening(ring, pairs.iter().all(|p| p.from < n && p.to < n), chunk) else {
        return s;
    };
    // Offsets of each pair in its sender's send and its receiver's recv.
    let mut sent = vec![0usize; n];
    let mut received = vec![0usize; n];
    let mut placed = Vec::with_capacity(pairs.len());
    for p in pairs {
        let (Some(so), Some(ro)) = (
            sent[p.from].checked_add(p.count),
            received[p.to].checked_add(p.count),
        ) else {
            return s;
        };
        placed.push((p, sent[p.from], received[p.to]));
        sent[p.from] = so;
        received[p.to] = ro;
    }
    let staged = layout != Layout::OutOfPlace;
    let maxc = pairs
        .iter()
        .map(|p| nchunks(p.count, chunk))
        .max()
        .unwrap_or(0);
    if staged {
        s.scratch_len = sent.iter().copied().max().unwrap_or(0);
        for c in 0..maxc {
            for &(p, so, _) in &placed {
                if let Some((o, l)) = chunk_of(p.count, chunk, c) {
                    let src = reg(p.from, Send, so + o, l);
                    s.push(Step::copy(p.from, src, reg(p.from, Scratch, so + o, l)));
                }
            }
        }
    }
    for c in 0..maxc {
        for &(p, so, ro) in &placed {
            if let Some((o, l)) = chunk_of(p.count, chunk, c) {
                let src = reg(p.from, if staged { Scratch } else { Send }, so + o, l);
                s.push(Step::copy(p.to, src, reg(p.to, Recv, ro + o, l)));
            }
        }
    }
    s.finish(layout)
}

