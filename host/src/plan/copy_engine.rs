//! Collectives on the copy engines, planned. The all-reduce ([`plan`]) is a ring whose peer
//! traffic is `cuMemcpyAsync` on a second stream per rank (the GPU's copy engines) while the
//! first stream reduces, so that the copy of one chunk overlaps the reduction of the previous
//! one and no SM waits on NVLink; all-gather, broadcast and all-to-all ([`all_gather`],
//! [`broadcast`], [`all_to_all`]) are plain copies from each input to the outputs.
//!
//! The count is cut into one segment per ring position and each segment into chunks. With the
//! ranks at positions `0..n` of the ring, and `p + 1` the next position:
//! * **reduce-scatter**, steps `s = 0..n-1`: position `p` copies chunk `c` of segment
//!   `(p - s) mod n` (its input at step 0, its partial result after) into a *slot* of the next
//!   position's scratch ([`Lane::Copy`]); the next position reduces its own input with the slot
//!   into its output ([`Lane::Compute`]; the last step applies avg's division). After `n - 1`
//!   steps position `p` holds the result of segment `(p + 1) mod n`.
//! * **all-gather**, steps `s = 0..n-1`: position `p` copies chunk `c` of segment
//!   `(p + 1 - s) mod n` from its output into the next position's output ([`Lane::Copy`]).
//!
//! A rank receives slots from one rank only (the previous position), in order; its `k`-th
//! received chunk goes to slot `k mod slots`, which the copy may fill only once the reduction of
//! chunk `k - slots` is done. Every operation lists the earlier operations it waits for on other
//! lanes (the executor turns them into events); on its own lane, order is issue order.
//!
//! The CPU simulation in the tests runs the plan with every lane as an independent queue under
//! random interleavings and checks every rank's result.

use crate::{Error, Result};

/// Which of a rank's two streams runs an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    /// The caller's stream: reductions.
    Compute,
    /// The rank's copy stream: `cuMemcpyAsync` to the next rank.
    Copy,
}

/// Where an operation reads or writes: an element offset in a rank's send or receive buffer, or
/// a slot of its scratch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    /// The rank's input, `offset` elements in.
    Send {
        /// The rank.
        rank: usize,
        /// Elements from the start.
        offset: usize,
    },
    /// The rank's output, `offset` elements in.
    Recv {
        /// The rank.
        rank: usize,
        /// Elements from the start.
        offset: usize,
    },
    /// Slot `slot` of the rank's scratch (each [`CePlan::slot_elems`] elements).
    Slot {
        /// The rank.
        rank: usize,
        /// The slot.
        slot: usize,
    },
}

/// What one operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// `dst = src` (`elems` elements), on the copy lane of the source's rank.
    Copy {
        /// Source.
        src: Loc,
        /// Destination (the next rank's memory).
        dst: Loc,
        /// Elements.
        elems: usize,
    },
    /// `dst = a ⊕ b`, with avg's division if `finish`, on the compute lane.
    Reduce {
        /// The rank's own input.
        a: Loc,
        /// The slot the previous rank filled.
        b: Loc,
        /// The rank's output.
        dst: Loc,
        /// Elements.
        elems: usize,
        /// The last reduction of the element (avg divides here).
        finish: bool,
    },
}

/// One operation: who runs it, on which lane, after which operations of other lanes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CeOp {
    /// The running rank.
    pub rank: usize,
    /// Its lane.
    pub lane: Lane,
    /// The work.
    pub work: Work,
    /// Operations (indices into [`CePlan::ops`], all earlier) on other lanes it waits for.
    pub waits: Vec<usize>,
}

/// A copy-engine all-reduce, in issue order. See the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CePlan {
    /// Ranks.
    pub nranks: usize,
    /// Elements of one scratch slot.
    pub slot_elems: usize,
    /// Slots per rank.
    pub slots: usize,
    /// The operations.
    pub ops: Vec<CeOp>,
    /// Per operation: whether an operation of another lane waits for it (the executor records
    /// an event after it).
    pub needs_event: Vec<bool>,
    /// Per rank and lane ([`Self::lane_index`]): the last operation, if any.
    pub last: Vec<Option<usize>>,
}

impl CePlan {
    /// The index of `(rank, lane)` in [`CePlan::last`].
    pub fn lane_index(rank: usize, lane: Lane) -> usize {
        2 * rank + usize::from(lane == Lane::Copy)
    }
}

/// Elements `[start, start + len)` of segment `g` of `count` elements cut into `n` segments.
fn segment(count: usize, n: usize, g: usize) -> (usize, usize) {
    let (base, rem) = (count / n, count % n);
    (g * base + g.min(rem), base + usize::from(g < rem))
}

/// Plans an all-reduce of `count` elements over the ranks in `ring` order (every rank once),
/// chunks of at most `chunk_elems`, `slots` scratch slots per rank. See the module docs.
///
/// ```
/// use ringccl::internals::plan::copy_engine::{plan, Lane, Work};
/// let p = plan(&[0, 1], 1000, 100, 3)?;
/// // Two segments of 500 elements, 5 chunks each: per chunk one slot copy and one reduction
/// // per rank, then one all-gather copy per rank.
/// assert_eq!(p.ops.len(), 2 * 5 * 3);
/// assert!(matches!(p.ops[0].work, Work::Copy { elems: 100, .. }) && p.ops[0].lane == Lane::Copy);
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn plan(ring: &[usize], count: usize, chunk_elems: usize, slots: usize) -> Result<CePlan> {
    let n = ring.len();
    let mut seen = vec![false; n];
    for &r in ring {
        if r >= n || std::mem::replace(&mut seen[r], true) {
            return Err(Error::Internal {
                reason: format!("ring {ring:?} is not a permutation"),
            });
        }
    }
    if n < 2 || chunk_elems == 0 || slots == 0 {
        return Err(Error::Internal {
            reason: format!("a copy-engine plan of {n} ranks, chunks of {chunk_elems}, {slots} slots"),
        });
    }
    let chunks = |g: usize| segment(count, n, g).1.div_ceil(chunk_elems);
    let max_chunks = (0..n).map(chunks).max().unwrap_or(0);
    let piece = |g: usize, c: usize| {
        let (start, len) = segment(count, n, g);
        let off = c * chunk_elems;
        (start + off, chunk_elems.min(len - off))
    };
    let mut ops: Vec<CeOp> = Vec::new();
    // The operation that last wrote chunk c of segment g on a rank (its partial or result),
    // and on which lane.
    let mut wrote: Vec<Option<usize>> = vec![None; n * n * max_chunks];
    let key = |rank: usize, g: usize, c: usize| (rank * n + g) * max_chunks + c;
    // Per rank: the reductions that consumed its slots, in order.
    let mut consumed: Vec<Vec<usize>> = vec![Vec::new(); n];
    for s in 0..n - 1 {
        for c in 0..max_chunks {
            for p in 0..n {
                let g = (p + n - s % n) % n;
                if c >= chunks(g) {
                    continue;
                }
                let (a, b) = (ring[p], ring[(p + 1) % n]);
                let (offset, elems) = piece(g, c);
                let k = consumed[b].len();
                let slot = k % slots;
                let mut waits = Vec::new();
                let src = if s == 0 {
                    Loc::Send { rank: a, offset }
                } else {
                    waits.extend(wrote[key(a, g, c)]);
                    Loc::Recv { rank: a, offset }
                };
                if k >= slots {
                    waits.push(consumed[b][k - slots]);
                }
                let copy = ops.len();
                ops.push(CeOp {
                    rank: a,
                    lane: Lane::Copy,
                    work: Work::Copy {
                        src,
                        dst: Loc::Slot { rank: b, slot },
                        elems,
                    },
                    waits,
                });
                let reduce = ops.len();
                ops.push(CeOp {
                    rank: b,
                    lane: Lane::Compute,
                    work: Work::Reduce {
                        a: Loc::Send { rank: b, offset },
                        b: Loc::Slot { rank: b, slot },
                        dst: Loc::Recv { rank: b, offset },
                        elems,
                        finish: s == n - 2,
                    },
                    waits: vec![copy],
                });
                consumed[b].push(reduce);
                wrote[key(b, g, c)] = Some(reduce);
            }
        }
    }
    for s in 0..n - 1 {
        for c in 0..max_chunks {
            for p in 0..n {
                let g = (p + 1 + n - s % n) % n;
                if c >= chunks(g) {
                    continue;
                }
                let (a, b) = (ring[p], ring[(p + 1) % n]);
                let (offset, elems) = piece(g, c);
                let id = ops.len();
                ops.push(CeOp {
                    rank: a,
                    lane: Lane::Copy,
                    work: Work::Copy {
                        src: Loc::Recv { rank: a, offset },
                        dst: Loc::Recv { rank: b, offset },
                        elems,
                    },
                    waits: wrote[key(a, g, c)].into_iter().collect(),
                });
                wrote[key(b, g, c)] = Some(id);
            }
        }
    }
    Ok(finish(n, chunk_elems, slots, ops))
}

/// The plan of `ops` (in issue order) over `n` ranks: same-lane waits dropped (implied by the
/// lane's order), events where another lane waits and after every lane's last operation.
fn finish(n: usize, slot_elems: usize, slots: usize, mut ops: Vec<CeOp>) -> CePlan {
    let lane_of: Vec<(usize, Lane)> = ops.iter().map(|o| (o.rank, o.lane)).collect();
    for op in &mut ops {
        let me = (op.rank, op.lane);
        op.waits.retain(|&w| lane_of[w] != me);
    }
    let mut needs_event = vec![false; ops.len()];
    for op in &ops {
        for &w in &op.waits {
            needs_event[w] = true;
        }
    }
    let mut last = vec![None; 2 * n];
    for (i, op) in ops.iter().enumerate() {
        last[CePlan::lane_index(op.rank, op.lane)] = Some(i);
    }
    // The executor waits for every lane's last operation at the end of the call.
    for l in last.iter().flatten() {
        needs_event[*l] = true;
    }
    CePlan {
        nranks: n,
        slot_elems,
        slots,
        ops,
        needs_event,
        last,
    }
}

/// The rank whose memory `loc` is.
fn owner(loc: Loc) -> usize {
    match loc {
        Loc::Send { rank, .. } | Loc::Recv { rank, .. } | Loc::Slot { rank, .. } => rank,
    }
}

/// A plan of independent copies `(rank, src, dst, elems)` (no slots, no reductions): the
/// collectives that only move data. A copy to another rank goes on the copy lane; a copy
/// within the rank on the compute lane, so that it runs beside the peer copies instead of
/// before or after them (measured: out-of-place all-gather at 1 GiB on 2 × H200, 320 GB/s with
/// the local copy on the copy lane, 387 in place without it).
fn copies(n: usize, list: impl IntoIterator<Item = (usize, Loc, Loc, usize)>) -> CePlan {
    let ops = list
        .into_iter()
        .filter(|&(_, src, dst, elems)| elems > 0 && src != dst)
        .map(|(rank, src, dst, elems)| CeOp {
            rank,
            lane: if owner(src) == owner(dst) {
                Lane::Compute
            } else {
                Lane::Copy
            },
            work: Work::Copy { src, dst, elems },
            waits: Vec::new(),
        })
        .collect();
    finish(n, 0, 0, ops)
}

/// All-gather of `count` elements per rank over `n` ranks on the copy engines: every rank
/// copies its input into block `rank` of every rank's output (its own too, unless `in_place`:
/// the input already is that block).
///
/// ```
/// use ringccl::internals::plan::copy_engine::all_gather;
/// assert_eq!(all_gather(2, 100, false).ops.len(), 4); // two peer copies, two local ones
/// assert_eq!(all_gather(2, 100, true).ops.len(), 2);
/// ```
pub fn all_gather(n: usize, count: usize, in_place: bool) -> CePlan {
    copies(
        n,
        (0..n).flat_map(|a| {
            (0..n)
                .filter(move |&b| !(in_place && a == b))
                .map(move |b| {
                    let src = Loc::Send { rank: a, offset: 0 };
                    (a, src, Loc::Recv { rank: b, offset: a * count }, count)
                })
        }),
    )
}

/// Broadcast of `count` elements from `root` over `n` ranks on the copy engines: the root
/// copies its input into every rank's output (its own too, unless `in_place`).
///
/// ```
/// use ringccl::internals::plan::copy_engine::broadcast;
/// assert_eq!(broadcast(4, 100, 2, true).ops.len(), 3);
/// ```
pub fn broadcast(n: usize, count: usize, root: usize, in_place: bool) -> CePlan {
    copies(
        n,
        (0..n).filter(|&b| !(in_place && b == root)).map(|b| {
            let src = Loc::Send { rank: root, offset: 0 };
            (root, src, Loc::Recv { rank: b, offset: 0 }, count)
        }),
    )
}

/// All-to-all of `count` elements per pair over `n` ranks on the copy engines: rank `a` copies
/// block `b` of its input into block `a` of rank `b`'s output, for every `b` (itself too).
///
/// ```
/// use ringccl::internals::plan::copy_engine::all_to_all;
/// assert_eq!(all_to_all(3, 10).ops.len(), 9);
/// ```
pub fn all_to_all(n: usize, count: usize) -> CePlan {
    copies(
        n,
        (0..n).flat_map(|a| {
            (0..n).map(move |b| {
                let src = Loc::Send { rank: a, offset: b * count };
                (a, src, Loc::Recv { rank: b, offset: a * count }, count)
            })
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `p` on the CPU with integer sums: every (rank, lane) a queue that runs its next
    /// operation once the operations it waits for are done, the queues picked at random by
    /// `seed` (0: in issue order). Returns every rank's output.
    fn simulate(p: &CePlan, inputs: &[Vec<i64>], seed: u64) -> Vec<Vec<i64>> {
        simulate_len(p, inputs, inputs[0].len(), seed)
    }

    /// [`simulate`] with outputs of `recv_len` elements.
    fn simulate_len(p: &CePlan, inputs: &[Vec<i64>], recv_len: usize, seed: u64) -> Vec<Vec<i64>> {
        let n = p.nranks;
        let mut recv = vec![vec![i64::MIN; recv_len]; n];
        let mut slots = vec![vec![vec![i64::MIN; p.slot_elems]; p.slots]; n];
        let mut queues: Vec<Vec<usize>> = vec![Vec::new(); 2 * n];
        for (i, op) in p.ops.iter().enumerate() {
            queues[CePlan::lane_index(op.rank, op.lane)].push(i);
        }
        let mut head = vec![0usize; 2 * n];
        let mut done = vec![false; p.ops.len()];
        let mut rng = seed;
        loop {
            let ready: Vec<usize> = (0..2 * n)
                .filter(|&l| {
                    queues[l]
                        .get(head[l])
                        .is_some_and(|&i| p.ops[i].waits.iter().all(|&w| done[w]))
                })
                .collect();
            if ready.is_empty() {
                assert!(
                    (0..2 * n).all(|l| head[l] == queues[l].len()),
                    "lanes wait forever"
                );
                break;
            }
            let l = if seed == 0 {
                *ready
                    .iter()
                    .min_by_key(|&&l| queues[l][head[l]])
                    .unwrap_or(&ready[0])
            } else {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                ready[(rng % ready.len() as u64) as usize]
            };
            let i = queues[l][head[l]];
            let read = |loc: Loc, j: usize, recv: &[Vec<i64>], slots: &[Vec<Vec<i64>>]| match loc {
                Loc::Send { rank, offset } => inputs[rank][offset + j],
                Loc::Recv { rank, offset } => recv[rank][offset + j],
                Loc::Slot { rank, slot } => slots[rank][slot][j],
            };
            let vals: Vec<i64> = match p.ops[i].work {
                Work::Copy { src, elems, .. } => {
                    (0..elems).map(|j| read(src, j, &recv, &slots)).collect()
                }
                Work::Reduce { a, b, elems, .. } => (0..elems)
                    .map(|j| read(a, j, &recv, &slots).wrapping_add(read(b, j, &recv, &slots)))
                    .collect(),
            };
            let dst = match p.ops[i].work {
                Work::Copy { dst, .. } | Work::Reduce { dst, .. } => dst,
            };
            for (j, v) in vals.into_iter().enumerate() {
                match dst {
                    Loc::Send { .. } => panic!("an operation writes an input"),
                    Loc::Recv { rank, offset } => recv[rank][offset + j] = v,
                    Loc::Slot { rank, slot } => slots[rank][slot][j] = v,
                }
            }
            done[i] = true;
            head[l] += 1;
        }
        recv
    }

    fn check(ring: &[usize], count: usize, chunk: usize, slots: usize) {
        let n = ring.len();
        let p = plan(ring, count, chunk, slots).unwrap();
        let inputs: Vec<Vec<i64>> = (0..n)
            .map(|r| (0..count).map(|i| ((r * 1000 + i) as i64) << (r * 7)).collect())
            .collect();
        let want: Vec<i64> = (0..count)
            .map(|i| inputs.iter().map(|v| v[i]).fold(0i64, i64::wrapping_add))
            .collect();
        for seed in [0, 1, 3, 42, 777, 0xfeed, 12345, 9] {
            let got = simulate(&p, &inputs, seed);
            for (r, g) in got.iter().enumerate() {
                assert_eq!(g, &want, "rank {r}, ring {ring:?}, count {count}, chunk {chunk}, slots {slots}, seed {seed}");
            }
        }
        // Every element is finished (avg's division) exactly once, on one rank.
        let mut finished = vec![0; count];
        for op in &p.ops {
            if let Work::Reduce { dst: Loc::Recv { offset, .. }, elems, finish: true, .. } = op.work {
                for f in &mut finished[offset..offset + elems] {
                    *f += 1;
                }
            }
        }
        assert!(finished.iter().all(|&f| f == 1), "{ring:?} {count}");
    }

    #[test]
    fn two_ranks_every_shape() {
        for count in [0, 1, 2, 3, 10, 99, 100, 101, 1000] {
            for chunk in [1, 7, 50, 1000] {
                for slots in [1, 2, 4] {
                    check(&[0, 1], count, chunk, slots);
                    check(&[1, 0], count, chunk, slots);
                }
            }
        }
    }

    #[test]
    fn rings_of_three_to_six() {
        for ring in [vec![0, 1, 2], vec![2, 0, 1], vec![0, 2, 1, 3], vec![4, 3, 2, 1, 0], vec![0, 1, 2, 3, 4, 5]] {
            for count in [5, 64, 333] {
                for chunk in [4, 30] {
                    check(&ring, count, chunk, 2);
                }
            }
        }
    }

    /// Runs a copy plan and returns the outputs (each `recv_len` long).
    fn run_copies(p: &CePlan, inputs: &[Vec<i64>], recv_len: usize, seed: u64) -> Vec<Vec<i64>> {
        simulate_len(p, inputs, recv_len, seed)
    }

    #[test]
    fn copy_collectives() {
        for n in 2..=5 {
            let count = 37;
            let inputs: Vec<Vec<i64>> = (0..n)
                .map(|r| (0..n * count).map(|i| (r * 10_000 + i) as i64).collect())
                .collect();
            for seed in [0, 5, 99] {
                // All-gather, out of place.
                let got = run_copies(&all_gather(n, count, false), &inputs, n * count, seed);
                for g in &got {
                    for (i, v) in g.iter().enumerate() {
                        assert_eq!(*v, inputs[i / count][i % count], "all_gather n {n}");
                    }
                }
                // Broadcast from the last rank.
                let got = run_copies(&broadcast(n, count, n - 1, false), &inputs, count, seed);
                for g in &got {
                    assert_eq!(g[..], inputs[n - 1][..count], "broadcast n {n}");
                }
                // All-to-all.
                let got = run_copies(&all_to_all(n, count), &inputs, n * count, seed);
                for (b, g) in got.iter().enumerate() {
                    for (i, v) in g.iter().enumerate() {
                        let a = i / count;
                        assert_eq!(*v, inputs[a][b * count + i % count], "all_to_all n {n}");
                    }
                }
            }
            // Copies within a rank run on its compute lane, beside the peer copies.
            for o in &all_gather(n, count, false).ops {
                if let Work::Copy { src, dst, .. } = o.work {
                    let local = owner(src) == owner(dst);
                    assert_eq!(o.lane == Lane::Compute, local, "{o:?}");
                }
            }
            // In place: the own block is not copied.
            let p = all_gather(n, count, true);
            assert!(p.ops.iter().all(|o| !matches!(o.work, Work::Copy { dst: Loc::Recv { rank, .. }, .. } if rank == o.rank)));
            assert_eq!(broadcast(n, count, 0, true).ops.len(), n - 1);
            assert_eq!(broadcast(n, 0, 0, false).ops.len(), 0);
        }
    }

    #[test]
    fn bad_rings_are_refused() {
        assert!(plan(&[0, 0], 10, 4, 2).is_err());
        assert!(plan(&[0, 2], 10, 4, 2).is_err());
        assert!(plan(&[0], 10, 4, 2).is_err());
        assert!(plan(&[0, 1], 10, 0, 2).is_err());
    }

    #[test]
    fn waits_point_back_and_across_lanes() {
        let p = plan(&[0, 1, 2], 100, 10, 2).unwrap();
        for (i, op) in p.ops.iter().enumerate() {
            for &w in &op.waits {
                assert!(w < i);
                assert!((p.ops[w].rank, p.ops[w].lane) != (op.rank, op.lane));
                assert!(p.needs_event[w]);
            }
        }
    }
}
